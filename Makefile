# rxelab: the testbed's entry points. Settings (declared in infra/lab_settings.py, listed in
# docs/lab.md): NODES IMAGE EXTRAS ACCEL MEM_MB DATA_NET MTU LAB SSH_PORT_BASE and the RXELAB_* ones.
PY := .venv/bin/python
export NODES IMAGE EXTRAS ACCEL MEM_MB DATA_NET MTU LAB SSH_PORT_BASE INVENTORY
export RXELAB_STATE RXELAB_CACHE RXELAB_STALL RXELAB_BOOT_TIMEOUT RXELAB_UBUNTU_URL RXELAB_UBUNTU_KEYRING RXELAB_APT_SOURCES
export RXELAB_ACCEPT_NEW_HOST_KEYS

.PHONY: help check deps test-deps provision status boot-profile ssh destroy test test-unit test-slow
help:
	@echo "make check       # can this host run the lab? (Terraform or OpenTofu, Python, disk, memory; seconds)"
	@echo "make provision   # boot the lab ($$($(PY) -m infra.lab_settings 2>/dev/null || python3 -m infra.lab_settings 2>/dev/null || echo 'settings: docs/lab.md'))"
	@echo "make status      # node, state, SSH endpoint, data IP, RDMA port state"
	@echo "make boot-profile # where each node's boot went: kernel, systemd, cloud-init, readiness"
	@echo "make ssh NODE=node1"
	@echo ".venv/bin/fab deploy          # install the rxelab wheel and apps on the nodes"
	@echo ".venv/bin/fab run-experiment --spec smoke   # run a spec (experiments/specs/) on the nodes"
	@echo ".venv/bin/fab report          # report.html and report.md of the newest run"
	@echo ".venv/bin/fab calibrate       # measure the lab: the simulator's cost profile (~12 min)"
	@echo ".venv/bin/fab validate        # a lab run's cases predicted beside what the lab took"
	@echo ".venv/bin/fab simulate --spec smoke   # predict beyond the lab with SimGrid (no lab needed)"
	@echo "make destroy     # remove VMs, network, overlays and state"
	@echo "make test        # the whole test suite (boots its own lab; ~30 min)"
	@echo "make test-unit   # the quick loop: no VMs, no tests marked slow (a few minutes)"
	@echo "make test-slow   # the host tests marked slow (wheel builds, venvs, replays, reports; no VMs)"

check:
	@bash infra/check-host.sh

deps: .venv/.deps-ok
.venv/.deps-ok: pyproject.toml lib/pyproject.toml infra/install-deps.sh infra/check-host.sh
	bash infra/install-deps.sh
	touch $@

test-deps: .venv/.test-deps-ok
.venv/.test-deps-ok: pyproject.toml lib/pyproject.toml infra/install-deps.sh infra/check-host.sh
	bash infra/install-deps.sh test
	touch .venv/.deps-ok $@

provision: deps
	$(PY) -m infra provision

status: deps
	$(PY) -m infra status

boot-profile: deps
	$(PY) -m infra boot-profile

ssh: deps
	@test -n "$(NODE)" || { echo "usage: make ssh NODE=node1"; exit 2; }
	$(PY) -m infra ssh $(NODE)

destroy: deps
	$(PY) -m infra destroy

# Two workers: the VM tests in order on one (tests/conftest.py says how), the unit tests beside;
# then the torch backend's host tests under the distribution's torch (.venv-torch: Debian 12's
# 1.13) and under a current torch 2 from pip (.venv-torch2). The 30 slowest are listed: what CI spends.
test: test-deps
	$(PY) -m pytest -n 2 --durations=30 $(PYTEST_ARGS)
	.venv-torch/bin/python -m pytest tests/torch $(PYTEST_ARGS)
	.venv-torch2/bin/python -m pytest tests/torch $(PYTEST_ARGS)

# The quick loop: neither the VM tests nor the host tests marked slow (pyproject.toml: why),
# on two workers, each test module whole on one (tests/conftest.py); then the torch backend's.
test-unit: test-deps
	$(PY) -m pytest -n 2 -m 'not vm and not slow' $(PYTEST_ARGS)
	.venv-torch/bin/python -m pytest tests/torch $(PYTEST_ARGS)
	.venv-torch2/bin/python -m pytest tests/torch $(PYTEST_ARGS)

# What test-unit leaves out and needs no lab: `make test-unit test-slow` runs every host test.
test-slow: test-deps
	$(PY) -m pytest -m 'slow and not vm' $(PYTEST_ARGS)

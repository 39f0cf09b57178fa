# rxelab: the testbed's entry points. Settings: NODES=2..8 IMAGE=auto|ubuntu-24.04|debian-12
# ACCEL=auto|kvm|tcg MEM_MB=... DATA_NET=auto|bridge|vde; state in $(RXELAB_STATE) or .lab/
PY := .venv/bin/python
export NODES IMAGE ACCEL MEM_MB DATA_NET LAB SSH_PORT_BASE INVENTORY RXELAB_STATE

.PHONY: help deps provision status ssh destroy test test-unit
help:
	@echo "make provision   # boot the lab (NODES=3 IMAGE=auto ACCEL=auto MEM_MB=1024)"
	@echo "make status      # node, state, SSH endpoint, data IP, RDMA port state"
	@echo "make ssh NODE=node1"
	@echo "make destroy     # remove VMs, network, overlays and state"
	@echo "make test        # the whole test suite (boots its own lab); test-unit: no VMs"

deps: .venv/.deps-ok
.venv/.deps-ok: pyproject.toml infra/install-deps.sh
	bash infra/install-deps.sh
	touch $@

provision: deps
	$(PY) -m infra provision

status: deps
	$(PY) -m infra status

ssh: deps
	@test -n "$(NODE)" || { echo "usage: make ssh NODE=node1"; exit 2; }
	$(PY) -m infra ssh $(NODE)

destroy: deps
	$(PY) -m infra destroy

test: deps
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: deps
	$(PY) -m pytest -m 'not vm' $(PYTEST_ARGS)

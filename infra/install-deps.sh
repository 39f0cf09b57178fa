#!/usr/bin/env bash
# Installs what the testbed needs on a Debian/Ubuntu host: the host programs from apt and the
# Python packages into .venv (with `test`: the test tools too). Safe to re-run; the Makefile
# runs it when pyproject.toml or this file changes.
set -euo pipefail
cd "$(dirname "$0")/.."

# What apt cannot install (Terraform or OpenTofu, Python, disk, memory) first: a missing one is
# said in seconds, before minutes of apt and pip.
bash infra/check-host.sh "${1:-}"

APT_PACKAGES=(qemu-system-x86 qemu-utils mmdebstrap e2fsprogs fakeroot vde2 iproute2
              openssh-client python3-venv gpgv
              libsimgrid-dev g++ libjemalloc2)  # fab simulate: SimGrid (3.32 in Debian 12), its
              # replayer's compiler and allocator
# the tests of rxelab.torch run against the distribution's torch (Debian 12: 1.13, the nodes');
# the report's browser test renders it in the distribution's headless Chromium
[ "${1:-}" = test ] && APT_PACKAGES+=(python3-torch chromium chromium-driver)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]} (apt)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

PYTHON=${PYTHON:-python3}
TORCH2_CPU="2.13.0+cpu"  # the torch 2 the host tests run under (tests/torch), besides Debian's
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "deps: $PYTHON is $("$PYTHON" --version 2>&1); rxelab needs Python 3.11 or newer" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# The test tools (pytest, mypy, ruff, ...) only for the tests: `install-deps.sh test`.
extras=""
[ "${1:-}" = test ] && extras="[test]"
# the library first (lib/ is its own project, the rxelab wheel), then the testbed beside it
.venv/bin/python -m pip install -q --disable-pip-version-check -e ./lib
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".$extras"
if [ "${1:-}" = test ]; then
  # .venv-torch: the system's python3 and its torch, with the test tools beside them; numpy
  # stays below 2, which the distribution's torch was built against
  [ -x .venv-torch/bin/python ] || /usr/bin/python3 -m venv --system-site-packages .venv-torch
  .venv-torch/bin/python -m pip install -q --disable-pip-version-check -e ./lib -e ".[test]" "numpy<2"
  .venv-torch/bin/python -c 'import torch, torch.distributed as d; assert d.is_available()' || {
    echo "deps: .venv-torch cannot import the system's torch (python3-torch)" >&2; exit 1; }
  # .venv-torch2: a current torch 2 from pip, for the same tests; its CPU build where one is at
  # hand (a fifth of the size), else PyPI's own (with CUDA libraries, about 5.5 GB)
  [ -x .venv-torch2/bin/python ] || "$PYTHON" -m venv .venv-torch2
  if ! .venv-torch2/bin/python -c 'import torch' 2>/dev/null; then
    .venv-torch2/bin/python -m pip install -q --disable-pip-version-check "torch==$TORCH2_CPU" || {
      echo "deps: no CPU build of torch $TORCH2_CPU at hand: PyPI's torch 2 (about 5.5 GB)"
      .venv-torch2/bin/python -m pip install -q --disable-pip-version-check "torch>=2.6"; }
  fi
  .venv-torch2/bin/python -m pip install -q --disable-pip-version-check -e ./lib -e ".[test]"
fi
echo "deps: ready"

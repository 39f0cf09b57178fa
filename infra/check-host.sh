#!/usr/bin/env bash
# `make check`: whether this host can run the lab, in seconds, before anything is installed.
# What apt installs later (qemu, mmdebstrap, ...) is only listed; what it cannot install is
# checked: Terraform or OpenTofu, Python, the rights to install, disk, memory. One line each;
# exit 1 naming every blocker. install-deps.sh runs it first. With `test`: the test suite's
# needs (more disk, more time).
set -uo pipefail
cd "$(dirname "$0")/.."

blockers=0
ok() { printf '  ok       %s\n' "$*"; }
note() { printf '  note     %s\n' "$*"; }
missing() { printf '  MISSING  %s\n' "$*"; blockers=$((blockers + 1)); }

version_of() {  # the x.y.z a tool prints first
  "$@" 2>/dev/null | sed -n 's/^[^0-9]*\([0-9][0-9]*\.[0-9][0-9]*\(\.[0-9][0-9]*\)\{0,1\}\).*/\1/p' | head -n 1
}
at_least() {  # at_least VERSION MAJOR MINOR
  local major minor
  major=${1%%.*}; minor=${1#*.}; minor=${minor%%.*}
  [ -n "$major" ] && { [ "$major" -gt "$2" ] || { [ "$major" -eq "$2" ] && [ "$minor" -ge "$3" ]; }; }
}

echo "rxelab: checking this host"
# Terraform or OpenTofu: in neither Debian's nor Ubuntu's archive, so never installed here.
tf=""
if command -v terraform >/dev/null; then
  v=$(version_of terraform version)
  if at_least "$v" 1 4; then tf="terraform $v"; else note "terraform $v is older than 1.4"; fi
fi
if [ -z "$tf" ] && command -v tofu >/dev/null; then
  v=$(version_of tofu version)
  if at_least "$v" 1 6; then tf="tofu $v (OpenTofu)"; else note "tofu $v is older than 1.6"; fi
fi
if [ -n "$tf" ]; then ok "$tf"
else missing "Terraform >= 1.4 or OpenTofu >= 1.6 (tofu): neither is in Debian's or Ubuntu's" \
             "archive; install one from its maker (a single binary on the PATH)"; fi

py=${PYTHON:-python3}
if command -v "$py" >/dev/null && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  ok "python $("$py" -c 'import platform; print(platform.python_version())')"
else missing "Python >= 3.11 as $py (set PYTHON=... to another)"; fi

for tool in make git; do
  if command -v "$tool" >/dev/null; then ok "$tool"; else missing "$tool (apt-get install $tool)"; fi
done

if command -v apt-get >/dev/null && command -v dpkg-query >/dev/null; then
  if [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null; then
    ok "apt-get (host packages are installed with it$([ "$(id -u)" -eq 0 ] || echo ', through sudo'))"
  else missing "root or sudo: install-deps.sh installs host packages with apt-get"; fi
else
  missing "apt-get: install-deps.sh knows Debian and Ubuntu hosts; elsewhere install by hand what" \
          "infra/install-deps.sh lists (qemu, mmdebstrap, ...)"
fi

# Disk: the image cache (~1 GB, 3 GB more with EXTRAS=torch), the venvs, apt's packages; the
# test suite boots labs of its own beside and installs Debian's torch for its host tests.
need_gb=6; [ "${1:-}" = test ] && need_gb=12
cache=${RXELAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rxelab}
where=$cache; while [ ! -d "$where" ]; do where=$(dirname "$where"); done
free_kb=$(df -Pk "$where" . 2>/dev/null | awk 'NR > 1 {print $4}' | sort -n | head -n 1)
if [ -n "$free_kb" ] && [ "$free_kb" -ge $((need_gb * 1024 * 1024)) ]; then
  ok "disk: $((free_kb / 1024 / 1024)) GB free (needs $need_gb GB)"
else missing "disk: $((${free_kb:-0} / 1024 / 1024)) GB free where the cache ($cache) and the" \
             "checkout are; needs $need_gb GB (RXELAB_CACHE=/bigger/disk moves the cache)"; fi

# Memory: each node's qemu holds its guest's memory (MEM_MB) and, under TCG, ~0.5 GB of code cache.
nodes=${NODES:-3}; mem_mb=${MEM_MB:-1024}
need_mb=$((nodes * (mem_mb + 512) + 512))
avail_mb=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo 2>/dev/null)
if [ -n "$avail_mb" ] && [ "$avail_mb" -ge "$need_mb" ]; then
  ok "memory: $avail_mb MB available (NODES=$nodes x MEM_MB=$mem_mb needs about $need_mb MB)"
else missing "memory: ${avail_mb:-?} MB available; NODES=$nodes x MEM_MB=$mem_mb needs about" \
             "$need_mb MB (fewer NODES, or less MEM_MB)"; fi

cores=$(nproc 2>/dev/null || echo 1)
load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
note "$cores cores, load $load: $( [ -r /dev/kvm ] && echo 'KVM is tried first' || echo 'no KVM: emulated (TCG)')," \
     "first provision ~5 min on 2 quiet cores (image build ~2 min); a busy host is slower, and waited for"
[ "${1:-}" = test ] && note "make test: ~70-80 min on 2 cores (it boots its own labs, the first beside CPU hogs)"

if [ "$blockers" -gt 0 ]; then
  echo "rxelab: $blockers thing(s) missing above; nothing was installed"
  exit 1
fi
echo "rxelab: this host can run the lab"

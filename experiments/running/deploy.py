"""`fab deploy`: the library and apps/ on every node (idempotent: a content hash decides), and
the checks that say what a node lacks.

The library goes as a user installs it: the rxelab wheel (`pip wheel lib/`), installed offline
(`pip install --no-index --no-deps`) into a venv of ours that sees the system's packages
(pyverbs, numpy, mpi4py are the distribution's), ~/rxelab/venv; every rank runs its python.

A busy node takes minutes to make a venv, so each remote step is waited for while the node
makes progress (experiments/running/watched.py), each node's steps are shown as they start, and a node
that fails is one line naming it and what to do.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import io
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import paramiko
from invoke.exceptions import Failure
from packaging.requirements import Requirement

from experiments.running import watched
from experiments.running.fleet import (
    REMOTE_HOME,
    FleetError,
    connect,
    on_every_host,
    raise_ours,
    said_of,
)
from infra import lab_settings, rdmaport
from infra.config import REPO
from infra.inventory import Host, Inventory

# The deploy directory is ours only if it carries this file: a ~/rxelab of the user's own is
# refused, never replaced.
DEPLOY_MARK = ".rxelab-deploy"
STALL_SETTING = lab_settings.STALL


def unmet_build_requirements(project: Path = REPO / "lib" / "pyproject.toml") -> list[str]:
    """What lib/pyproject.toml's [build-system] asks for and this Python lacks, each as
    "setuptools>=77.0.3 (found 70.1.0)". The wheel is built without isolation, with the venv's
    own tools: an older setuptools fails on the PEP 639 licence in many lines of its own."""
    unmet = []
    for line in tomllib.loads(project.read_text())["build-system"]["requires"]:
        wanted = Requirement(line)
        try:
            found = importlib.metadata.version(wanted.name)
        except importlib.metadata.PackageNotFoundError:
            unmet.append(f"{wanted} (not installed)")
            continue
        if not wanted.specifier.contains(found, prereleases=True):
            unmet.append(f"{wanted} (found {found})")
    return unmet


def build_wheel(out: Path) -> Path:
    """The library's wheel, as `pip wheel lib/` makes it (offline: the build tools are ours),
    from a copy of lib/: setuptools writes build/ and *.egg-info where it builds, and two builds
    at once (a deploy beside a test) must not meet there."""
    if unmet := unmet_build_requirements():
        raise FleetError(f"building the rxelab wheel needs {', '.join(unmet)} in {sys.prefix}: "
                         "run `make deps` (infra/install-deps.sh)")
    source = out / "lib"
    shutil.copytree(REPO / "lib", source, ignore=shutil.ignore_patterns(
        "__pycache__", "build", "*.egg-info", "dist"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "--disable-pip-version-check", "-w", str(out), str(source)],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                       cwd=out)
    found = sorted(out.glob("rxelab-*.whl"))
    if r.returncode != 0 or len(found) != 1:
        raise FleetError(f"building the rxelab wheel failed: {(r.stderr or r.stdout)[-800:]}")
    return found[0]


def sources_digest() -> str:
    """What the deployed code is made of (the library's files and its project, the apps): the
    same sources, the same digest, whatever the wheel's own timestamps."""
    h = hashlib.sha256()
    for root in (REPO / "lib" / "rxelab", REPO / "apps"):
        for path in sorted(root.rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update((REPO / "lib" / "pyproject.toml").read_bytes())
    return h.hexdigest()


def bundle() -> tuple[bytes, str]:
    """The library's wheel and apps/ as one tarball, and the sources' digest."""
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(Path(tmp))
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            files = [(wheel, f"wheels/{wheel.name}")] + [
                (p, f"apps/{p.relative_to(REPO / 'apps')}") for p in sorted((REPO / "apps").rglob("*"))
                if "__pycache__" not in p.parts and p.is_file()]
            for path, name in files:
                info = tarfile.TarInfo(name)
                data = path.read_bytes()
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), sources_digest()


@dataclass(frozen=True)
class NodeCheck:
    host: str
    deployed: bool  # False: was already up to date
    problems: tuple[str, ...]
    version: str = ""  # the rxelab the node's venv imports


# What the node's venv can import, in one interpreter (each start of Python costs seconds of a
# busy TCG node's CPU: four starts took a minute beside CPU hogs).
_IMPORTS = """
import sys
if sys.version_info < (3, 11):
    print("PROBLEM: python3 >= 3.11 missing")
for module, package in (("numpy", "python3-numpy"), ("pyverbs", "python3-pyverbs")):
    try:
        __import__(module)
    except Exception:
        print(f"PROBLEM: {module} missing ({package})")
try:
    import rxelab
    print("VERSION:", rxelab.__version__)
except Exception:
    print("PROBLEM: the rxelab wheel is not installed")
"""
CHECK = ('"$HOME/{home}/venv/bin/python3" -c ' + shlex.quote(_IMPORTS).replace("{", "{{").replace("}", "}}")
         + " 2>/dev/null || echo 'PROBLEM: python3 >= 3.11 missing (no venv python)'; ")


def check_command(host: Host) -> str:
    """CHECK, then whether the node has its RDMA device and the port is ACTIVE."""
    r = host.rdma
    return (CHECK.format(home=REMOTE_HOME)
            + f"{rdmaport.device_exists(r)} || echo "
            + shlex.quote(f"PROBLEM: no RDMA device {r.device}") + "; "
            + f"{rdmaport.is_active(r)} || echo "
            + shlex.quote(f"PROBLEM: {r.device} port {r.port} is not ACTIVE"))


# Deploy only into a ~/rxelab that is ours (marked; or one an earlier rxelab deployed: its
# .deployed holds a digest) or new; the bundle lands inside it, never in a shared /tmp, and
# only its lib/ and apps/ are replaced.
CLAIM = (
    'd="$HOME/{home}"; '
    'if [ -e "$d" ] && [ ! -f "$d/{mark}" ] && [ -n "$(ls -A "$d" 2>/dev/null)" ] '
    '&& ! grep -qxE "[0-9a-f]{{64}}" "$d/.deployed" 2>/dev/null; then '
    'echo "PROBLEM: ~/{home} exists and was not made by rxelab: move it away, then deploy again"; '
    'exit 0; fi; '
    'mkdir -p "$d" && touch "$d/{mark}" && cat "$d/.deployed" 2>/dev/null; true'
)
# The wheel goes into a venv of ours that sees the system's packages (pyverbs is rdma-core's,
# not PyPI's), installed offline and alone; lib/ is an earlier deploy's copy, gone. The venv
# gets no pip of its own where the system has one (python3-pip): the system's installs into it
# (ensurepip took 30 s of a quiet TCG node, 5 minutes of a busy one; without it 0.5 s). Each
# part says when it starts.
UNPACK = (
    'set -e; d="$HOME/{home}"; new="$d/.new-{digest}"; rm -rf "$new"; mkdir "$new"; '
    f'echo "{watched.STEP_MARK} unpacking"; '
    'tar -xzf "$d/.bundle-{digest}.tgz" -C "$new"; '
    'for x in apps wheels; do rm -rf "$d/$x"; mv "$new/$x" "$d/$x"; done; '
    '[ -x "$d/venv/bin/python3" ] || {{ rm -rf "$d/venv"; '
    f'echo "{watched.STEP_MARK} making the venv"; '
    'if python3 -c "import pip" 2>/dev/null; then nopip=--without-pip; else nopip=; fi; '
    'python3 -m venv $nopip --system-site-packages "$d/venv" >/dev/null 2>&1 || '
    '{{ echo "PROBLEM: python3 -m venv failed (python3-venv and python3-pip missing?)"; exit 0; }}; }}; '
    f'echo "{watched.STEP_MARK} installing the wheel"; '
    '"$d/venv/bin/python3" -m pip install -q --no-index --no-deps --force-reinstall '
    '--disable-pip-version-check "$d"/wheels/rxelab-*.whl; '
    'rm -rf "$new" "$d/.bundle-{digest}.tgz" "$d/lib"; echo {digest} > "$d/.deployed"'
)


def deploy_one(host: Host, data: bytes, digest: str,
               say: Callable[[str], None] = lambda line: None) -> NodeCheck:
    """One node's deploy and check; what went wrong is in the NodeCheck's problems, one line
    each, never an exception."""
    stall = lab_settings.stall_window()
    began = time.monotonic()

    def step(what: str) -> None:
        say(f"{host.name}: {what} ({time.monotonic() - began:.0f} s)")

    def remote(command: str, what: str) -> watched.Output:
        return watched.run(c, command, what=what, stall=stall, setting=STALL_SETTING, on_step=step)

    try:
        with connect(host) as c:
            have = remote(CLAIM.format(home=REMOTE_HOME, mark=DEPLOY_MARK),
                          "claiming ~/" + REMOTE_HOME).stdout.strip()
            if have.startswith("PROBLEM: "):
                return NodeCheck(host.name, False, (have.removeprefix("PROBLEM: "),))
            changed = have != digest
            unpacked = ""
            if changed:
                step("uploading the bundle")
                c.put(io.BytesIO(data), f"{REMOTE_HOME}/.bundle-{digest}.tgz")
                unpacked = remote(UNPACK.format(home=REMOTE_HOME, digest=digest),
                                  "installing").stdout + "\n"
            step("checking what it needs")
            out = unpacked + remote(check_command(host), "checking").stdout
    except paramiko.BadHostKeyException as err:
        return NodeCheck(host.name, False, (f"its SSH host key has CHANGED ({err}): refused",))
    except watched.Stalled as err:
        return NodeCheck(host.name, False, (str(err),))
    except (OSError, paramiko.SSHException, EOFError, Failure) as err:
        return NodeCheck(host.name, False, (f"unreachable over SSH: {err}",))
    problems = tuple(line.removeprefix("PROBLEM: ") for line in out.splitlines()
                     if line.startswith("PROBLEM: "))
    version = next((line.removeprefix("VERSION: ").strip()[:40] for line in out.splitlines()
                    if line.startswith("VERSION: ")), "")
    return NodeCheck(host.name, changed, problems, version)


def deploy(inv: Inventory, hosts: list[Host] | None = None,
           say: Callable[[str], None] = lambda line: None) -> list[NodeCheck]:
    """Put lib/ and apps/ on every node and check it can run them; raise naming each problem.
    `say` hears each node's steps as they start (from several threads, one line at a time)."""
    data, digest = bundle()
    targets = hosts or list(inv.hosts)
    lock = threading.Lock()

    def said(line: str) -> None:
        with lock:
            say(line)

    done = on_every_host(targets, lambda h: deploy_one(h, data, digest, said))
    raise_ours(done)  # deploy_one says a node's own failures in its NodeCheck
    checks = [NodeCheck(name, False, (said_of(c),)) if isinstance(c, Exception) else c
              for name, c in done.items()]
    bad = [c for c in checks if c.problems]
    if bad:
        lines = [f"{c.host}: {p}" for c in bad for p in c.problems]
        raise FleetError("some nodes cannot run the experiments:\n  " + "\n  ".join(lines))
    return checks

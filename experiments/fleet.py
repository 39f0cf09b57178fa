"""The nodes, as Fabric sees them: connections built from any inventory, deploy of the library
and apps/ (idempotent: a content hash decides), and the checks that say what a node lacks.

The library goes as a user installs it: the rxelab wheel (`pip wheel lib/`), installed offline
(`pip install --no-index --no-deps`) into a venv of ours that sees the system's packages
(pyverbs, numpy, mpi4py are the distribution's), ~/rxelab/venv; every rank runs its python.

Nothing here hangs: connections have a connect timeout, commands a timeout, and a group's
failures are reported per host.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from fabric import Config, Connection

from infra import rdmaport
from infra.config import REPO
from infra.inventory import Host, Inventory
from infra.ssh import accept_new_host_keys
from infra.state import mkdir_private

REMOTE_HOME = "rxelab"  # ~/rxelab/{venv,apps,wheels} on every node
# The deploy directory is ours only if it carries this file: a ~/rxelab of the user's own is
# refused, never replaced.
DEPLOY_MARK = ".rxelab-deploy"
CONNECT_TIMEOUT = 15


class FleetError(Exception):
    pass


class AcceptNew(paramiko.MissingHostKeyPolicy):
    """ssh's accept-new: trust a host seen for the first time and remember its key by adding
    a line to the known_hosts file (never rewriting it: a user's comments and markers stay).
    A changed key never reaches a policy: paramiko refuses it."""

    def __init__(self, path: Path, revoked: set[str]) -> None:
        self.path, self.revoked = path, revoked

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if key.get_base64() in self.revoked:
            raise paramiko.SSHException(f"the host key of {hostname} is revoked in {self.path}")
        mkdir_private(self.path.parent)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


class UnknownHostKey(paramiko.MissingHostKeyPolicy):
    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise paramiko.SSHException(
            f"the host key of {hostname} ({key.get_name()}) is not in {self.known_hosts}: check it "
            "and add it there (ssh-keyscan prints it), name a known_hosts file in the inventory, or "
            "set RXELAB_ACCEPT_NEW_HOST_KEYS=1 to trust hosts seen for the first time")


def load_known_hosts(keys: paramiko.HostKeys, path: Path) -> set[str]:
    """The plain and hashed host lines of a known_hosts file, and the keys it revokes. paramiko's
    own loader gives up on the whole file at one line it does not know (a @cert-authority, a
    typo); ssh skips such lines, and so do we: a key they would have vouched for is then unknown,
    and refused. A @revoked key is trusted by no line and accepted by no policy."""
    lines = path.read_text(errors="replace").splitlines()
    revoked = {f[3] for f in (x.split() for x in lines) if len(f) >= 4 and f[0] == "@revoked"}
    for n, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith(("#", "@")):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, n)
        except (paramiko.hostkeys.InvalidHostKey, ValueError):
            continue
        if entry is not None and entry.key is not None and entry.key.get_base64() not in revoked:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)
    return revoked


def connect(host: Host) -> Connection:
    kwargs: dict[str, object] = {"look_for_keys": host.ssh.key is None, "allow_agent": host.ssh.key is None}
    if host.ssh.key:
        kwargs["key_filename"] = os.path.expanduser(host.ssh.key)
    # Never forward our stdin: runs are unattended (CI, pytest, a pipe) and nothing remote reads it.
    config = Config(overrides={"run": {"in_stream": False}})
    c = Connection(host.ssh.host, user=host.ssh.user, port=host.ssh.port, config=config,
                   connect_timeout=CONNECT_TIMEOUT, connect_kwargs=kwargs)
    # Host keys come from the inventory's known_hosts (the lab pins its nodes') or the user's
    # own; an unknown one is refused unless the user accepts new ones.
    known = Path(os.path.expanduser(host.ssh.known_hosts or "~/.ssh/known_hosts"))
    if host.ssh.known_hosts and not known.is_file():
        raise paramiko.SSHException(f"the inventory's known_hosts {known} does not exist")
    revoked = load_known_hosts(c.client.get_host_keys(), known) if known.is_file() else set()
    c.client.set_missing_host_key_policy(AcceptNew(known, revoked) if accept_new_host_keys()
                                         else UnknownHostKey(known))
    return c


def build_wheel(out: Path) -> Path:
    """The library's wheel, as `pip wheel lib/` makes it (offline: the build tools are ours),
    from a copy of lib/: setuptools writes build/ and *.egg-info where it builds, and two builds
    at once (a deploy beside a test) must not meet there."""
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


CHECK = (
    'py="$HOME/{home}/venv/bin/python3"; '
    '"$py" -c "import sys; assert sys.version_info >= (3, 11)" 2>/dev/null '
    "|| echo 'PROBLEM: python3 >= 3.11 missing'; "
    '"$py" -c "import numpy" 2>/dev/null || echo "PROBLEM: numpy missing (python3-numpy)"; '
    '"$py" -c "import pyverbs" 2>/dev/null || echo "PROBLEM: pyverbs missing (python3-pyverbs)"; '
    '"$py" -c "import rxelab; print(\'VERSION:\', rxelab.__version__)" 2>/dev/null '
    "|| echo 'PROBLEM: the rxelab wheel is not installed'; "
)


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
# not PyPI's), installed offline and alone; lib/ is an earlier deploy's copy, gone.
UNPACK = (
    'set -e; d="$HOME/{home}"; new="$d/.new-{digest}"; rm -rf "$new"; mkdir "$new"; '
    'tar -xzf "$d/.bundle-{digest}.tgz" -C "$new"; '
    'for x in apps wheels; do rm -rf "$d/$x"; mv "$new/$x" "$d/$x"; done; '
    '[ -x "$d/venv/bin/pip" ] || {{ rm -rf "$d/venv"; '
    'python3 -m venv --system-site-packages "$d/venv" >/dev/null 2>&1 || '
    '{{ echo "PROBLEM: python3 -m venv failed (python3-venv and python3-pip missing?)"; exit 0; }}; }}; '
    '"$d/venv/bin/pip" install -q --no-index --no-deps --force-reinstall '
    '--disable-pip-version-check "$d"/wheels/rxelab-*.whl; '
    'rm -rf "$new" "$d/.bundle-{digest}.tgz" "$d/lib"; echo {digest} > "$d/.deployed"'
)


def deploy_one(host: Host, data: bytes, digest: str) -> NodeCheck:
    try:
        with connect(host) as c:
            have = c.run(CLAIM.format(home=REMOTE_HOME, mark=DEPLOY_MARK), hide=True,
                         timeout=60).stdout.strip()
            if have.startswith("PROBLEM: "):
                return NodeCheck(host.name, False, (have.removeprefix("PROBLEM: "),))
            changed = have != digest
            unpacked = ""
            if changed:
                c.put(io.BytesIO(data), f"{REMOTE_HOME}/.bundle-{digest}.tgz")
                unpacked = c.run(UNPACK.format(home=REMOTE_HOME, digest=digest), hide=True,
                                 timeout=300).stdout
            out = unpacked + c.run(check_command(host), hide=True, warn=True,
                                   timeout=120).stdout
    except paramiko.BadHostKeyException as err:
        return NodeCheck(host.name, False, (f"its SSH host key has CHANGED ({err}): refused",))
    except (OSError, paramiko.SSHException, EOFError) as err:
        return NodeCheck(host.name, False, (f"unreachable over SSH: {err}",))
    problems = tuple(line.removeprefix("PROBLEM: ") for line in out.splitlines()
                     if line.startswith("PROBLEM: "))
    version = next((line.removeprefix("VERSION: ").strip()[:40] for line in out.splitlines()
                    if line.startswith("VERSION: ")), "")
    return NodeCheck(host.name, changed, problems, version)


def deploy(inv: Inventory, hosts: list[Host] | None = None) -> list[NodeCheck]:
    """Put lib/ and apps/ on every node and check it can run them; raise naming each problem."""
    data, digest = bundle()
    targets = hosts or list(inv.hosts)
    with ThreadPoolExecutor(max_workers=8) as pool:
        checks = list(pool.map(lambda h: deploy_one(h, data, digest), targets))
    bad = [c for c in checks if c.problems]
    if bad:
        lines = [f"{c.host}: {p}" for c in bad for p in c.problems]
        raise FleetError("some nodes cannot run the experiments:\n  " + "\n  ".join(lines))
    return checks


def remote_paths() -> dict[str, str]:
    """Where a deploy put things on a node: the venv's python (with the rxelab wheel, and the
    system's packages) and the apps."""
    return {"python": f"$HOME/{REMOTE_HOME}/venv/bin/python3", "apps": f"$HOME/{REMOTE_HOME}/apps"}


def run_interruptibly(connection: Any, command: str, timeout: float) -> Any:
    """A long remote command that Ctrl-C can stop. Fabric's own run, given Ctrl-C without a
    pty, re-raises it and then waits for the remote command to end (its output readers join
    with no timeout), so a run of 100000 stages would hold Ctrl-C for hours. Here we wait,
    and on Ctrl-C we close the channel and cancel the timeout's (non-daemon) timer thread,
    which would otherwise keep the process alive; the caller's clean-up ends the remote ranks."""
    promise = connection.run(command, hide=True, warn=True, timeout=timeout, asynchronous=True)
    runner = promise.runner
    try:
        while not (runner.process_is_finished or runner.has_dead_threads):
            time.sleep(0.1)
    except KeyboardInterrupt:
        runner.stop()  # closes the channel and cancels the timeout's timer thread
        connection.close()
        raise
    return promise.join()

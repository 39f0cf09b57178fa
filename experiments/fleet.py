"""The nodes, as Fabric sees them: connections built from any inventory, deploy of lib/ and
apps/ (idempotent: a content hash decides), and the checks that say what a node lacks.

Nothing here hangs: connections have a connect timeout, commands a timeout, and a group's
failures are reported per host.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import paramiko
from fabric import Config, Connection

from infra.config import REPO
from infra.inventory import Host, Inventory

REMOTE_HOME = "rxelab"  # ~/rxelab/{lib,apps} on every node
CONNECT_TIMEOUT = 15


class FleetError(Exception):
    pass


def connect(host: Host) -> Connection:
    kwargs: dict[str, object] = {"look_for_keys": host.ssh.key is None, "allow_agent": host.ssh.key is None}
    if host.ssh.key:
        kwargs["key_filename"] = host.ssh.key
    # Never forward our stdin: runs are unattended (CI, pytest, a pipe) and nothing remote reads it.
    config = Config(overrides={"run": {"in_stream": False}})
    c = Connection(host.ssh.host, user=host.ssh.user, port=host.ssh.port, config=config,
                   connect_timeout=CONNECT_TIMEOUT, connect_kwargs=kwargs)
    if host.ssh.known_hosts:  # the lab pins its nodes' host keys: accept nothing else
        c.client.load_host_keys(host.ssh.known_hosts)
        c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return c


def bundle() -> tuple[bytes, str]:
    """lib/rxelab and apps/ as one tarball, and its hash (stable: sorted, no mtimes)."""
    buf = io.BytesIO()
    # gzip with mtime 0: the same files give the same bytes, so the hash says "up to date"
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for root, arcroot in ((REPO / "lib" / "rxelab", "lib/rxelab"), (REPO / "apps", "apps")):
            for path in sorted(root.rglob("*")):
                if "__pycache__" in path.parts or not path.is_file():
                    continue
                info = tarfile.TarInfo(f"{arcroot}/{path.relative_to(root)}")
                data = path.read_bytes()
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class NodeCheck:
    host: str
    deployed: bool  # False: was already up to date
    problems: tuple[str, ...]


CHECK = (
    "python3 -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null "
    "|| echo 'PROBLEM: python3 >= 3.11 missing'; "
    "python3 -c 'import numpy' 2>/dev/null || echo 'PROBLEM: numpy missing (python3-numpy)'; "
    "python3 -c 'import pyverbs' 2>/dev/null || echo 'PROBLEM: pyverbs missing (python3-pyverbs)'; "
    "test -e /sys/class/infiniband/{dev} || echo 'PROBLEM: no RDMA device {dev}'; "
    "test \"$(cat /sys/class/infiniband/{dev}/ports/{port}/state 2>/dev/null | cut -d' ' -f2)\" = ACTIVE "
    "|| echo 'PROBLEM: {dev} port {port} is not ACTIVE'"
)


def deploy_one(host: Host, data: bytes, digest: str) -> NodeCheck:
    try:
        with connect(host) as c:
            have = c.run(f"cat {REMOTE_HOME}/.deployed 2>/dev/null || true", hide=True,
                         timeout=60).stdout.strip()
            changed = have != digest
            if changed:
                c.put(io.BytesIO(data), "/tmp/rxelab-bundle.tgz")
                c.run(f"rm -rf {REMOTE_HOME}/lib {REMOTE_HOME}/apps && mkdir -p {REMOTE_HOME} && "
                      f"tar -xzf /tmp/rxelab-bundle.tgz -C {REMOTE_HOME} && rm /tmp/rxelab-bundle.tgz "
                      f"&& echo {digest} > {REMOTE_HOME}/.deployed", hide=True, timeout=120)
            out = c.run(CHECK.format(dev=host.rdma.device, port=host.rdma.port), hide=True,
                        warn=True, timeout=120).stdout
    except (OSError, paramiko.SSHException, EOFError) as err:
        return NodeCheck(host.name, False, (f"unreachable over SSH: {err}",))
    problems = tuple(line.removeprefix("PROBLEM: ") for line in out.splitlines()
                     if line.startswith("PROBLEM: "))
    return NodeCheck(host.name, changed, problems)


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
    return {"lib": f"$HOME/{REMOTE_HOME}/lib", "apps": f"$HOME/{REMOTE_HOME}/apps"}


"""The nodes, as Fabric sees them: connections built from any inventory (host keys checked
against its known_hosts), the one fan-out to every node, where a deploy put things on a node,
and long remote commands that Ctrl-C can stop. The deploy itself is experiments/running/deploy.py.

Nothing here hangs: connections have connect, banner and authentication timeouts (generous: a
busy TCG guest takes seconds of its CPU for one login), commands a deadline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut

from infra.inventory import Host
from infra.ssh import accept_new_host_keys
from infra.state import mkdir_private

REMOTE_HOME = "rxelab"  # ~/rxelab/{venv,apps,wheels} on every node
CONNECT_TIMEOUT = 15  # the TCP connect
LOGIN_TIMEOUT = 60  # the SSH banner and authentication, on a guest that may be busy


T = TypeVar("T")
# what a node, its network or its SSH can do to us: said as that node's failure. Anything
# else raised on a node's behalf is a fault of ours and keeps its traceback.
NODE_ERRORS = (OSError, EOFError, paramiko.SSHException, CommandTimedOut)


class FleetError(Exception):
    pass


def on_every_host(hosts: Sequence[Host], work: Callable[[Host], T]) -> dict[str, T | Exception]:
    """The one way we run something on every node: all in parallel, and every node tried to the
    end even when one fails, so that the caller can name each node that failed rather than the
    first failure hiding the rest. Per host name, what `work` returned or the exception it
    raised."""
    def one(host: Host) -> T | Exception:
        try:
            return work(host)
        except Exception as err:  # handed to the caller, which names it with its host
            return err
    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip([h.name for h in hosts], pool.map(one, hosts), strict=True))


def raise_ours(results: dict[str, T | Exception]) -> None:
    """A failure that is not a node's (a bug of ours) is raised as it was, traceback and all."""
    for err in results.values():
        if isinstance(err, Exception) and not isinstance(err, NODE_ERRORS):
            raise err


def said_of(err: Exception) -> str:
    """A node's failure in one line: the first line of its words (a timed-out command's run on
    with the command and its output)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]


def failed_hosts(results: dict[str, T | Exception]) -> list[str]:
    """`host: what went wrong`, one line for each host whose work failed (raise_ours first)."""
    raise_ours(results)
    return [f"{name}: {said_of(err)}" for name, err in results.items() if isinstance(err, Exception)]


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
    kwargs: dict[str, object] = {"look_for_keys": host.ssh.key is None, "allow_agent": host.ssh.key is None,
                                 "banner_timeout": LOGIN_TIMEOUT, "auth_timeout": LOGIN_TIMEOUT}
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

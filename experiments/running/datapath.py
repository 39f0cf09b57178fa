"""After a case that failed, does the data network still reach every node of it? A node whose
data NIC stopped sending (its kernel logs `NETDEV WATCHDOG ... transmit queue ... timed out`)
fails every later case only after the ranks' join timeout, a minute each, and its records say
"did not join", not why. So the run stops at the first failed case after which the case's first
node cannot ping one of the others over the data network, and says which."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence

from invoke.runners import Result

from experiments.running.fleet import FleetError
from infra.inventory import Host

AFTER = ("failed", "timeout")  # the statuses after which the path is looked at
UNREACHABLE = "unreachable"
TRIES = 3  # pings per node, one answer is enough: a lossy case's netem is already removed


def probe_command(peers: Sequence[Host]) -> str:
    """For the case's first node: a line `unreachable <name>` per peer no ping reaches."""
    return "; ".join(
        f"ping -c {TRIES} -W 3 -q {shlex.quote(p.data_ip)} >/dev/null 2>&1 "
        f"|| echo {UNREACHABLE} {shlex.quote(p.name)}" for p in peers) + "; true"


def unreachable(output: str, peers: Sequence[Host]) -> list[str]:
    """The peers the probe's output names (names it does not know are ignored)."""
    names = {p.name for p in peers}
    said = [line.split(None, 1)[1].strip() for line in output.splitlines()
            if line.startswith(f"{UNREACHABLE} ") and len(line.split(None, 1)) == 2]
    return [n for n in said if n in names]


def check(on_hosts: Callable[..., dict[str, Result | Exception]], hosts: Sequence[Host],
          case: int) -> None:
    """Raises FleetError when the case's first node no longer reaches one of the others; a
    probe that itself could not run (SSH gone) decides nothing: the next case will say."""
    head, peers = hosts[0], list(hosts[1:])
    if not peers:
        return
    result = on_hosts([head], lambda _h: probe_command(peers), timeout=30 + 4 * TRIES * len(peers))
    got = result.get(head.name)
    if got is None or isinstance(got, Exception):
        return
    gone = unreachable(got.stdout, peers)
    if gone:
        raise FleetError(
            f"after case {case} failed, {head.name} no longer reaches {', '.join(gone)} over the "
            f"data network ({TRIES} pings each): the run stops here, its records kept. A node "
            "whose kernel logs `NETDEV WATCHDOG ... transmit queue ... timed out` (its serial "
            "log, `sudo dmesg`) has lost its data NIC until it restarts: `make destroy && make "
            "provision`")

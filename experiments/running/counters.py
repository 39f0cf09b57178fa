"""The RDMA device's own counters on each node (rxe: /sys/class/infiniband/rxe0/ports/1/
hw_counters/), read before and after every case. They prove which transport a case really
used (an MPI "over UCX" case whose rxe sent no packet did not use RDMA) and count what go-back-N
cost under loss: retransmissions, sequence errors, duplicates.

Devices without hw_counters (some real NICs name theirs differently) give an empty reading;
the runner then records nothing rather than a false zero.
"""

from __future__ import annotations

import shlex

from infra import rdmaport
from infra.inventory import Host


def read_command(host: Host) -> str:
    d = rdmaport.counters_path(host.rdma)
    return f"cd {shlex.quote(d)} 2>/dev/null && grep -H . * 2>/dev/null; true"


def parse(text: str) -> dict[str, int]:
    """`grep -H . *` output (name:value per line) to a dict; other lines are ignored."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().partition(":")
        if sep and name and value.strip().isdigit():
            out[name] = int(value)
    return out


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What moved during a case, for the counters both readings have (a wrap or a device
    reset shows as 0, not as a negative count)."""
    return {k: max(0, after[k] - before[k]) for k in sorted(before.keys() & after.keys())}


def total(per_node: dict[str, dict[str, int]], name: str) -> int:
    return sum(d.get(name, 0) for d in per_node.values())

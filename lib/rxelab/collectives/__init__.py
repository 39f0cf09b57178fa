"""The collectives, one module per algorithm, selectable by name."""

from __future__ import annotations

from collections.abc import Callable

from rxelab.collectives import (
    allgather_ring,
    allgather_sequential,
    allgather_star,
    alltoall_pairwise,
    alltoall_parallel,
    alltoall_sequential,
)
from rxelab.collectives.common import Call

ALLTOALL: dict[str, Callable[[Call], None]] = {
    "sequential": alltoall_sequential.run,
    "pairwise": alltoall_pairwise.run,
    "parallel": alltoall_parallel.run,
}
ALLGATHER: dict[str, Callable[[Call], None]] = {
    "star": allgather_star.run,
    "ring": allgather_ring.run,
    "sequential": allgather_sequential.run,
}

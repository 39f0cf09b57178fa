"""The algorithms of each collective, by name (the names and what each collective is are in
rxelab.ops; a test checks the two agree)."""

from __future__ import annotations

from collections.abc import Callable

from rxelab.collectives import (
    allgather_ring,
    allgather_sequential,
    allgather_star,
    allreduce_rd,
    alltoall_pairwise,
    alltoall_parallel,
    alltoall_sequential,
    bcast,
    reduce_ring,
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
ALLREDUCE: dict[str, Callable[[Call], None]] = {
    "ring": reduce_ring.allreduce,
    "recursive-doubling": allreduce_rd.run,
}
REDUCE_SCATTER: dict[str, Callable[[Call], None]] = {"ring": reduce_ring.reduce_scatter_block}
BCAST: dict[str, Callable[[Call], None]] = {"binomial": bcast.binomial, "star": bcast.star}
ALGORITHMS = {"alltoall": ALLTOALL, "allgather": ALLGATHER, "allreduce": ALLREDUCE,
              "reduce_scatter": REDUCE_SCATTER, "bcast": BCAST}

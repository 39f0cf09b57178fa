"""One description per collective (as nccl-tests' testColl is): its name, its algorithms, the
sizes of its buffers, the test data each rank sends and the exact result it must receive (a
numpy reference), and its bus-bandwidth model. The communicator, the benchmark, the self-test,
both demo apps, the experiment specs and the report all read it, so a collective is added here
once (and its algorithms in rxelab/collectives/).

Pure Python and numpy: importing it touches no RDMA (experiments read it on the host).

`count` is in elements: per peer for alltoall and allgather, the whole vector for allreduce
and bcast, each rank's result block for reduce_scatter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

REDUCTIONS: dict[str, Callable[..., np.ndarray]] = {
    "sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
}


def block(src: int, dst: int, n: int, dtype: np.dtype | str = np.uint8, salt: int = 0) -> np.ndarray:
    """What rank src sends rank dst: distinct for every (src, dst, index, salt)."""
    x = (np.arange(n, dtype=np.int64) * 7 + src * 31 + dst * 17 + salt * 13) % 251
    return x.astype(dtype)


def contribution(rank: int, n: int, dtype: np.dtype | str, salt: int = 0) -> np.ndarray:
    """A rank's input to a reduction: small whole numbers (1..7), so sums and products of up to
    8 ranks are exact in every float type and wrap the same way in every integer type."""
    x = (np.arange(n, dtype=np.int64) * 3 + rank * 5 + salt) % 7 + 1
    return x.astype(dtype)


def reference(op: str, parts: list[np.ndarray]) -> np.ndarray:
    out = parts[0].copy()
    for x in parts[1:]:
        REDUCTIONS[op](out, x, out=out)
    return out


Data = tuple[np.ndarray, np.ndarray]  # (what this rank sends, what it must end up with)


@dataclass(frozen=True)
class Collective:
    name: str
    algorithms: tuple[str, ...]
    default: str
    busbw: Callable[[int], float]  # bus bandwidth = algbw * busbw(n), nccl-tests' model
    algbw_bytes: Callable[[int, int], int]  # (size as the spec gives it, n) -> bytes moved per rank
    data: Callable[[int, int, int, str, int, str], Data]  # (rank, p, count, dtype, salt, op)
    reduces: bool = False

    def sizes(self, count: int, p: int) -> tuple[int, int]:
        """Elements of the send and receive buffers."""
        send, want = self.data(0, p, count, "uint8", 0, "sum")
        return send.size, want.size


def _alltoall(rank: int, p: int, count: int, dtype: str, salt: int, op: str) -> Data:
    send = np.concatenate([block(rank, d, count, dtype, salt) for d in range(p)])
    return send, np.concatenate([block(s, rank, count, dtype, salt) for s in range(p)])


def _allgather(rank: int, p: int, count: int, dtype: str, salt: int, op: str) -> Data:
    return block(rank, rank, count, dtype, salt), \
        np.concatenate([block(s, s, count, dtype, salt) for s in range(p)])


def _allreduce(rank: int, p: int, count: int, dtype: str, salt: int, op: str) -> Data:
    return contribution(rank, count, dtype, salt), \
        reference(op, [contribution(s, count, dtype, salt) for s in range(p)])


def _reduce_scatter(rank: int, p: int, count: int, dtype: str, salt: int, op: str) -> Data:
    total = reference(op, [contribution(s, p * count, dtype, salt) for s in range(p)])
    return contribution(rank, p * count, dtype, salt), total[rank * count:(rank + 1) * count]


def _bcast(rank: int, p: int, count: int, dtype: str, salt: int, op: str) -> Data:
    """The root is rank 0 here; the buffer is both sent (at the root) and received."""
    want = block(0, 0, count, dtype, salt)
    return (want.copy() if rank == 0 else np.zeros(count, dtype)), want


def _fraction(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("alltoall", ("sequential", "pairwise", "parallel"), "pairwise", _fraction,
               lambda size, n: size * n, _alltoall),
    Collective("allgather", ("star", "ring", "sequential"), "ring", _fraction,
               lambda size, n: size * n, _allgather),
    Collective("allreduce", ("ring", "recursive-doubling"), "ring",
               lambda n: 2 * _fraction(n), lambda size, n: size, _allreduce, reduces=True),
    Collective("reduce_scatter", ("ring",), "ring", _fraction, lambda size, n: size * n,
               _reduce_scatter, reduces=True),
    Collective("bcast", ("binomial", "star"), "binomial", lambda n: 1.0 if n > 1 else 0.0,
               lambda size, n: size, _bcast),
)}


def run(comm: object, name: str, algorithm: str, send: np.ndarray, recv: np.ndarray,
        op: str = "sum", pairs: int = 1) -> object:
    """Call collective `name` on a communicator the way its test data is laid out (bcast: in
    place in `send`, from root 0; pairs: the sequential schedule's window)."""
    if name == "bcast":
        return comm.bcast(send, 0, algorithm=algorithm)  # type: ignore[attr-defined]
    if COLLECTIVES[name].reduces:
        return getattr(comm, name)(send, recv, op=op, algorithm=algorithm)
    if pairs != 1:
        return getattr(comm, name)(send, recv, algorithm=algorithm, pairs=pairs)
    return getattr(comm, name)(send, recv, algorithm=algorithm)


def dtype_for(name: str) -> str:
    """What the demo apps and benchmarks move: bytes, or float32 (gradients) for reductions."""
    return "float32" if COLLECTIVES[name].reduces else "uint8"


def get(name: str) -> Collective:
    try:
        return COLLECTIVES[name]
    except KeyError:
        from rxelab.errors import ConfigError

        raise ConfigError(f"unknown collective {name!r}",
                          hint=f"use one of {', '.join(COLLECTIVES)}") from None

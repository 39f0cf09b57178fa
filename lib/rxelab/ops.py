"""One executable description per collective (as nccl-tests' testColl is): its name; its
algorithms (each a function "module:function", imported when first used) and the default;
its extra arguments and in-place rule; the builder of a call's layout (rxelab.layouts); the
test data each rank sends and the exact result it must receive (a numpy reference); its
bus-bandwidth model; what the apps move; its MPI counterpart (the mpi4py call and Open
MPI's coll_tuned algorithm numbers) and its Gloo counterpart (the torch.distributed call).
The communicator runs any described collective; the benchmark, the self-test, the demo
apps, the experiment specs and the report read the description. A new collective is its
algorithm module and its description: register() it.

Pure Python and numpy: importing it touches no RDMA (experiments read it on the host).

`count` is in elements: per peer for alltoall and allgather, the whole vector for allreduce
and bcast, each rank's result block for reduce_scatter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rxelab import layouts
from rxelab.errors import ConfigError
from rxelab.layouts import REDUCTIONS

# What the test data looks like, for the compression study (rxelab.codecs): a short repeated
# pattern (the default), all zeros, sparse (1 in 100 elements set, as a sparse gradient), and
# random (as little as a codec can squeeze). Every kind is exactly reproducible on every rank.
PATTERNS = ("pattern", "zeros", "sparse", "random")
SPARSE_EVERY = 100
FINE = 2.0 ** -20  # random reduction inputs are whole multiples of it below 1: sums stay exact


def _rng(*seed: int) -> np.random.Generator:
    return np.random.default_rng([*seed, 0x5EED])


def _sparse(values: np.ndarray, n: int, rng: np.random.Generator, dtype: Any) -> np.ndarray:
    """About one element in SPARSE_EVERY set, at random places (drawn with repeats: a
    permutation of n, as choice() without them makes, costs seconds under emulation)."""
    x = np.zeros(n, dtype)
    if n:
        where = rng.integers(0, n, max(1, n // SPARSE_EVERY))
        x[where] = values[:where.size]
    return x


def block(src: int, dst: int, n: int, dtype: Any = np.uint8, salt: int = 0,
          pattern: str = "pattern") -> np.ndarray:
    """What rank src sends rank dst: distinct for every (src, dst, index, salt) (but zeros)."""
    if pattern == "zeros":
        return np.zeros(n, dtype)
    if pattern in ("random", "sparse"):
        rng = _rng(src, dst, salt)
        values = rng.integers(1, 256, n if pattern == "random" else max(1, n // SPARSE_EVERY),
                              dtype=np.uint8).astype(dtype, copy=False)
        return values if pattern == "random" else _sparse(values, n, rng, dtype)
    x = (np.arange(n, dtype=np.int64) * 7 + src * 31 + dst * 17 + salt * 13) % 251
    return x.astype(dtype)


def contribution(rank: int, n: int, dtype: np.dtype | str, salt: int = 0,
                 pattern: str = "pattern") -> np.ndarray:
    """A rank's input to a reduction: small whole numbers (1..7), so sums and products of up to
    8 ranks are exact in every float type and wrap the same way in every integer type.
    random (and sparse's values): floats are whole multiples of 2^-20 in (-1, 1) - random
    bits in most of the significand, yet sums of up to 16 ranks stay exact."""
    if pattern == "zeros":
        return np.zeros(n, dtype)
    if pattern in ("random", "sparse"):
        rng = _rng(rank, salt)
        k = n if pattern == "random" else max(1, n // SPARSE_EVERY)
        if np.dtype(dtype).kind in "fc":
            values = rng.integers(-(1 << 20) + 1, 1 << 20, k, dtype=np.int32).astype(dtype)
            values *= FINE
        else:
            values = rng.integers(1, 8, k, dtype=np.int8).astype(dtype)
        return values if pattern == "random" else _sparse(values, n, rng, dtype)
    x = (np.arange(n, dtype=np.int64) * 3 + rank * 5 + salt) % 7 + 1
    return x.astype(dtype)


def reference(op: str, parts: list[np.ndarray]) -> np.ndarray:
    out = parts[0].copy()
    for x in parts[1:]:
        REDUCTIONS[op](out, x, out=out)
    return out


Data = tuple[np.ndarray, np.ndarray]  # (what this rank sends, what it must end up with)


@dataclass(frozen=True)
class Mpi:
    """The MPI counterpart: the mpi4py method, and what each label forces through Open MPI's
    coll_tuned (its algorithm number; None: Open MPI's own choice)."""

    call: str
    tuned: Mapping[str, int | None] = field(default_factory=lambda: {"mpi-default": None})


ARGUMENTS = ("pairs", "root", "op")  # what a collective may take beside its buffers


@dataclass(frozen=True)
class Collective:
    name: str
    algorithms: Mapping[str, str]  # name -> "module:function" that runs it
    default: str
    layout: layouts.Builder  # (send, recv, size, rank, **arguments) -> Layout
    busbw: Callable[[int], float]  # bus bandwidth = algbw * busbw(n), nccl-tests' model
    algbw_bytes: Callable[[int, int], int]  # (size as the spec gives it, n) -> bytes moved per rank
    data: Callable[..., Data]  # (rank, p, count, dtype, salt, op, pattern="pattern")
    takes: tuple[str, ...] = ()  # of ARGUMENTS: pairs (the sequential window), root, op
    in_place: bool = False  # one buffer, sent and received (bcast)
    mpi: Mpi | None = None
    # torch.distributed's call on the Gloo backend; None where torch 1.13 (Debian 12's) has
    # none for Gloo ("ProcessGroupGloo does not support reduce_scatter" before torch 2.7)
    gloo: str | None = None
    dtype: str = "uint8"  # what the apps and the benchmark move
    unit: str = "per peer"  # what a size counts (the report's tables say it)

    @property
    def reduces(self) -> bool:
        return "op" in self.takes

    def sizes(self, count: int, p: int) -> tuple[int, int]:
        """Elements of the send and receive buffers."""
        send, want = self.data(0, p, count, "uint8", 0, "sum")
        return send.size, want.size

    def result(self, send: Any, recv: Any) -> Any:
        """The buffer that holds the result."""
        return send if self.in_place else recv

    def arguments(self, p: int, op: str = "sum", pairs: int = 1) -> dict[str, Any]:
        """The extra arguments of a call with the test data's layout (bcast: from root 0)."""
        return {k: v for k, v in (("pairs", pairs), ("root", 0), ("op", op)) if k in self.takes}


def _alltoall(rank: int, p: int, count: int, dtype: str, salt: int, op: str,
              pattern: str = "pattern") -> Data:
    send = np.concatenate([block(rank, d, count, dtype, salt, pattern) for d in range(p)])
    return send, np.concatenate([block(s, rank, count, dtype, salt, pattern) for s in range(p)])


def _allgather(rank: int, p: int, count: int, dtype: str, salt: int, op: str,
               pattern: str = "pattern") -> Data:
    return block(rank, rank, count, dtype, salt, pattern), \
        np.concatenate([block(s, s, count, dtype, salt, pattern) for s in range(p)])


def _allreduce(rank: int, p: int, count: int, dtype: str, salt: int, op: str,
               pattern: str = "pattern") -> Data:
    return contribution(rank, count, dtype, salt, pattern), \
        reference(op, [contribution(s, count, dtype, salt, pattern) for s in range(p)])


def _reduce_scatter(rank: int, p: int, count: int, dtype: str, salt: int, op: str,
                    pattern: str = "pattern") -> Data:
    total = reference(op, [contribution(s, p * count, dtype, salt, pattern) for s in range(p)])
    return contribution(rank, p * count, dtype, salt, pattern), \
        total[rank * count:(rank + 1) * count]


def _bcast(rank: int, p: int, count: int, dtype: str, salt: int, op: str,
           pattern: str = "pattern") -> Data:
    """The root is rank 0 here; the buffer is both sent (at the root) and received."""
    want = block(0, 0, count, dtype, salt, pattern)
    return (want.copy() if rank == 0 else np.zeros(count, dtype)), want


def inputs(name: str, rank: int, p: int, count: int, dtype: str, salt: int = 0,
           pattern: str = "pattern") -> list[np.ndarray]:
    """Of a reduction: every rank's input to the part whose result `rank` checks (what a
    lossy codec's error bound is taken over, rxelab.codecs.error_bound)."""
    if name == "reduce_scatter":
        return [contribution(s, p * count, dtype, salt, pattern)[rank * count:(rank + 1) * count]
                for s in range(p)]
    return [contribution(s, count, dtype, salt, pattern) for s in range(p)]


def _fraction(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def _algorithms(**modules: str) -> dict[str, str]:
    """{name: "rxelab.collectives.<module>"} with `:run` unless the module names another."""
    return {name.replace("_", "-"): f"rxelab.collectives.{m}" + ("" if ":" in m else ":run")
            for name, m in modules.items()}


COLLECTIVES: dict[str, Collective] = {}


def register(c: Collective) -> Collective:
    """Make a described collective known to everything that reads descriptions."""
    if c.default not in c.algorithms or not set(c.takes) <= set(ARGUMENTS):
        raise ValueError(f"{c.name}: default {c.default!r} or arguments {c.takes} do not fit")
    COLLECTIVES[c.name] = c
    return c


def collective(name: Any) -> Collective:
    if not isinstance(name, str) or name not in COLLECTIVES:
        raise ConfigError(f"unknown collective {name!r}", hint=f"use one of {', '.join(COLLECTIVES)}")
    return COLLECTIVES[name]


for _c in (
    Collective("alltoall", _algorithms(sequential="alltoall_sequential",
                                       pairwise="alltoall_pairwise", parallel="alltoall_parallel"),
               "pairwise", layouts.personalized, _fraction, lambda size, n: size * n, _alltoall,
               takes=("pairs",), mpi=Mpi("Alltoall", {"mpi-default": None, "mpi-linear": 1,
                                                      "mpi-pairwise": 2, "mpi-bruck": 3}),
               gloo="all_to_all_single"),
    Collective("allgather", _algorithms(star="allgather_star", ring="allgather_ring",
                                        sequential="allgather_sequential"),
               "ring", layouts.gathered, _fraction, lambda size, n: size * n, _allgather,
               takes=("pairs",), mpi=Mpi("Allgather", {"mpi-default": None, "mpi-linear": 1,
                                                       "mpi-bruck": 2, "mpi-ring": 4}),
               gloo="all_gather"),
    Collective("allreduce", _algorithms(ring="reduce_ring:allreduce",
                                        recursive_doubling="allreduce_rd"),
               "ring", layouts.reduced, lambda n: 2 * _fraction(n), lambda size, n: size,
               _allreduce, takes=("op",), dtype="float32", unit="vector",
               mpi=Mpi("Allreduce", {"mpi-default": None, "mpi-recursive-doubling": 3,
                                     "mpi-ring": 4}), gloo="all_reduce"),
    Collective("reduce_scatter", _algorithms(ring="reduce_ring:reduce_scatter_block"),
               "ring", layouts.scattered, _fraction, lambda size, n: size * n, _reduce_scatter,
               takes=("op",), dtype="float32", unit="per block", mpi=Mpi("Reduce_scatter_block")),
    Collective("bcast", _algorithms(binomial="bcast:binomial", star="bcast:star"),
               "binomial", layouts.broadcast, lambda n: 1.0 if n > 1 else 0.0,
               lambda size, n: size, _bcast, takes=("root",), in_place=True, unit="vector",
               mpi=Mpi("Bcast", {"mpi-default": None, "mpi-binomial": 6}), gloo="broadcast"),
):
    register(_c)


def run(comm: Any, name: str, algorithm: str, send: np.ndarray, recv: np.ndarray,
        op: str = "sum", pairs: int = 1, compression: str | None = None) -> Any:
    """Call collective `name` on a communicator the way its test data is laid out."""
    c = COLLECTIVES[name]
    coded = {} if compression is None else {"compression": compression}
    return comm.collective(name, send, None if c.in_place else recv, algorithm=algorithm,
                           **c.arguments(comm.size, op, pairs), **coded)

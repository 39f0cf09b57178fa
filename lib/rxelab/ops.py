"""One executable description per collective (as nccl-tests' testColl is): its name; its
algorithms (each a function "module:function", imported when first used) and the default;
its extra arguments and its root, in-place and pairs rules; the builder of a call's layout
(rxelab.layouts); the test data each rank sends and the exact result it must receive (a numpy
reference), and a reduction's inputs; its bus-bandwidth model; what the apps move and what a
size counts (the report's unit, the plots' axis); its MPI counterpart (the mpi4py call, its
adapter and Open MPI's coll_tuned algorithm numbers) and its Gloo counterpart (the
torch.distributed call and its adapter). The communicator runs any described collective;
the benchmark, the self-test, the demo apps, the experiment specs and the report read the
description. A new collective is its algorithm module and its description: register() it.

Pure Python and numpy: importing it touches no RDMA (experiments read it on the host).

`count` is in elements, of what the description's `unit` says (units() lists them).
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


ROOT = 0  # the root of the test data's calls (a rooted collective's)
Call = Callable[[Any, Any], Any]  # (send, recv) -> None: one call of a counterpart
# (description, mpi4py communicator, the MPI module) -> the call on the test buffers
MpiBinder = Callable[["Collective", Any, Any], Call]
# (description, torch.distributed, rank, size) -> the call on the test buffers as tensors
GlooBinder = Callable[["Collective", Any, int, int], Call]


def mpi_buffers(c: Collective, comm: Any, MPI: Any) -> Call:
    """comm.Alltoall(send, recv), and the like."""
    assert c.mpi is not None
    return getattr(comm, c.mpi.call)  # type: ignore[no-any-return]


def mpi_reduction(c: Collective, comm: Any, MPI: Any) -> Call:
    """comm.Allreduce(send, recv, op=MPI.SUM), and the like."""
    assert c.mpi is not None
    method, op = getattr(comm, c.mpi.call), MPI.SUM
    return lambda send, recv: method(send, recv, op=op)


def mpi_from_root(c: Collective, comm: Any, MPI: Any) -> Call:
    """comm.Bcast(buf, root=ROOT): in place, one buffer."""
    assert c.mpi is not None
    method = getattr(comm, c.mpi.call)
    return lambda send, recv: method(send, root=ROOT)


def mpi_varying(c: Collective, comm: Any, MPI: Any) -> Call:
    """comm.Alltoallv([send, counts], [recv, counts]) with the test data's counts."""
    assert c.mpi is not None and c.counts is not None
    method, rank, p = getattr(comm, c.mpi.call), comm.Get_rank(), comm.Get_size()
    counts = c.counts

    def call(send: Any, recv: Any) -> Any:
        sc, rc = counts(rank, p, send.size)
        return method([send, sc], [recv, rc])
    return call


@dataclass(frozen=True)
class Mpi:
    """The MPI counterpart: the mpi4py method, what each label forces through Open MPI's
    coll_tuned (its algorithm number; None: Open MPI's own choice), and how it is called on
    the test buffers (an MpiBinder)."""

    call: str
    tuned: Mapping[str, int | None] = field(default_factory=lambda: {"mpi-default": None})
    bind: MpiBinder = mpi_buffers


def gloo_buffers(c: Collective, dist: Any, rank: int, p: int) -> Call:
    """dist.all_to_all_single(out, send), and the like."""
    method = getattr(dist, str(c.gloo))
    return lambda send, out: method(out, send)


def gloo_listed(c: Collective, dist: Any, rank: int, p: int) -> Call:
    """dist.all_gather(list of p views of out, send)."""
    method = getattr(dist, str(c.gloo))
    return lambda send, out: method(list(out.chunk(p)), send)


def gloo_reduction(c: Collective, dist: Any, rank: int, p: int) -> Call:
    """dist.all_reduce in place: the input copied into the result first (as a training loop
    keeps its gradient)."""
    method, op = getattr(dist, str(c.gloo)), dist.ReduceOp.SUM

    def call(send: Any, out: Any) -> Any:
        out.copy_(send)
        return method(out, op=op)
    return call


def gloo_from_root(c: Collective, dist: Any, rank: int, p: int) -> Call:
    """dist.broadcast(buf, src=ROOT): in place, one buffer."""
    method = getattr(dist, str(c.gloo))
    return lambda send, out: method(send, src=ROOT)


def gloo_varying(c: Collective, dist: Any, rank: int, p: int) -> Call:
    """dist.all_to_all_single(out, send, split sizes) with the test data's counts."""
    assert c.counts is not None
    method, counts = getattr(dist, str(c.gloo)), c.counts

    def call(send: Any, out: Any) -> Any:
        sc, rc = counts(rank, p, send.numel())
        return method(out, send, output_split_sizes=rc, input_split_sizes=sc)
    return call


Inputs = Callable[..., list[np.ndarray]]  # (rank, p, count, dtype, salt, pattern)
Counts = Callable[[int, int, int], tuple[list[int], list[int]]]  # (rank, p, send elements)

# what a collective may take beside its buffers
ARGUMENTS = ("pairs", "root", "op", "send_counts", "recv_counts")


def _vector_inputs(rank: int, p: int, count: int, dtype: str, salt: int = 0,
                   pattern: str = "pattern") -> list[np.ndarray]:
    """Every rank's whole input vector (allreduce: each element's result is over all)."""
    return [contribution(s, count, dtype, salt, pattern) for s in range(p)]


def _block_inputs(rank: int, p: int, count: int, dtype: str, salt: int = 0,
                  pattern: str = "pattern") -> list[np.ndarray]:
    """Every rank's input to block `rank` (reduce_scatter's result block there)."""
    return [contribution(s, p * count, dtype, salt, pattern)[rank * count:(rank + 1) * count]
            for s in range(p)]


@dataclass(frozen=True)
class Collective:
    name: str
    algorithms: Mapping[str, str]  # name -> "module:function" that runs it
    default: str
    layout: layouts.Builder  # (send, recv, size, rank, **arguments) -> Layout
    busbw: Callable[[int], float]  # bus bandwidth = algbw * busbw(n), nccl-tests' model
    algbw_bytes: Callable[[int, int], int]  # (size as the spec gives it, n) -> bytes moved per rank
    data: Callable[..., Data]  # (rank, p, count, dtype, salt, op, pattern="pattern")
    # of ARGUMENTS: pairs (the window of the algorithms in `windowed`), root (the test data's
    # is ROOT), op (a reduction), send_counts and recv_counts (per peer, from `counts`)
    takes: tuple[str, ...] = ()
    in_place: bool = False  # one buffer, sent and received (bcast)
    mpi: Mpi | None = None
    # torch.distributed's call on the Gloo backend, and how it is called on the test buffers;
    # None where torch has none for Gloo, and `no_gloo` says why (torch 1.13, Debian 12's:
    # "ProcessGroupGloo does not support reduce_scatter" before torch 2.7)
    gloo: str | None = None
    dtype: str = "uint8"  # what the apps and the benchmark move
    unit: str = "per peer"  # what a size counts (the report's tables say it)
    inputs: Inputs = _vector_inputs  # a reduction's inputs to what a rank checks
    windowed: tuple[str, ...] = ()  # the algorithms that take pairs= (a sequential window)
    counts: Counts | None = None  # the test data's per-peer counts (of takes' send_counts)
    gloo_bind: GlooBinder = gloo_buffers
    no_gloo: str = "in torch 1.13"
    axis: str = "bytes per peer"  # the plots' size axis

    @property
    def reduces(self) -> bool:
        return "op" in self.takes

    @property
    def rooted(self) -> bool:
        return "root" in self.takes

    def given(self, send: Any, recv: Any) -> tuple[Any, Any]:
        """The buffers a call is given: in place, the one buffer (and None)."""
        return (send, None) if self.in_place else (send, recv)

    def mpi_call(self, comm: Any, MPI: Any) -> Call:
        """The MPI counterpart's call on the test buffers: f(send, recv)."""
        if self.mpi is None:
            raise ConfigError(f"{self.name} has no MPI counterpart")
        return self.mpi.bind(self, comm, MPI)

    def gloo_call(self, dist: Any, rank: int, p: int) -> Call:
        """The Gloo counterpart's call on the test buffers as tensors: f(send, out)."""
        if self.gloo is None:
            raise ConfigError(f"{self.name} has no Gloo counterpart {self.no_gloo}")
        return self.gloo_bind(self, dist, rank, p)

    def sizes(self, count: int, p: int) -> tuple[int, int]:
        """Elements of the send and receive buffers."""
        send, want = self.data(0, p, count, "uint8", 0, "sum")
        return send.size, want.size

    def result(self, send: Any, recv: Any) -> Any:
        """The buffer that holds the result."""
        return send if self.in_place else recv

    def arguments(self, p: int, op: str = "sum", pairs: int = 1, rank: int = 0,
                  send: Any = None) -> dict[str, Any]:
        """The extra arguments of a call with the test data's layout (rooted: at ROOT; per-peer
        counts: the test data's, of this rank's send buffer)."""
        out: dict[str, Any] = {k: v for k, v in (("pairs", pairs), ("root", ROOT), ("op", op))
                               if k in self.takes}
        if self.counts is not None:
            out["send_counts"], out["recv_counts"] = self.counts(rank, p, 0 if send is None
                                                                 else send.size)
        return out


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
    """The root is ROOT here; the buffer is both sent (at the root) and received."""
    want = block(ROOT, ROOT, count, dtype, salt, pattern)
    return (want.copy() if rank == ROOT else np.zeros(count, dtype)), want


def _uneven(src: int, dst: int, count: int) -> int:
    """What src sends dst in the per-peer counts' test data: count, plus 0..2 by the pair
    (src sends dst and dst receives from src the same; a rank's own block is count)."""
    return count + (2 * src + dst) % 3


def _varying_counts(rank: int, p: int, sent: int) -> tuple[list[int], list[int]]:
    """The test data's send and receive counts of a rank whose send buffer holds `sent`
    elements (its count is found from that: the extras are known)."""
    count = max(0, (sent - sum(_uneven(rank, d, 0) for d in range(p))) // max(p, 1))
    return ([_uneven(rank, d, count) for d in range(p)],
            [_uneven(s, rank, count) for s in range(p)])


def _alltoallv(rank: int, p: int, count: int, dtype: str, salt: int, op: str,
               pattern: str = "pattern") -> Data:
    """alltoall's blocks, of uneven sizes (about count per peer, some more)."""
    send = [block(rank, d, _uneven(rank, d, count), dtype, salt, pattern) for d in range(p)]
    want = [block(s, rank, _uneven(s, rank, count), dtype, salt, pattern) for s in range(p)]
    return np.concatenate(send), np.concatenate(want)


def inputs(name: str, rank: int, p: int, count: int, dtype: str, salt: int = 0,
           pattern: str = "pattern") -> list[np.ndarray]:
    """Of a reduction: every rank's input to the part whose result `rank` checks (what a
    lossy codec's error bound is taken over, rxelab.codecs.error_bound); its description's
    `inputs` says which."""
    return COLLECTIVES[name].inputs(rank, p, count, dtype, salt, pattern)


def count_wrong(got: np.ndarray, want: np.ndarray, bound: Any = None) -> int:
    """Elements not as they must be: exactly, or within `bound` (per element: a lossy codec's
    error bound; NaN is never within it)."""
    if bound is None:
        return int(np.count_nonzero(got != want))
    return int(np.count_nonzero(~(np.abs(got.astype(np.float64) - want) <= bound)))


def wrong(c: Collective, send: np.ndarray, recv: np.ndarray, want: np.ndarray,
          bound: Any = None) -> int:
    """The one count of wrong elements every harness reports (the self-test, the benchmark,
    the apps): of the buffer that holds c's result, against the test data's `want`."""
    return count_wrong(c.result(send, recv), want, bound)


def _fraction(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def _algorithms(**modules: str) -> dict[str, str]:
    """{name: "rxelab.collectives.<module>"} with `:run` unless the module names another."""
    return {name.replace("_", "-"): f"rxelab.collectives.{m}" + ("" if ":" in m else ":run")
            for name, m in modules.items()}


COLLECTIVES: dict[str, Collective] = {}


def register(c: Collective) -> Collective:
    """Make a described collective known to everything that reads descriptions."""
    if c.default not in c.algorithms or not set(c.takes) <= set(ARGUMENTS) \
            or ("pairs" in c.takes) != bool(c.windowed) or not set(c.windowed) <= set(c.algorithms) \
            or ("send_counts" in c.takes) != (c.counts is not None):
        raise ValueError(f"{c.name}: default {c.default!r}, arguments {c.takes}, windowed "
                         f"{c.windowed} or counts do not fit")
    COLLECTIVES[c.name] = c
    return c


def units() -> str:
    """What a size counts, collective by collective (for help texts and docstrings)."""
    by: dict[str, list[str]] = {}
    for c in COLLECTIVES.values():
        by.setdefault(c.unit, []).append(c.name)
    return "; ".join(f"{unit}: {', '.join(names)}" for unit, names in by.items())


def collective(name: Any) -> Collective:
    if not isinstance(name, str) or name not in COLLECTIVES:
        raise ConfigError(f"unknown collective {name!r}", hint=f"use one of {', '.join(COLLECTIVES)}")
    return COLLECTIVES[name]


_ALLTOALL = _algorithms(sequential="alltoall_sequential", pairwise="alltoall_pairwise",
                       parallel="alltoall_parallel")
_SEQUENTIAL = ("sequential",)
for _c in (
    Collective("alltoall", _ALLTOALL, "pairwise", layouts.personalized, _fraction,
               lambda size, n: size * n, _alltoall, takes=("pairs",), windowed=_SEQUENTIAL,
               mpi=Mpi("Alltoall", {"mpi-default": None, "mpi-linear": 1, "mpi-pairwise": 2,
                                    "mpi-bruck": 3}),
               gloo="all_to_all_single"),
    Collective("allgather", _algorithms(star="allgather_star", ring="allgather_ring",
                                        sequential="allgather_sequential"),
               "ring", layouts.gathered, _fraction, lambda size, n: size * n, _allgather,
               takes=("pairs",), windowed=_SEQUENTIAL,
               mpi=Mpi("Allgather", {"mpi-default": None, "mpi-linear": 1, "mpi-bruck": 2,
                                     "mpi-ring": 4}),
               gloo="all_gather", gloo_bind=gloo_listed),
    Collective("allreduce", _algorithms(ring="reduce_ring:allreduce",
                                        recursive_doubling="allreduce_rd"),
               "ring", layouts.reduced, lambda n: 2 * _fraction(n), lambda size, n: size,
               _allreduce, takes=("op",), dtype="float32", unit="vector", axis="bytes",
               mpi=Mpi("Allreduce", {"mpi-default": None, "mpi-recursive-doubling": 3,
                                     "mpi-ring": 4}, bind=mpi_reduction),
               gloo="all_reduce", gloo_bind=gloo_reduction),
    Collective("reduce_scatter", _algorithms(ring="reduce_ring:reduce_scatter_block"),
               "ring", layouts.scattered, _fraction, lambda size, n: size * n, _reduce_scatter,
               takes=("op",), dtype="float32", unit="per block", axis="bytes",
               inputs=_block_inputs, mpi=Mpi("Reduce_scatter_block", bind=mpi_reduction)),
    Collective("bcast", _algorithms(binomial="bcast:binomial", star="bcast:star"),
               "binomial", layouts.broadcast, lambda n: 1.0 if n > 1 else 0.0,
               lambda size, n: size, _bcast, takes=("root",), in_place=True, unit="vector",
               axis="bytes", mpi=Mpi("Bcast", {"mpi-default": None, "mpi-binomial": 6},
                                     bind=mpi_from_root),
               gloo="broadcast", gloo_bind=gloo_from_root),
    # MPI_Alltoallv with contiguous blocks: alltoall's algorithms over per-peer counts
    Collective("alltoallv", _ALLTOALL, "pairwise", layouts.varying, _fraction,
               lambda size, n: size * n, _alltoallv,
               takes=("pairs", "send_counts", "recv_counts"), windowed=_SEQUENTIAL,
               counts=_varying_counts,
               mpi=Mpi("Alltoallv", {"mpi-default": None, "mpi-linear": 1, "mpi-pairwise": 2},
                       bind=mpi_varying),
               gloo="all_to_all_single", gloo_bind=gloo_varying),
):
    register(_c)


def run(comm: Any, name: str, algorithm: str, send: np.ndarray, recv: np.ndarray,
        op: str = "sum", pairs: int = 1, compression: str | None = None) -> Any:
    """Call collective `name` on a communicator the way its test data is laid out."""
    c = COLLECTIVES[name]
    coded = {} if compression is None else {"compression": compression}
    return comm.collective(name, *c.given(send, recv), algorithm=algorithm,
                           **c.arguments(comm.size, op, pairs, comm.rank, send), **coded)

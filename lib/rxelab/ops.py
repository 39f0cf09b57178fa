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
Its test data live in rxelab.testdata and its counterparts' binders in rxelab.counterparts
(both named here again, for every reader of descriptions).

Pure Python and numpy: importing it touches no RDMA (experiments read it on the host).

`count` is in elements, of what the description's `unit` says (units() lists them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rxelab import layouts, testdata
from rxelab.counterparts import (
    CounterpartCall,
    GlooBinder,
    Mpi,
    gloo_buffers,
    gloo_from_root,
    gloo_listed,
    gloo_reduction,
    gloo_varying,
    mpi_from_root,
    mpi_reduction,
    mpi_varying,
)
from rxelab.errors import ConfigError
from rxelab.testdata import PATTERNS, ROOT, Data, block, contribution, count_wrong, reference

# the test data's and the counterparts' names, as every reader of descriptions finds them here
__all__ = ["ARGUMENTS", "COLLECTIVES", "PATTERNS", "ROOT", "Collective", "Data", "Mpi", "block",
           "collective", "contribution", "count_wrong", "inputs", "reference", "register", "run",
           "runner", "units", "wrong"]
Inputs = Callable[..., list[np.ndarray]]  # (rank, p, count, dtype, salt, pattern)
Counts = Callable[[int, int, int], tuple[list[int], list[int]]]  # (rank, p, send elements)

# what a collective may take beside its buffers
ARGUMENTS = ("pairs", "root", "op", "send_counts", "recv_counts")


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
    inputs: Inputs = testdata.vector_inputs  # a reduction's inputs to what a rank checks
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

    def mpi_call(self, comm: Any, MPI: Any) -> CounterpartCall:
        """The MPI counterpart's call on the test buffers: f(send, recv)."""
        if self.mpi is None:
            raise ConfigError(f"{self.name} has no MPI counterpart")
        return self.mpi.bind(self, comm, MPI)

    def gloo_call(self, dist: Any, rank: int, p: int) -> CounterpartCall:
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


def inputs(name: str, rank: int, p: int, count: int, dtype: str, salt: int = 0,
           pattern: str = "pattern") -> list[np.ndarray]:
    """Of a reduction: every rank's input to the part whose result `rank` checks (what a
    lossy codec's error bound is taken over, rxelab.codecs.error_bound); its description's
    `inputs` says which."""
    return COLLECTIVES[name].inputs(rank, p, count, dtype, salt, pattern)


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
            or ("send_counts" in c.takes) != (c.counts is not None) \
            or (c.mpi is not None and set(c.mpi.smpi) != set(c.mpi.tuned)):
        raise ValueError(f"{c.name}: default {c.default!r}, arguments {c.takes}, windowed "
                         f"{c.windowed}, counts or MPI labels (Open MPI's and SMPI's) do not fit")
    COLLECTIVES[c.name] = c
    return c


_RUNNERS: dict[str, Callable[[Any], None]] = {}  # "module:function" -> the function


def runner(c: Collective, algorithm: str) -> Callable[[Any], None]:
    """The function that runs an algorithm (it takes a rxelab.collectives.common.Call),
    imported when first used: a description names it, so reading descriptions imports no
    algorithm."""
    if algorithm not in c.algorithms:
        raise ConfigError(f"unknown {c.name} algorithm {algorithm!r}",
                          hint=f"use one of {', '.join(c.algorithms)}")
    found = _RUNNERS.get(c.algorithms[algorithm])
    if found is None:
        module, _, function = c.algorithms[algorithm].partition(":")
        found = _RUNNERS[c.algorithms[algorithm]] = getattr(importlib.import_module(module),
                                                            function)
    return found


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
                       parallel="alltoall_parallel")  # alltoallv's too: blocks of any size
_SEQUENTIAL = ("sequential",)
for _c in (
    Collective("alltoall", {**_ALLTOALL, **_algorithms(bruck="bruck:alltoall")}, "pairwise",
               layouts.personalized, _fraction,
               lambda size, n: size * n, testdata.alltoall, takes=("pairs",), windowed=_SEQUENTIAL,
               mpi=Mpi("Alltoall", {"mpi-default": None, "mpi-linear": 1, "mpi-pairwise": 2,
                                    "mpi-bruck": 3},
                       smpi={"mpi-default": "ompi", "mpi-linear": "basic_linear",
                             "mpi-pairwise": "ring", "mpi-bruck": "bruck"}),
               gloo="all_to_all_single"),
    Collective("allgather", _algorithms(star="allgather_star", ring="allgather_ring",
                                        sequential="allgather_sequential", bruck="bruck:allgather",
                                        parallel="allgather_parallel"),
               "ring", layouts.gathered, _fraction, lambda size, n: size * n, testdata.allgather,
               takes=("pairs",), windowed=_SEQUENTIAL,
               mpi=Mpi("Allgather", {"mpi-default": None, "mpi-linear": 1, "mpi-bruck": 2,
                                     "mpi-ring": 4},
                       smpi={"mpi-default": "ompi", "mpi-linear": "GB", "mpi-bruck": "bruck",
                             "mpi-ring": "ring"}),
               gloo="all_gather", gloo_bind=gloo_listed),
    Collective("allreduce", _algorithms(ring="reduce_ring:allreduce",
                                        recursive_doubling="allreduce_rd"),
               "ring", layouts.reduced, lambda n: 2 * _fraction(n), lambda size, n: size,
               testdata.allreduce, takes=("op",), dtype="float32", unit="vector", axis="bytes",
               mpi=Mpi("Allreduce", {"mpi-default": None, "mpi-recursive-doubling": 3,
                                     "mpi-ring": 4}, bind=mpi_reduction,
                       smpi={"mpi-default": "ompi", "mpi-recursive-doubling": "rdb",
                             "mpi-ring": "lr"}),
               gloo="all_reduce", gloo_bind=gloo_reduction),
    Collective("reduce_scatter", _algorithms(ring="reduce_ring:reduce_scatter_block"),
               "ring", layouts.scattered, _fraction, lambda size, n: size * n, testdata.reduce_scatter,
               takes=("op",), dtype="float32", unit="per block", axis="bytes",
               inputs=testdata.block_inputs, mpi=Mpi("Reduce_scatter_block", bind=mpi_reduction)),
    Collective("bcast", _algorithms(binomial="bcast:binomial", star="bcast:star"),
               "binomial", layouts.broadcast, lambda n: 1.0 if n > 1 else 0.0,
               lambda size, n: size, testdata.bcast, takes=("root",), in_place=True, unit="vector",
               axis="bytes", mpi=Mpi("Bcast", {"mpi-default": None, "mpi-binomial": 6},
                                     bind=mpi_from_root,
                                     smpi={"mpi-default": "ompi", "mpi-binomial": "binomial_tree"}),
               gloo="broadcast", gloo_bind=gloo_from_root),
    # MPI_Alltoallv with contiguous blocks: alltoall's algorithms over per-peer counts
    Collective("alltoallv", _ALLTOALL, "pairwise", layouts.varying, _fraction,
               lambda size, n: size * n, testdata.alltoallv,
               takes=("pairs", "send_counts", "recv_counts"), windowed=_SEQUENTIAL,
               counts=testdata.varying_counts,
               mpi=Mpi("Alltoallv", {"mpi-default": None, "mpi-linear": 1, "mpi-pairwise": 2},
                       bind=mpi_varying, smpi={"mpi-default": "ompi", "mpi-linear": "ompi_basic_linear",
                                               "mpi-pairwise": "ring"}),
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

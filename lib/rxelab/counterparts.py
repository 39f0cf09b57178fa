"""How each collective's counterparts are called on the test buffers: its MPI call (mpi4py,
and what each label forces through Open MPI's coll_tuned) and its Gloo call
(torch.distributed). A description (rxelab.ops) names its binders; the comparison apps call
what they bind, and nothing else in the project knows a counterpart's call by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rxelab.testdata import ROOT


class Described(Protocol):
    """What a binder reads of a collective's description (rxelab.ops.Collective)."""

    @property
    def mpi(self) -> Mpi | None: ...

    @property
    def gloo(self) -> str | None: ...

    @property
    def counts(self) -> Callable[[int, int, int], tuple[list[int], list[int]]] | None: ...


# (send, recv) -> None: one call of an MPI or Gloo counterpart on the test buffers (not
# rxelab.collectives.common.Call, what an algorithm of rxelab runs on)
CounterpartCall = Callable[[Any, Any], Any]
# (description, mpi4py communicator, the MPI module) -> the call on the test buffers
MpiBinder = Callable[[Described, Any, Any], CounterpartCall]
# (description, torch.distributed, rank, size) -> the call on the test buffers as tensors
GlooBinder = Callable[[Described, Any, int, int], CounterpartCall]


def mpi_buffers(c: Described, comm: Any, MPI: Any) -> CounterpartCall:
    """comm.Alltoall(send, recv), and the like."""
    assert c.mpi is not None
    return getattr(comm, c.mpi.call)  # type: ignore[no-any-return]


def mpi_reduction(c: Described, comm: Any, MPI: Any) -> CounterpartCall:
    """comm.Allreduce(send, recv, op=MPI.SUM), and the like."""
    assert c.mpi is not None
    method, op = getattr(comm, c.mpi.call), MPI.SUM
    return lambda send, recv: method(send, recv, op=op)


def mpi_from_root(c: Described, comm: Any, MPI: Any) -> CounterpartCall:
    """comm.Bcast(buf, root=ROOT): in place, one buffer."""
    assert c.mpi is not None
    method = getattr(comm, c.mpi.call)
    return lambda send, recv: method(send, root=ROOT)


def mpi_varying(c: Described, comm: Any, MPI: Any) -> CounterpartCall:
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
    coll_tuned (its algorithm number; None: Open MPI's own choice), how it is called on the
    test buffers (an MpiBinder), and each label's algorithm in SimGrid's SMPI (its
    --cfg=smpi/<collective>: name; "ompi": Open MPI's own choice, as SMPI copies it)."""

    call: str
    tuned: Mapping[str, int | None] = field(default_factory=lambda: {"mpi-default": None})
    bind: MpiBinder = mpi_buffers
    smpi: Mapping[str, str] = field(default_factory=lambda: {"mpi-default": "ompi"})


def gloo_buffers(c: Described, dist: Any, rank: int, p: int) -> CounterpartCall:
    """dist.all_to_all_single(out, send), and the like."""
    method = getattr(dist, str(c.gloo))
    return lambda send, out: method(out, send)


def gloo_listed(c: Described, dist: Any, rank: int, p: int) -> CounterpartCall:
    """dist.all_gather(list of p views of out, send)."""
    method = getattr(dist, str(c.gloo))
    return lambda send, out: method(list(out.chunk(p)), send)


def gloo_reduction(c: Described, dist: Any, rank: int, p: int) -> CounterpartCall:
    """dist.all_reduce in place: the input copied into the result first (as a training loop
    keeps its gradient)."""
    method, op = getattr(dist, str(c.gloo)), dist.ReduceOp.SUM

    def call(send: Any, out: Any) -> Any:
        out.copy_(send)
        return method(out, op=op)
    return call


def gloo_from_root(c: Described, dist: Any, rank: int, p: int) -> CounterpartCall:
    """dist.broadcast(buf, src=ROOT): in place, one buffer."""
    method = getattr(dist, str(c.gloo))
    return lambda send, out: method(send, src=ROOT)


def gloo_varying(c: Described, dist: Any, rank: int, p: int) -> CounterpartCall:
    """dist.all_to_all_single(out, send, split sizes) with the test data's counts."""
    assert c.counts is not None
    method, counts = getattr(dist, str(c.gloo)), c.counts

    def call(send: Any, out: Any) -> Any:
        sc, rc = counts(rank, p, send.numel())
        return method(out, send, output_split_sizes=rc, input_split_sizes=sc)
    return call

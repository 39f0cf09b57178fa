"""The rxelab process group: torch.distributed's collectives on the library's own
algorithms, on CPU tensors in place (rxelab.torch.tensors says which). Each call is checked
at once (an error is raised by the call itself) and started on the communicator's progress
thread; its Work completes when the library is done (rxelab.torch.works), so async_op=True
overlaps with the caller's work and DDP's buckets go out as their gradients are ready.

One class for torch 1.13 and 2.x. torch 2 takes a Python process group as the group itself (a
pure-Python c10d Backend cannot be made), so every call must land on a method of ours: torch's
Python calls them by their 2.x names (all_gather_single, reduce_scatter_single,
all_to_all_single, and the *_coalesced ones FSDP and functional collectives use), its C++ (DDP's
reducer) through the trampoline's names; 1.13's names are the same methods. The group keeps
the name torch gives it (getGroupName): device meshes, DTensor and functional collectives find
groups by name. Every call is kept out of Dynamo: torch.compile(DDP(model)) would otherwise
trace into DDP's own broadcast here.

What it does not do it refuses, naming the call: it never falls back to Gloo. scatter, gather
and reduce (DTensor's distribute_tensor scatters) are made of the library's broadcast,
allgather and allreduce, moving p times the bytes of a rooted algorithm. Point to point calls
run in the caller's thread after every started collective (send waits for the matching recv,
as a rendezvous MPI_Send does: torch's batch_isend_irecv, which posts every isend first,
deadlocks on a ring), and take tag 0 only.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from rxelab.comm import Communicator
from rxelab.errors import ConfigError
from rxelab.torch.composed import ComposedCalls, not_compiled
from rxelab.torch.options import Options
from rxelab.torch.tensors import WIDENED, apart, direct, one, reduction, several
from rxelab.torch.works import Completions, finished, in_callback

SUPPORTED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
             "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
             "barrier", "send", "recv", "scatter", "gather", "reduce",
             "all_reduce_coalesced", "all_gather_into_tensor_coalesced",
             "reduce_scatter_tensor_coalesced")
# the collectives whose sizes every rank shares: an empty call is empty everywhere
SAME_SIZE_EVERYWHERE = ("allreduce", "bcast", "allgather", "reduce_scatter")
_OPEN: weakref.WeakSet[ProcessGroupRxelab] = weakref.WeakSet()


def _unsupported(call: str) -> Callable[..., Any]:
    def refuse(self: ProcessGroupRxelab, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError(f"the rxelab backend does not support {call} (it never falls back to "
                          f"Gloo)", hint=f"it supports {', '.join(SUPPORTED)}; for the rest, a "
                                         "group of its own: dist.new_group(backend='gloo')")
    refuse.__name__ = call
    return refuse


class ProcessGroupRxelab(ComposedCalls, dist.ProcessGroup):
    def __init__(self, comm: Communicator, options: Options) -> None:
        super().__init__(comm.rank, comm.size)
        self.comm, self.options = comm, options
        self._lock = threading.Lock()  # torch may call from several threads; the library serves one
        self._completions = Completions()
        self._closed = False
        self._group_name, self._group_desc = "", ""
        _OPEN.add(self)
        # torch's destroy_process_group() only lets go of the group: closed when it is gone
        self._finalizer = weakref.finalize(self, _close_quietly, comm, self._completions)

    def getBackendName(self) -> str:
        return "rxelab"

    # torch 2 names its groups through these (the base class keeps a name only on a C++
    # backend, which a Python group has none of: "ProcessGroup name not set")
    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = str(name)

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = str(desc)

    def close(self) -> None:
        """Let started calls finish, then close the communicator (the peers hear a goodbye).
        Run for every open group when the interpreter exits."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._finalizer.detach()
        try:
            self.comm.close()
        finally:
            self._completions.close()
            _OPEN.discard(self)

    # ---- collectives ----------------------------------------------------------------
    @not_compiled
    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        given = one(tensors, "all_reduce")
        if isinstance(given, torch.Tensor) and given.dtype in WIDENED:
            return self._widened_allreduce(given, tensors, opts)
        t = direct(given, "all_reduce", "the tensor", reduced=True)
        op, average = reduction(opts, t.dtype, "all_reduce")
        return self._start("allreduce", t, t, tensors, self._averaged(t) if average else None,
                           op=op)

    def _widened_allreduce(self, given: torch.Tensor, tensors: Any, opts: Any) -> Any:
        """bfloat16 (DDP's bf16 hook): numpy has no such type, so it is summed in float32,
        each rank's values widened exactly; twice the bytes travel."""
        direct(given.view(torch.int16), "all_reduce", "the tensor")  # its layout, checked
        op, average = reduction(opts, given.dtype, "all_reduce")
        wide = given.detach().to(WIDENED[given.dtype])
        divide = self._averaged(wide) if average else None

        def narrow() -> None:
            if divide is not None:
                divide()
            with torch.no_grad():
                given.copy_(wide)
        return self._start("allreduce", wide, wide, tensors, narrow, op=op)

    @not_compiled
    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        t = direct(one(tensors, "broadcast"), "broadcast", "the tensor")
        root = int(getattr(opts, "rootRank", 0))
        return self._start("bcast", t, None, tensors, root=root)

    @not_compiled
    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
        given = one(input_tensors, "all_gather")
        mine = direct(given, "all_gather", "the input")
        outs = several(output_tensors, "all_gather", self.size())
        for o in outs:
            if o.numel() != mine.numel() or o.dtype != given.dtype:
                raise ConfigError(f"all_gather: every output holds {mine.numel()} elements of "
                                  f"the input's dtype, one has {o.numel()} of {o.dtype}")
        stage = torch.empty(self.size() * mine.numel(), dtype=mine.dtype)
        return self._start("allgather", mine, stage, output_tensors, self._spread(stage, outs))

    @not_compiled
    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        mine = direct(input, "all_gather_into_tensor", "the input")
        out = direct(output, "all_gather_into_tensor", "the output")
        return self._start("allgather", apart(mine, out), out, [output])

    _allgather_base = all_gather_single  # torch <= 2.12's name


    @not_compiled
    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
        out = direct(one(output_tensors, "reduce_scatter"), "reduce_scatter", "the output",
                     reduced=True)
        ins = several(input_tensors, "reduce_scatter", self.size())
        if any(x.numel() != out.numel() or x.dtype != out.dtype for x in ins):
            raise ConfigError(f"reduce_scatter: every input holds {out.numel()} elements of "
                              f"{out.dtype}, as the output does")
        op, average = reduction(opts, out.dtype, "reduce_scatter")
        stage = torch.cat([x.detach().reshape(-1) for x in ins])
        return self._start("reduce_scatter", stage, out, output_tensors,
                           self._averaged(out) if average else None, op=op)

    @not_compiled
    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        out = direct(output, "reduce_scatter_tensor", "the output", reduced=True)
        mine = direct(input, "reduce_scatter_tensor", "the input", reduced=True)
        op, average = reduction(opts, out.dtype, "reduce_scatter_tensor")
        return self._start("reduce_scatter", apart(mine, out), out, [output],
                           self._averaged(out) if average else None, op=op)

    _reduce_scatter_base = reduce_scatter_single  # torch <= 2.12's name


    @not_compiled
    def alltoall(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
        p = self.size()
        outs, ins = several(output_tensors, "all_to_all", p), several(input_tensors, "all_to_all", p)
        dtype = ins[0].dtype
        if any(t.dtype != dtype for t in (*outs, *ins)):
            raise ConfigError("all_to_all: every tensor has the same dtype")
        send = direct(torch.cat([x.detach().reshape(-1) for x in ins]), "all_to_all", "the inputs")
        sent, wanted = [x.numel() for x in ins], [o.numel() for o in outs]
        stage = torch.empty(sum(wanted), dtype=dtype)
        recv = direct(stage, "all_to_all", "the outputs")
        after = self._spread(stage, outs)
        if sent == wanted and len(set(sent)) == 1:
            return self._start("alltoall", send, recv, output_tensors, after)
        return self._start("alltoallv", send, recv, output_tensors, after,
                           send_counts=sent, recv_counts=wanted)

    @not_compiled
    def all_to_all_single(self, output: Any, input: Any, output_split_sizes: Any,
                          input_split_sizes: Any, opts: Any = None) -> Any:
        call = "all_to_all_single"
        out, mine = direct(output, call, "the output"), direct(input, call, "the input")
        mine = apart(mine, out)
        if not output_split_sizes and not input_split_sizes:
            return self._start("alltoall", mine, out, [output])
        sent = _counts(input, input_split_sizes, self.size(), call, "input")
        wanted = _counts(output, output_split_sizes, self.size(), call, "output")
        return self._start("alltoallv", mine, out, [output], send_counts=sent,
                           recv_counts=wanted)

    alltoall_base = all_to_all_single  # torch <= 2.12's name

    @not_compiled
    def barrier(self, opts: Any = None) -> Any:
        with self._lock:
            self._check_open()
            self.comm.barrier()
        return finished([])

    # ---- point to point ---------------------------------------------------------------
    @not_compiled
    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> Any:
        t = direct(one(tensors, "send"), "send", "the tensor")
        self._p2p(lambda: self.comm.send(t, dstRank), "send", tag)
        return finished(tensors)

    @not_compiled
    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> Any:
        t = direct(one(tensors, "recv"), "recv", "the tensor")
        self._p2p(lambda: self.comm.recv(t, srcRank), "recv", tag)
        return finished(tensors)

    allgather_coalesced = _unsupported("all_gather_coalesced")
    recv_anysource = _unsupported("recv from any source")
    monitored_barrier = _unsupported("monitored_barrier")

    # ---- the paths every call takes -----------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this rxelab process group is closed")

    def _start(self, collective: str, send: Any, recv: Any, value: Any,
               after: Callable[[], None] | None = None, **arguments: Any) -> Any:
        if collective in SAME_SIZE_EVERYWHERE and send.numel() == 0 and \
                (recv is None or recv.numel() == 0):
            return finished(value)  # nothing to move on any rank (all-to-alls may still have)
        if self.options.overlapping and in_callback():
            raise ConfigError(
                f"{collective} started in a callback of another call's future (a DDP "
                "communication hook such as PowerSGD's): with calls overlapping, it may start "
                "before or after the next gradient bucket's on different ranks",
                hint="pg_options=rxelab.torch.Options(overlap=False), or RXELAB_TORCH_OVERLAP=0: "
                     "each call completes before it returns, and such callbacks run in order")
        with self._lock:
            self._check_open()
            request = self.comm.start(collective, send, recv, self.options.algorithm(collective),
                                      **arguments)
        if not self.options.overlapping:
            return self._completions.now(request, value, after)
        return self._completions.work(request, value, after)

    def _p2p(self, call: Callable[[], None], name: str, tag: int) -> None:
        if tag != 0:
            raise ConfigError(f"{name}: tag {tag}: the rxelab backend matches a peer's "
                              "messages in order, and takes tag 0 only")
        with self._lock:
            self._check_open()
            self.comm.progress.quiesce()  # started collectives first, in the order they began
            call()

    def _averaged(self, t: torch.Tensor) -> Callable[[], None]:
        size = self.size()

        def divide() -> None:
            t.div_(size)
        return divide

    @staticmethod
    def _spread(stage: torch.Tensor, outs: list[torch.Tensor]) -> Callable[[], None]:
        def copy_out() -> None:
            at = 0
            for o in outs:
                n = o.numel()
                o.copy_(stage[at:at + n].view(o.shape).view(o.dtype) if o.dtype != stage.dtype
                        else stage[at:at + n].view(o.shape))
                at += n
        return copy_out


def _counts(t: torch.Tensor, splits: Any, p: int, call: str, what: str) -> list[int]:
    """all_to_all_single's split sizes (rows of dim 0, per rank) as element counts."""
    rows = t.shape[0] if t.dim() else 1
    per_row = t.numel() // rows if rows else 0
    if not splits:
        if rows % p:
            raise ConfigError(f"{call}: the {what}'s {rows} rows do not split evenly over {p} ranks")
        splits = [rows // p] * p
    splits = [int(s) for s in splits]
    if len(splits) != p or any(s < 0 for s in splits) or sum(splits) != rows:
        raise ConfigError(f"{call}: {what} split sizes {splits} must be {p} counts that add up "
                          f"to its {rows} rows")
    return [s * per_row for s in splits]


def _close_quietly(comm: Communicator, completions: Completions) -> None:
    try:
        comm.close()
    except Exception:  # collected late, or at exit: the peers may be gone already
        pass
    completions.close()


@atexit.register
def _close_all() -> None:
    for group in list(_OPEN):
        try:
            group.close()
        except Exception:  # at exit: the peers may be gone already
            pass

"""The calls the torch backend makes of its own (rxelab.torch.group): rooted ones made of the
library's unrooted collectives (scatter, gather, reduce: DTensor's distribute_tensor scatters),
moving p times the bytes a rooted algorithm would, and the coalesced forms torch 2's FSDP and
functional collectives call, several tensors with one Work.
"""

from __future__ import annotations

from typing import Any

import torch

from rxelab.errors import ConfigError
from rxelab.torch.tensors import direct, one, reduction, several
from rxelab.torch.works import all_of, finished

try:  # torch >= 2.1: torch.compile(DDP(model)) must not trace into a backend
    from torch.compiler import disable as not_compiled
except ImportError:  # torch 1.13 has no Dynamo to keep out
    def not_compiled(fn: Any) -> Any:  # type: ignore[no-redef]
        return fn


class ComposedCalls:
    """A mixin of the process group: every name it uses (_start, _averaged, _spread, the
    one-tensor calls) is the group's."""

    _start: Any
    _averaged: Any
    _spread: Any
    all_gather_single: Any
    reduce_scatter_single: Any
    rank: Any
    size: Any

    @not_compiled
    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Any:
        """Several tensors of one dtype reduced as one call (their bytes side by side)."""
        ts = [direct(t, "all_reduce_coalesced", "a tensor", reduced=True) for t in tensors]
        if not ts:
            return finished(tensors)
        if any(t.dtype != ts[0].dtype for t in ts):
            raise ConfigError("all_reduce_coalesced: every tensor has the same dtype")
        op, average = reduction(opts, ts[0].dtype, "all_reduce_coalesced")
        stage = torch.cat([t.reshape(-1) for t in ts])
        divide = self._averaged(stage) if average else None

        def copy_back() -> None:
            if divide is not None:
                divide()
            at = 0
            for t in ts:
                t.copy_(stage[at:at + t.numel()].view(t.shape))
                at += t.numel()
        return self._start("allreduce", stage, stage, tensors, copy_back, op=op)

    # ---- rooted calls, made of the library's unrooted ones ----------------------------
    @not_compiled
    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
        """The root's p tensors broadcast together, each rank keeping its own."""
        root, me = int(getattr(opts, "rootRank", 0)), self.rank()
        out = direct(one(output_tensors, "scatter"), "scatter", "the output")
        stage = torch.empty(self.size() * out.numel(), dtype=out.dtype)
        if me == root:
            ins = several(input_tensors, "scatter", self.size())
            if any(x.numel() != out.numel() or x.dtype != ins[0].dtype for x in ins):
                raise ConfigError(f"scatter: every input holds {out.numel()} elements, as the "
                                  "output does")
            stage.copy_(torch.cat([x.detach().reshape(-1) for x in ins]).view(out.dtype))

        def keep_mine() -> None:
            out.copy_(stage[me * out.numel():(me + 1) * out.numel()].view(out.shape))
        return self._start("bcast", stage, None, output_tensors, keep_mine, root=root)

    @not_compiled
    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Any:
        """Everyone's tensor gathered everywhere, kept by the root."""
        root = int(getattr(opts, "rootRank", 0))
        mine = direct(one(input_tensors, "gather"), "gather", "the input")
        stage = torch.empty(self.size() * mine.numel(), dtype=mine.dtype)
        outs = several(output_tensors, "gather", self.size()) if self.rank() == root else []
        return self._start("allgather", mine, stage, output_tensors,
                           self._spread(stage, outs) if outs else None)

    @not_compiled
    def reduce(self, tensors: Any, opts: Any = None) -> Any:
        """Reduced everywhere into a copy; the root's tensor takes the result."""
        root = int(getattr(opts, "rootRank", 0))
        t = direct(one(tensors, "reduce"), "reduce", "the tensor", reduced=True)
        op, average = reduction(opts, t.dtype, "reduce")
        stage = t.clone()
        divide = self._averaged(stage) if average else None

        def to_root() -> None:
            if divide is not None:
                divide()
            if self.rank() == root:
                t.copy_(stage)
        return self._start("allreduce", stage, stage, tensors, to_root, op=op)

    @not_compiled
    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return all_of([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)],
                      outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # torch <= 2.12's name

    @not_compiled
    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return all_of([self.reduce_scatter_single(o, i, opts)
                       for o, i in zip(outputs, inputs, strict=True)], outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # torch <= 2.12's name


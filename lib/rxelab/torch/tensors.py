"""What the backend checks of the tensors torch hands it, and how a reduction of torch's is
named in the library. CPU tensors in place: the library reads and writes their memory
directly, so a tensor it works on must be a dense, contiguous CPU tensor of a dtype numpy
knows (bool and bfloat16 travel as bytes where nothing is reduced; all_reduce sums bfloat16 in
float32). Outputs of the list
forms (all_gather, all_to_all) are copied into, so they may be laid out any way, and an input
that shares memory with its output (FSDP's in-place calls) is copied first (apart)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from rxelab import buffers
from rxelab.errors import ConfigError

REDUCED = (torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
           torch.int64, torch.uint8)
AS_BYTES = {torch.bool: torch.uint8, torch.bfloat16: torch.int16}  # moved as they are
WIDENED = {torch.bfloat16: torch.float32}  # all_reduce sums these in a wider type
_OPS = {"SUM": "sum", "PRODUCT": "prod", "MIN": "min", "MAX": "max"}
AVG = "AVG"


def one(tensors: Any, call: str) -> torch.Tensor:
    """The one tensor of a call torch passes as a list (one per device: a CPU group has one)."""
    if isinstance(tensors, torch.Tensor):
        return tensors
    if not isinstance(tensors, Sequence) or len(tensors) != 1:
        raise ConfigError(f"{call}: one tensor per call (a CPU group has one device), "
                          f"not {len(tensors) if isinstance(tensors, Sequence) else tensors!r}")
    return tensors[0]


def several(tensors: Any, call: str, size: int) -> list[torch.Tensor]:
    """A list form's p tensors (all_gather's outputs, all_to_all's lists), one per rank."""
    if isinstance(tensors, Sequence) and len(tensors) == 1 and not isinstance(tensors[0], torch.Tensor):
        tensors = tensors[0]  # the process group's own form: a list per device
    if not isinstance(tensors, Sequence) or len(tensors) != size:
        raise ConfigError(f"{call}: a list of {size} tensors, one per rank, not "
                          f"{len(tensors) if isinstance(tensors, Sequence) else type(tensors).__name__}")
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            raise ConfigError(f"{call}: every tensor of the list must be a CPU tensor")
    return list(tensors)


def direct(t: Any, call: str, what: str, reduced: bool = False) -> torch.Tensor:
    """A tensor the library reads or writes in place, checked: as it is (or its bytes, for a
    dtype numpy lacks), detached if it needs a gradient."""
    if not isinstance(t, torch.Tensor):
        raise ConfigError(f"{call}: {what} is a {type(t).__name__}, not a torch tensor")
    if t.device.type != "cpu":
        raise ConfigError(f"{call}: {what} is on {t.device}: the rxelab backend takes CPU tensors")
    if t.layout != torch.strided:
        raise ConfigError(f"{call}: {what} is a {t.layout} tensor: the rxelab backend takes "
                          "dense tensors")
    if not t.is_contiguous():
        raise ConfigError(f"{call}: {what} is not contiguous",
                          hint="pass tensor.contiguous() and copy the result back, as Gloo "
                               "asks too")
    if t.dtype not in REDUCED:
        if reduced or t.dtype not in AS_BYTES:
            raise ConfigError(f"{call}: {t.dtype} is not supported"
                              + (" for reductions" if t.dtype in AS_BYTES else ""),
                              hint=f"use one of {', '.join(str(d) for d in REDUCED)}")
        t = t.view(AS_BYTES[t.dtype])
    return t.detach() if t.requires_grad else t


def reduction(opts: Any, dtype: torch.dtype, call: str) -> tuple[str, bool]:
    """torch's reduction (an options object or a ReduceOp) as the library's op, and whether
    the result is then divided by the group's size (AVG, on floating point only)."""
    op = getattr(opts, "reduceOp", opts)
    if op is None:
        return "sum", False
    for name in (*_OPS, AVG):
        mine = getattr(dist.ReduceOp, name, None)
        if mine is not None and op == mine:
            if name == AVG:
                if not dtype.is_floating_point:
                    raise ConfigError(f"{call}: AVG of {dtype} is not supported",
                                      hint="sum, then divide as your program means to round")
                return "sum", True
            return _OPS[name], False
    raise ConfigError(f"{call}: reduction {op} is not supported",
                      hint="SUM, PRODUCT, MIN, MAX and AVG (floating point) are")


def apart(given: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """`given`, or a copy of it where it shares memory with `other`. torch's users gather and
    scatter in place, NCCL's way: FSDP's input is its own slot of the output
    (all_gather_into_tensor) or its output a chunk of the input (reduce_scatter_tensor); the
    library refuses overlapping buffers, because a peer would overwrite what is not sent yet."""
    if buffers.overlap(given.data_ptr(), given.numel() * given.element_size(),
                       other.data_ptr(), other.numel() * other.element_size()):
        return given.clone()
    return given

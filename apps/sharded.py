"""FSDP beside DDP in apps/ddp_train.py: the same model sharded over a process group, by
FSDP (FullyShardedDataParallel, on CPU) or FSDP2 (`fully_shard`, over a device mesh made
from the group; on CPU it needs a torch newer than 2.6), and its whole parameters after training, so they can
be compared with DDP's and Gloo's.

Sharding is what FSDP adds to the wire: every step all-gathers the parameters and
reduce-scatters the gradients (all_gather_into_tensor, reduce_scatter_tensor), where DDP
all-reduces gradient buckets. FSDP2 needs a default process group (its mesh is made from the
job's), so it runs in a job started by init_process_group, not in the host tests' thread-ranks.
"""

from __future__ import annotations

import importlib
from typing import Any

SHARDED = ("fsdp", "fsdp2")  # beside DDP's own wrap
WRAPS = ("ddp", *SHARDED)


def torch_major_minor() -> tuple[int, int]:
    import torch

    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def unsupported(wrap: str) -> str | None:
    """Why this torch cannot run `wrap`, said before any rank starts it (so every rank skips
    it alike), or None."""
    if wrap == "fsdp2" and torch_major_minor() < (2, 6):
        return "FSDP2 (fully_shard) needs torch 2.6 or later"
    if wrap == "fsdp2" and not cpu_streams_record_events():
        return ("FSDP2 on CPU needs a torch whose CPU stream records events (2.6's does not: "
                "'Stream' object has no attribute 'record_event'; 2.13's does)")
    try:  # torch 1.13's FSDP does not import on Python 3.11 (a dataclass default it declares)
        importlib.import_module("torch.distributed.fsdp")
    except (ImportError, ValueError) as err:
        return f"FSDP does not import under this torch and Python: {err}"
    return None


def cpu_streams_record_events() -> bool:
    """What FSDP2 asks of the CPU's stream (torch 2.6's has no record_event)."""
    import torch

    current = getattr(torch.cpu, "current_stream", None)  # torch 1.13 has none
    return current is not None and hasattr(current(), "record_event")


def shard(model: Any, group: Any, wrap: str) -> Any:
    """The model wrapped for training; each linear layer a unit of its own, as FSDP's users
    wrap a transformer's blocks, so a step gathers and reduces layer by layer. `group` None is
    the job's default group (DDP's and FSDP's own meaning; FSDP2's mesh wants it named)."""
    import torch
    import torch.distributed as dist

    if wrap == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FullyShardedDataParallel(model, process_group=group, device_id=torch.device("cpu"),
                                        auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}))
    if wrap == "fsdp2":
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(group or dist.group.WORLD, "cpu")
        for layer in model.modules():
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    raise ValueError(f"not a sharded wrap: {wrap!r}")


def whole_parameters(model: Any, wrapped: Any, wrap: str) -> Any:
    """Every parameter, gathered from the shards, flattened in the model's order."""
    import torch

    if wrap == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(wrapped):
            return torch.cat([p.detach().reshape(-1) for p in wrapped.parameters()]).clone()
    return torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()]).clone()

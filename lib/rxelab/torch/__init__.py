"""rxelab as a torch.distributed backend. Importing this module registers "rxelab":

    import torch.distributed as dist
    import rxelab.torch
    dist.init_process_group("rxelab")          # torchrun, srun, our launcher: env://
    model = DistributedDataParallel(model)     # its gradients go over rxelab's allreduce

The ranks meet through the store torch hands the backend (rxelab.torch.rendezvous); under srun
or mpirun, importing it also sets what torch's env:// reads (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) from the launcher's own variables, where they are not set; options
come from `pg_options=rxelab.torch.Options(...)` or the environment (rxelab.torch.options);
what it supports and how is in rxelab.torch.group. Needs torch >= 1.13; tested on 1.13 (Debian
12), 2.6 (Debian 13) and 2.13 (pip).
"""

from __future__ import annotations

import importlib
import inspect
import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from rxelab.torch.group import SUPPORTED, ProcessGroupRxelab
from rxelab.torch.options import Options, resolve
from rxelab.torch.rendezvous import meet, stores_without_libuv, torch_environment

__all__ = ["BACKEND", "SUPPORTED", "Options", "ProcessGroupRxelab", "create", "new_group"]
BACKEND = "rxelab"


def new_group(store: Any, rank: int, size: int, timeout: timedelta = timedelta(minutes=30),
              options: Options | None = None, first_of_job: bool = True) -> ProcessGroupRxelab:
    """A process group of its own over `store` (torch's Store), for a program that makes its
    groups itself (DDP(process_group=...)) rather than through init_process_group.
    first_of_job: its rank 0 is the job's (at MASTER_ADDR)."""
    from rxelab import logs, transports
    from rxelab.comm import Communicator

    logs.configure()
    chosen = resolve(options, os.environ)
    transports.load(transports.choose(chosen.transport))  # what this host lacks, before meeting
    job, listener = meet(store, rank, size, timeout.total_seconds(), first_of_job=first_of_job)
    try:
        comm = Communicator(job, _listener=listener, **chosen.opening())
    except BaseException:
        if listener is not None:
            listener.close()
        raise
    return ProcessGroupRxelab(comm, chosen)


def create(backend_options: Any, pg_options: Any = None) -> ProcessGroupRxelab:
    """torch's creator of the backend (extended API): the group's store, rank, size, timeout."""
    members = list(backend_options.global_ranks_in_group or [])
    return new_group(backend_options.store, backend_options.group_rank,
                     backend_options.group_size, backend_options.timeout, pg_options,
                     first_of_job=not members or min(members) == 0)


if BACKEND.upper() not in dist.Backend._plugins:
    # torch 2 asks which devices a backend serves (and warns when not told); 1.13 cannot be told
    _devices = ({"devices": ["cpu"]}
                if "devices" in inspect.signature(dist.Backend.register_backend).parameters else {})
    dist.Backend.register_backend(BACKEND, create, extended_api=True, **_devices)
# under srun or mpirun, torch's env:// finds its variables too (torchrun sets its own); and a
# torch without libuv (Debian 13's) gets stores it can make through torch's rendezvous (env://,
# a torchrun worker's client of its agent's store): the module by its name, since
# torch.distributed.rendezvous as an attribute is a function
os.environ.update(torch_environment(os.environ))
stores_without_libuv([importlib.import_module("torch.distributed.rendezvous")])

"""p ranks as threads, each with its own process group over one in-memory torch store:
rxelab's (on the in-memory fabric) or Gloo's (TCP over loopback), so one test compares
them. Every rank's result or exception comes back; a rank still running after the deadline
is named."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import rxelab.torch as rt
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from pyverbs import _fabric

from tests.unit.fakejob import in_threads


def make_group(backend: str, store: Any, rank: int, p: int, **options: Any) -> Any:
    if backend == "rxelab":
        group = rt.new_group(store, rank, p, timedelta(seconds=30),
                             rt.Options(**options) if options else None)
    else:
        group = gloo_group(store, rank, p)
    # torch's calls that name a rank (broadcast's src, send's dst) look the group up here;
    # each thread's group is the whole job, so its ranks are the job's
    c10d._pg_group_ranks[group] = {r: r for r in range(p)}
    return group


def gloo_group(store: Any, rank: int, p: int) -> Any:
    """Gloo as a process group DDP takes: torch 1.13's ProcessGroupGloo is one; torch 2's is a
    backend, registered for the CPU in a ProcessGroup as init_process_group does."""
    backend = dist.ProcessGroupGloo(store, rank, p, timedelta(seconds=30))
    if isinstance(backend, dist.ProcessGroup):
        return backend
    group = dist.ProcessGroup(store, rank, p)
    gloo = dist.ProcessGroup.BackendType.GLOO
    group._set_default_backend(gloo)
    group._register_backend(torch.device("cpu"), gloo, backend)
    return group


def run_groups(p: int, fn: Callable[[Any], Any], backend: str = "rxelab", *,
               deadline: float = 90, keep_errors: bool = False, **options: Any) -> list[Any]:
    _fabric.FABRIC.reset(seed=0, max_delay=0.0002)
    store = dist.HashStore()
    # no rank lets go of its group before every rank is done with its own, as a job ends
    # with a barrier: a Gloo group destroyed while a peer's last send to it was on its way
    # aborted the whole process (SIGABRT in a rank thread, about 1 run in 20 of the DDP tests)
    done = threading.Barrier(p)

    def rank(r: int) -> Any:
        group = make_group(backend, store, r, p, **options)
        try:
            return fn(group)
        finally:
            try:  # half the deadline: a rank held here by a hung one is not named with it
                done.wait(deadline / 2)
            except threading.BrokenBarrierError:
                pass  # a rank that never came: the deadline names it
            c10d._pg_group_ranks.pop(group, None)
            if hasattr(group, "close"):
                group.close()
    return in_threads(p, rank, deadline, keep_errors)


@contextmanager
def environ(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

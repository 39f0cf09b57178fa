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
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from pyverbs import _fabric

from tests.unit.fakejob import RankFailed


def make_group(backend: str, store: Any, rank: int, p: int, **options: Any) -> Any:
    if backend == "rxelab":
        group = rt.new_group(store, rank, p, timedelta(seconds=30),
                             rt.Options(**options) if options else None)
    else:
        group = dist.ProcessGroupGloo(store, rank, p, timedelta(seconds=30))
    # torch's calls that name a rank (broadcast's src, send's dst) look the group up here;
    # each thread's group is the whole job, so its ranks are the job's
    c10d._pg_group_ranks[group] = {r: r for r in range(p)}
    return group


def run_groups(p: int, fn: Callable[[Any], Any], backend: str = "rxelab", *,
               deadline: float = 90, keep_errors: bool = False, **options: Any) -> list[Any]:
    _fabric.FABRIC.reset(seed=0, max_delay=0.0002)
    store = dist.HashStore()
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}

    def rank(r: int) -> None:
        group = None
        try:
            group = make_group(backend, store, r, p, **options)
            results[r] = fn(group)
        except BaseException as err:  # reported per rank
            errors[r] = err
        finally:
            if group is not None:
                c10d._pg_group_ranks.pop(group, None)
                if hasattr(group, "close"):
                    group.close()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True, name=f"rank{r}")
               for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline)
    hung = [t.name for t in threads if t.is_alive()]
    if hung:
        raise AssertionError(f"{', '.join(hung)} still running after {deadline} s")
    if errors and not keep_errors:
        raise RankFailed(errors)
    return [results.get(r, errors.get(r)) for r in range(p)]


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

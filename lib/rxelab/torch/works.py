"""torch's Work for the library's requests. A torch collective returns a Work at once; with
async_op=False torch waits on it itself. Every call is started on the communicator's progress
thread (rxelab.requests), and its Work is torch's own, made from a torch Future
(`_create_work_from_future`): a Python subclass of Work is not kept alive by the C++ side
that waits on it (DDP's reducer), so its overrides can vanish under a waiter.

The Future is completed on a thread of its own, not the progress thread: callbacks chained on
it (DDP's reducer, communication hooks) may start the next collective, which must not wait
behind the request that is finishing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch._C._distributed_c10d import _create_work_from_future

from rxelab.requests import Request


def finished(value: Any) -> Any:
    """The Work of a call that is done already (barrier, send, recv)."""
    fut: torch.futures.Future[Any] = torch.futures.Future()
    fut.set_result(value)
    return _create_work_from_future(fut)


class Completions:
    """One thread that completes a group's torch Futures, in the order their requests end."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rxelab-torch")
        self._lock = threading.Lock()
        self._closed = False

    def work(self, request: Request, value: Any, after: Callable[[], None] | None = None) -> Any:
        """A Work that completes with `value` once `request` is done and `after` (copying
        results out of a staging buffer, scaling an average) ran; with the request's error
        (or after's) if either failed."""
        fut: torch.futures.Future[Any] = torch.futures.Future()

        def complete() -> None:
            try:
                request.wait()
                if after is not None:
                    after()
            except BaseException as err:  # the waiter gets it
                fut.set_exception(err)
                return
            fut.set_result(value)

        def ended(_: Request) -> None:
            with self._lock:
                if not self._closed:
                    self._pool.submit(complete)
                    return
            complete()

        request.when_done(ended)
        return _create_work_from_future(fut)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)

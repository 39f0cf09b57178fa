"""torch's Work for the library's requests. A torch collective returns a Work at once; with
async_op=False torch waits on it itself, and DDP's reducer takes its future. Every call is
started on the communicator's progress thread (rxelab.requests).

Two traps of torch 1.13 shape this module:
- A Work made from a future (`_create_work_from_future`) never raises from wait(), and a
  Python future's set_exception() only stores the exception as its value: a failed call would
  look done. So the future a Work hands out is a then() of the one completed here, whose
  callback raises: torch marks that one failed, for DDP's reducer and for get_future()'s users,
  and our Work's wait() raises the library's own error.
- A Python Work's overrides live only as long as its Python object, and C++ callers (DDP's
  reducer, _broadcast_coalesced) hold the C++ side alone: once the object is gone, their wait()
  would block forever in the base class. So each Work is kept (in OUTSTANDING) until its wait()
  ran, or its future was handed out and is done.

Futures are completed on threads of their own, not the progress thread: callbacks chained on
them (DDP's reducer, communication hooks) may start the next collective, which must not wait
behind the request that is finishing. More than one: a callback may also wait for that next
collective (PowerSGD's hook does), which one completion thread would then never complete.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist

from rxelab.requests import Request

_OK, _FAILED = "ok", "failed"
# Callbacks that wait for a further collective each hold a thread until it completes: this
# many may wait at once (threads are made as they are needed).
COMPLETION_THREADS = 8
OUTSTANDING: set[Work] = set()  # Works C++ may still call into (see the module's docstring)
_LOCK = threading.Lock()
_COMPLETING = threading.local()  # set on a completion thread while it completes a Work


def in_callback() -> bool:
    """Whether this thread is completing a Work: callbacks chained on its future run here."""
    return bool(getattr(_COMPLETING, "now", False))


def _unwrap(fut: Any) -> Any:
    """then()'s callback: the value, or the library's error raised (torch fails the future)."""
    kind, payload = fut.value()
    if kind == _FAILED:
        raise payload
    return payload


class Work(dist._Work):
    """One call's Work: done when the library is, its error raised by wait()."""

    def __init__(self, value_if_done: Any = None, done: bool = False) -> None:
        super().__init__()
        self._base: torch.futures.Future[Any] = torch.futures.Future()
        self._future = self._base.then(_unwrap)
        self._error: BaseException | None = None
        self._handed_out = False
        with _LOCK:
            OUTSTANDING.add(self)
        if done:
            self.complete(value_if_done)

    def complete(self, value: Any, error: BaseException | None = None) -> None:
        self._error = error
        self._base.set_result((_FAILED, error) if error is not None else (_OK, value))
        if self._handed_out:
            self._release()

    # ---- torch's Work -----------------------------------------------------------------
    def wait(self, timeout: Any = None) -> bool:
        try:
            try:
                self._future.wait()  # then() ran too: a waiter sees the future done
            except RuntimeError:  # torch's wrapping of the error raised just below
                pass
            if self._error is not None:
                raise self._error
            return True
        finally:
            self._release()

    def get_future(self) -> Any:
        self._handed_out = True
        if self._base.done():
            self._release()
        return self._future

    def is_completed(self) -> bool:
        return bool(self._base.done())

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Any:
        return self._error

    def result(self) -> Any:
        self.wait()
        value = self._future.value()
        return value if isinstance(value, list) else [value]

    def _release(self) -> None:
        with _LOCK:
            OUTSTANDING.discard(self)


def finished(value: Any) -> Work:
    """The Work of a call that is done already (barrier, send, recv)."""
    return Work(value, done=True)


def all_of(works: list[Work], value: Any) -> Work:
    """One Work for several calls (the *_coalesced ones): done when every one is, failed
    with the first error among them."""
    together = Work()
    if not works:
        together.complete(value)
        return together
    left = [len(works)]
    lock = threading.Lock()

    def one_done(_: Any) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        together.complete(value, next((w._error for w in works if w._error is not None), None))

    for w in works:
        w.get_future()  # nobody waits on the parts themselves: let them go once done
        w._base.add_done_callback(one_done)
    return together


class Completions:
    """The threads that complete a group's Works, as their requests end."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(COMPLETION_THREADS, thread_name_prefix="rxelab-torch")
        self._lock = threading.Lock()
        self._closed = False

    def work(self, request: Request, value: Any, after: Callable[[], None] | None = None) -> Work:
        """A Work that completes with `value` once `request` is done and `after` (copying
        results out of a staging buffer, scaling an average) ran; with the request's error
        (or after's) if either failed."""
        work = Work()

        def complete() -> None:
            _COMPLETING.now = True
            try:
                try:
                    request.wait()
                    if after is not None:
                        after()
                except BaseException as err:  # the waiter gets it
                    work.complete(None, err)
                    return
                work.complete(value)
            finally:
                _COMPLETING.now = False

        def ended(_: Request) -> None:
            with self._lock:
                if not self._closed:
                    try:
                        self._pool.submit(complete)
                        return
                    except RuntimeError:  # the interpreter is shutting its pools down
                        pass
            complete()

        request.when_done(ended)
        return work

    def now(self, request: Request, value: Any, after: Callable[[], None] | None = None) -> Work:
        """The Work of `request`, completed here before it is returned (Options(overlap=False)):
        a callback chained on its future runs at once, in the caller's thread."""
        work = Work()
        try:
            request.wait()
            if after is not None:
                after()
        except BaseException as err:
            work.complete(None, err)
            return work
        work.complete(value)
        return work

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)

"""Nonblocking collectives (MPI's MPI_Ialltoall and friends): `req = comm.ialltoall(...)`
checks its arguments and returns at once; the collective runs on the communicator's progress
thread while the application computes; `req.test()` says whether it is done, `req.wait()`
returns its Stats (or raises what it raised).

Requests run one after another in the order they were started, which is the order MPI
requires every rank to start them in. A blocking call made while requests are pending first
waits for them, so the engine (which is not thread-safe) only ever serves one caller. The
progress thread sleeps on the completion channel while it waits for peers, so the
application's own work (numpy releases the GIL) and the communication overlap.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Request:
    def __init__(self, name: str, future: Future[Any]) -> None:
        self.name, self._future = name, future

    def test(self) -> bool:
        """Done (or failed)?"""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> Any:
        """The Stats of the collective, once it is done (its exception, if it failed)."""
        return self._future.result(timeout)

    def when_done(self, fn: Callable[[Request], None]) -> None:
        """fn(self) once it is done or failed, on the progress thread (at once if it is):
        keep fn short, it holds up the next request."""
        self._future.add_done_callback(lambda _: fn(self))


class ProgressThread:
    """One worker per communicator, started on the first request."""

    def __init__(self) -> None:
        self.work: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        self.pending = 0
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.thread: threading.Thread | None = None

    def submit(self, name: str, job: Callable[[], Any]) -> Request:
        future: Future[Any] = Future()
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._serve, name="rxelab-progress",
                                               daemon=True)
                self.thread.start()
            self.pending += 1
        self.work.put((job, future))
        return Request(name, future)

    def in_worker(self) -> bool:
        return threading.current_thread() is self.thread

    def quiesce(self) -> None:
        """From any other thread: wait until every started request has finished."""
        if not self.pending:  # the common case, on the hot path: no lock taken
            return  # (only the caller's thread raises pending, so a 0 read here stays 0)
        if self.in_worker():
            return
        with self.lock:
            while self.pending:
                self.idle.wait()

    def _serve(self) -> None:
        while True:
            item = self.work.get()
            if item is None:
                return
            job, future = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(job())
                except BaseException as err:  # handed to whoever waits
                    future.set_exception(err)
            with self.lock:
                self.pending -= 1
                self.idle.notify_all()

    def stop(self) -> None:
        """Let started requests finish (their own deadlines bound them), then end."""
        if self.thread is None:
            return
        self.quiesce()
        self.work.put(None)
        self.thread.join(timeout=5)

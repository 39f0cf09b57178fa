"""The library keeps the promises of its docs (issue 16) about who may call, on the in-memory
fabric: one call at a time on a communicator; what cannot work (point to point while requests
are pending (#11), a second thread at once) is refused at once and clearly, never corrupted or
deadlocked; one thread after another, and a close from another thread, work. Each test is named
for a defect a second reader reproduced, and failed before it was mended."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from rxelab.errors import ConfigError

from tests.unit.fakejob import run_ranks


def test_point_to_point_while_requests_are_pending_is_refused_at_once():
    """Rank 0: ialltoall then send; rank 1: recv then ialltoall - legal in MPI, a deadlock
    here (the send waited for the request, which waited for rank 1's, which waited for the
    recv): both timed out. Now the send (and any point-to-point call) refuses at once."""
    def job(comm):
        s, r = np.ones(8, np.uint8), np.zeros(8, np.uint8)
        if comm.rank == 0:
            req = comm.ialltoall(s, r)
            started = time.monotonic()
            with pytest.raises(ConfigError, match="pending"):
                comm.send(np.ones(4, np.uint8), 1)
            took = time.monotonic() - started
            req.wait(10)
            comm.send(np.ones(4, np.uint8), 1)
            return took
        x = np.zeros(4, np.uint8)
        req = comm.ialltoall(s, r)
        req.wait(10)
        comm.recv(x, 0)
        return int(x.sum())
    took, got = run_ranks(2, job, timeout=5)
    assert took < 1 and got == 4


def test_two_threads_at_once_on_one_communicator_are_refused_not_corrupted():
    """Before: silently wrong sums (12,288 wrong elements per thread in one run) or stalls."""
    def job(comm):
        errors: list[BaseException] = []
        wrong = [0]
        go = threading.Barrier(2)

        def worker() -> None:
            x = np.full(4096, comm.rank + 1.0)
            y = np.zeros(4096)
            go.wait()
            try:
                for _ in range(20):
                    comm.allreduce(x, y)
                    wrong[0] += int(np.count_nonzero(y != 3.0))
            except BaseException as err:  # every way it can end is looked at
                errors.append(err)

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return wrong[0], [str(e) for e in errors]
    out = run_ranks(2, job, timeout=10, keep_errors=True)
    for got in out:
        assert not isinstance(got, BaseException), got
        wrong, errors = got
        assert wrong == 0, "no wrong data, ever"
        assert errors and all("another thread" in e for e in errors), errors


def test_one_thread_after_another_is_fine():
    def job(comm):
        out = []

        def call() -> None:
            y = np.zeros(8)
            comm.allreduce(np.ones(8), y)
            out.append(float(y[0]))
        for _ in range(3):
            t = threading.Thread(target=call)
            t.start()
            t.join(10)
        return out
    assert run_ranks(2, job) == [[2.0] * 3] * 2


def test_a_thread_cannot_slip_a_request_in_while_another_starts_a_call():
    """The claim is taken before anything else: a second thread's start() while the first is
    between the start of its call and its work is refused (it ran beside it on one engine)."""
    def job(comm):
        entered, refused = threading.Event(), []
        real = comm.progress.quiesce

        def slow_quiesce():
            if threading.current_thread().name == "first":
                entered.set()
                time.sleep(0.3)  # the first thread is inside its call, before its work
            real()

        comm.progress.quiesce = slow_quiesce

        def first() -> None:
            comm.allreduce(np.ones(8), np.zeros(8))

        t = threading.Thread(target=first, name="first")
        t.start()
        entered.wait(10)
        try:
            comm.start("allreduce", np.ones(8), np.zeros(8)).wait(10)
        except ConfigError as err:
            refused.append(str(err))
        t.join(10)
        return refused
    for refused in run_ranks(2, job, timeout=5):
        assert refused and "another thread" in refused[0], refused


def test_close_from_another_thread_waits_for_the_call_inside():
    def job(comm):
        results = []

        def call() -> None:
            y = np.zeros(1 << 16)
            comm.allreduce(np.ones(1 << 16), y)
            results.append(float(y[0]))

        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.05)
        comm.close()
        t.join(10)
        return results
    assert run_ranks(2, job, max_delay=0.002) == [[2.0], [2.0]]

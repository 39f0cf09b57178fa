"""The library keeps the promises of its docs (issue 16) about memory, on the in-memory
fabric: registrations stay right for views and exposed buffers and are let go of (#2, #7, #8);
pin_limit is kept before anything is posted; peak_inflight counts a call's own blocks; after a
rank gave up nobody writes into its memory (#1); a one-sided write needs no slot of the
target's. Each test is named for a defect a second reader reproduced, and failed before it was
mended."""

from __future__ import annotations

import time

import numpy as np
import pytest
import rxelab
from rxelab.errors import ConfigError, PeerError

from tests.unit.fakejob import run_ranks


def test_an_exposed_buffer_keeps_its_registration_when_a_view_of_it_is_used():
    """expose(t) then bcast(t[:]): the registry replaced the exposed entry (same address,
    another object); the peer's write then failed with a remote access error, both QPs died."""
    def job(comm):
        t = np.zeros(64, np.uint8)
        other = 1 - comm.rank
        comm.expose(t, other)
        target = comm.remote(other)
        comm.bcast(t[:], root=0)  # rendezvous: registers the view
        comm.barrier()
        comm.write(np.full(64, 7 + comm.rank, np.uint8), target)
        comm.barrier()
        return int(t[0])
    assert run_ranks(2, job, eager_limit=0) == [8, 7]


def test_reductions_let_go_of_buffers_the_application_dropped():
    """A fresh 1 MiB buffer per call: allreduce and reduce_scatter kept 8 receive buffers, 8
    plans and 17.4 MB pinned (views of the buffers in the plan defeated the refcount test)."""
    import gc

    def job(comm):
        for _ in range(12):
            x = np.ones(1 << 18, np.float32)
            comm.allreduce(x, np.zeros_like(x))
            comm.reduce_scatter(x, np.zeros((1 << 18) // comm.size, np.float32))
        gc.collect()
        return len(comm.plans), comm.registry.pinned
    for plans, pinned in run_ranks(2, job, eager_limit=0):
        assert plans <= 4 and pinned < 12 << 20, (plans, pinned)


def test_pin_limit_with_an_exposed_buffer_refuses_a_kept_plan_before_anything_is_posted():
    """A plan checked against pin_limit, then expose() pinned more: the next call on the kept
    plan failed mid-call and killed both communicators. Now it is refused up front."""
    def job(comm):
        p = comm.size
        s, r = np.ones(p * 60000, np.uint8), np.zeros(p * 60000, np.uint8)
        comm.alltoall(s, r, algorithm="parallel")  # plan kept; fits alone
        big = np.zeros(150_000, np.uint8)
        comm.expose(big, 1 - comm.rank)
        comm.remote(1 - comm.rank)
        with pytest.raises(ConfigError, match="pin_limit"):
            comm.alltoall(s, r, algorithm="parallel")
        assert comm.failed is None
        small = np.zeros(p * 8, np.uint8)
        comm.alltoall(np.ones(p * 8, np.uint8), small)  # still usable
        return int(small.sum())
    assert run_ranks(2, job, eager_limit=1024, pin_limit=400_000, slots=8, timeout=5) == [16, 16]


def test_peak_inflight_counts_eager_blocks_too():
    def job(comm):
        p = comm.size
        return comm.alltoall(np.ones(p * 64, np.uint8), np.zeros(p * 64, np.uint8),
                             algorithm="parallel").peak_inflight
    assert all(x >= 64 for x in run_ranks(3, job))


@pytest.mark.slow
@pytest.mark.parametrize("aborts_first", [True, False])
def test_a_late_writer_cannot_touch_a_buffer_whose_receiver_gave_up(aborts_first, monkeypatch):
    """rank 1's recv times out and the application reuses the buffer; rank 0's send comes
    late. Before, the late rendezvous write still landed (all of it): the ready-to-receive
    notice and the abort came in one poll, and the failed rank's registrations stayed open.
    Now the waiter sees the abort before its ready-to-receive, and the receiver's memory is
    closed to peers the moment it fails (tested both ways: with the abort notices lost too)."""
    if not aborts_first:  # the abort never arrives: only the closed registration protects
        from rxelab import engine
        monkeypatch.setattr(engine.Engine, "post_aborts", lambda self, *a, **k: [])
        from rxelab.control import plane
        monkeypatch.setattr(plane.ControlPlane, "abort", lambda self, *a, **k: None)

    def job(comm):
        buf = np.zeros(64, np.uint8)
        if comm.rank == 1:
            with pytest.raises(PeerError, match="no progress"):
                comm.recv(buf, 0)
            buf[:] = 0x55  # the application reuses its buffer
            time.sleep(2.5)  # while rank 0's late send happens
            return buf.tolist()
        time.sleep(1.5)
        try:
            comm.send(np.full(64, 0xAA, np.uint8), 1)
            return "sent"
        except rxelab.RdmaError as err:
            return type(err).__name__
    out = run_ranks(2, job, timeout=1, eager_limit=0, keep_errors=True)
    assert out[1] == [0x55] * 64, "the late write landed in a buffer the application reused"
    assert out[0] != "sent"


def test_a_long_one_sided_write_reaches_a_target_that_is_not_polling():
    """Progress notices take the receiver's slots; a one-sided target in a barrier does not
    poll, so the writer stalled once they ran out. One-sided writes carry none."""
    def job(comm):
        n = 65536
        if comm.rank == 1:
            buf = np.zeros(n, np.uint8)
            comm.expose(buf, 0)
            comm.barrier()
            comm.barrier()  # rank 0 writes before this one (a put and a fence)
            comm.wait_imm(0, 5, n)
            return int(buf.min())
        target = comm.remote(1)
        comm.barrier()
        comm.write(np.full(n, 9, np.uint8), target, imm=5)
        comm.barrier()
        return "wrote"
    assert run_ranks(2, job, timeout=3, slots=4, window=1024, chunk=1024, eager_limit=0) == \
        ["wrote", 9]


def test_peak_inflight_is_the_calls_own():
    """Earlier calls' unacknowledged eager blocks stayed counted into a later call's peak."""
    def job(comm):
        p = comm.size
        for _ in range(3):
            comm.alltoall(np.ones(p * 64, np.uint8), np.zeros(p * 64, np.uint8), algorithm="parallel")
        return comm.bcast(np.zeros(0, np.uint8)).peak_inflight
    assert run_ranks(3, job) == [0, 0, 0]

"""What goes wrong around the edges, on the in-memory fabric: every fault ends in a clear
error naming who and what, at once or within the no-progress deadline; nothing hangs,
nothing is silently corrupted, a communicator that failed refuses further work."""

from __future__ import annotations

import time

import numpy as np
import pytest
import rxelab
from pyverbs import _fabric
from rxelab.errors import ClosedError, ConfigError, PeerError, ProtocolError

from tests.unit.fakejob import die, run_ranks


def test_a_dead_peer_is_named_by_its_closed_connection_long_before_the_timeout():
    def job(comm):
        if comm.rank == 2:
            comm.barrier()
            die(comm)
            return None
        started = time.monotonic()
        with pytest.raises(PeerError) as err:
            # rank 2 may be gone before a survivor's barrier returns (the death is relayed at
            # once, whatever a rank is doing): that too is the dead peer named
            comm.barrier()
            for _ in range(50):
                comm.alltoall(np.zeros(3 * 8192, np.uint8), np.zeros(3 * 8192, np.uint8))
        return str(err.value), time.monotonic() - started
    out = run_ranks(3, job, timeout=30)
    for message, took in out[:2]:
        assert "rank 2" in message, message
        assert took < 5, f"found after {took:.1f} s, the timeout is 30 s"


@pytest.mark.slow
def test_a_hung_peer_ends_in_a_no_progress_error_naming_what_was_awaited():
    def job(comm):
        comm.barrier()
        if comm.rank == 1:
            time.sleep(4)  # alive (socket open) but silent
            return None
        with pytest.raises(PeerError) as err:
            comm.alltoall(np.zeros(3 * 64, np.uint8), np.zeros(3 * 64, np.uint8), "parallel")
        return str(err.value)
    out = run_ranks(3, job, timeout=1.5, keep_errors=True)
    for message in (out[0], out[2]):  # found by itself, or told by the other that found it
        assert "no progress for 1.5 s" in message or "no progress from rank 1" in message, message
        assert "rank 1" in message, message


def test_a_slow_transfer_that_moves_is_not_cut_off():
    """64 one-KiB chunks, one in flight at a time, ~30 ms each: ~2 s in all, with a 1 s
    no-progress deadline (a total-wait deadline killed this)."""
    def job(comm):
        send = np.arange(2 * 65536, dtype=np.uint32).astype(np.uint8)
        recv = np.zeros_like(send)
        comm.alltoall(send, recv, algorithm="parallel")
        return int(recv.sum())
    out = run_ranks(2, job, timeout=1.0, max_delay=0.06, chunk=1024, window=1024)
    assert out[0] > 0 and out[1] > 0


@pytest.mark.parametrize("sent, expected", [(5, 9), (9, 5), (5000, 9000), (9000, 5000),
                                            (100, 5000), (5000, 100)],
                         ids=["eager<", "eager>", "rdv<", "rdv>", "mixed<", "mixed>"])
def test_alltoallv_count_mismatch_names_both_ranks_and_counts_at_once(sent, expected):
    """The receiver knows at once (the eager block's size, or the sender's ready-to-send
    notice); the sender either fails too or, if its part was done, its next call does."""
    def job(comm):
        r = comm.rank
        sc = [4, sent] if r == 0 else [4, 4]  # rank 0 sends `sent` bytes to rank 1 ...
        rc = [expected, 4] if r == 1 else [4, 4]  # ... which expects `expected`
        started = time.monotonic()
        try:
            comm.alltoallv(np.zeros(sum(sc), np.uint8), sc, np.zeros(sum(rc), np.uint8), rc,
                           algorithm="pairwise")
            comm.barrier()
            comm.alltoall(np.zeros(2, np.uint8), np.zeros(2, np.uint8))
        except rxelab.RdmaError as err:
            return str(err), time.monotonic() - started
        return "no error", 0
    (m0, t0), (m1, t1) = run_ranks(2, job, timeout=20)
    assert f"rank 0 sends {sent} bytes to this rank, which expects {expected}" in m1 or \
        f"rank 1 expects {expected} bytes from rank 0, which has {sent}" in m1, m1
    assert "rank 1" in m0, m0
    assert max(t0, t1) < 5, "detected at once, not at the 20 s timeout"


def test_an_exception_mid_collective_fails_the_communicator_and_tells_the_peers():
    def job(comm):
        if comm.rank == 1:
            real = comm.engine.send_eager

            def interrupted(*a, **k):
                comm.engine.send_eager = real
                raise KeyboardInterrupt
            comm.engine.send_eager = interrupted
        send = np.zeros(3 * 16, np.uint8)
        recv = np.zeros_like(send)
        started = time.monotonic()
        try:
            comm.alltoall(send, recv, algorithm="parallel")
            first = "no error"
        except (KeyboardInterrupt, PeerError) as err:
            first = type(err).__name__ + ": " + str(err)
        with pytest.raises(ClosedError, match="failed earlier"):
            comm.alltoall(send, recv)
        return first, time.monotonic() - started
    out = run_ranks(3, job, timeout=20)
    assert out[1][0].startswith("KeyboardInterrupt")
    for first, took in (out[0], out[2]):
        assert first.startswith("PeerError") and "rank 1 stopped" in first, first
        assert took < 5


def test_overlapping_buffers_are_refused_and_the_communicator_stays_usable():
    def job(comm):
        x = np.zeros(comm.size * 8, np.uint8)
        with pytest.raises(ConfigError, match="overlap"):
            comm.alltoall(x, x)
        with pytest.raises(ConfigError, match="overlap"):
            comm.alltoall(x[:comm.size * 4], x[comm.size * 2:comm.size * 6])
        y = np.zeros_like(x)
        comm.alltoall(np.full_like(x, comm.rank + 1), y)
        return y.tolist()
    out = run_ranks(2, job)
    assert out[0] == [1] * 8 + [2] * 8


def test_pin_limit_refuses_a_call_too_big_and_never_evicts_what_a_call_uses():
    def job(comm):
        p = comm.size
        with pytest.raises(ConfigError, match="pin_limit=200000"):
            comm.alltoall(np.zeros(p * 80000, np.uint8), np.zeros(p * 80000, np.uint8))
        bad = 0
        for k in range(6):  # fresh 40 KiB rendezvous buffers: together far beyond the limit
            send = np.full(p * 20000, k + comm.rank, np.uint8)
            recv = np.zeros_like(send)
            comm.alltoall(send, recv, algorithm="parallel")
            want = np.concatenate([np.full(20000, k + s, np.uint8) for s in range(p)])
            bad += int(np.count_nonzero(recv != want))
        return bad, comm.registry.pinned
    out = run_ranks(2, job, pin_limit=200_000, eager_limit=1024, slots=8)
    for bad, pinned in out:
        assert bad == 0 and pinned <= 200_000


def test_buffers_dropped_by_the_application_are_let_go():
    def job(comm):
        for _ in range(20):  # a fresh buffer every call, like the seed's demo did
            send = np.ones(2 * 10000, np.uint8)
            comm.alltoall(send, np.zeros_like(send), algorithm="parallel")
        return len(comm.registry.entries), comm.registry.registrations
    for entries, registrations in run_ranks(2, job, eager_limit=1024):
        assert registrations >= 20 and entries <= 4, (entries, registrations)


def test_close_right_after_a_sequential_collective_delivers_its_last_token():
    def job(comm):
        recv = np.zeros(comm.size * 16, np.uint8)
        comm.allgather(np.full(16, comm.rank, np.uint8), recv, algorithm="sequential")
        return recv.tolist()  # and the with-block closes at once
    out = run_ranks(4, job, max_delay=0.01, timeout=10)
    assert all(r == sum(([k] * 16 for k in range(4)), []) for r in out)


def test_a_rank_that_closes_late_still_drains_into_live_peers(monkeypatch):
    """Rank 0 lingers after the last collective (it prints results, say) while the others
    close at once: their QPs must stay up until rank 0 has drained what it sent them, or its
    flush never completes (on rxe: it waits out its drain bound, 10 s, at every job's end)."""
    from rxelab import engine

    drained: dict[int, object] = {}
    real = engine.Engine.drain

    def spy(self, seconds):
        rank = next(iter(set(range(len(self.conns) + 1)) - set(self.conns)))
        try:
            drained[rank] = real(self, seconds)
        except Exception as err:  # recorded for the assertion
            drained[rank] = err
            raise
        return drained[rank]

    monkeypatch.setattr(engine.Engine, "drain", spy)

    def job(comm):
        recv = np.zeros(comm.size * 1024, np.uint8)
        for _ in range(5):
            comm.alltoall(np.full(comm.size * 1024, comm.rank, np.uint8), recv,
                          algorithm="sequential")
        if comm.rank == 0:
            time.sleep(0.5)
        return recv[::1024].tolist()
    out = run_ranks(3, job, timeout=10)
    assert out == [[0, 1, 2]] * 3
    assert drained == {0: True, 1: True, 2: True}, drained


def test_numpy_counts_object_dtypes_and_repeated_immediates():
    def job(comm):
        r, p = comm.rank, comm.size
        counts = np.bincount([0, 1, 1], minlength=p)  # numpy integers
        send = np.arange(int(counts.sum()), dtype=np.uint8)
        recv = np.zeros(int(counts[r]) * p, np.uint8)
        comm.alltoallv(send, counts, recv, [int(counts[r])] * p)
        with pytest.raises(ConfigError, match="Python objects"):
            comm.alltoall(np.array([None] * p, dtype=object), np.zeros(p, np.uint8))
        target = np.zeros(16, np.uint8)
        comm.expose(target, 1 - r)
        remote = comm.remote(1 - r)
        comm.write(np.full(8, 1, np.uint8), remote, offset=0, imm=5)
        comm.write(np.full(8, 2, np.uint8), remote, offset=8, imm=5)
        comm.wait_imm(1 - r, 5, 8)
        comm.wait_imm(1 - r, 5, 8)  # the second write with the same immediate is its own
        comm.barrier()
        return target.tolist()
    assert run_ranks(2, job) == [[1] * 8 + [2] * 8] * 2


def test_work_requests_never_share_an_sge_with_pyverbs():
    run_ranks(3, lambda comm: comm.alltoall(np.zeros(3 * 9000, np.uint8),
                                            np.zeros(3 * 9000, np.uint8)))
    assert _fabric.FABRIC.stats.aliased_sges == 0


def test_control_messages_are_checked(monkeypatch):
    def job(comm):
        if comm.rank == 0:  # a control message of another version
            from rxelab import engine
            monkeypatch.setattr(engine, "CTRL_VERSION", 9)
            comm.engine.send_ctrl(1, engine.TOKEN, 1)
            monkeypatch.setattr(engine, "CTRL_VERSION", 1)
            return None
        with pytest.raises(ProtocolError, match="version 9 from rank 0"):
            comm.engine.wait(lambda: False, "anything")
        return "refused"
    assert run_ranks(2, job, keep_errors=True)[1] == "refused"


def test_a_blocking_call_after_a_request_waits_its_turn_on_every_rank():
    """The blocking call takes its call number only after started requests finished; a rank
    that reaches it sooner must not give it the request's number (then both hang)."""
    def job(comm):
        x, y = np.ones(64), np.zeros(64)
        a, b = np.full(64, 2.0), np.zeros(64)
        req = comm.iallreduce(x, y)
        if comm.rank == 0:
            time.sleep(0.2)
        comm.allreduce(a, b)
        req.wait(10)
        return float(y[0]), float(b[0])
    assert run_ranks(2, job, timeout=3, deadline=30) == [(2.0, 4.0)] * 2


def test_alltoallv_notices_are_consumed_so_counts_may_change_when_call_numbers_repeat():
    """Every ready-to-send notice is taken with its data; a stale one would later be compared
    with another call's count (call numbers wrap after 16384 calls)."""
    def job(comm):
        p = comm.size
        s, r = np.ones(64 * p, np.uint8), np.zeros(64 * p, np.uint8)
        for _ in range(10):
            comm.seq = 0  # as after 16384 calls
            comm.alltoallv(s, [64] * p, r, [64] * p, algorithm="parallel")
            comm.barrier()
            comm.seq = 0
            comm.alltoallv(s[:8 * p], [8] * p, r[:8 * p], [8] * p, algorithm="parallel")
            comm.barrier()
        return len(comm.engine.box.rts)
    assert run_ranks(4, job, eager_limit=16, max_delay=0.0005) == [0] * 4


def test_pin_limit_counts_a_reduction_s_scratch_before_anything_is_sent():
    def job(comm):
        with pytest.raises(ConfigError, match="pin_limit"):
            comm.reduce_scatter(np.ones(2 * 16384, np.float32), np.zeros(16384, np.float32))
        assert comm.failed is None
        small = np.zeros(16, np.float32)
        comm.reduce_scatter(np.ones(32, np.float32), small)  # still usable
        return float(small[0])
    assert run_ranks(2, job, eager_limit=0, pin_limit=8192 + 220 * 1024, timeout=5) == [2.0] * 2


def test_a_plan_stays_while_the_application_holds_its_buffer_and_a_tiny_send_depth_works():
    def job(comm):
        b = np.ones(16, np.uint8)
        comm.bcast(b)
        comm.allgather(np.ones(8, np.uint8), np.zeros(8 * comm.size, np.uint8))
        kept = sorted(k[0] for k in comm.plans)
        r = np.zeros(4 * comm.size, np.uint8)
        for _ in range(30):  # many unsignaled sends in a row, two allowed outstanding
            comm.alltoall(np.full(4 * comm.size, comm.rank, np.uint8), r, algorithm="parallel")
        return kept, r[::4].tolist()
    out = run_ranks(3, job, send_depth=2, timeout=5)
    assert out == [(["allgather", "bcast"], [0, 1, 2])] * 3


def test_the_peers_are_watched_while_unrelated_completions_keep_coming():
    """A rank waiting for a dead peer's block while its other transfers keep completing still
    looks at the control connections every WATCH_EVERY seconds (that is how a dead process is
    noticed before the no-progress deadline)."""
    import itertools

    from rxelab.engine import WATCH_EVERY, Engine

    class Looked(Exception):
        pass

    def watch():
        raise Looked

    eng = Engine(None, {}, timeout=30, window=1, chunk=1, send_depth=1, watch=watch)
    completions = itertools.cycle([True, False])  # something completes every other poll
    eng.progress = lambda: next(completions)  # type: ignore[method-assign]
    eng._block = lambda seconds: time.sleep(0.002)  # type: ignore[method-assign]
    start = time.monotonic()
    with pytest.raises(Looked):
        eng.wait(lambda: time.monotonic() - start > 3, "a block from a dead peer")
    assert time.monotonic() - start < WATCH_EVERY + 1

"""The library keeps every promise of its README (issue 16), on the in-memory fabric. Each test
is named for a defect a second reader reproduced, and failed before it was mended."""

from __future__ import annotations

import math
import re
import threading
import time

import numpy as np
import pytest
import rxelab
from rxelab import settings
from rxelab.errors import ClosedError, ConfigError, PeerError

from infra.config import REPO
from tests.unit.fakejob import die, run_ranks, settle


# ---- settings: one table -------------------------------------------------------------------
def test_the_readme_lists_the_options_of_init_as_the_table_declares_them():
    assert settings.markdown_table() in (REPO / "README.md").read_text()


@pytest.mark.parametrize("option, value", [
    ("slots", 0), ("slots", -1), ("send_depth", 0), ("timeout", math.inf), ("timeout", math.nan),
    ("timeout", 0), ("timeout", "60"), ("eager_limit", True), ("window", 1.5), ("chunk", None),
    ("qp_timeout", 32), ("retry_cnt", 8), ("pin_limit", 10),
])
def test_every_option_of_init_is_checked_and_named(option, value):
    """#10: slots=0 gave a raw PyverbsRDMAError, send_depth=0 a later 'no progress',
    timeout=inf an OverflowError, timeout=nan a hang."""
    with pytest.raises(ConfigError, match=f"^{option}="):
        rxelab.init(0, 1, device="fake0", **{option: value})


def test_numpy_numbers_are_numbers():
    assert settings.resolve({"slots": np.int64(8), "timeout": np.float32(2.5)}) ["slots"] == 8


def test_an_unknown_option_is_named():
    with pytest.raises(ConfigError, match="unknown option eagerlimit"):
        rxelab.init(0, 1, device="fake0", eagerlimit=0)


def test_ranks_that_disagree_on_a_shared_option_all_fail_at_init_naming_it():
    def job(comm):
        return "started"

    def rank_options(r: int) -> dict[str, int]:
        return {"eager_limit": 65536 if r == 2 else 4096}

    out = run_ranks(3, job, keep_errors=True, per_rank=rank_options)
    for r, err in enumerate(out):
        assert isinstance(err, rxelab.RdmaError), (r, err)
        assert "rank 2 has eager_limit=65536, rank 0 has eager_limit=4096" in str(err), (r, err)


def test_bench_prints_every_setting_as_nccl_tests_does():
    from rxelab import bench

    class Comm:
        size, options = 2, settings.resolve({"eager_limit": 0})
        dev = type("Dev", (), {"name": "fake0", "port": 1, "gid_index": 1, "mtu": 5})()

    line = next(x for x in bench.preamble(Comm(), type("A", (), {"iterations": 1, "warmup": 0})())
                if x.startswith("# settings"))
    for o in settings.OPTIONS:
        assert re.search(rf"\b{o.name}=", line), o.name
    assert "eager_limit=0" in line


# ---- #9: wrong errors for bad arguments -------------------------------------------------------
@pytest.mark.parametrize("call, argument", [
    (lambda c, s, r: c.alltoall(s, r, algorithm=["pairwise"]), "algorithm"),
    (lambda c, s, r: c.alltoall(s, r, algorithm={}), "algorithm"),
    (lambda c, s, r: c.allgather(s[:4], r, algorithm=3), "algorithm"),
    (lambda c, s, r: c.allreduce(s.astype(np.float32), r.astype(np.float32), op=["sum"]), "op"),
    (lambda c, s, r: c.bcast(s, root="0"), "root"),
    (lambda c, s, r: c.alltoall(s, r, algorithm="sequential", pairs=1.5), "pairs"),
])
def test_bad_argument_types_are_a_config_error_naming_the_argument(call, argument):
    def job(comm):
        s, r = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
        with pytest.raises(ConfigError, match=argument):
            call(comm, s, r)
        comm.alltoall(s, r)  # still usable
        return "ok"
    assert run_ranks(2, job) == ["ok", "ok"]


def test_numpy_integers_are_integers_for_root_pairs_and_peers():
    def job(comm):
        b = np.full(8, comm.rank, np.uint8)
        comm.bcast(b, root=np.int64(1))
        r = np.zeros(8 * comm.size, np.uint8)
        comm.allgather(np.full(8, comm.rank, np.uint8), r, algorithm="sequential",
                       pairs=np.int64(2))
        x = np.zeros(4, np.uint8)
        if comm.rank == 0:
            comm.send(np.ones(4, np.uint8), np.int64(1))
        else:
            comm.recv(x, np.int32(0))
        return int(b[0]), r[::8].tolist(), int(x.sum())
    out = run_ranks(2, job)
    assert out == [(1, [0, 1], 0), (1, [0, 1], 4)]


# ---- #12: every rank ends with the same bits ----------------------------------------------
@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_complex_products_are_bitwise_identical_on_every_rank(p):
    rng = np.random.default_rng(7)
    parts = [(rng.standard_normal(257) + 1j * rng.standard_normal(257)).astype(np.complex64)
             for _ in range(p)]

    def job(comm):
        out = np.zeros(257, np.complex64)
        comm.allreduce(parts[comm.rank], out, op="prod", algorithm="recursive-doubling")
        return out.tobytes()
    results = run_ranks(p, job)
    assert len(set(results)) == 1, "ranks disagree bitwise"


# ---- #11 and threads: what cannot work is refused at once, clearly -------------------------
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


# ---- #2, #7, #8: registrations ------------------------------------------------------------
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


# ---- #4, #5: a dead or failed rank is reported everywhere at once ---------------------------
def test_a_peer_dying_during_a_barrier_is_named_at_once_on_every_rank():
    """Before: reported after the full timeout, blaming rank 0."""
    def job(comm):
        settle(comm)
        if comm.rank == 2:
            die(comm)
            return None
        started = time.monotonic()
        with pytest.raises(PeerError) as err:
            comm.barrier()
        with pytest.raises(ClosedError):
            comm.barrier()
        return str(err.value), time.monotonic() - started
    out = run_ranks(4, job, timeout=20)
    for r in (0, 1, 3):
        message, took = out[r]
        assert "rank 2" in message and "gone" in message, message
        assert took < 3, f"rank {r} found out after {took:.1f} s"


def test_ctrl_c_in_a_barrier_fails_the_communicator_and_tells_the_peers():
    """Before: the rank stayed 'usable' and out of step (its next barrier: ProtocolError), and
    the peers waited the full timeout."""
    def job(comm):
        comm.barrier()
        if comm.rank == 1:
            real = comm.control.barrier

            def interrupted():
                comm.control.barrier = real
                raise KeyboardInterrupt
            comm.control.barrier = interrupted
            with pytest.raises(KeyboardInterrupt):
                comm.barrier()
            with pytest.raises(ClosedError, match="failed earlier"):
                comm.barrier()
            return "failed"
        started = time.monotonic()
        with pytest.raises(PeerError, match="rank 1"):
            comm.barrier()
        return time.monotonic() - started
    out = run_ranks(3, job, timeout=20)
    assert out[1] == "failed" and out[0] < 3 and out[2] < 3, out


def test_a_dead_peer_is_reported_while_rank_0_is_busy_elsewhere():
    """#5: binomial bcast at p = 4: rank 3 waits for rank 2, which dies; rank 0 (the only
    watcher of every connection) had finished its part and was not in an RDMA wait, so rank 3
    waited the full timeout. Now rank 0's reader passes the death on at once."""
    def job(comm):
        settle(comm)
        buf = np.zeros(4096, np.uint8)
        if comm.rank == 2:
            die(comm)
            return None
        if comm.rank == 0:
            comm.bcast(buf, root=0)  # done as soon as its sends are acknowledged
            time.sleep(4)  # computing: not in any wait of the library
            return "busy"
        started = time.monotonic()
        with pytest.raises(PeerError) as err:
            comm.bcast(buf, root=0)
        return str(err.value), time.monotonic() - started
    out = run_ranks(4, job, timeout=20, keep_errors=True)
    message, took = out[3]
    assert "rank 2" in message and took < 3, (message, took)


# ---- #1: after a rank gave up, nobody writes into its memory --------------------------------
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
        from rxelab import control
        monkeypatch.setattr(control.ControlPlane, "abort", lambda self, *a, **k: None)

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


# ---- #3: a slow transfer that moves is never cut off -----------------------------------------
@pytest.mark.parametrize("how", ["bcast", "send/recv"])
def test_a_slow_one_way_transfer_that_moves_is_not_cut_off(how):
    """64 one-KiB chunks, one in flight at a time, ~30 ms each: ~2 s, with a 1 s no-progress
    deadline. The receiver saw no completion until the last chunk and gave up."""
    def job(comm):
        buf = np.full(65536, comm.rank, np.uint8)
        if how == "bcast":
            comm.bcast(buf, root=0)
        elif comm.rank == 0:
            comm.send(buf, 1)
        else:
            comm.recv(buf, 0)
        return int(buf.max())
    assert run_ranks(2, job, timeout=1.0, max_delay=0.06, chunk=1024, window=1024,
                     eager_limit=0) == [0, 0]


def test_a_rank_waiting_its_turn_in_the_sequential_walk_is_not_cut_off():
    """Each pair's exchange takes ~1 s, and moves; the last pair waits ~5 s for its turn with a
    1 s no-progress deadline (it saw no completion of its own meanwhile)."""
    def job(comm):
        p = comm.size
        recv = np.zeros(p * 32768, np.uint8)
        comm.allgather(np.full(32768, comm.rank, np.uint8), recv, algorithm="sequential")
        return recv[::32768].tolist()
    out = run_ranks(4, job, timeout=1.0, max_delay=0.05, chunk=1024, window=1024, eager_limit=0,
                    deadline=120)
    assert out == [[0, 1, 2, 3]] * 4


# ---- a second reader's findings -------------------------------------------------------------
@pytest.mark.parametrize("valid, invalid", [
    (dict(pairs=2), dict(pairs=2.0)), (dict(pairs=1), dict(pairs=True)),
    (dict(pairs=1), dict(bogus=1)), (dict(pairs=1), dict(root=1)),
])
def test_a_bad_argument_is_refused_even_after_a_valid_call_on_the_same_buffers(valid, invalid):
    """The plan is found by the call's own arguments: 2.0 == 2 and True == 1 must not find it."""
    def job(comm):
        s, r = np.ones(comm.size * 8, np.uint8), np.zeros(comm.size * 8, np.uint8)
        comm.collective("alltoall", s, r, algorithm="sequential", **valid)
        with pytest.raises(ConfigError):
            comm.collective("alltoall", s, r, algorithm="sequential", **invalid)
        return "ok"
    assert run_ranks(2, job) == ["ok", "ok"]


def test_a_root_of_the_wrong_type_is_refused_after_a_valid_bcast():
    def job(comm):
        b = np.ones(8, np.uint8)
        comm.bcast(b, root=1)
        for bad in (True, 1.0):
            with pytest.raises(ConfigError, match="root"):
                comm.bcast(b, root=bad)
        return "ok"
    assert run_ranks(2, job) == ["ok", "ok"]


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


def test_a_rank_that_hangs_late_in_the_sequential_walk_is_found_in_a_few_deadlines():
    """Patience counts the pairs between a rank's last step and its turn, not those since the
    call began: at p = 6 rank 4 waited 15 deadlines for a rank that hung before their pair."""
    from rxelab.collectives import common

    real = common.Call.send_block

    def send_block(self, peer, *a, **k):
        if self.rank == 5 and peer == 4 and threading.current_thread().name.startswith("rank"):
            time.sleep(12)  # hangs, alive, before its last exchange
        return real(self, peer, *a, **k)

    def job(comm):
        p = comm.size
        started = time.monotonic()
        try:
            comm.alltoall(np.ones(p * 64, np.uint8), np.zeros(p * 64, np.uint8),
                          algorithm="sequential")
            return None
        except PeerError:
            return time.monotonic() - started
    common.Call.send_block = send_block
    try:
        out = run_ranks(6, job, timeout=1.0, keep_errors=True, deadline=60)
    finally:
        common.Call.send_block = real
    assert out[4] is not None and out[4] < 5, out


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


@pytest.mark.parametrize("call, argument", [
    (lambda c, t: c.write(np.ones(4, np.uint8), t, imm=1.5), "imm"),
    (lambda c, t: c.write(np.ones(4, np.uint8), t, offset="0"), "offset"),
    (lambda c, t: c.write(np.ones(4, np.uint8), t, offset=1.5), "offset"),
    (lambda c, t: c.wait_imm(1 - c.rank, 1 << 24, 4), "imm"),
    (lambda c, t: c.wait_imm(1 - c.rank, 5, -1), "nbytes"),
])
def test_one_sided_arguments_are_checked(call, argument):
    def job(comm):
        comm.expose(np.zeros(16, np.uint8), 1 - comm.rank)
        target = comm.remote(1 - comm.rank)
        with pytest.raises(ConfigError, match=argument):
            call(comm, target)
        comm.barrier()
        return "ok"
    assert run_ranks(2, job) == ["ok", "ok"]

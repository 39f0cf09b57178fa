"""Every collective and algorithm on the in-memory fabric (RC semantics, random delays), at
world sizes 1..8, against a numpy reference: sizes 0, 1, odd, and several chunks per message
with a window smaller than a message; float and integer dtypes; alltoallv with zero counts;
point to point and one-sided writes. The lab's tests are the truth on rxe; these are the
breadth, in seconds."""

from __future__ import annotations

import numpy as np
import pytest
import rxelab
from rxelab import ops

from tests.unit.fakejob import TRANSPORTS, over_transports, run_ranks

SIZES = [0, 1, 7, 4099]  # bytes per peer; 4099 = 5 chunks of 1 KiB with a 2 KiB window
SMALL = {"chunk": 1024, "window": 2048}


def block(src: int, dst: int, n: int, dtype=np.uint8, salt: int = 0) -> np.ndarray:
    """What rank src sends rank dst: distinct for every (src, dst, index, salt)."""
    x = (np.arange(n) * 7 + src * 31 + dst * 17 + salt * 5) % 251
    return x.astype(dtype)


def alltoall_job(algorithms, sizes, dtype=np.uint8):
    def job(comm):
        r, p = comm.rank, comm.size
        wrong = {}
        for m in sizes:
            send = np.concatenate([block(r, d, m, dtype) for d in range(p)])
            want = np.concatenate([block(s, r, m, dtype) for s in range(p)])
            for algo in algorithms:
                recv = np.full_like(want, 99)
                comm.alltoall(send, recv, algorithm=algo)
                wrong[f"alltoall/{algo}/{m}"] = int(np.count_nonzero(recv != want))
        return wrong
    return job


PROTOCOLS = pytest.mark.parametrize("eager_limit", [0, 4096], ids=["rendezvous", "eager"])


@PROTOCOLS
@over_transports(range(1, 9))
def test_alltoall_every_algorithm(p, transport, eager_limit):
    for rank_result in run_ranks(p, alltoall_job(rxelab.ALLTOALL_ALGORITHMS, SIZES), seed=p,
                                 eager_limit=eager_limit, transport=transport, **SMALL):
        assert set(rank_result.values()) == {0}, rank_result


@PROTOCOLS
@over_transports(range(1, 9))
def test_allgather_every_algorithm(p, transport, eager_limit):
    def job(comm):
        r, p = comm.rank, comm.size
        wrong = {}
        for m in SIZES:
            want = np.concatenate([block(s, s, m) for s in range(p)])
            for algo in rxelab.ALLGATHER_ALGORITHMS:
                recv = np.full_like(want, 99)
                comm.allgather(block(r, r, m), recv, algorithm=algo)
                wrong[f"allgather/{algo}/{m}"] = int(np.count_nonzero(recv != want))
        return wrong
    for rank_result in run_ranks(p, job, seed=10 + p, eager_limit=eager_limit, transport=transport,
                                 **SMALL):
        assert set(rank_result.values()) == {0}, rank_result


@PROTOCOLS
@over_transports([1, 2, 3, 5, 8])
def test_alltoallv_with_zero_and_uneven_counts(p, transport, eager_limit):
    def counts(src, dst):  # some pairs send nothing at all
        return 0 if (src + dst) % 3 == 0 else (src * 5 + dst * 3) % 11 + 1

    def job(comm):
        r, p = comm.rank, comm.size
        sc = [counts(r, d) for d in range(p)]
        rc = [counts(s, r) for s in range(p)]
        send = np.concatenate([block(r, d, c, np.float64) for d, c in enumerate(sc)])
        want = np.concatenate([block(s, r, c, np.float64) for s, c in enumerate(rc)])
        wrong = {}
        for algo in ops.COLLECTIVES["alltoallv"].algorithms:
            recv = np.full_like(want, -1.0)
            comm.alltoallv(send, sc, recv, rc, algorithm=algo)
            wrong[algo] = int(np.count_nonzero(recv != want))
        return wrong
    for rank_result in run_ranks(p, job, seed=20 + p, eager_limit=eager_limit, transport=transport,
                                 **SMALL):
        assert set(rank_result.values()) == {0}, rank_result


def test_alltoallv_takes_counts_as_any_iterable_of_whole_numbers():
    """As before alltoallv was described: a generator or map of counts is read once."""
    def job(comm):
        p = comm.size
        send, recv = np.arange(2 * p, dtype=np.int64), np.zeros(2 * p, np.int64)
        comm.alltoallv(send, (2 for _ in range(p)), recv, map(int, [2] * p))
        return recv.tolist()
    out = run_ranks(3, job, **SMALL)
    for r in range(3):
        assert out[r] == [x for s in range(3) for x in (2 * r, 2 * r + 1)], out


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.complex64])
def test_dtypes_travel_intact(dtype):
    for rank_result in run_ranks(4, alltoall_job(rxelab.ALLTOALL_ALGORITHMS, [1, 33], dtype), **SMALL):
        assert set(rank_result.values()) == {0}, rank_result


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_point_to_point_and_one_sided_writes(transport):
    def job(comm):
        r, p = comm.rank, comm.size
        right, left = (r + 1) % p, (r - 1) % p
        got = np.zeros(5000, np.uint8)
        if r % 2 == 0:
            comm.send(block(r, right, 5000), right)
            comm.recv(got, left)
        else:
            comm.recv(got, left)
            comm.send(block(r, right, 5000), right)
        target = np.zeros(100, np.uint8)
        comm.expose(target, left)
        remote = comm.remote(right)
        comm.write(block(r, right, 90), remote, offset=10, imm=7)
        comm.wait_imm(left, 7, 90)
        return (np.array_equal(got, block(left, r, 5000)),
                np.array_equal(target[10:], block(left, r, 90)) and not target[:10].any())
    assert run_ranks(4, job, transport=transport, **SMALL) == [(True, True)] * 4


def test_many_calls_in_a_row_with_longer_random_delays():
    """Reordering across QPs: tags must keep consecutive calls apart."""
    def job(comm):
        r, p = comm.rank, comm.size
        bad = 0
        for salt in range(30):
            send = np.concatenate([block(r, d, 16, salt=salt) for d in range(p)])
            want = np.concatenate([block(s, r, 16, salt=salt) for s in range(p)])
            recv = np.zeros_like(want)
            comm.alltoall(send, recv, algorithm=rxelab.ALLTOALL_ALGORITHMS[salt % 3])
            bad += int(np.count_nonzero(recv != want))
        return bad
    assert run_ranks(5, job, max_delay=0.002, seed=3) == [0] * 5


def test_every_described_algorithm_is_a_function_that_exists():
    import importlib

    from rxelab import ops
    for name, c in ops.COLLECTIVES.items():
        assert c.default in c.algorithms, name
        for algo, where in c.algorithms.items():
            module, _, function = where.partition(":")
            assert callable(getattr(importlib.import_module(module), function)), (name, algo)


REDUCE_COUNTS = [0, 1, 7, 1500]  # elements; 1500 float64 = 12000 B: several chunks by rendezvous


@PROTOCOLS
@over_transports(range(1, 6))
def test_allreduce_reduce_scatter_and_bcast_against_numpy(p, transport, eager_limit):
    from rxelab import ops

    def job(comm):
        r, wrong = comm.rank, {}
        for count in REDUCE_COUNTS:
            for dtype, op in (("float64", "sum"), ("int32", "prod"), ("float32", "min"),
                              ("int64", "max")):
                for algo in ops.COLLECTIVES["allreduce"].algorithms:
                    send, want = ops.COLLECTIVES["allreduce"].data(r, p, count, dtype, 2, op)
                    got = np.full_like(want, 99)
                    comm.allreduce(send, got, op=op, algorithm=algo)
                    wrong[f"allreduce/{algo}/{op}/{dtype}/{count}"] = int((got != want).sum())
                    comm.allreduce(send, send, op=op, algorithm=algo)  # in place
                    wrong[f"allreduce/{algo}/in-place/{count}"] = int((send != want).sum())
                send, want = ops.COLLECTIVES["reduce_scatter"].data(r, p, count, dtype, 3, op)
                got = np.full_like(want, 99)
                comm.reduce_scatter(send, got, op=op)
                wrong[f"reduce_scatter/{op}/{dtype}/{count}"] = int((got != want).sum())
            for algo in ops.COLLECTIVES["bcast"].algorithms:
                for root in {0, p - 1, p // 2}:
                    want = ops.block(root, 0, count, "float64", 4)
                    buf = want.copy() if r == root else np.zeros(count)
                    comm.bcast(buf, root=root, algorithm=algo)
                    wrong[f"bcast/{algo}/root{root}/{count}"] = int((buf != want).sum())
        return wrong
    for rank_result in run_ranks(p, job, seed=30 + p, eager_limit=eager_limit, transport=transport,
                                 **SMALL):
        assert set(rank_result.values()) == {0}, {k: v for k, v in rank_result.items() if v}


@pytest.mark.slow
@PROTOCOLS
@pytest.mark.parametrize("p", range(6, 9))
def test_allreduce_reduce_scatter_and_bcast_at_larger_sizes(p, eager_limit):
    test_allreduce_reduce_scatter_and_bcast_against_numpy(p, "verbs", eager_limit)


def test_reductions_refuse_what_they_cannot_do():
    from rxelab.errors import ConfigError

    def job(comm):
        x = np.zeros(4, np.complex64)
        with pytest.raises(ConfigError, match="max is not defined on complex64"):
            comm.allreduce(x, x.copy(), op="max")
        with pytest.raises(ConfigError, match="unknown reduction 'xor'"):
            comm.allreduce(np.zeros(4), np.zeros(4), op="xor")
        with pytest.raises(ConfigError, match="must be a numpy array"):
            comm.allreduce(bytearray(4), np.zeros(4, np.uint8))
        with pytest.raises(ConfigError, match="root 7 is not a rank"):
            comm.bcast(np.zeros(4), root=7)
        comm.allreduce(np.ones(4), y := np.zeros(4))
        return y.tolist()
    assert run_ranks(2, job) == [[2.0] * 4] * 2


def test_the_benchmark_measures_and_checks_every_collective():
    from rxelab import bench, ops

    def job(comm):
        return [bench.measure(comm, op, algo, 4096, 2, 1) for op, c in ops.COLLECTIVES.items()
                for algo in c.algorithms]
    rows = run_ranks(3, job)[0]
    assert len(rows) == sum(len(c.algorithms) for c in ops.COLLECTIVES.values())
    for row in rows:
        assert row["wrong"] == 0 and row["avg_us"] > 0 and row["busbw_MBps"] > 0, row
    allreduce = next(r for r in rows if r["op"] == "allreduce")
    assert allreduce["busbw_MBps"] == pytest.approx(allreduce["algbw_MBps"] * 4 / 3)


@pytest.mark.parametrize("p", [3, 5, 8])
def test_the_pairs_dial_of_the_sequential_schedule(p):
    total = p * (p - 1) // 2

    def job(comm):
        r, out = comm.rank, {}
        for k in sorted({1, 2, total // 2 or 1, total}):
            send = np.concatenate([ops_block(r, d, 3000) for d in range(p)])
            want = np.concatenate([ops_block(s, r, 3000) for s in range(p)])
            recv = np.zeros_like(want)
            st = comm.alltoall(send, recv, algorithm="sequential", pairs=k)
            g = np.zeros(p * 100, np.uint8)
            comm.allgather(ops_block(r, r, 100), g, algorithm="sequential", pairs=k)
            out[k] = (int((recv != want).sum()) + int((g != np.concatenate(
                [ops_block(s, s, 100) for s in range(p)])).sum()), st.peak_inflight)
        with pytest.raises(rxelab.ConfigError, match="pairs="):
            comm.alltoall(send, recv, algorithm="parallel", pairs=2)
        return out
    for result in run_ranks(p, job, eager_limit=1024, chunk=1024, window=4096):
        assert all(wrong == 0 for wrong, _ in result.values()), result


def ops_block(src, dst, n):
    from rxelab import ops
    return ops.block(src, dst, n)


def test_nonblocking_collectives_progress_while_the_caller_works():
    from rxelab import ops
    from rxelab.errors import ConfigError

    def job(comm):
        r, p = comm.rank, comm.size
        send, want = ops.COLLECTIVES["allreduce"].data(r, p, 20000, "float64", 0, "sum")
        got = np.zeros_like(want)
        req = comm.iallreduce(send, got)
        a2a_send = np.concatenate([ops.block(r, d, 5000) for d in range(p)])
        a2a_want = np.concatenate([ops.block(s, r, 5000) for s in range(p)])
        a2a_recv = np.zeros_like(a2a_want)
        req2 = comm.ialltoall(a2a_send, a2a_recv, algorithm="parallel")
        with pytest.raises(ConfigError, match="unknown alltoall algorithm"):
            comm.ialltoall(a2a_send, a2a_recv, algorithm="nope")  # refused at once
        busy = 0
        while not req2.test():  # the caller computes meanwhile
            busy += 1
            np.dot(np.ones((60, 60)), np.ones((60, 60)))
        stats = req.wait(30)
        req2.wait(30)
        comm.barrier()  # blocking calls after requests: in order
        return (np.array_equal(got, want), np.array_equal(a2a_recv, a2a_want),
                stats.operation, busy > 0)
    out = run_ranks(3, job, eager_limit=1024, max_delay=0.001)
    assert all(r[:3] == (True, True, "allreduce") for r in out), out


def test_the_overlap_benchmark_measures_hidden_communication():
    from rxelab import bench
    out = run_ranks(2, lambda comm: bench.overlap(comm, "allreduce", "ring", 400000, 2),
                    max_delay=0.002)
    for o in out:
        assert o["pure_us"] > 0 and o["cpu_us"] > 0 and 0 <= o["overlap_pct"] <= 100, o


@pytest.mark.parametrize(("p", "window"), [(3, 1), (4, 1), (5, 1), (4, 2), (5, 2), (5, 3)])
@PROTOCOLS
def test_the_sequential_schedule_keeps_its_window_on_the_wire(p, window, eager_limit):
    """Every block as the fabric delivered it (random delays), mapped to its pair: every
    block of pair k arrives after every block of pair k - window (with window 1: one pair at
    a time, in the schedule's order). The turn rides with the data where a rank knows
    first-hand: for a strict schedule only the planned tokens go, none for 3 ranks. (Blocks
    are one chunk each, so one delivery is one block.)"""
    from pyverbs import _fabric
    from rxelab import schedules
    from rxelab.engine import CTRL

    n = 3000

    def job(comm):
        r = comm.rank
        qpns = {c.qp.qp_num: (r, peer) for peer, c in comm.conns.items()}
        send = np.concatenate([block(r, d, n) for d in range(p)])
        want = np.concatenate([block(s, r, n) for s in range(p)])
        recv = np.zeros_like(want)
        comm.barrier()
        if r == 0:
            _fabric.FABRIC.trace = []
        comm.barrier()
        comm.alltoall(send, recv, algorithm="sequential", pairs=window)
        comm.barrier()
        if r == 0:
            trace, _fabric.FABRIC.trace = _fabric.FABRIC.trace, None
            return qpns, int(np.count_nonzero(recv != want)), trace
        return qpns, int(np.count_nonzero(recv != want)), None

    results = run_ranks(p, job, eager_limit=eager_limit, chunk=1 << 20)
    assert all(wrong == 0 for _, wrong, _ in results)
    sender = {q: who for qpns, _, _ in results for q, who in qpns.items()}
    trace = results[0][2]
    order = {pair: k for k, pair in enumerate(schedules.sequential_pairs(p))}
    steps = [order[tuple(sorted(sender[d.qpn]))] for d in trace if d.nbytes == n]
    assert len(steps) == p * (p - 1), trace
    at = {k: [i for i, s in enumerate(steps) if s == k] for k in order.values()}
    for k in range(window, len(order)):
        assert min(at[k]) > max(at[k - window]), f"pair {k} overlapped pair {k - window}: {steps}"
    if window == 1:
        assert steps == sorted(steps), f"pairs overlapped on the wire: {steps}"
    if eager_limit and window == 1:  # the only control messages left are tokens
        tokens = sum(1 for d in trace if d.nbytes == CTRL.size)
        assert tokens == sum(len(schedules.token_receivers(schedules.sequential_steps(p), k))
                             for k in range(len(order)))
        assert p != 3 or tokens == 0


def test_alltoallv_plans_are_kept_by_their_counts():
    """alltoallv is a described collective: one plan per buffers and counts, found again
    whether the counts come as a list, a tuple or a numpy array, and new counts a new plan."""
    def job(comm):
        p, r = comm.size, comm.rank
        s, out = np.zeros(8 * p, np.uint8), np.zeros(8 * p, np.uint8)
        for counts in ([8] * p, tuple([8] * p), np.full(p, 8)):
            comm.alltoallv(s, counts, out, counts)
        kept = len(comm.plans)
        f = [8, 4, 12]  # circulant: rank r sends d f[(d - r) % p], the same total
        comm.ialltoallv(s, [f[(d - r) % p] for d in range(p)], out,
                        [f[(r - q) % p] for q in range(p)]).wait(10)
        send, want = ops.COLLECTIVES["alltoallv"].data(r, p, 5, "uint8", 1, "sum")
        got = np.zeros_like(want)
        ops.run(comm, "alltoallv", "sequential", send, got, pairs=2)
        return kept, len(comm.plans), bool((got == want).all())
    from rxelab import ops
    assert run_ranks(3, job) == [(1, 3, True)] * 3

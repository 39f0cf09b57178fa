"""rxelab.trace records what the library does: for every described collective and algorithm
at p = 2..8, eager and by rendezvous, the messages a recording says each rank sends are
exactly those the in-memory fabric delivers when the same call runs on it (source,
destination, kind, tag, bytes), and every wait of the recording pairs up with a send."""

from __future__ import annotations

import socket
from collections import Counter

import numpy as np
import pytest
from pyverbs import _fabric
from pyverbs import enums as e
from rxelab import ops, trace
from rxelab.errors import ConfigError
from rxelab.messages import CTRL, MOVING, PROGRESS_IMM

from tests.unit.fakejob import run_ranks

CASES = [(name, algorithm) for name, c in ops.COLLECTIVES.items() for algorithm in c.algorithms]
CHUNK = 1 << 24  # one write per block: a delivery is a message
PAGE = 4096


def delivered(p: int, name: str, algorithm: str, size: int, eager_limit: int,
              pairs: int = 1) -> Counter:
    """The call on the fabric: every message as (source, destination, kind, sub-tag, bytes),
    counted, with the check that it computed the right result."""
    c = ops.COLLECTIVES[name]
    count = size // np.dtype(c.dtype).itemsize

    def job(comm):
        r = comm.rank
        ends = {ch.qp.qp_num: (r, peer) for peer, ch in comm.conns.items()}
        send, want = c.data(r, p, count, c.dtype, 3, "sum")
        recv = np.zeros_like(want)
        comm.barrier()
        if r == 0:
            _fabric.FABRIC.trace = []
        comm.barrier()
        ops.run(comm, name, algorithm, send, recv, pairs=pairs)
        comm.barrier()
        seen = None
        if r == 0:
            seen, _fabric.FABRIC.trace = _fabric.FABRIC.trace, None
        return ends, ops.wrong(c, send, recv, want), seen

    results = run_ranks(p, job, eager_limit=eager_limit, chunk=CHUNK, window=CHUNK)
    assert [wrong for _, wrong, _ in results] == [0] * p
    ends = {q: who for found, _, _ in results for q, who in found.items()}
    out: Counter = Counter()
    for d in results[0][2]:
        src, dst = ends[d.qpn]
        if d.opcode == e.IBV_WR_SEND:
            kind, _, _, tag, *_ = CTRL.unpack(d.head[:CTRL.size])
            if kind != MOVING:  # a progress notice: when it goes depends on timing
                out[(src, dst, kind, tag & 0xFFFF, d.nbytes)] += 1
        elif d.opcode == e.IBV_WR_SEND_WITH_IMM:
            out[(src, dst, trace.EAGER, socket.ntohl(d.imm) & 0xFFFF, d.nbytes)] += 1
        elif d.opcode == e.IBV_WR_RDMA_WRITE_WITH_IMM and d.imm != PROGRESS_IMM:
            out[(src, dst, trace.WRITE, socket.ntohl(d.imm) & 0xFFFF, d.nbytes)] += 1
        elif not (d.opcode == e.IBV_WR_RDMA_WRITE and d.nbytes == 0):  # a closing rank's flush
            raise AssertionError(f"a delivery a collective of one chunk per block never makes: {d}")
    return out


def recorded(t: trace.Trace) -> Counter:
    return Counter({(s, d, k, tag & 0xFFFF, n): times
                    for (s, d, k, tag, n), times in t.messages().items()})


# p = 2..4 (one peer, an odd p, a power of two) in the quick loop; 5..8 marked slow
@pytest.mark.parametrize("p", [2, 3, 4, *(pytest.param(p, marks=pytest.mark.slow) for p in range(5, 9))])
@pytest.mark.parametrize(("name", "algorithm"), CASES)
@pytest.mark.parametrize("eager_limit", [65536, 0], ids=["eager", "rendezvous"])
def test_a_recording_sends_what_the_fabric_delivers(name, algorithm, p, eager_limit):
    size = 48  # a whole number of every dtype's elements, uneven over p for the vectors
    t = trace.record(name, algorithm, p, size, eager_limit=eager_limit)
    assert len(t.matched()) == sum(recorded(t).values())
    assert recorded(t) == delivered(p, name, algorithm, size, eager_limit)


@pytest.mark.parametrize("size", [48, 1 << 17], ids=["eager", "rendezvous"])
@pytest.mark.parametrize(("name", "algorithm"), CASES)
def test_a_recording_pins_what_the_library_pins(name, algorithm, size):
    """What a call pins (Stats.peak_pinned on the fabric): the connections' slots, and the
    buffers a rendezvous registers (eager blocks are copied through the slots)."""
    p, c = 3, ops.COLLECTIVES[name]
    count = size // np.dtype(c.dtype).itemsize

    def job(comm):
        send, want = c.data(comm.rank, p, count, c.dtype, 3, "sum")
        return ops.run(comm, name, algorithm, send, np.zeros_like(want)).peak_pinned
    t = trace.record(name, algorithm, p, size)
    # equal but for where the buffers start: a buffer pins the pages it touches, so each of
    # a rank's registered buffers may touch one page more or less here than there
    for got, want in zip(run_ranks(p, job), t.peak_pinned(), strict=True):
        assert abs(got - want) <= 3 * PAGE, (got, want)
        assert got >= t.peak_pinned()[0] - t.pinned[0]  # the slots, always
    writes = any(m.kind == trace.SEND and m.what == trace.WRITE for m in t.ranks[0])
    assert (t.pinned[0] > 0) == writes


@pytest.mark.parametrize("name", [n for n, c in ops.COLLECTIVES.items() if c.windowed])
def test_a_window_of_pairs_is_recorded_as_it_runs(name):
    t = trace.record(name, "sequential", 6, 64, pairs=3, eager_limit=0)
    t.matched()
    assert recorded(t) == delivered(6, name, "sequential", 64, 0, pairs=3)


@pytest.mark.parametrize("size", [64, 1 << 20])  # eager blocks, and blocks by rendezvous
def test_the_parallel_alltoall_goes_to_r_plus_i_and_waits_for_r_minus_i(size):
    """Rank r's i-th block goes to r+i, its i-th advertisement to r-i, and it takes the blocks
    from r-1, r-2, ...: at every step the p ranks' blocks go to p different ranks. Posted in
    rank order, every rank's first block met at rank 0 (p - 1 at one receiver)."""
    p = 8
    t = trace.record("alltoall", "parallel", p, size)
    t.matched()
    data = trace.EAGER if size == 64 else trace.WRITE
    def peers(moves, kind, what):
        return [m.peer for m in moves if m.kind == kind and m.what == what]
    for r, moves in enumerate(t.ranks):
        assert peers(moves, trace.SEND, data) == [(r + i) % p for i in range(1, p)]
        assert peers(moves, trace.RECV, data) == [(r - i) % p for i in range(1, p)]
        if data == trace.WRITE:
            assert peers(moves, trace.SEND, trace.RTR) == [(r - i) % p for i in range(1, p)]


def test_calls_back_to_back_take_the_next_call_numbers():
    t = trace.record("allreduce", "ring", 4, 4096, calls=3)
    t.matched()
    seqs = {m.tag >> 16 for moves in t.ranks for m in moves if m.kind == trace.SEND}
    assert seqs == {1, 2, 3}
    one = trace.record("allreduce", "ring", 4, 4096)
    assert t.events == 3 * one.events


def test_moves_name_local_work_and_waits():
    """A ring allreduce reduces p-1 chunks per rank and copies its input once; a rendezvous
    write is waited for by the id of its own send."""
    p, size = 4, 1 << 20
    t = trace.record("allreduce", "ring", p, size, eager_limit=0)
    for moves in t.ranks:
        reduced = [m.nbytes for m in moves if m.kind == trace.REDUCE]
        assert len(reduced) == p - 1 and sum(reduced) == size * (p - 1) // p
        assert [m.nbytes for m in moves if m.kind == trace.COPY] == [size]
        writes = {m.ids[0] for m in moves if m.kind == trace.SEND and m.what == trace.WRITE}
        waited = {i for m in moves if m.kind == trace.WAIT for i in m.ids}
        assert writes == waited


@pytest.mark.parametrize("p", [3, 4, 6])
@pytest.mark.parametrize(("name", "steps"), [("allreduce", 2), ("reduce_scatter", 1)])
def test_a_ring_advertises_one_step_ahead(p, name, steps):
    """A ring rank tells its left neighbour where step s+1 lands before it waits for step s's
    block (the neighbour, done with s, finds it waiting), and never more than one step ahead
    (a long ring's advertisements stay within the slots' credits)."""
    t = trace.record(name, "ring", p, 1 << 20, eager_limit=0)
    t.matched()
    for r, moves in enumerate(t.ranks):
        rtrs_before = []  # advertisements sent before each wait for a write
        sent = 0
        for m in moves:
            if m.kind == trace.SEND and m.what == trace.RTR:
                assert m.peer == (r - 1) % p
                sent += 1
            elif m.kind == trace.RECV and m.what == trace.WRITE:
                rtrs_before.append(sent)
        waits = steps * (p - 1)
        assert len(rtrs_before) == waits and sent == waits
        for phase in range(steps):  # step s of a phase: s + 2 advertised, the last step's own
            for s in range(p - 1):
                done = phase * (p - 1)
                assert rtrs_before[done + s] == done + min(s + 2, p - 1)


def test_a_recording_that_does_not_pair_up_is_refused():
    t = trace.record("alltoall", "pairwise", 3, 64)
    dropped = next(i for i, m in enumerate(t.ranks[1]) if m.kind == trace.SEND)
    del t.ranks[1][dropped]
    with pytest.raises(trace.TraceError, match="no message to wait for"):
        t.matched()
    t = trace.record("alltoall", "pairwise", 3, 64)
    t.ranks[2] = [m for m in t.ranks[2] if m.kind != trace.RECV]
    with pytest.raises(trace.TraceError, match="nobody waits for"):
        t.matched()
    t = trace.record("alltoall", "pairwise", 3, 1 << 20)
    t.ranks[0].append(trace.Move(trace.WAIT, ids=(99,)))
    with pytest.raises(trace.TraceError, match="has not made"):
        t.matched()


@pytest.mark.parametrize(("args", "said"), [
    (("alltoall", "nope", 4, 64), "unknown alltoall algorithm"),
    (("nope", None, 4, 64), "unknown collective"),
    (("alltoall", None, 0, 64), "p=0"),
    (("alltoall", None, 4, -1), "size=-1"),
    (("allreduce", None, 4, 6), "multiple of 4"),
    (("alltoall", "pairwise", 4, 64, {"pairs": 2}), "pairs= sets"),
    (("alltoall", None, 4, 64, {"eager_limit": 1 << 20}), "eager_limit"),
    (("alltoall", None, 4, 64, {"calls": 0}), "calls=0"),
])
def test_bad_arguments_are_named(args, said):
    *positional, options = args if isinstance(args[-1], dict) else (*args, {})
    with pytest.raises(ConfigError, match=said):
        trace.record(*positional, **options)


@pytest.mark.parametrize(("name", "p", "size"), [("alltoall", 6, 1500), ("allgather", 6, 3000)])
def test_bruck_steps_eager_and_by_rendezvous_in_one_call(name, p, size):
    """Bruck's steps carry different numbers of blocks: with a 4 KiB eager limit some of one
    call's steps go eager and others by rendezvous, on both sides alike."""
    t = trace.record(name, "bruck", p, size, eager_limit=4096)
    kinds = {m.what for m in t.ranks[0] if m.kind == trace.SEND}
    assert {trace.EAGER, trace.WRITE} <= kinds
    assert recorded(t) == delivered(p, name, "bruck", size, 4096)

"""Every collective the rxelab backend supports, through torch.distributed's own calls, against
a reference computed here: float32, float64 and int64, in place, blocking and async_op."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from tests.torch.groups import run_groups
from tests.unit.fakejob import SOCKETS, over

P = 3
DTYPES = (torch.float32, torch.float64, torch.int64)


def data(rank: int, n: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank-specific values that no two ranks share, exact in every dtype tested."""
    return (torch.arange(n, dtype=torch.int64) * 3 + rank * 7 + salt + 1).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,reference", [
    (dist.ReduceOp.SUM, lambda xs: sum(xs[1:], xs[0].clone())),
    (dist.ReduceOp.PRODUCT, lambda xs: xs[0] * xs[1] * xs[2]),
    (dist.ReduceOp.MIN, lambda xs: torch.stack(xs).min(0).values),
    (dist.ReduceOp.MAX, lambda xs: torch.stack(xs).max(0).values),
])
def test_all_reduce_in_place(dtype, op, reference):
    def job(pg):
        t = data(pg.rank(), 11, dtype)
        dist.all_reduce(t, op, group=pg)
        return t
    got = run_groups(P, job)
    want = reference([data(r, 11, dtype) for r in range(P)])
    for t in got:
        assert t.dtype == dtype and torch.equal(t, want), (t, want)


@over(SOCKETS)
def test_the_backend_runs_over_the_socket_transports_too(transport):
    def job(pg):
        t = data(pg.rank(), 5000, torch.float32)
        dist.all_reduce(t, group=pg)
        out = [torch.empty(7, dtype=torch.float64) for _ in range(P)]
        dist.all_gather(out, data(pg.rank(), 7, torch.float64), group=pg)
        return t, out, pg.comm.transport  # new_group's group: the backend itself
    got = run_groups(P, job, transport=transport)
    want = sum(data(r, 5000, torch.float32) for r in range(P))
    for t, out, used in got:
        assert used == transport and torch.equal(t, want)
        assert all(torch.equal(o, data(r, 7, torch.float64)) for r, o in enumerate(out))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_all_reduce_avg_divides_the_sum(dtype):
    def job(pg):
        t = data(pg.rank(), 8, dtype)
        dist.all_reduce(t, dist.ReduceOp.AVG, group=pg)
        return t
    want = sum(data(r, 8, dtype) for r in range(P)) / P
    for t in run_groups(P, job):
        assert torch.allclose(t, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("root", range(P))
def test_broadcast_from_every_root(dtype, root):
    def job(pg):
        t = data(pg.rank(), 9, dtype)
        dist.broadcast(t, root, group=pg)
        return t
    for t in run_groups(P, job):
        assert torch.equal(t, data(root, 9, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_list_and_tensor_forms(dtype):
    def job(pg):
        mine = data(pg.rank(), 6, dtype).view(2, 3)
        listed = [torch.zeros(2, 3, dtype=dtype) for _ in range(P)]
        dist.all_gather(listed, mine, group=pg)
        whole = torch.zeros(P * 2, 3, dtype=dtype)
        dist.all_gather_into_tensor(whole, mine, group=pg)
        return listed, whole
    want = [data(r, 6, dtype).view(2, 3) for r in range(P)]
    for listed, whole in run_groups(P, job):
        assert all(torch.equal(a, b) for a, b in zip(listed, want, strict=True))
        assert torch.equal(whole, torch.cat(want))


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_list_and_tensor_forms(dtype):
    def job(pg):
        r = pg.rank()
        ins = [data(r, 4, dtype, salt=10 * k) for k in range(P)]
        out = torch.zeros(4, dtype=dtype)
        dist.reduce_scatter(out, ins, group=pg)
        whole = torch.cat(ins)
        out2 = torch.zeros(4, dtype=dtype)
        dist.reduce_scatter_tensor(out2, whole, dist.ReduceOp.MAX, group=pg)
        return r, out, out2
    for r, out, out2 in run_groups(P, job):
        mine = [data(q, 4, dtype, salt=10 * r) for q in range(P)]
        assert torch.equal(out, sum(mine[1:], mine[0].clone()))
        assert torch.equal(out2, torch.stack(mine).max(0).values)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all_lists_even_and_uneven(dtype):
    def sizes(src, dst):  # uneven: what src sends dst
        return 1 + (src + 2 * dst) % 3

    def job(pg):
        r = pg.rank()
        ins = [data(r, 5, dtype, salt=100 * d) for d in range(P)]
        outs = [torch.zeros(5, dtype=dtype) for _ in range(P)]
        dist.all_to_all(outs, ins, group=pg)
        uneven_in = [data(r, sizes(r, d), dtype, salt=100 * d) for d in range(P)]
        uneven_out = [torch.zeros(sizes(s, r), dtype=dtype) for s in range(P)]
        dist.all_to_all(uneven_out, uneven_in, group=pg)
        return r, outs, uneven_out
    for r, outs, uneven in run_groups(P, job):
        for s in range(P):
            assert torch.equal(outs[s], data(s, 5, dtype, salt=100 * r))
            assert torch.equal(uneven[s], data(s, sizes(s, r), dtype, salt=100 * r))


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all_single_even_and_with_split_sizes(dtype):
    def split(src, dst):  # rows src sends dst
        return (src + dst) % 3

    def job(pg):
        r = pg.rank()
        x = data(r, P * 2 * 4, dtype).view(P * 2, 4)
        y = torch.zeros_like(x)
        dist.all_to_all_single(y, x, group=pg)
        ins = [split(r, d) for d in range(P)]
        outs = [split(s, r) for s in range(P)]
        xv = data(r, sum(ins) * 4, dtype).view(-1, 4)
        yv = torch.zeros(sum(outs), 4, dtype=dtype)
        dist.all_to_all_single(yv, xv, outs, ins, group=pg)
        return r, y, yv
    for r, y, yv in run_groups(P, job):
        want = [data(s, P * 2 * 4, dtype).view(P * 2, 4)[2 * r:2 * r + 2] for s in range(P)]
        assert torch.equal(y, torch.cat(want))
        pieces = []
        for s in range(P):
            rows = [split(s, d) for d in range(P)]
            start = sum(rows[:r])
            pieces.append(data(s, sum(rows) * 4, dtype).view(-1, 4)[start:start + rows[r]])
        assert torch.equal(yv, torch.cat(pieces))


def test_barrier_and_send_recv_in_a_ring():
    def job(pg):
        r, p = pg.rank(), pg.size()
        dist.barrier(group=pg)
        got = torch.zeros(4, dtype=torch.float64)
        mine = data(r, 4, torch.float64)
        if r % 2 == 0:  # rendezvous sends: one side sends first
            pg.send([mine], (r + 1) % p, 0).wait()
            pg.recv([got], (r - 1) % p, 0).wait()
        else:
            pg.recv([got], (r - 1) % p, 0).wait()
            pg.send([mine], (r + 1) % p, 0).wait()
        return r, got
    for r, got in run_groups(2, job):
        assert torch.equal(got, data((r - 1) % 2, 4, torch.float64))


def test_async_op_returns_at_once_and_completes_in_order():
    def job(pg):
        r = pg.rank()
        ts = [data(r, 1000, torch.float32, salt=k) for k in range(4)]
        works = [dist.all_reduce(t, group=pg, async_op=True) for t in ts]
        b = data(r, 10, torch.float64)
        works.append(dist.broadcast(b, 2, group=pg, async_op=True))
        for w in works:
            w.wait()
        return ts, b, [w.is_completed() for w in works], [w.get_future().done() for w in works]
    for ts, b, completed, done in run_groups(P, job):
        for k, t in enumerate(ts):
            assert torch.equal(t, sum(data(r, 1000, torch.float32, salt=k) for r in range(P)))
        assert torch.equal(b, data(2, 10, torch.float64))
        assert all(completed) and all(done)


def test_a_tensor_that_needs_a_gradient_is_reduced_in_its_own_memory():
    def job(pg):
        w = torch.ones(5, requires_grad=True)
        with torch.no_grad():
            dist.all_reduce(w, group=pg)
        return w
    for w in run_groups(P, job):
        assert torch.equal(w.detach(), torch.full((5,), float(P)))


def test_bool_and_bfloat16_travel_where_nothing_is_reduced():
    def job(pg):
        r = pg.rank()
        flags = torch.tensor([r == 1, True, False])
        dist.broadcast(flags, 1, group=pg)
        listed = [torch.zeros(2, dtype=torch.bfloat16) for _ in range(P)]
        dist.all_gather(listed, torch.full((2,), r + 0.5, dtype=torch.bfloat16), group=pg)
        return flags, listed
    for flags, listed in run_groups(P, job):
        assert flags.tolist() == [True, True, False]
        assert [x.tolist() for x in listed] == [[r + 0.5] * 2 for r in range(P)]


def test_empty_tensors_are_a_no_op():
    def job(pg):
        t = torch.zeros(0)
        dist.all_reduce(t, group=pg)
        return t.numel()
    assert run_groups(P, job) == [0] * P


def test_bfloat16_all_reduce_sums_in_float32_and_lands_in_the_tensor():
    def job(pg):
        t = torch.full((6,), 1.5 + pg.rank(), dtype=torch.bfloat16)
        dist.all_reduce(t, group=pg)
        return t
    for t in run_groups(P, job):
        assert t.dtype == torch.bfloat16 and t.tolist() == [1.5 * P + sum(range(P))] * 6


def test_all_to_all_single_where_a_rank_sends_nothing():
    def job(pg):
        r = pg.rank()
        ins = [0, 0, 0] if r == 2 else [1, 1, 0]  # rank 2 sends nothing, still receives
        outs = [ins_s[r] for ins_s in ([1, 1, 0], [1, 1, 0], [0, 0, 0])]
        x = torch.full((sum(ins),), float(r + 1))
        y = torch.zeros(sum(outs))
        dist.all_to_all_single(y, x, outs, ins, group=pg)
        t = torch.ones(2)
        dist.all_reduce(t, group=pg)  # the group is still in step
        return y, t
    got = run_groups(P, job)
    assert got[0][0].tolist() == [1.0, 2.0] and got[1][0].tolist() == [1.0, 2.0]
    assert got[2][0].tolist() == []
    assert all(t.tolist() == [3.0, 3.0] for _, t in got)


@pytest.mark.parametrize("root", range(P))
def test_scatter_gather_and_reduce_from_every_root(root):
    """Rooted calls (DTensor's distribute_tensor scatters), made of the library's broadcast,
    allgather and allreduce: only the root's outputs change. (The group's own methods: torch
    1.13's dist.scatter asks the default group for the rank.)"""
    def rooted(kind):
        opts = kind()
        opts.rootRank = root
        return opts

    def job(pg):
        r = pg.rank()
        out = torch.zeros(4)
        ins = [data(root, 4, torch.float32, salt=10 * k) for k in range(P)]
        pg.scatter([out], [ins] if r == root else [], rooted(c10d.ScatterOptions)).wait()
        gathered = [torch.zeros(4) for _ in range(P)]
        pg.gather([gathered] if r == root else [], [data(r, 4, torch.float32)],
                  rooted(c10d.GatherOptions)).wait()
        red = data(r, 4, torch.float64)
        opts = rooted(c10d.ReduceOptions)
        opts.reduceOp = dist.ReduceOp.MAX
        pg.reduce([red], opts).wait()
        return r, out, gathered, red
    for r, out, gathered, red in run_groups(P, job):
        assert torch.equal(out, data(root, 4, torch.float32, salt=10 * r))
        if r == root:
            assert all(torch.equal(g, data(q, 4, torch.float32)) for q, g in enumerate(gathered))
            assert torch.equal(red, torch.stack([data(q, 4, torch.float64) for q in range(P)]).max(0).values)
        else:
            assert all(not g.any() for g in gathered), "only the root's outputs are written"
            assert torch.equal(red, data(r, 4, torch.float64)), "left alone"


def test_coalesced_calls_move_every_tensor_and_complete_together():
    """What FSDP and functional collectives call under torch 2 (all_reduce_coalesced, and
    all-gather / reduce-scatter into tensors, several at once): one Work for all of them."""
    def job(pg):
        r = pg.rank()
        a, b = data(r, 5, torch.float32), data(r, 3, torch.float32, salt=50)
        pg.allreduce_coalesced([a, b], c10d.AllreduceCoalescedOptions()).wait()
        ins = [data(r, 2, torch.int64), data(r, 4, torch.int64, salt=9)]
        outs = [torch.zeros(P * 2, dtype=torch.int64), torch.zeros(P * 4, dtype=torch.int64)]
        pg.all_gather_single_coalesced(outs, ins, c10d.AllgatherOptions()).wait()
        whole = [data(r, P * 2, torch.float64), data(r, P, torch.float64, salt=3)]
        parts = [torch.zeros(2, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)]
        pg.reduce_scatter_single_coalesced(parts, whole, c10d.ReduceScatterOptions()).wait()
        return r, a, b, outs, parts
    for r, a, b, outs, parts in run_groups(P, job):
        assert torch.equal(a, sum(data(q, 5, torch.float32) for q in range(P)))
        assert torch.equal(b, sum(data(q, 3, torch.float32, salt=50) for q in range(P)))
        assert torch.equal(outs[0], torch.cat([data(q, 2, torch.int64) for q in range(P)]))
        assert torch.equal(outs[1], torch.cat([data(q, 4, torch.int64, salt=9) for q in range(P)]))
        assert torch.equal(parts[0], sum(data(q, P * 2, torch.float64) for q in range(P))[2 * r:2 * r + 2])
        assert torch.equal(parts[1], sum(data(q, P, torch.float64, salt=3) for q in range(P))[r:r + 1])


def test_gathers_scatters_and_all_to_all_in_place_as_fsdp_calls_them():
    """FSDP's input is its own slot of the output (all_gather_into_tensor) and its output a
    chunk of its input (reduce_scatter_tensor): "the send and receive buffers overlap" before."""
    def job(pg):
        r = pg.rank()
        whole = torch.zeros(P * 4)
        slot = whole.narrow(0, r * 4, 4)
        slot.copy_(data(r, 4, torch.float32))
        dist.all_gather_into_tensor(whole, slot, group=pg)
        grads = torch.cat([data(r, 4, torch.float32, salt=10 * k) for k in range(P)])
        mine = grads.narrow(0, r * 4, 4)
        dist.reduce_scatter_tensor(mine, grads, group=pg)
        both = torch.cat([data(r, 2, torch.float64, salt=10 * k) for k in range(P)])
        dist.all_to_all_single(both, both, group=pg)
        return r, whole, mine.clone(), both
    for r, whole, mine, both in run_groups(P, job):
        assert torch.equal(whole, torch.cat([data(q, 4, torch.float32) for q in range(P)]))
        assert torch.equal(mine, sum(data(q, 4, torch.float32, salt=10 * r) for q in range(P)))
        assert torch.equal(both, torch.cat([data(q, 2, torch.float64, salt=10 * r) for q in range(P)]))

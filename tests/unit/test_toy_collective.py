"""A new collective is its algorithm module and its description, nothing else (issue 16): this
file alone adds "shift" (each rank's buffer goes to the next rank) and "gather" (a rooted one:
every rank's block lands in the root's receive buffer), and the library, the self-test, the
benchmark, the demo apps, their MPI and Gloo counterparts, spec validation and the report
take them as they take the shipped ones, on the in-memory fabric."""

from __future__ import annotations

import argparse
import sys
import types

import numpy as np
import pytest
from rxelab import bench, layouts, ops, selftest
from rxelab.collectives.common import DATA, Call

from tests.unit.fakejob import run_ranks


def run(c: Call) -> None:
    """The algorithm: one block to the right neighbour, one from the left."""
    m, p, r = c.layout.send.nbytes, c.size, c.rank
    if p == 1:
        c.copy_own_block(0, 0, m)
        return
    right, left = (r + 1) % p, (r - 1) % p
    c.expect(left, DATA, 0, m)
    sent = c.send_block(right, DATA, 0, m)
    c.recv_block(left, DATA, 0, m)
    c.finish([sent])


def shifted(sendbuf, recvbuf, p, rank):
    """The layout: the whole send buffer to the right, the whole receive buffer from the left."""
    send, recv = (layouts.as_buffer(sendbuf, "send buffer"),
                  layouts.as_buffer(recvbuf, "receive buffer", writable=True))
    layouts.check_pair(send, recv, send.nbytes, send.nbytes)
    m, right, left = send.nbytes, (rank + 1) % p, (rank - 1) % p
    return layouts.Blocks(send, recv, [0] * p, [m if j == right else 0 for j in range(p)],
                          [0] * p, [m if j == left else 0 for j in range(p)])


def data(rank, p, count, dtype, salt, op):
    return ops.block(rank, (rank + 1) % p, count, dtype, salt), \
        ops.block((rank - 1) % p, rank, count, dtype, salt)


SHIFT = ops.Collective("shift", {"direct": f"{__name__}:run"}, "direct", shifted,
                       busbw=lambda n: 1.0, algbw_bytes=lambda size, n: size, data=data)


@pytest.fixture
def shift():
    ops.register(SHIFT)
    yield SHIFT
    del ops.COLLECTIVES["shift"]


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_the_self_test_checks_it_like_any_other(shift, p):
    def job(comm):
        return selftest.run(comm, [0, 7, 5000], {name: [] for name in ops.COLLECTIVES
                                                 if name != "shift"})
    for results in run_ranks(p, job, eager_limit=1024):
        checked = [r for r in results if r["check"].startswith("shift/direct/")]
        assert len(checked) == 3 and all(r["ok"] for r in checked), checked


def test_the_benchmark_measures_it_and_the_nonblocking_variant_runs(shift):
    def job(comm):
        row = bench.measure(comm, "shift", "direct", 4096, 3, 1)
        send, want = data(comm.rank, comm.size, 64, "uint8", 0, "sum")
        recv = np.zeros_like(want)
        comm.start("shift", send, recv).wait(10)
        return row["wrong"], row["busbw_MBps"] > 0, bool((recv == want).all())
    assert run_ranks(3, job) == [(0, True, True)] * 3


def test_specs_and_the_report_read_it(shift):
    from experiments import report, spec
    from experiments.report import summary

    s = spec.parse({"name": "t", "runs": [{"app": "rxelab", "op": "shift", "sizes": [8]}]})
    assert [c.algorithm for c in s.cases()] == ["direct"]
    with pytest.raises(spec.SpecError, match="no MPI counterpart"):
        spec.parse({"name": "t", "runs": [{"app": "mpi", "op": "shift", "sizes": [8]}]})
    assert summary.size_unit("shift") == "per peer"
    assert report.bandwidth(1_000_000, 3, 1.0, "shift") == (1.0, 1.0)


# ---- gather: a rooted collective, all of it here -------------------------------------------

def gather_run(c: Call) -> None:
    """The algorithm: every rank sends its block to the root, which receives them in place."""
    lay, r = c.layout, c.rank
    assert isinstance(lay, layouts.RootedBlocks)
    root = lay.root
    if r != root:
        c.finish([c.send_block(root, DATA, lay.send_off[root], lay.send_len[root])])
        return
    peers = [q for q in range(c.size) if q != root]
    for q in peers:
        c.expect(q, DATA, lay.recv_off[q], lay.recv_len[q])
    c.copy_own_block(lay.send_off[root], lay.recv_off[root], lay.send_len[root])
    for q in peers:
        c.recv_block(q, DATA, lay.recv_off[q], lay.recv_len[q])
    c.finish([])


def gathered_at(sendbuf, recvbuf, p, rank, root=0):
    """The layout: at the root, block q of the receive buffer from rank q; elsewhere the send
    buffer to the root and nothing received (the receive buffer may be None or empty)."""
    send = layouts.as_buffer(sendbuf, "send buffer")
    empty = np.zeros(0, getattr(sendbuf, "dtype", np.uint8))
    recv = layouts.as_buffer(empty if recvbuf is None else recvbuf, "receive buffer",
                             writable=True)
    m = send.nbytes
    layouts.check_pair(send, recv, m, m * p if rank == root else 0)
    here = rank == root
    return layouts.RootedBlocks(send, recv, [0] * p, [m if q == root else 0 for q in range(p)],
                                [q * m if here else 0 for q in range(p)],
                                [m if here else 0 for q in range(p)], root=root)


def gather_data(rank, p, count, dtype, salt, op, pattern="pattern"):
    send = ops.block(rank, ops.ROOT, count, dtype, salt, pattern)
    if rank != ops.ROOT:
        return send, np.zeros(0, dtype)
    return send, np.concatenate([ops.block(s, ops.ROOT, count, dtype, salt, pattern)
                                 for s in range(p)])


def mpi_gather(c, comm, MPI):
    """comm.Gather(send, recv at the root (None elsewhere), root=ROOT)."""
    method, here = getattr(comm, c.mpi.call), comm.Get_rank() == ops.ROOT
    return lambda send, recv: method(send, recv if here else None, root=ops.ROOT)


def gloo_gather(c, dist, rank, p):
    """dist.gather(send, p views of out at the root (None elsewhere), dst=ROOT)."""
    method = getattr(dist, c.gloo)
    return lambda send, out: method(send, list(out.chunk(p)) if rank == ops.ROOT else None,
                                    dst=ops.ROOT)


GATHER = ops.Collective("gather", {"direct": f"{__name__}:gather_run"}, "direct", gathered_at,
                        busbw=lambda n: (n - 1) / n, algbw_bytes=lambda size, n: size * n,
                        data=gather_data, takes=("root",), unit="per rank",
                        axis="bytes per rank", mpi=ops.Mpi("Gather", bind=mpi_gather),
                        gloo="gather", gloo_bind=gloo_gather)


@pytest.fixture
def gather():
    ops.register(GATHER)
    yield GATHER
    del ops.COLLECTIVES["gather"]


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_the_library_runs_it_from_any_root_blocking_and_started(gather, p):
    def job(comm):
        r, wrong = comm.rank, {}
        for count in (0, 7, 5000):  # eager and rendezvous blocks (eager_limit 1024)
            for root in sorted({0, p - 1, p // 2}):
                send = ops.block(r, root, count)
                want = np.concatenate([ops.block(s, root, count) for s in range(p)])
                recv = np.full(want.size if r == root else 0, 0xEE, np.uint8)
                st = comm.collective("gather", send, recv, root=root)
                wrong[f"{root}/{count}"] = int((recv != want).sum()) if r == root else recv.size
                assert st.operation == "gather" and st.algorithm == "direct"
                recv[:] = 0xEE
                comm.start("gather", send, None if r != root else recv, root=root).wait(10)
                wrong[f"i/{root}/{count}"] = int((recv != want).sum()) if r == root else 0
        return wrong
    for result in run_ranks(p, job, eager_limit=1024):
        assert set(result.values()) == {0}, result


@pytest.mark.parametrize("p", [1, 3])
def test_the_self_test_and_the_benchmark_take_the_rooted_one(gather, p):
    def job(comm):
        results = selftest.run(comm, [0, 7, 5000], {name: [] for name in ops.COLLECTIVES
                                                    if name != "gather"})
        row = bench.measure(comm, "gather", "direct", 4096, 3, 1)
        return [r for r in results if r["check"].startswith("gather/")], row
    for checked, row in run_ranks(p, job, eager_limit=1024):
        assert len(checked) == 3 and all(r["ok"] for r in checked), checked
        assert row["wrong"] == 0 and (row["busbw_MBps"] > 0) is (p > 1), row


def test_the_demo_apps_stage_loop_runs_it_on_the_library(gather):
    from apps import stages
    args = argparse.Namespace(op="gather", size=64, stages=3, warmup=1, tight=False)

    def job(comm):
        def collective(send, recv):
            ops.run(comm, "gather", "direct", send, recv)
        return stages.run(args, comm.rank, comm.size, collective, comm.barrier, "rxelab")
    for mine in run_ranks(3, job):
        assert not mine[1::2].any() and (mine[0::2] > 0).all()
    sends = [stages.buffers("gather", 2, r, 3, 64)[0] for r in range(3)]
    assert (stages.buffers("gather", 2, 0, 3, 64)[1] == np.concatenate(sends)).all()
    assert stages.buffers("gather", 2, 1, 3, 64)[1].size == 0, "only the root receives"
    from apps import server_client  # its --op and --algorithm take it
    ap = stages.arguments("", server_client.algorithms(), "star")
    parsed = ap.parse_args(["--op", "gather", "--algorithm", "direct", "--size", "64"])
    stages.check_args(ap, parsed)
    assert (parsed.op, parsed.algorithm) == ("gather", "direct")


class FakeMpiComm:
    """mpi4py's COMM_WORLD as far as the adapter and apps/mpi_compare.py use it: one rank
    (Gather and Allgather copy), or any rank whose calls are recorded."""

    def __init__(self, rank=0, size=1):
        self.rank, self.size, self.calls = rank, size, []

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Barrier(self):
        pass

    def Gather(self, send, recv, root):
        self.calls.append(("Gather", send, recv, root))
        if recv is not None and self.size == 1:
            np.copyto(recv, send)

    def Allgather(self, send, recv):
        np.copyto(recv, send)


def test_the_mpi_counterpart_is_called_as_its_adapter_says(gather, monkeypatch, capsys):
    send, recv = np.arange(4, dtype=np.uint8), np.zeros(12, np.uint8)
    for rank in (0, 2):
        comm = FakeMpiComm(rank, 3)
        gather.mpi_call(comm, types.SimpleNamespace(SUM="sum"))(send, recv)
        (name, s, r, root), = comm.calls
        assert (name, root) == ("Gather", 0) and s is send and r is (recv if rank == 0 else None)
    # the whole app, one rank of a fake MPI
    from apps import mpi_compare
    mpi = types.SimpleNamespace(COMM_WORLD=FakeMpiComm(), SUM="sum",
                                Get_library_version=lambda: "fake MPI 0\n")
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=mpi))
    assert mpi_compare.main(["--op", "gather", "--stages", "2", "--size", "8", "--quiet"]) == 0
    assert '"op": "gather"' in capsys.readouterr().out
    assert len(mpi.COMM_WORLD.calls) == 3, "warm-up and two stages, all through the adapter"


def test_the_gloo_counterpart_is_called_as_its_adapter_says(gather, monkeypatch, capsys):
    class Out:  # as much of a tensor as the adapter uses (torch may be absent here)
        def __init__(self, a):
            self.a = a

        def chunk(self, n):
            return np.split(self.a, n)
    calls = []
    dist = types.SimpleNamespace(gather=lambda t, gather_list, dst: calls.append(
        (t, gather_list, dst)))
    send, out = np.arange(4, dtype=np.uint8), Out(np.zeros(12, np.uint8))
    gather.gloo_call(dist, 0, 3)(send, out)
    gather.gloo_call(dist, 1, 3)(send, out)
    (t0, l0, d0), (t1, l1, d1) = calls
    assert t0 is send and len(l0) == 3 and l0[1].base is out.a and d0 == 0
    assert t1 is send and l1 is None and d1 == 0
    from apps import gloo_compare  # the app takes it (and stops at the missing rendezvous)
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(SystemExit):
        gloo_compare.main(["--op", "gather"])
    assert "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set" in capsys.readouterr().err
    no_gloo = ops.Collective("gather", GATHER.algorithms, "direct", gathered_at,
                             busbw=GATHER.busbw, algbw_bytes=GATHER.algbw_bytes,
                             data=gather_data, takes=("root",), no_gloo="on Tuesdays")
    monkeypatch.setitem(ops.COLLECTIVES, "gather", no_gloo)
    with pytest.raises(SystemExit):
        gloo_compare.main(["--op", "gather"])
    assert "gather has no Gloo counterpart on Tuesdays" in capsys.readouterr().err


def test_specs_and_the_report_read_the_rooted_one(gather):
    from experiments import report, spec
    from experiments.report import summary

    s = spec.parse({"name": "t", "runs": [
        {"app": "rxelab", "op": "gather", "sizes": [8]},
        {"app": "mpi", "op": "gather", "sizes": [8], "transport": ["tcp"]},
        {"app": "gloo", "op": "gather", "sizes": [8]}]})
    assert [(c.app, c.algorithm) for c in s.cases()] == [
        ("rxelab", "direct"), ("mpi", "mpi-default"), ("gloo", "gloo-default")]
    with pytest.raises(spec.SpecError, match="only rxelab's sequential"):
        spec.parse({"name": "t", "runs": [{"app": "rxelab", "op": "gather", "sizes": [8],
                                           "pairs": [2]}]})
    assert summary.size_unit("gather") == "per rank"
    assert report.bandwidth(1_000_000, 4, 1.0, "gather") == (4.0, 3.0)

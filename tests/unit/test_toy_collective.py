"""A new collective is its algorithm module and its description, nothing else (issue 16): this
file alone adds "shift" (each rank's buffer goes to the next rank) and the self-test, the
benchmark, spec validation and the report take it as they take the shipped ones, on the
in-memory fabric."""

from __future__ import annotations

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
    from experiments import report, report_summary, spec

    s = spec.parse({"name": "t", "runs": [{"app": "rxelab", "op": "shift", "sizes": [8]}]})
    assert [c["algorithm"] for c in s.cases()] == ["direct"]
    with pytest.raises(spec.SpecError, match="no MPI counterpart"):
        spec.parse({"name": "t", "runs": [{"app": "mpi", "op": "shift", "sizes": [8]}]})
    assert report_summary.size_unit("shift") == "per peer"
    assert report.bandwidth(1_000_000, 3, 1.0, "shift") == (1.0, 1.0)

"""Coded calls keep the library's other promises (issue 27, items 15 and 16): what their
staging areas pin counts against pin_limit before anything is posted (before, an lz4
allreduce whose buffers fit failed mid-call, and its peers were told "counts disagree"), and
a peer's zstd block must be one frame and nothing after it."""

from __future__ import annotations

import numpy as np
import pytest
from rxelab import codecs, ops
from rxelab.collectives.common import RECEIVING, SENDING
from rxelab.errors import ConfigError, ProtocolError
from rxelab.registry import pinned_size

from tests.unit.fakejob import run_ranks
from tests.unit.test_codecs_fake import RENDEZVOUS, coded, decode

MiB = 1 << 20


@pytest.mark.slow
def test_staging_is_counted_before_anything_is_posted_and_the_communicator_stays_usable():
    n = 4 * MiB // 4  # float32: 4 MiB in place, and as much scratch

    def job(comm):
        x = np.ones(n, np.float32)
        with pytest.raises(ConfigError, match="staging for compression=lz4") as err:
            comm.allreduce(x, x, compression="lz4")
        y = np.ones(1024, np.float32)  # the communicator was never failed: it goes on
        comm.allreduce(y, y)
        comm.allreduce(x, x)  # uncoded, the same call fits
        return str(err.value), float(y[0]), float(x[0])
    out = run_ranks(3, job, pin_limit=9 * MiB, **RENDEZVOUS)
    for said, small, big in out:
        assert "pin_limit" in said and "counts disagree" not in said
        assert small == 3.0 and big == 3.0


@pytest.mark.parametrize("p", [2, 3, pytest.param(5, marks=pytest.mark.slow)])
def test_the_staging_bound_covers_what_every_collective_stages(p):
    """What each call really staged (its areas, pinned in whole pages: coded blocks' and an
    algorithm's workspace) never exceeds what was counted for it."""
    def job(comm):
        worst = {}
        for name, c in ops.COLLECTIVES.items():
            dtype = "float32" if c.reduces else "uint8"
            for algo in c.algorithms:
                for count in (3000, 70000):
                    send, want = c.data(comm.rank, comm.size, count, dtype, 0, "sum", "pattern")
                    recv = np.zeros_like(want)
                    ops.run(comm, name, algo, send, recv, compression="lz4")
                    plan = list(comm.plans.values())[-1]
                    st = plan.staging
                    used = sum(pinned_size(area.address, area.nbytes)
                               for kind in (SENDING, RECEIVING)
                               for area, _ in st.areas[kind][:st.used[kind]])
                    bound = (codecs.staging_bound(plan.codec, plan.layout, comm.size, algo)
                             + plan.layout.workspace(comm.size, algo))  # Bruck's, as counted
                    worst[f"{name}/{algo}/{count}"] = (used, bound)
        return worst
    for rank, worst in enumerate(run_ranks(p, job, **RENDEZVOUS)):
        over = {k: v for k, v in worst.items() if v[0] > v[1]}
        assert not over, f"rank {rank} staged more than was counted: {over}"
        assert any(used for used, _ in worst.values()), "nothing was coded: the test tests nothing"


def test_a_zstd_block_of_two_frames_is_refused():
    import zstandard
    data = np.zeros(4096, np.uint8)
    first = zstandard.ZstdCompressor().compress(data.tobytes())
    second = zstandard.ZstdCompressor().compress(b"smuggled")
    payload = np.frombuffer(first + second, np.uint8)
    area = coded("zstd", data)
    codecs.HEADER.pack_into(area.data, 0, 2, codecs.CODED, 0, 4096, payload.size)
    area = np.concatenate([area[:codecs.HEADER.size], payload])
    with pytest.raises(ProtocolError, match="zstd block from rank 4 does not decode") as err:
        decode("zstd", area, 4096)
    assert "rank 4" in str(err.value)

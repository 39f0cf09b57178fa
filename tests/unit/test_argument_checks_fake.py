"""The library keeps the promises of its docs (issue 16) about the arguments of a call, on the
in-memory fabric: one of the wrong type is a ConfigError naming it (#9), even after a valid call
on the same buffers; numpy integers are integers; the communicator stays usable. Each test is
named for a defect a second reader reproduced, and failed before it was mended."""

from __future__ import annotations

import numpy as np
import pytest
from rxelab.errors import ConfigError

from tests.unit.fakejob import run_ranks


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

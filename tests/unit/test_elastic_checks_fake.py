"""Elastic membership on the in-memory fabric (issue 18), its arguments: shrink and admit on a
job that is not elastic, a bad quorum, timeout or count, an elastic job without a secret and
the loop's own arguments are each refused with a ConfigError that names them."""

from __future__ import annotations

import numpy as np
import pytest
import rxelab
from rxelab import elastic
from rxelab.errors import ClosedError, ConfigError

from tests.unit.elastic_helpers import secret  # noqa: F401 (autouse: jobs need the secret)
from tests.unit.fakejob import run_ranks


def test_membership_calls_are_checked():
    def job(comm):
        with pytest.raises(ConfigError, match="not elastic"):
            comm.shrink()
        with pytest.raises(ConfigError, match="not elastic"):
            comm.admit()
        assert comm.rendezvous is None
        comm.barrier()
        return True
    assert run_ranks(2, job) == [True, True]

    def elastic(comm):
        for bad in ("most", 0, 3, True, 1.5):
            with pytest.raises(ConfigError, match="quorum"):
                comm.shrink(quorum=bad)
        for bad in (-1, "soon", float("nan")):
            with pytest.raises(ConfigError, match="timeout"):
                comm.shrink(timeout=bad)
        with pytest.raises(ConfigError, match="wanted"):
            comm.admit(wanted=-1)
        comm.barrier()
        comm.close()
        with pytest.raises(ClosedError):
            comm.shrink()
        return True
    assert run_ranks(2, elastic, elastic=True) == [True, True]
    with pytest.raises(ConfigError, match="elastic"):
        rxelab.init(0, 1, "127.0.0.1", 1, device="fake0", elastic="yes")


def test_an_elastic_job_without_a_secret_is_refused(monkeypatch):
    monkeypatch.delenv("RXELAB_JOB_TOKEN")
    with pytest.raises(ConfigError, match="needs a secret"):
        rxelab.init(0, 1, "127.0.0.1", 1, device="fake0", elastic=True)


def test_the_loop_checks_its_arguments():
    def job(comm):
        for bad in ({"steps": -1}, {"steps": 1.5}, {"steps": 3, "admit_every": -2}):
            with pytest.raises(ConfigError):
                elastic.run(comm, lambda c, k: None, **{"state": [], **bad})
        with pytest.raises(ConfigError, match="state"):
            elastic.run(comm, lambda c, k: None, 1, [np.zeros(4)[::2]])
        comm.barrier()
        return True
    assert run_ranks(2, job, elastic=True) == [True, True]

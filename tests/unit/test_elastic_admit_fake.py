"""Elastic membership on the in-memory fabric (issue 18), newcomers: they join between steps
and everyone computes with them; only a newcomer with the job's secret is admitted; a job
that grew can shrink again; admit waits no longer than the others wait for rank 0."""

from __future__ import annotations

import threading
import time

import pytest
import rxelab
from rxelab.errors import PeerError

from tests.unit.elastic_helpers import (
    after_losing,
    checked_allreduce,
    members_of,
    secret,  # noqa: F401 (autouse: jobs need the secret)
)
from tests.unit.fakejob import TRANSPORTS, over, run_ranks


def newcomer(port: int, results: dict, key: str, **options) -> threading.Thread:
    def run():
        try:
            with rxelab.join("127.0.0.1", port, wait=30, **{"device": "fake0", **options}) as comm:
                me = 100 + int(key[-1])
                ids = members_of(comm, me)
                checked_allreduce(comm, ids, me)
                results[key] = (comm.rank, comm.size, ids, comm.formed["how"], comm.transport)
        except BaseException as err:  # reported to the test
            results[key] = err
    t = threading.Thread(target=run, daemon=True, name=key)
    t.start()
    return t


@over(TRANSPORTS)
def test_newcomers_join_between_steps_and_everyone_computes_with_them(transport):
    results: dict = {}
    theirs = {"transport": transport} if transport == "verbs" else {"transport": transport,
                                                                   "device": None}
    started: list[threading.Thread] = []

    def job(comm):
        me = comm.rank
        assert comm.admit() is comm, "nobody knocked: the same communicator"
        if me == 0:
            port = comm.rendezvous[1]
            started.extend(newcomer(port, results, f"new{i}", **theirs) for i in range(2))
        comm.barrier()
        grown = comm.admit(timeout=10, wanted=2)
        with grown:
            assert comm.closed and grown.size == 5 and grown.rank == me
            ids = members_of(grown, me)
            checked_allreduce(grown, ids, me)
            return ids, grown.formed["admitted"]
    out = run_ranks(3, job, timeout=20, deadline=90, elastic=True, transport=transport)
    for t in started:
        t.join(30)
    assert sorted(results) == ["new0", "new1"], results
    for key in results:
        rank, size, ids, how, used = results[key]
        assert size == 5 and rank in (3, 4) and how == "join" and used == transport
    assert all(ids == out[0][0] for ids, _ in out) and sorted(out[0][0]) == [0, 1, 2, 100, 101]
    assert out[0][1] == [3, 4]


@pytest.mark.slow
def test_a_newcomer_without_the_secret_is_never_admitted(monkeypatch):
    results: dict = {}

    def job(comm):
        if comm.rank == 0:
            port = comm.rendezvous[1]
            with monkeypatch.context() as m:  # the stranger's own environment
                m.setenv("RXELAB_JOB_TOKEN", "F7k1UOiqmKHr5_LIzs0jCLDDWQcFaTg412LOGA5O23o")  # a strong guess
                with pytest.raises(PeerError) as err:
                    rxelab.join("127.0.0.1", port, wait=1.5, device="fake0")
                results["stranger"] = str(err.value)
        comm.barrier()
        return comm.admit(timeout=0.5).size
    out = run_ranks(2, job, timeout=20, deadline=60, elastic=True)
    assert out == [2, 2] and "not admitted" in results["stranger"]


def test_a_job_that_grew_can_shrink_again_even_losing_a_newcomer():
    """Two newcomers join; one of them and an old rank die; the rest, old and new, shrink."""
    results: dict = {}

    def arrive(port: int, key: str, dies: bool) -> threading.Thread:
        def run():
            try:
                comm = rxelab.join("127.0.0.1", port, wait=30, device="fake0")
                me = 100 + comm.rank
                small = after_losing(comm, {comm.rank} if dies else set())
                if small is None:
                    results[key] = "died"
                    return
                with small:
                    results[key] = members_of(small, me)
            except BaseException as err:  # reported to the test
                results[key] = err
        t = threading.Thread(target=run, daemon=True, name=key)
        t.start()
        return t

    threads: list[threading.Thread] = []

    def job(comm):
        me = comm.rank
        if me == 0:
            threads.extend(arrive(comm.rendezvous[1], f"new{i}", dies=i == 0) for i in range(2))
        comm.barrier()
        comm = comm.admit(timeout=10, wanted=2)
        assert comm.size == 5
        small = after_losing(comm, {1})
        if small is None:
            return None
        with small:
            return members_of(small, me)
    out = run_ranks(3, job, timeout=20, deadline=90, elastic=True)
    for t in threads:
        t.join(30)
    assert results["new0"] == "died"
    # newcomers take ranks 3 and 4 in the order they knocked
    assert out[0] == out[2] == results["new1"] and out[0][:2] == [0, 2], (out, results)
    assert out[0][2] in (103, 104)


def test_admit_waits_no_longer_than_the_others_wait_for_rank_0():
    def job(comm):
        started = time.monotonic()
        same = comm.admit(timeout=30)
        assert same is comm
        comm.barrier()
        return time.monotonic() - started
    took = run_ranks(3, job, timeout=2, elastic=True)
    assert max(took) < 5, took

"""Elastic membership on the in-memory fabric (issue 18), the agreement under failure: a
survivor, the coordinator or a member of the new mesh that dies while the others agree is left
out and the rest agree again; a rank that speaks of another generation is told, never taken
in."""

from __future__ import annotations

import time

import pytest
from rxelab.comm import Communicator
from rxelab.membership import agreement as membership

from tests.unit.elastic_helpers import (
    Died,
    after_losing,
    dies,
    members_of,
    secret,  # noqa: F401 (autouse: jobs need the secret)
    until_failure,
)
from tests.unit.fakejob import die, run_ranks


def test_a_survivor_that_dies_during_the_agreement_is_left_out():
    """Rank 3 comes to the coordinator and dies there (its connection and listener close):
    the agreement counts it dead; the others go on."""
    def job(comm):
        me = comm.rank
        if dies(comm, {1}):
            return None
        if me == 3:
            seat = comm._seat()
            link = seat.dial(0, "shrink", 0, time.monotonic() + 10)
            link.send({"type": "shrink", "rank": 3, "generation": 0})
            time.sleep(0.3)
            link.close()
            die(comm)
            return None
        until_failure(comm)
        new = comm.shrink()
        with new:
            return members_of(new, me)
    out = run_ranks(5, job, timeout=20, deadline=90, elastic=True)
    assert out[0] == out[2] == out[4] == [0, 2, 4]


def test_a_coordinator_that_dies_during_the_agreement_hands_it_to_the_next(monkeypatch):
    """Rank 0 dies first; rank 1 starts coordinating and dies with the others waiting on it:
    they move on to rank 2."""
    real = membership.coordinate

    def coordinate(seat, members, dead, generation, deadline, quorum):
        if seat.job.rank == 1:
            time.sleep(0.5)  # the others are waiting on it now
            seat.server.close(listener=True)
            raise Died()
        return real(seat, members, dead, generation, deadline, quorum)
    monkeypatch.setattr(membership, "coordinate", coordinate)

    def job(comm):
        new = after_losing(comm, {0})
        if new in (None, "died"):
            return new
        with new:
            return members_of(new, comm.rank), new.formed["lost"]
    out = run_ranks(5, job, timeout=20, deadline=90, elastic=True)
    assert out[1] == "died"
    for r in (2, 3, 4):
        assert out[r] == ([2, 3, 4], [0, 1]), out


@pytest.mark.slow
def test_a_member_that_dies_while_the_new_mesh_is_built_makes_them_agree_again(monkeypatch):
    real = Communicator._builder

    def builder(seat):
        build = real(seat)

        def dying(job, generation, alive=None):
            if seat.job.rank == 3 and generation == 1:
                seat.server.close(listener=True)
                raise Died()
            return build(job, generation, alive)
        return dying
    monkeypatch.setattr(Communicator, "_builder", staticmethod(builder))

    def job(comm):
        started = time.monotonic()
        new = after_losing(comm, {4})
        if new in (None, "died"):
            return new
        with new:
            return members_of(new, comm.rank), new.formed["lost"], time.monotonic() - started
    out = run_ranks(5, job, timeout=30, deadline=90, elastic=True)
    for r in (0, 1, 2):
        ids, lost, took = out[r]
        assert ids == [0, 1, 2] and lost == [3, 4], out
        assert took < 10, f"the dead member was found by its closed listener, not a timeout: {took:.1f} s"


def test_a_rank_that_saw_another_membership_is_told_and_left_out():
    """A shrink request that speaks of another generation (a rank that built, or failed to
    build, a communicator the others did not) is answered, never silently taken in."""
    def job(comm):
        me = comm.rank
        if dies(comm, {2}):
            return None
        if me == 3:  # claims to leave generation 7
            seat = comm._seat()
            reply = {"type": "later"}
            while reply["type"] == "later":  # until rank 0 coordinates (as ask() does)
                link = seat.dial(0, "shrink", 7, time.monotonic() + 10)
                link.send({"type": "shrink", "rank": 3, "generation": 7})
                reply = link.recv(deadline=time.monotonic() + 20, peer="rank 0")
                link.close()
                time.sleep(0.1)
            die(comm)
            return reply
        until_failure(comm)
        with comm.shrink() as new:
            return members_of(new, me)
    out = run_ranks(5, job, timeout=20, deadline=90, elastic=True)
    assert out[3]["type"] == "failed" and "generation 7" in out[3]["reason"]
    assert out[0] == out[1] == out[4] == [0, 1, 4]

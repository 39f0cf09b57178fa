"""Elastic membership on the in-memory fabric (issue 18), the shrink: survivors of any victim
agree on one set, renumber in the old order and go on with correct collectives; the quorum
lets one side of a split at most go on; every wait is bounded and says what it waited for; a
rank cut off without closing anything is found by its silence; nothing is left open."""

from __future__ import annotations

import time

import numpy as np
import pytest
from rxelab.errors import PeerError
from rxelab.membership import agreement as membership

from tests.unit.elastic_helpers import (
    after_losing,
    checked_allreduce,
    dies,
    members_of,
    secret,  # noqa: F401 (autouse: jobs need the secret)
    until_failure,
)
from tests.unit.fakejob import SOCKETS, die, over, run_ranks, settle


def survive(victims: set[int], *, at_barrier: bool = True, quorum: str | int = "majority"):
    """A job where the victims die after a barrier and the others shrink, check an allreduce
    on the new communicator, and report what they agreed on."""
    def job(comm):
        me = comm.rank
        started = time.monotonic()
        new = after_losing(comm, victims, quorum=quorum)
        if new is None:
            return None
        took = time.monotonic() - started
        with new:
            assert comm.closed and not comm.conns, "the old communicator is gone whole"
            ids = members_of(new, me)
            checked_allreduce(new, ids, me)
            return {"rank": new.rank, "size": new.size, "ids": ids, "lost": new.formed["lost"],
                    "took": took, "transport": new.transport}
    return job


@pytest.mark.parametrize("p,victims", [
    (2, {1}), (3, {0}), (3, {2}), (4, {1}), (5, {0, 4}), (6, {3}), (7, {0, 1, 2}), (8, {0}),
    (8, {7}), (8, {2, 5, 6}),
])
def test_survivors_agree_renumber_in_the_old_order_and_compute_correctly(p, victims):
    out = run_ranks(p, survive(victims), timeout=20, deadline=90, elastic=True)
    alive = [r for r in range(p) if r not in victims]
    for old, got in enumerate(out):
        if old in victims:
            assert got is None
            continue
        assert got["ids"] == alive, "one set, in the old order"
        assert got["rank"] == alive.index(old) and got["size"] == len(alive)
        assert got["lost"] == sorted(victims)
        assert got["took"] < 10, f"shrink took {got['took']:.1f} s"


@pytest.mark.parametrize("p,victims", [(3, {0}), (5, {1, 3})])
@over(SOCKETS)
def test_over_sockets_the_survivors_shrink_and_compute_as_over_verbs(p, victims, transport):
    """The next communicator opens the same transport (the seat carries it) and works."""
    out = run_ranks(p, survive(victims), timeout=20, deadline=90, elastic=True,
                    transport=transport)
    alive = [r for r in range(p) if r not in victims]
    for old, got in enumerate(out):
        if old not in victims:
            assert got["ids"] == alive and got["size"] == len(alive) and got["lost"] == sorted(victims)
            assert got["transport"] == transport


def test_rank_0_dying_alone_in_a_pair_stops_the_survivor_unless_any_group_may_go_on():
    out = run_ranks(2, survive({0}), timeout=10, deadline=60, elastic=True, keep_errors=True)
    assert isinstance(out[1], PeerError) and "quorum" in str(out[1]) and "[1]" in str(out[1])
    out = run_ranks(2, survive({0}, quorum="any"), timeout=10, deadline=60, elastic=True)
    assert out[1]["ids"] == [1] and out[1]["size"] == 1


def test_the_quorum_rule_lets_one_side_of_a_split_at_most_go_on():
    members = list(range(6))
    for left in ([0, 1, 2], [3, 4, 5], [0, 1, 2, 3], [4, 5], [1, 2, 3]):
        right = [m for m in members if m not in left]
        sides = [membership.quorate(s, members, "majority") for s in (left, right)]
        assert sides.count(True) <= 1, (left, sides)
    assert membership.quorate([0, 1, 2], members, "majority")
    assert not membership.quorate([3, 4, 5], members, "majority")
    assert membership.quorate([5], members, "any") and membership.quorate([4, 5], members, 2)
    assert not membership.quorate([5], members, 2)


@pytest.mark.slow
def test_deaths_seen_at_different_moments_end_in_one_set():
    """Rank 2 dies in a loop of collectives; rank 4 sees that failure and dies before the
    shrink; rank 5 dies a moment after the others saw the first failure. Each survivor's
    error names whichever it noticed; all end with the same set."""
    def job(comm):
        me = comm.rank
        if dies(comm, {2}):
            return None
        try:
            for _ in range(400):
                comm.allreduce(np.ones(64), np.empty(64))
        except PeerError as err:
            seen = err.peer
        if me in (4, 5):
            time.sleep(0.0 if me == 4 else 0.1)
            die(comm)
            return None
        new = comm.shrink()
        with new:
            return seen, members_of(new, me)
    out = run_ranks(7, job, timeout=20, deadline=90, elastic=True)
    for r in (0, 1, 3, 6):
        assert out[r][1] == [0, 1, 3, 6], out


@pytest.mark.slow
def test_a_live_rank_that_never_comes_is_named_and_nothing_hangs():
    def job(comm):
        me = comm.rank
        if dies(comm, {2}):
            return None
        if me == 3:  # alive (its listener answers), busy elsewhere, never shrinks
            time.sleep(4)
            comm.close()
            return None
        until_failure(comm)
        started = time.monotonic()
        with pytest.raises(PeerError) as err:
            comm.shrink(timeout=2)
        return str(err.value), time.monotonic() - started
    out = run_ranks(4, job, timeout=20, deadline=60, elastic=True)
    for r in (0, 1):
        why, took = out[r]
        assert "[3]" in why and "did not come" in why, why
        assert took < 6


@pytest.mark.slow
def test_repeated_shrinks_and_a_shrink_without_a_death():
    def job(comm):
        me = comm.rank
        settle(comm)
        for victim in (5, 1):
            if me == victim:
                die(comm)
                return None
            with pytest.raises(PeerError):
                for _ in range(200):
                    comm.allreduce(np.ones(64), np.empty(64))
            comm = comm.shrink()
            comm.barrier()
        same = comm.shrink()  # nobody died: the same members, a fresh communicator
        with same:
            ids = members_of(same, me)
            checked_allreduce(same, ids, me)
            return ids, same.formed["generation"]
    out = run_ranks(6, job, timeout=20, deadline=90, elastic=True)
    for r in (0, 2, 3, 4):
        assert out[r] == ([0, 2, 3, 4], 3)


def test_nothing_of_an_elastic_job_is_left_open():
    """Listeners and connections: a job that shrank closes all of its sockets."""
    import gc
    before = _open_sockets()
    run_ranks(4, survive({3}), timeout=20, deadline=60, elastic=True)
    gc.collect()
    assert _open_sockets() <= before, "sockets left open"


def _open_sockets() -> int:
    import os
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except FileNotFoundError:  # closed since the listing (the listing's own, say)
            pass
    return found


@pytest.mark.slow
def test_a_rank_cut_off_without_a_closed_connection_is_found_by_its_silence(monkeypatch):
    """A node that powers off or drops off the network closes nothing, and the others may be
    waiting to receive (nothing of theirs could fail): the heartbeats find it, long before
    the no-progress timeout."""
    from rxelab.control import plane
    monkeypatch.setattr(plane, "SILENT_S", 2.0)

    def job(comm):
        me = comm.rank
        settle(comm)
        if me == 2:  # frozen: no beats, no data, its sockets open
            comm.control.quiet.set()
            comm.control.stopping = True
            time.sleep(5)
            die(comm)
            return None
        started = time.monotonic()
        with pytest.raises(PeerError) as err:
            comm.allreduce(np.ones(64), np.empty(64))
        took = time.monotonic() - started
        return str(err.value), took, err.value.peer, err.value.lost
    out = run_ranks(4, job, timeout=60, deadline=60, elastic=True, keep_errors=True)
    for r in (0, 1, 3):
        assert out[r][1] < 10, out  # the no-progress timeout is 60 s
    # whoever heard its silence takes rank 2 for lost (the others may hear a peer's abort)
    heard = [out[r][2:] for r in (0, 1, 3) if "rank 2 has been silent" in out[r][0]]
    assert heard and set(heard) == {(2, True)}, out
    # whoever heard of it first says why (the others may hear a peer's abort first)
    assert any("rank 2 has been silent" in out[r][0] for r in (0, 1, 3)), out

"""Elastic membership on the in-memory fabric (issue 18): survivors of any victim agree on one
set, renumber in the old order and go on with correct collectives; newcomers join between
steps; every wait is bounded and says what it waited for."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import numpy as np
import pytest
import rxelab
from rxelab import elastic
from rxelab.comm import Communicator
from rxelab.errors import ClosedError, ConfigError, PeerError
from rxelab.membership import agreement as membership

from tests.unit.fakejob import die, run_ranks, settle


@pytest.fixture(autouse=True)
def secret(monkeypatch):
    """Elastic jobs need a secret (the ranks are threads: one environment)."""
    monkeypatch.setenv("RXELAB_JOB_TOKEN", "the job's secret")


class Died(BaseException):
    """A rank's thread ends as a killed process would (its sockets closed)."""


def total(ids: list[int]) -> float:
    return float(sum(i + 1 for i in ids))


def checked_allreduce(comm: Communicator, ids: list[int], me: int) -> float:
    """An allreduce of each rank's (original id + 1): the sum over the members' ids."""
    x = np.full(257, me + 1.0)
    y = np.empty_like(x)
    comm.allreduce(x, y)
    assert np.all(y == total(ids)), (y[0], ids)
    return float(y[0])


def until_failure(comm: Communicator) -> None:
    """A survivor's work until a death is noticed."""
    with pytest.raises(PeerError):
        for _ in range(200):
            comm.allreduce(np.ones(64), np.empty(64))


def dies(comm: Communicator, victims: Any) -> bool:
    """Every rank settles; a victim then dies (and says so)."""
    settle(comm)
    if comm.rank in victims:
        die(comm)
        return True
    return False


def after_losing(comm: Communicator, victims: set[int] | tuple[int, ...], **shrink: Any) -> Any:
    """Every rank settles, the victims die; the others wait for the failure and shrink: the
    new communicator, None on a victim, "died" on a rank that died in the shrink."""
    if dies(comm, victims):
        return None
    until_failure(comm)
    try:
        return comm.shrink(**shrink)
    except Died:
        return "died"


def members_of(comm: Communicator, me: int) -> list[int]:
    """The original ids of the communicator's ranks, in rank order."""
    ids = np.empty(comm.size, np.int64)
    comm.allgather(np.array([me], np.int64), ids)
    return [int(i) for i in ids]


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
                    "took": took}
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
            seat.porter.close(listener=True)
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


def test_a_member_that_dies_while_the_new_mesh_is_built_makes_them_agree_again(monkeypatch):
    real = Communicator._builder

    def builder(seat):
        build = real(seat)

        def dying(job, generation, alive=None):
            if seat.job.rank == 3 and generation == 1:
                seat.porter.close(listener=True)
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


def newcomer(port: int, results: dict, key: str, **options) -> threading.Thread:
    def run():
        try:
            with rxelab.join("127.0.0.1", port, wait=30, device="fake0", **options) as comm:
                me = 100 + int(key[-1])
                ids = members_of(comm, me)
                checked_allreduce(comm, ids, me)
                results[key] = (comm.rank, comm.size, ids, comm.formed["how"])
        except BaseException as err:  # reported to the test
            results[key] = err
    t = threading.Thread(target=run, daemon=True, name=key)
    t.start()
    return t


def test_newcomers_join_between_steps_and_everyone_computes_with_them(monkeypatch):
    results: dict = {}
    started: list[threading.Thread] = []

    def job(comm):
        me = comm.rank
        assert comm.admit() is comm, "nobody knocked: the same communicator"
        if me == 0:
            port = comm.rendezvous[1]
            started.extend(newcomer(port, results, f"new{i}") for i in range(2))
        comm.barrier()
        grown = comm.admit(timeout=10, wanted=2)
        with grown:
            assert comm.closed and grown.size == 5 and grown.rank == me
            ids = members_of(grown, me)
            checked_allreduce(grown, ids, me)
            return ids, grown.formed["admitted"]
    out = run_ranks(3, job, timeout=20, deadline=90, elastic=True)
    for t in started:
        t.join(30)
    assert sorted(results) == ["new0", "new1"], results
    for key in results:
        rank, size, ids, how = results[key]
        assert size == 5 and rank in (3, 4) and how == "join"
    assert all(ids == out[0][0] for ids, _ in out) and sorted(out[0][0]) == [0, 1, 2, 100, 101]
    assert out[0][1] == [3, 4]


def test_a_newcomer_without_the_secret_is_never_admitted(monkeypatch):
    results: dict = {}

    def job(comm):
        if comm.rank == 0:
            port = comm.rendezvous[1]
            with monkeypatch.context() as m:  # the stranger's own environment
                m.setenv("RXELAB_JOB_TOKEN", "a guess")
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


def training(me: int, when: dict[int, int], log: list | None = None):
    """A step of a data-parallel loop: this rank's gradient (its original id + 1, times the
    step + 1), allreduced and checked against the sum over this step's members, added to the
    parameters. A rank in `when` dies at the start of that step."""
    seen: dict[str, Any] = {"comm": None, "ids": []}

    def step(comm: Communicator, k: int) -> None:
        if when.get(me) == k:
            die(comm)
            raise Died()
        if comm is not seen["comm"]:
            seen["comm"], seen["ids"] = comm, members_of(comm, me)
        grad = np.full(300, (me + 1.0) * (k + 1))
        total_grad = np.empty_like(grad)
        comm.allreduce(grad, total_grad)
        expected = sum(i + 1.0 for i in seen["ids"]) * (k + 1)
        assert np.all(total_grad == expected), (k, total_grad[0], expected, seen["ids"])
        params[me] += total_grad
        if log is not None:
            log.append((me, k, list(seen["ids"])))
    params: dict[int, np.ndarray] = {me: np.zeros(300)}
    return step, params[me], seen


@pytest.mark.parametrize("seed", range(8))
def test_random_schedules_of_deaths_during_a_training_loop(seed):
    """p ranks, a minority of victims each dying at a random step; elastic.run shrinks, rolls
    back whoever finished the interrupted step and redoes it. Every step's allreduce equals
    the sum over that step's members; all survivors end with the same members and the same
    parameters."""
    rnd = random.Random(seed)
    p = rnd.randint(3, 8)
    victims = rnd.sample(range(p), rnd.randint(1, (p - 1) // 2))
    when = {v: rnd.randint(0, 6) for v in victims}

    def job(comm):
        me = comm.rank
        step, params, seen = training(me, when)
        try:
            last = elastic.run(comm, step, 10, [params])
        except Died:
            return None
        last.close()
        return seen["ids"], params.copy()
    out = run_ranks(p, job, timeout=20, deadline=120, elastic=True, seed=seed)
    alive = [r for r in range(p) if r not in victims]
    for r in alive:
        assert out[r][0] == alive, (seed, p, victims, out)
        assert np.array_equal(out[r][1], out[alive[0]][1]), "the same parameters everywhere"


def test_the_loop_shares_step_and_state_with_newcomers_and_reports_every_change():
    events: dict[int, list] = {}
    joined: dict = {}

    def newcomer_loop(port: int) -> threading.Thread:
        def run():
            try:
                comm = rxelab.join("127.0.0.1", port, wait=30, device="fake0")
                step, params, _ = training(100, {})
                got: list = []
                last = elastic.run(comm, step, 8, [params], admit_every=4, report=got.append)
                last.close()
                joined["events"], joined["params"] = got, params.copy()
            except BaseException as err:  # reported to the test
                joined["error"] = err
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    threads = []

    def job(comm):
        me = comm.rank
        step, params, _ = training(me, {2: 5})
        mine: list = events.setdefault(me, [])

        def knock_early(event):
            mine.append(event)
            if me == 0 and event["event"] == "step" and event["step"] == 0:
                threads.append(newcomer_loop(comm.rendezvous[1]))
        try:
            last = elastic.run(comm, step, 8, [params], admit_every=4, admit_timeout=20,
                               report=knock_early)
        except Died:
            return None
        last.close()
        return params.copy()
    out = run_ranks(4, job, timeout=20, deadline=120, elastic=True)
    for t in threads:
        t.join(60)
    assert "error" not in joined, joined
    assert np.array_equal(out[0], joined["params"]) and np.array_equal(out[0], out[3])
    kinds = [e["event"] for e in events[0]]
    assert "admit" in kinds and "shrink" in kinds, kinds
    admitted = next(e for e in events[0] if e["event"] == "admit")
    assert admitted["size"] == 5 and admitted["step"] == 4
    shrunk = next(e for e in events[0] if e["event"] == "shrink")
    # rank 2 dies at step 5's start, maybe before the others finished step 4 with it
    assert shrunk["size"] == 4 and shrunk["step"] in (4, 5) and shrunk["lost"] == [2]
    assert joined["events"][0]["event"] == "joined" and joined["events"][0]["step"] == 4
    # every step finished; one may be finished twice (redone after the rollback)
    done = [e["step"] for e in events[0] if e["event"] == "step"]
    assert sorted(set(done)) == list(range(8)) and len(done) <= 9, done


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


def test_the_demo_app_trains_through_a_death_and_a_newcomer(monkeypatch, capsys):
    """apps/elastic_train.py as the lab runs it, its ranks as threads: rank 3 of 5 dies at
    step 4, a newcomer joins at step 6; every step is checked by the app, survivors end with
    the same parameters, and the JSON lines tell the story."""
    from pyverbs import _fabric

    from apps import elastic_train
    from tests.unit.fakejob import free_port

    _fabric.FABRIC.reset(seed=1, max_delay=0.0002)
    port, p = free_port(), 5
    real_init, real_join = rxelab.init, rxelab.join
    rank_of = {f"rank{r}": r for r in range(p)}
    monkeypatch.setattr(rxelab, "init", lambda **kw: real_init(
        rank_of[threading.current_thread().name], p, "127.0.0.1", port, device="fake0", **kw))
    monkeypatch.setattr(rxelab, "join", lambda **kw: real_join(
        "127.0.0.1", port, device="fake0", **kw))

    def dies(comm):
        die(comm)
        raise Died()
    monkeypatch.setattr(elastic_train, "die", dies)
    codes: dict[str, Any] = {}
    common = ["--steps", "10", "--size", "4096", "--admit-every", "6", "--admit-timeout", "20",
              "--timeout", "20"]

    def start(name: str, argv: list[str]) -> threading.Thread:
        def run():
            try:
                codes[name] = elastic_train.main(argv)
            except Died:
                codes[name] = "died"
            except BaseException as err:  # reported to the test
                codes[name] = err
        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        return t
    threads = [start(f"rank{r}", [*common, "--kill", "4:3"]) for r in range(p)]
    threads.append(start("new", ["--join", "--join-timeout", "30", "--size", "4096", "--steps",
                                 "10", "--admit-every", "6", "--timeout", "20"]))
    for t in threads:
        t.join(90)
    assert codes == {"rank0": 0, "rank1": 0, "rank2": 0, "rank3": "died", "rank4": 0, "new": 0}
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    done = [e for e in events if e["event"] == "done"]
    assert len(done) == 5 and len({e["params"] for e in done}) == 1, done
    assert all(e["size"] == 5 for e in done), "4 survivors and the newcomer"
    kinds = {e["event"] for e in events}
    assert {"start", "dying", "shrink", "admit", "joined", "step", "done"} <= kinds
    steps = [e["step"] for e in events if e["event"] == "step"]
    assert sorted(set(steps)) == list(range(10))


def test_a_death_while_the_loop_recovers_is_survived_too(monkeypatch):
    """Rank 1 dies at step 3; rank 3 dies while the survivors agree where to go on: they
    shrink again and finish together."""
    real, hit = elastic._agree_step, []

    def agree(comm, done, arrays, before):
        if threading.current_thread().name == "rank3" and not hit:
            hit.append(True)
            die(comm)
            raise Died()
        return real(comm, done, arrays, before)
    monkeypatch.setattr(elastic, "_agree_step", agree)

    def job(comm):
        me = comm.rank
        step, params, seen = training(me, {1: 3})
        try:
            last = elastic.run(comm, step, 8, [params])
        except Died:
            return None
        last.close()
        return seen["ids"], params.copy()
    out = run_ranks(5, job, timeout=20, deadline=120, elastic=True)
    assert hit and out[1] is None and out[3] is None
    assert out[0][0] == out[2][0] == out[4][0] == [0, 2, 4]
    assert np.array_equal(out[0][1], out[2][1]) and np.array_equal(out[0][1], out[4][1])


def test_admit_waits_no_longer_than_the_others_wait_for_rank_0():
    def job(comm):
        started = time.monotonic()
        same = comm.admit(timeout=30)
        assert same is comm
        comm.barrier()
        return time.monotonic() - started
    took = run_ranks(3, job, timeout=2, elastic=True)
    assert max(took) < 5, took


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


def test_a_rank_cut_off_without_a_closed_connection_is_found_by_its_silence(monkeypatch):
    """A node that powers off or drops off the network closes nothing, and the others may be
    waiting to receive (nothing of theirs could fail): the heartbeats find it, long before
    the no-progress timeout."""
    from rxelab import control
    monkeypatch.setattr(control, "SILENT_S", 2.0)

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
        return str(err.value), took
    out = run_ranks(4, job, timeout=60, deadline=60, elastic=True, keep_errors=True)
    for r in (0, 1, 3):
        assert out[r][1] < 10, out  # the no-progress timeout is 60 s
    # whoever heard of it first says why (the others may hear a peer's abort first)
    assert any("rank 2 has been silent" in out[r][0] for r in (0, 1, 3)), out

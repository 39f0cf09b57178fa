"""Elastic membership on the in-memory fabric (issue 18), the training loop (elastic.run):
through deaths at random steps and during its own recovery, with newcomers that take its
step and state, every step's sum is right and the survivors end with the same parameters;
apps/elastic_train.py, the demo, does the same."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import numpy as np
import pytest
import rxelab
from rxelab import elastic
from rxelab.comm import Communicator

from tests.unit.elastic_helpers import (
    Died,
    members_of,
    secret,  # noqa: F401 (autouse: jobs need the secret)
)
from tests.unit.fakejob import die, run_ranks


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_a_job_waits_at_its_admit_points_for_the_newcomer_it_expects_and_no_longer(monkeypatch):
    """The newcomer starts knocking only once the job is at its first admit point: expected
    (expect=1), it is waited for there (a job whose newcomer started up slower than its steps
    ended without it: issue 56's lab run, 17 s of steps, 18 s of a newcomer's start-up), and
    once it came the later admit points wait for nobody."""
    joined: dict = {}
    threads: list[threading.Thread] = []
    asked: list[tuple[int, float, int]] = []  # (thread, timeout, wanted) of each admit call
    real_admit = Communicator.admit

    def admit(self, timeout=0.0, wanted=1, quorum="majority"):
        asked.append((threading.get_ident(), timeout, wanted))
        return real_admit(self, timeout, wanted, quorum)
    monkeypatch.setattr(Communicator, "admit", admit)

    def newcomer(port: int) -> None:
        try:
            comm = rxelab.join("127.0.0.1", port, wait=40, device="fake0")
            step, params, _ = training(100, {})
            got: list = []
            elastic.run(comm, step, 4, [params], admit_every=1, report=got.append).close()
            joined["events"] = got
        except BaseException as err:  # reported to the test
            joined["error"] = err

    def job(comm):
        step, params, _ = training(comm.rank, {})
        mine: list = [threading.get_ident()]

        def start_late(event):
            mine.append(event)
            if comm.rank == 0 and event["event"] == "step" and event["step"] == 0:
                threads.append(threading.Thread(target=newcomer, args=(comm.rendezvous[1],),
                                                daemon=True))
                threads[-1].start()  # the job is at its first admit point (after step 0 of 4)
        elastic.run(comm, step, 4, [params], admit_every=1, admit_timeout=30, expect=1,
                    report=start_late).close()
        return mine
    out = run_ranks(2, job, timeout=60, deadline=120, elastic=True)
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "the newcomer still running 60 s after the job ended"
    assert "error" not in joined, joined
    me, events = out[0][0], out[0][1:]
    assert [(e["step"], e["size"]) for e in events if e["event"] == "admit"] == [(1, 3)], events
    assert [e["size"] for e in events if e["event"] == "step"] == [2, 3, 3, 3]
    assert joined["events"][0]["event"] == "joined" and joined["events"][0]["step"] == 1
    assert [(t, w) for i, t, w in asked if i == me] == [(30, 1), (0.0, 1), (0.0, 1)], asked


@pytest.mark.parametrize("expect", [-1, 65, True, 1.0])
def test_expect_is_a_small_whole_number(expect):
    with pytest.raises(rxelab.ConfigError, match="expect="):
        elastic.run(None, lambda c, k: None, 1, expect=expect)  # type: ignore[arg-type]


@pytest.mark.parametrize("flags", [["--expect-newcomers", "1"],
                                   ["--expect-newcomers", "1", "--admit-every", "3"],
                                   ["--expect-newcomers", "1", "--admit-timeout", "30"],
                                   ["--expect-newcomers", "65", "--admit-every", "3",
                                    "--admit-timeout", "30"]])
def test_the_demo_app_refuses_newcomers_it_could_not_wait_for(flags, capsys):
    from apps import elastic_train

    with pytest.raises(SystemExit) as ended:
        elastic_train.main(flags)
    assert ended.value.code == 2 and "--expect-newcomers" in capsys.readouterr().err

"""`fab validate`'s yardstick: another lab run of the same cases scored as the simulator's
predictions are, so a reader sees how close the lab comes to itself."""

from __future__ import annotations

import json
import random
import re
import shutil
import statistics

import pytest

from experiments.report import Record
from experiments.simulation import validate, yardstick
from experiments.simulation.costs import PLACEHOLDER


def row(algorithm, lab_s, predicted_s, size=1024, spread=0.1):
    return validate.Row("alltoall", algorithm, 3, 3, size, lab_s, lab_s * (1 - spread),
                        lab_s * (1 + spread), 3, predicted_s)


def run_dir(path, spec, medians, run_id=None):
    """A lab run's directory: environment.json naming its spec (and its run id, if given), and
    three rounds of each (algorithm, size) -> median, at +-5 %."""
    path.mkdir(parents=True)
    (path / "environment.json").write_text(json.dumps({"spec": spec, "run_id": run_id}))
    records = [{"app": "rxelab", "op": "alltoall", "algorithm": algorithm, "nodes": 3,
                "size": size, "status": "ok", "netem": {},
                "summary": {"tight": True, "ranks": 3, "avg_stage_us": seconds * f * 1e6}}
               for (algorithm, size), seconds in medians.items() for f in (0.95, 1.0, 1.05)]
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_error_is_the_geometric_mean_of_each_miss_either_way():
    assert yardstick.error([1.0, 1.0]) == pytest.approx(1.0)
    assert yardstick.error([2.0, 0.5]) == pytest.approx(2.0)
    assert yardstick.error([4.0, 1.0]) == pytest.approx(2.0)


@pytest.mark.parametrize("rounds", [2, 3, 5])
def test_an_exact_median_falls_outside_the_rounds_min_max_as_often_as_said(rounds):
    """Draws of `rounds` rounds around a known median: the share whose min-max misses it."""
    draw = random.Random(rounds)
    trials = 20000
    outside = 0
    for _ in range(trials):
        got = [draw.lognormvariate(0.0, 0.2) for _ in range(rounds)]  # true median 1.0
        outside += not (min(got) <= 1.0 <= max(got))
    assert outside / trials == pytest.approx(yardstick.chance_outside(rounds), abs=0.015)


def test_another_runs_medians_are_scored_on_the_cases_both_ran():
    table = [row("pairwise", 1.0, 1.5), row("parallel", 2.0, 1.9), row("bruck", 3.0, 3.0)]
    theirs = {("alltoall", "pairwise", 3, 3, 1024): [0.9, 1.05, 1.3],
              ("alltoall", "parallel", 3, 3, 1024): [2.5, 2.6, 2.7],
              ("alltoall", "sequential", 3, 3, 1024): [9.0]}  # not in this run: left out
    lab = yardstick.beside(table, theirs)
    assert [(r.algorithm, r.predicted_s) for r in lab] == [("pairwise", 1.05), ("parallel", 2.6)]
    s = yardstick.score(lab, validate.rankings)
    assert (s.cases, s.within, s.orders, s.same, s.first) == (2, 1, 1, 1, 1)
    assert s.error == pytest.approx(statistics.geometric_mean([1.05, 1.3]))


def test_the_yardstick_is_the_newest_run_before_of_the_same_spec_then_the_first_after(tmp_path):
    """Runs before this one, newest first, then the ones after, oldest first; another spec's
    run and one whose environment.json is broken are no yardstick."""
    one = {("pairwise", 1024): 1e-3}
    mine = run_dir(tmp_path / "20260103-000000-validation", "validation", one)
    assert yardstick.candidates(mine) == []
    for name, spec in (("20260101-000000-validation", "validation"),
                       ("20260102-000000-latency", "latency"),
                       ("20260105-000000-validation", "validation"),
                       ("20260104-000000-validation", "validation"),
                       ("20260102-120000-validation", "validation")):
        run_dir(tmp_path / name, spec, one)
    broken = tmp_path / "20260102-180000-validation"
    broken.mkdir()
    (broken / "records.jsonl").write_text("")
    (broken / "environment.json").write_text("{not json")
    assert [p.name for p in yardstick.candidates(mine)] == [
        "20260102-120000-validation", "20260101-000000-validation",
        "20260104-000000-validation", "20260105-000000-validation"]
    assert yardstick.candidates(tmp_path / "20260102-000000-latency") == []


def test_a_broken_or_unrelated_run_is_passed_over_for_the_next(tmp_path):
    """The newest run before this one has broken records, the next ran other cases: the third
    is the yardstick; with none left, there is no yardstick and no error."""
    mine = run_dir(tmp_path / "20260109-000000-validation", "validation",
                   {("pairwise", 1024): 1e-3})
    good = run_dir(tmp_path / "20260101-000000-validation", "validation",
                   {("pairwise", 1024): 1.01e-3})
    run_dir(tmp_path / "20260102-000000-validation", "validation", {("parallel", 65536): 1e-3})
    cut = run_dir(tmp_path / "20260103-000000-validation", "validation",
                  {("pairwise", 1024): 1e-3})
    (cut / "records.jsonl").write_text('{"app": "rxelab", "op"\n')  # cut short mid-write
    table = [row("pairwise", 1e-3, 1e-3)]
    assert validate.against_itself(mine, table, None)["run"] == good.name
    (good / "records.jsonl").unlink()
    assert validate.against_itself(mine, table, None) is None


def test_a_round_that_timed_nothing_is_no_measurement():
    """A zero, negative or missing time is left out: it would be no ratio's divisor."""
    def rec(us):
        return Record.model_validate({"app": "rxelab", "op": "alltoall", "algorithm": "pairwise",
                                      "nodes": 3, "size": 1024, "status": "ok",
                                      "summary": {"tight": True, "ranks": 3, "avg_stage_us": us}})
    got = validate.lab_cases([rec(0), rec(-5.0), rec(float("nan")), rec(None), rec(True),
                              rec(2000.0)])
    assert got == {("alltoall", "pairwise", 3, 3, 1024): [2e-3]}


def test_the_lab_against_itself_is_written_beside_the_simulators_score(tmp_path):
    """The other run's medians inside this run's spread for pairwise (1.02x), not for parallel
    (0.4x, and so the faster of the two there); the simulator's score on the same cases
    beside it; the section names the run."""
    mine = run_dir(tmp_path / "20260102-000000-validation", "validation",
                   {("pairwise", 1024): 1e-3, ("parallel", 1024): 2e-3})
    run_dir(tmp_path / "20260101-000000-validation", "validation",
            {("pairwise", 1024): 1.02e-3, ("parallel", 1024): 0.8e-3})
    table = [validate.Row("alltoall", a, 3, 3, 1024, lab, lab * 0.95, lab * 1.05, 3, predicted)
             for a, lab, predicted in (("pairwise", 1e-3, 1e-3), ("parallel", 2e-3, 2e-3))]
    itself = validate.against_itself(mine, table, None)
    assert itself["run"] == "20260101-000000-validation" and itself["rounds"] == 3
    assert (itself["lab"].within, itself["lab"].same) == (1, 0)
    assert (itself["simulator"].within, itself["simulator"].same) == (2, 1)
    out = validate._write(mine, PLACEHOLDER, table, validate.rankings(table), itself)
    text = out.read_text()
    assert "the lab's run `20260101-000000-validation`" in text
    assert "1 of 2 inside this run's spread, 0 of 1 orders" in text
    assert "The simulator\non those cases: 2 of 2, 1 of 1, 1, error 1.000." in text
    assert "falls outside their min-max\n25 %" in text
    alone = validate._write(mine, PLACEHOLDER, table, validate.rankings(table), None)
    assert "against itself" not in alone.read_text()


def test_a_yardstick_run_that_is_no_yardstick_is_refused_by_name(tmp_path):
    mine = run_dir(tmp_path / "a", "validation", {("pairwise", 1024): 1e-3})
    other = run_dir(tmp_path / "b", "validation", {("parallel", 65536): 1e-3})
    table = [row("pairwise", 1e-3, 1e-3)]
    with pytest.raises(validate.CannotValidate, match="ran none of a's cases"):
        validate.against_itself(mine, table, other)
    assert validate.against_itself(mine, table, None) is None  # chosen alone: left out, no error
    with pytest.raises(validate.CannotValidate, match="the run itself"):
        validate.against_itself(mine, table, mine)
    (other / "records.jsonl").write_text("{broken\n")
    with pytest.raises(validate.CannotValidate, match="not a run's directory"):
        validate.against_itself(mine, table, other)


def test_a_refused_yardstick_writes_no_validation(tmp_path, monkeypatch):
    """`--beside` the run itself, a run without its cases, a directory without records: refused
    before anything is written."""
    from invoke import Context
    from invoke.exceptions import Exit

    import fabfile
    mine = run_dir(tmp_path / "a", "validation", {("pairwise", 1024): 1e-3})
    unrelated = run_dir(tmp_path / "b", "validation", {("parallel", 65536): 1e-3})
    monkeypatch.setattr(validate, "rows", lambda records, profile: [row("pairwise", 1e-3, 1e-3)])
    for other, why in ((mine, "the run itself"), (unrelated, "ran none of a's cases")):
        with pytest.raises(validate.CannotValidate, match=why):
            validate.write(mine, PLACEHOLDER, other)
    with pytest.raises(Exit, match="--beside .*not a lab run's directory"):
        fabfile.validate(Context(), run=str(mine), profile=None,
                         beside=str(tmp_path / "nowhere"))
    assert sorted(p.name for p in mine.iterdir()) == ["environment.json", "records.jsonl"]
    validate.write(mine, PLACEHOLDER)  # alone: written, without a yardstick
    assert "against itself" not in (mine / "validation.md").read_text()
    assert sorted(p.name for p in mine.iterdir()) == [
        "environment.json", "records.jsonl", "validation.jsonl", "validation.md"]


def test_a_copy_of_the_run_is_no_yardstick(tmp_path):
    """A directory holding this very run (its run id) beside it scored the lab 74 of 74 inside:
    passed over when the yardstick is chosen, refused when named; a run of its own id is one."""
    one = {("pairwise", 1024): 1e-3}
    mine = run_dir(tmp_path / "20260103-000000-validation", "validation", one, run_id="a1b2c3")
    copy = tmp_path / "20260103-000000-validation-copy"
    shutil.copytree(mine, copy)
    table = [row("pairwise", 1e-3, 1e-3)]
    assert yardstick.candidates(mine) == []
    assert validate.against_itself(mine, table, None) is None
    with pytest.raises(validate.CannotValidate, match="a copy of the run itself .run id a1b2c3"):
        validate.against_itself(mine, table, copy)
    other = run_dir(tmp_path / "20260101-000000-validation", "validation", one, run_id="d4e5f6")
    assert yardstick.candidates(mine) == [other]
    assert validate.against_itself(mine, table, None)["run"] == other.name
    assert validate.against_itself(mine, table, other)["run"] == other.name
    (other / "environment.json").write_text("{not json")
    with pytest.raises(validate.CannotValidate, match="environment.json"):
        validate.against_itself(mine, table, other)
    assert yardstick.candidates(mine) == []  # passed over when chosen


def test_a_results_root_named_as_the_run_is_refused_naming_the_run_under_it(tmp_path):
    """`fab validate --run results` (the root, not a run) used to look for the profile `lab`
    and fail on that; it names what it was given and the newest run to name instead, before
    any profile is read. The other way round, a run named as --results (what --results meant
    in `fab validate` before issue 59) is refused naming --run."""
    from invoke import Context
    from invoke.exceptions import Exit

    import fabfile
    mine = run_dir(tmp_path / "20260103-000000-validation", "validation",
                   {("pairwise", 1024): 1e-3})
    with pytest.raises(Exit, match=re.escape(f"{tmp_path} is not a lab run's directory")
                       + f".*{re.escape(f'--run {mine}')}"):
        fabfile.validate(Context(), run=str(tmp_path), profile=None, beside=None)
    with pytest.raises(Exit, match="nowhere is not a lab run's directory .no records.jsonl.$"):
        fabfile.validate(Context(), run=str(tmp_path / "nowhere"), profile=None, beside=None)
    with pytest.raises(Exit, match=re.escape(f"--results {mine} is one run's directory: name it "
                                             f"with --run {mine}")):
        fabfile.validate(Context(), results=str(mine), profile=None, beside=None)
    assert validate.named_run(mine) == mine
    with pytest.raises(validate.CannotValidate, match="a run's records: name its directory"):
        validate.named_run(mine / "records.jsonl")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "records.jsonl").write_bytes(b"\xff\xfe not text")
    with pytest.raises(validate.CannotValidate, match="reading the runs under"):
        validate.newest(tmp_path)  # refused by name, not a traceback

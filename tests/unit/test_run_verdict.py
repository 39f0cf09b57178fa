"""A run's verdict is decided in experiments/report/verdict.py (issue 57), not in the fabfile:
wrong data always fails a run, a failure on an unimpaired network fails it, a failure under
impairment is a finding, a contender the nodes lack is said once; a scenario that did not end
well fails the run before its cases are judged."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from experiments.report import verdict
from experiments.running.records import Record

OUT = Path("/results/run")
LOSS = {"loss_pct": 5.0}


def rec(status: str, app: str = "rxelab", algorithm: str = "sequential", netem=None,
        error: str | None = None, transport: str | None = None) -> Record:
    return Record(app=app, op="alltoall", algorithm=algorithm, status=status,
                  netem=netem or {}, error=error, transport=transport)


def test_a_run_whose_cases_all_verified_passes():
    v = verdict.of_cases(OUT, [rec("ok"), rec("ok", algorithm="pairwise")])
    assert v == verdict.Verdict([f"results: {OUT} (2/2 cases ok)"], None)


def test_wrong_data_fails_the_run_even_under_impairment():
    v = verdict.of_cases(OUT, [rec("ok"), rec("wrong", netem=LOSS)])
    assert v.failure == "1 cases did not verify: rxelab alltoall/sequential (wrong)"
    assert v.said == [f"results: {OUT} (1/2 cases ok)"]


def test_a_case_that_failed_on_a_quiet_network_fails_the_run():
    v = verdict.of_cases(OUT, [rec("timeout", app="mpi", algorithm="mpi-default",
                                   transport="ucx")])
    assert v.failure == "1 cases did not verify: mpi-ucx alltoall/mpi-default (timeout)"


def test_a_case_that_failed_under_impairment_is_a_finding_not_a_failure():
    v = verdict.of_cases(OUT, [rec("ok"), rec("timeout", netem=LOSS)])
    assert v.failure is None
    assert v.said[-1] == ("1 cases under impairment did not finish (see the report): "
                          "rxelab sequential {'loss_pct': 5.0} (timeout)")


def test_a_contender_the_nodes_lack_is_said_once_with_its_reason():
    v = verdict.of_cases(OUT, [rec("ok"), rec("skipped", app="gloo", error="no torch on node2"),
                               rec("skipped", app="gloo", error="no torch on node2")])
    assert v.failure is None
    assert v.said == [f"results: {OUT} (1/3 cases ok, 2 not run)",
                      "gloo cases were not run: no torch on node2"]


class FakeScenario:
    NAME, WHAT = "elastic", "the elastic scenario"

    def __init__(self, wrong: list[str]) -> None:
        self.wrong = wrong

    def load(self, out: Path) -> list[str]:
        return ["said"]

    def problems(self, said: list[str]) -> list[str]:
        return self.wrong

    def not_run(self, said: list[str]) -> list[str]:
        return []


def test_a_scenario_that_did_not_end_well_fails_before_the_cases_are_judged(monkeypatch):
    monkeypatch.setattr(verdict.report, "SCENARIOS", (FakeScenario(["rank 2 never rejoined"]),))
    spec = SimpleNamespace(elastic=object())
    v = verdict.of_run(spec, OUT, [rec("wrong")])  # type: ignore[arg-type]
    assert v == verdict.Verdict([f"results: {OUT} (rank 2 never rejoined)"],
                                "the elastic scenario did not end well: rank 2 never rejoined")


def test_a_scenario_that_ended_well_is_said_and_its_cases_judged(monkeypatch):
    monkeypatch.setattr(verdict.report, "SCENARIOS", (FakeScenario([]),))
    v = verdict.of_run(SimpleNamespace(elastic=object()), OUT, [rec("ok")])  # type: ignore[arg-type]
    assert v == verdict.Verdict([f"results: {OUT}", f"results: {OUT} (1/1 cases ok)"], None)
    plain = verdict.of_run(SimpleNamespace(elastic=None), OUT, [rec("ok")])  # type: ignore[arg-type]
    assert plain.said == [f"results: {OUT} (1/1 cases ok)"]

"""The report's summary, from results recorded once on the 3-node lab: it names the fastest and
every failure, compares back-to-back rows apart from stage rows, speaks once for an impaired
case run in rounds, and does not count cases that were not run as failures."""

import json

from experiments import report
from experiments.report import summary
from tests.unit.report_helpers import results_fixture  # noqa: F401 (the fixture: results)


def _with(record, **changes):
    """A copy of a record with some keys changed, as its JSON would say them."""
    return report.Record.model_validate({**json.loads(record.to_json()), **changes})


def test_summary_names_the_fastest_and_every_failure(results):
    env, records, loads = report.load(results)
    records[0] = _with(records[0], status="wrong")
    lines = report.summary_lines(report.rows(records), records, loads)
    assert lines[0].startswith(f"{len(records) - 1} of {len(records)} cases")
    assert "not ok: rxelab sequential (wrong)" in lines[0]
    assert any("fastest" in x and "256 KiB per peer" in x for x in lines)


def test_back_to_back_rows_are_compared_apart_from_stage_rows(results):
    records = report.load(results)[1]
    tight = [_with(r, case=r.case + 100, tight=True) for r in records if r.app != "perftest"]
    lines = report.summary_lines(report.rows(records + tight), records + tight, [])
    assert any("1 KiB per peer, 3 calls back to back: fastest" in x for x in lines)
    assert any("1 KiB per peer, 3 stages: fastest" in x for x in lines)


def test_an_impaired_case_run_in_rounds_speaks_once_against_its_own_kind_of_clean_run(results):
    """Three rounds of a lossy case are one statement (its median round), and its clean
    reference is a case of the same kind: stage by stage, not back to back."""
    records = [r for r in report.load(results)[1] if r.app != "perftest" and r.size == 1024]
    base = json.loads(records[0].to_json())
    clean = report.Record(**{**base, "case": 0})
    fast = report.Record(**{**base, "case": 1, "tight": True,
                            "summary": {**base["summary"],
                                        "avg_stage_us": base["summary"]["avg_stage_us"] / 10}})
    lossy = []
    for rnd, factor in enumerate((3, 2, 9)):
        lossy.append(report.Record(**{**base, "case": 2, "round": rnd, "netem": {"loss": 1.0},
                                      "summary": {**base["summary"],
                                                  "avg_stage_us": base["summary"]["avg_stage_us"] * factor}}))
    recs = [clean, fast, *lossy]
    flat = report.medians(report.rows(recs))
    lines = [x for x in summary.loss_lines(flat, recs) if x.startswith("Under impairment")]
    assert len(lines) == 1 and lines[0].count("loss 1%") == 1, lines
    assert "loss 1%: 3.0x its clean time" in lines[0], "the median round over the stage-by-stage clean run"


def test_gloo_cases_not_run_are_said_so_and_not_counted_as_failures(results):
    env, records, loads = report.load(results)
    skipped = json.loads(records[0].to_json()) | {
        "app": "gloo", "algorithm": "gloo-default", "status": "skipped",
        "error": "not run: no torch on these nodes (a lab built with EXTRAS=torch has it) (node2)"}
    skipped.pop("summary", None)
    records = [*records, report.Record(**skipped)]
    lines = report.summary_lines(report.rows(records), records, loads)
    assert lines[0].startswith(f"{len(records) - 1} of {len(records)} cases") and "not ok" not in lines[0]
    assert "1 gloo cases were not run: not run: no torch on these nodes" in "\n".join(lines)

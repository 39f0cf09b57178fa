"""The report, rendered from results recorded once on the 3-node lab (tests/fixtures/results-mini:
every all-to-all algorithm and two MPI ones at two sizes, perftest, load samples)."""

import json
import shutil
from pathlib import Path

import pytest

from experiments import report

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "results-mini"


@pytest.fixture
def results(tmp_path):
    dest = tmp_path / "run"
    shutil.copytree(FIXTURE, dest)
    return dest


def test_report_has_the_tables_plots_and_the_emulation_caveat(results):
    html_path, md_path = report.write(results)
    page = html_path.read_text()
    assert report.EMULATION_NOTE in page
    records = [json.loads(x) for x in (results / "records.jsonl").read_text().splitlines()]
    collective = [r for r in records if r["app"] != "perftest"]
    assert page.count("<tr><td>") == len(collective) + 1, "one row per case (+1 perftest row)"
    for algo in ("sequential", "pairwise", "parallel", "mpi-default", "mpi-pairwise"):
        assert f"<td>{algo}</td>" in page
    assert page.count("data:image/png;base64,") == 4, "latency, busbw, memory and load inlined"
    for name in ("latency-alltoall-3n.png", "busbw-alltoall-3n.png", "memory.png", "load.png"):
        assert (results / name).stat().st_size > 5000, name
    md = md_path.read_text()
    assert "## Summary" in md and "peak-to-mean" in md and "ib_write_bw" in md
    assert "| 262144 |" in md


def test_busbw_in_the_table_follows_the_model(results):
    flat = report.rows(report.load(results)[1])
    for r in flat:
        algbw, busbw = report.bandwidth(r["size"], r["nodes"], r["avg_us"] / 1e6)
        assert r["busbw"] == pytest.approx(busbw) and r["busbw"] == pytest.approx(algbw * 2 / 3)


def test_summary_names_the_fastest_and_every_failure(results):
    env, records, loads = report.load(results)
    records[0] = {**records[0], "status": "wrong"}
    lines = report.summary_lines(report.rows(records), records, loads)
    assert lines[0].startswith(f"{len(records) - 1} of {len(records)} cases")
    assert "not ok: rxelab sequential (wrong)" in lines[0]
    assert any("fastest" in x and "262144 B per peer" in x for x in lines)


def test_an_incomplete_run_says_so(results):
    env = json.loads((results / "environment.json").read_text())
    (results / "environment.json").write_text(json.dumps({**env, "complete": False}))
    html_path, _ = report.write(results)
    assert "INCOMPLETE" in html_path.read_text()


def test_the_seed_stages_table_appears_when_runs_differ_in_stages(results):
    lines = (results / "records.jsonl").read_text().splitlines()
    extra = []
    for line in lines:
        r = json.loads(line)
        if r["app"] == "rxelab" and r.get("summary"):
            r = {**r, "stages": 100, "summary": {**r["summary"], "stages": 100,
                                                 "total_seconds": r["summary"]["total_seconds"] * 30}}
            extra.append(json.dumps(r))
    (results / "records.jsonl").write_text("\n".join(lines + extra) + "\n")
    _, md_path = report.write(results)
    md = md_path.read_text()
    assert "## Stages (total seconds)" in md and "| run | 3 stages | 100 stages |" in md
    assert "| rxelab alltoall/sequential 1024 B |" in md

"""The report, rendered from results recorded once on the 3-node lab
(tests/fixtures/results-mini), shows what the run holds: its tables, plots and caveat; the
sections that only some runs have (seed stages, MPI by transport, a loss study, long runs' stage
figures) appear when they do; an incomplete run says so."""

import json
import re

import pytest

from experiments import report
from experiments.report import run_facts
from tests.unit.report_helpers import results_fixture  # noqa: F401 (the fixture: results)

pytestmark = pytest.mark.slow  # each test renders a whole report, figures and all


def test_report_has_the_tables_plots_and_the_emulation_caveat(results):
    html_path, md_path = report.write(results)
    page = html_path.read_text()
    assert run_facts.EMULATION_NOTE in page
    records = [json.loads(x) for x in (results / "records.jsonl").read_text().splitlines()]
    collective = [r for r in records if r["app"] != "perftest"]
    assert page.count("<tr><td>") == len(collective) + 1, "one row per case (+1 perftest row)"
    for algo in ("sequential", "pairwise", "parallel", "mpi-default", "mpi-pairwise"):
        assert f"<td>{algo}</td>" in page
    assert page.count("data:image/png;base64,") == 4, "latency, busbw, memory and load inlined"
    for name in ("latency-alltoall-3n.png", "busbw-alltoall-3n.png", "memory.png", "load.png"):
        assert (results / name).stat().st_size > 5000, name
    md = md_path.read_text()
    assert "## Findings" in md and "peak-to-mean" in md and "ib_write_bw" in md
    assert "| 256 KiB |" in md and "262144" not in md, "sizes in KiB/MiB, never raw bytes"


def test_the_headline_comes_first_and_names_the_winner_with_its_ratio(results):
    html_path, md_path = report.write(results)
    page, md = html_path.read_text(), md_path.read_text()
    head = page.index("class=\"headline\"")
    assert head < page.index("<img") and head < page.index("<table"), "before plots and tables"
    assert "Best rxelab algorithm: <b>pairwise at 1 KiB; parallel at 256 KiB</b>" in page
    # the fixture: rxelab's best 66.0 ms (1 KiB) and 248 ms (256 KiB) against mpi-tcp's
    # 23.8 and 146: (66.0/23.8 * 248/146) ** 0.5
    assert "- rxelab (best per size) takes **2.17x** the time of MPI over TCP: 117 % more " \
        "(geometric mean of 2 sizes), slower in one round (not judged); from 1.70x at 256 KiB " \
        "to 2.78x at 1 KiB; one round: no spread to judge by" in md
    assert md.index("### alltoall") < md.index("## Plots")
    constants = md.splitlines()[2]
    assert "nodes: **3**" in constants and "network: **none**" in constants
    every_case = md[md.index("## Every case"):]
    assert "| contender | algorithm | size | ms per call |" in every_case, \
        "the constants are said once, not in columns"


def test_an_incomplete_run_says_so(results):
    """The banner, then the header's status, which agree: the issue's run said "status: ok"
    under its INCOMPLETE banner (the failed cases left no row, and the rows all said ok)."""
    env = json.loads((results / "environment.json").read_text())
    (results / "environment.json").write_text(json.dumps({**env, "complete": False}))
    records = [json.loads(x) for x in (results / "records.jsonl").read_text().splitlines()]
    records[1] = {**records[1], "status": "failed", "summary": None, "error": "rank 2 died"}
    (results / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    html_path, md_path = report.write(results)
    page, md = html_path.read_text(), md_path.read_text()
    assert page.index("INCOMPLETE") < page.index("class=\"headline\""), "said before anything"
    assert md.index("**INCOMPLETE**") < md.index("### alltoall")
    constants = md.splitlines()[4]
    assert "status: **INCOMPLETE: 10 of the 11 cases it recorded ok, 1 failed**" in constants, constants
    assert "status: **ok**" not in md and "status: <b>ok</b>" not in page
    assert "status: <b>INCOMPLETE: 10 of the 11 cases it recorded ok, 1 failed</b>" in page


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
    assert "| rxelab alltoall/sequential 3 nodes 1 KiB |" in md


def synthetic(results, transform):
    """Rewrite the fixture's records with transform(record) -> list of records."""
    records = [json.loads(x) for x in (results / "records.jsonl").read_text().splitlines()]
    out = [new for r in records for new in transform(r)]
    for i, r in enumerate(out):
        r["case"] = i
    (results / "records.jsonl").write_text("\n".join(json.dumps(r) for r in out) + "\n")
    return out


def test_mpi_rows_are_labelled_by_transport_and_compared_with_rxelab(results):
    def both(r):
        if r["app"] != "mpi":
            return [r]
        return [{**r, "transport": t, "rxe": {"node1": {"sent_pkts": 0 if t == "tcp" else 500}}}
                for t in ("ucx", "tcp")]
    synthetic(results, both)
    _, md_path = report.write(results)
    md = md_path.read_text()
    assert "| mpi-ucx | mpi-default |" in md and "| mpi-tcp | mpi-default |" in md
    assert "mpi-ucx 500-500" in md and "mpi-tcp 0-0" in md
    assert "best rxelab takes" in md and "x the time of MPI over UCX (" in md
    assert "UCX_UD_ETH_DGID_CHECK=n" in md, "how MPI runs over rxe, and why"


def test_loss_study_plot_and_words(results):
    def lossy(r):
        if r["app"] == "perftest" or r["size"] != 1024:
            return [r]
        out = []
        for loss, factor in ((0, 1), (1.0, 3), (5.0, 20)):
            s = dict(r["summary"])
            s["avg_stage_us"] *= factor
            out.append({**r, "netem": {"loss": loss} if loss else {}, "summary": s,
                        "rxe": {"node1": {"sent_pkts": 9, "completer_retry_err": int(loss * 10)}}})
        out.append({**r, "netem": {"loss": 1.0, "delay_ms": 1, "jitter_ms": 2, "reorder": 5},
                    "status": "timeout", "summary": None, "error": "passed its deadline",
                    "partial": {"stages_done": 2, "seconds": 4.0}})
        return out
    synthetic(results, lossy)
    _, md_path = report.write(results)
    md = md_path.read_text()
    assert (results / "loss.png").stat().st_size > 5000
    assert "At 5 % loss, time per call as a multiple of the clean network's" in md
    assert "loss 1%: 3.0x its clean time, 10 retransmission timeouts" in md
    assert "ran out of time (2 of 3 stages done)" in md
    assert "| timeout |" in md and "| 2000 |" in md, "a timed-out case shows its partial average"


def test_long_runs_get_the_stages_figure_and_call_distributions(results):
    def stages(r):
        if r["app"] == "perftest" or r["size"] != 1024:
            return [r]
        out = []
        for n in (100, 1000):
            s = {**r["summary"], "stages": n, "total_seconds": r["summary"]["total_seconds"] * n}
            out.append({**r, "stages": n, "summary": s, "stage_seconds": [0.01 + i * 1e-5
                                                                          for i in range(n)]})
        return out
    synthetic(results, stages)
    html_path, _ = report.write(results)
    for name in ("stages.png", "distribution.png"):
        assert (results / name).stat().st_size > 5000, name
    page = html_path.read_text()
    assert page.index('alt="stages.png"') < page.index("<h2>Time per call (ms)</h2>"), "the answer first"


def test_markdown_cells_stay_one_cell_and_values_cannot_make_links(results):
    def odd(r):
        if r["app"] == "rxelab" and r["algorithm"] == "parallel" and r["size"] == 1024:
            return [{**r, "status": "failed", "summary": None,
                     "error": "line one\n# line two | ![x](http://example.invalid/x.png)"}]
        return [r]
    synthetic(results, odd)
    env = json.loads((results / "environment.json").read_text())
    (results / "environment.json").write_text(json.dumps({**env, "spec": "a|b\n[x](javascript:y)"}))
    _, md_path = report.write(results)
    md = md_path.read_text()
    live = re.search(r"(?<!\\)\[[^\]]*(?<!\\)\]\((http|javascript)", md)
    assert live is None, "no live link or image from a value"
    assert "\n# line two" not in md, "a value's line break makes no heading"
    title = md.splitlines()[0]
    assert title.startswith("# rxelab report: a|b \\[x\\]")


def test_the_cpu_per_call_section_shows_what_the_apps_said(results):
    """Rank 0's user + system CPU per call from each case's summary, in both pages; a run
    whose apps said none (the fixture's, recorded before they did) has no such section."""
    report.write(results)
    assert "CPU per call" not in (results / "report.md").read_text()
    path = results / "records.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for i, r in enumerate(lines):
        if r["app"] != "perftest" and r.get("summary"):
            r["summary"].update(cpu_user_us=1000.0 + i, cpu_sys_us=500.0)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    html_path, md_path = report.write(results)
    md, page = md_path.read_text(), html_path.read_text()
    assert "## CPU per call (ms)" in md and "<h2>CPU per call (ms)</h2>" in page
    first = next(i for i, r in enumerate(lines) if r["app"] != "perftest" and r.get("summary"))
    assert f"{(1500.0 + first) / 1e3:.2f}" in md

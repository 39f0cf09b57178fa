"""The report's numbers, from results recorded once on the 3-node lab: bus bandwidth follows
each collective's model, and a case run in rounds counts its median round, of an even count the
faster of the two middle ones, and every page says so (the share of the link:
test_report_link.py)."""

import html
import json

import pytest

from experiments import report
from experiments.report import Record
from tests.unit.report_helpers import results_fixture  # noqa: F401 (the fixture: results)


def test_busbw_in_the_table_follows_the_model(results):
    flat = report.rows(report.load(results)[1])
    for r in flat:
        algbw, busbw = report.bandwidth(r.size, r.nodes, r.avg_us / 1e6)
        assert r.busbw == pytest.approx(busbw) and r.busbw == pytest.approx(algbw * 2 / 3)


@pytest.mark.parametrize("op, factor", [("alltoall", 2 / 3), ("allgather", 2 / 3),
                                        ("reduce_scatter", 2 / 3), ("allreduce", 4 / 3),
                                        ("bcast", 1.0)])
def test_bus_bandwidth_follows_each_collectives_model(op, factor):
    algbw, busbw = report.bandwidth(size=3_000_000, ranks=3, seconds=1.0, op=op)
    per_rank = 3_000_000 * (3 if op in ("alltoall", "allgather", "reduce_scatter") else 1)
    assert algbw == pytest.approx(per_rank / 1e6) and busbw == pytest.approx(algbw * factor)


def _with(record, **changes):
    """A copy of a record with some keys changed, as its JSON would say them."""
    return Record.model_validate({**json.loads(record.to_json()), **changes})


def _rounds(records, factors):
    """The records as if each case ran once per round, its time scaled by the round's factor."""
    out = []
    for rnd, f in enumerate(factors):
        for r in records:
            r = Record.from_json(r.to_json())
            r.round = rnd
            if r.summary and r.summary.avg_stage_us:
                r.summary.avg_stage_us *= f
                r.summary.total_seconds *= f
            out.append(r)
    return out


@pytest.mark.slow
def test_rounds_give_each_case_its_median(results):
    records = report.load(results)[1]
    once = {r.case: r.avg_us for r in report.rows(records)}
    flat = report.medians(report.rows(_rounds(records, [1.3, 1.0, 7.0])))
    assert sorted(r.case for r in flat) == sorted(once), "one row per case"
    assert all(r.avg_us == pytest.approx(once[r.case] * 1.3) and r.rounds == 3
               for r in flat), "the middle of 1.0, 1.3 and 7.0"
    two = report.medians(report.rows(_rounds(records, [2.0, 1.0])))
    assert all(r.avg_us == pytest.approx(once[r.case]) for r in two), "the lower middle"
    (results / "records.jsonl").write_text(
        "\n".join(r.to_json() for r in _rounds(records, [1.3, 1.0, 7.0])) + "\n")
    assert all(r.round_min_us == pytest.approx(once[r.case]) and
               r.round_max_us == pytest.approx(once[r.case] * 7.0) for r in flat), \
        "each case keeps its rounds' range"
    md = report.write(results)[1].read_text()
    assert "(times: the median of 3 rounds)" in md and md.count("| rxelab | parallel |") == 2
    parallel_1k = next(r for r in flat if r.algorithm == "parallel" and r.size == 1024)
    assert (parallel_1k.avg_us, parallel_1k.round_min_us, parallel_1k.round_max_us) == \
        pytest.approx((87558, 67353, 471469), rel=1e-4), "the fixture's 67.35 ms, 1.3x and 7x"
    assert "| rxelab | parallel | 1 KiB | 87.6 | 67.4-471 |" in md, \
        "the full table shows each case's median round and the rounds' range, in ms"


@pytest.mark.slow
def test_the_round_of_an_even_count_is_said_as_what_it_is(results):
    """Of two rounds the row is the faster one: no page calls that a median."""
    records = report.load(results)[1]
    (results / "records.jsonl").write_text(
        "\n".join(r.to_json() for r in _rounds(records, [2.0, 1.0])) + "\n")
    html_path, md_path = report.write(results)
    md, page = md_path.read_text(), html.unescape(html_path.read_text())
    assert "(times: the faster of 2 rounds)" in md and "medians of" not in md
    said = "each case's median round; of an even count of rounds, the faster of the two middle ones"
    assert md.count(said) == 2 and page.count(said) == 2, "the time table's legend and the full table's"
    assert "Median round" not in md and "Median round" not in page
    assert "CPU per call" not in md or "of the round shown for time" in md
    assert report.view.middle_of(4) == "the faster middle one of 4 rounds"
    assert report.view.middle_of(5) == "the median of 5 rounds"


def test_a_case_beside_busy_nodes_reads_apart_from_the_same_case_alone(results):
    """The calibration's exchange beside a busy node is the same op, algorithm, nodes and
    size as the exchange alone: its row, the seed's table and its progress line say what it
    ran beside, so the two never read as one case measured twice."""
    from experiments.running import caselog
    records = report.load(results)[1]
    first = next(r for r in records if r.app == "rxelab")
    loaded = _with(first, case=999, busy_neighbours=1, busy_hosts=["node3"], stages=first.stages * 10)
    alone = _with(first, case=998, stages=first.stages * 10)
    rows = report.rows([first, loaded, alone])
    assert {r.case: r.network for r in rows}[999] == "1 node busy beside"
    counts, table = report.seed_table(rows)
    assert len(counts) == 2 and len(table) == 2, "alone at two stage counts; beside: its own row"
    assert any("1 node busy beside" in name for name, _ in table)
    assert report.network({"loss": 1}, ["a", "b"]) == "loss 1%, 2 nodes busy beside"
    assert report.network({}, None) == report.network({}, []) == report.network({}, "x") == "none"
    assert caselog.label(loaded).endswith(", 1 busy beside") and "busy" not in caselog.label(first)

"""The report's long-haul answers: a table by link with collapses marked, quic held against tcp
and rxe, bf16 against none, the seeds' three claims judged from the figures (and said not
measured where they are missing), and a case without figures shown as failed."""

import json

import pytest

from experiments import report
from experiments.report import long_haul
from experiments.report.long_haul import Point
from tests.unit.report_helpers import results_fixture  # noqa: F401 (the fixture: results)

MiB = 1 << 20
LINKS = [(0.2, 0.0), (10.0, 0.0), (100.0, 0.0), (10.0, 1.0)]


def study(times: dict[str, list[float | None]], op: str = "allreduce", size: int = MiB) -> list[Point]:
    """Each contender's ms per call on LINKS, in order (None: failed)."""
    return [Point(who, op, size, rtt, loss, ms, "ok" if ms is not None else "failed")
            for who, row in times.items() for (rtt, loss), ms in zip(LINKS, row, strict=True)]


def test_the_table_has_a_column_per_link_lossless_first_and_marks_collapses_and_failures():
    pts = study({"rxelab-tcp": [10.0, 30.0, 250.0, 120.0], "rxelab": [5.0, 20.0, None, 60.0]})
    head, rows = long_haul.table(pts)
    assert head == ["op", "size", "contender", "RTT 0.2 ms (ms)", "RTT 10 ms (ms)", "RTT 100 ms (ms)",
                    "RTT 10 ms, loss 1 % (ms)"]
    assert rows == [["allreduce", "1 MiB", "rxelab", "5.0", "20.0", "failed", "60.0 (collapsed)"],
                    ["allreduce", "1 MiB", "rxelab-tcp", "10.0", "30.0", "250.0 (collapsed)",
                     "120.0 (collapsed)"]]


def test_quic_is_held_against_tcp_and_rxe_case_by_case():
    pts = study({"rxelab-quic": [20.0, 25.0, 90.0, 40.0], "rxelab-tcp": [10.0, 30.0, 100.0, 120.0],
                 "rxelab": [5.0, 20.0, 80.0, 400.0]})
    said = long_haul.lines(pts)
    assert ("rxelab-quic is faster than rxelab-tcp in 3 of 4 cases on long links; at best it "
            "takes 0.33x rxelab-tcp's time (allreduce 1 MiB, RTT 10 ms, loss 1 %), at worst "
            "2.00x (allreduce 1 MiB, RTT 0.2 ms)." in said)
    assert any(x.startswith("rxelab-quic is faster than rxelab in 1 of 4 cases") for x in said)
    assert any(x.startswith("rxelab collapsed") and "first at allreduce 1 MiB, RTT 10 ms, loss 1 %"
               in x for x in said)


def test_the_claims_hold_where_the_figures_say_so():
    pts = study({"rxelab-tcp": [10.0, 30.0, 100.0, 120.0], "gloo": [12.0, 40.0, 150.0, 200.0],
                 "rxelab-quic": [20.0, 25.0, 90.0, 40.0], "rxelab-bf16-tcp": [8.0, 20.0, 60.0, 70.0]})
    head, rows = long_haul.claims(pts)
    assert head == ["claim", "what the lab measured", "verdict"]
    verdicts = {row[0]: row[2] for row in rows}
    assert verdicts == {"TCP suffers badly at high latency and loss": "holds",
                        "QUIC keeps transfers efficient there": "holds",
                        "Compression saves bandwidth on such links": "holds for rxelab-tcp"}
    said = {row[0]: row[1] for row in rows}
    assert "rxelab-tcp: 10.0x from the shortest to the longest round trip, 4.0x at the most loss" \
        in said["TCP suffers badly at high latency and loss"]
    assert "at RTT 100 ms it takes 0.90x rxelab-tcp's time" in said["QUIC keeps transfers efficient there"]
    assert "rxelab-tcp 0.63x (4 links)" in said["Compression saves bandwidth on such links"]


def test_a_claim_the_figures_refute_is_said_not_to_hold_and_a_missing_one_not_measured():
    pts = study({"rxelab-tcp": [10.0, 30.0, 100.0, 40.0], "rxelab-quic": [50.0, 60.0, 200.0, 90.0]})
    rows = long_haul.claims(pts)[1]
    verdicts = {row[0]: row[2] for row in rows}
    assert verdicts["TCP suffers badly at high latency and loss"].startswith("does not hold here")
    assert verdicts["QUIC keeps transfers efficient there"] == "does not hold here"
    assert "its own cost, not the link's, sets its pace" in rows[1][1]  # 5x tcp's on the shortest
    assert verdicts["Compression saves bandwidth on such links"] == "-"
    coded = pts + study({"rxelab-bf16-tcp": [9.5, 29.0, 98.0, 41.0]})
    said = {row[0]: row[2] for row in long_haul.claims(coded)[1]}
    assert said["Compression saves bandwidth on such links"].startswith("does not hold here")


def test_only_delayed_links_count():
    pts = study({"rxelab-tcp": [10.0, 30.0, 100.0, 120.0]})
    assert long_haul.figure(pts) is not None
    assert long_haul.points([], []) == [] and long_haul.figure([]) is None


@pytest.mark.slow
def test_a_run_on_long_links_gets_its_sections_figure_and_failures(results):
    path = results / "records.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()]
    base = next(r for r in records if r["app"] == "rxelab" and r["status"] == "ok")
    made = []
    for case, (delay, loss, us, status) in enumerate(
            [(0.1, 0, 1000.0, "ok"), (5, 0, 3000.0, "ok"), (5, 1, 9000.0, "ok"),
             (50, 0, None, "timeout")], start=2000):
        r = json.loads(json.dumps(base))
        r.update(case=case, round=0, netem={"delay_ms": delay, **({"loss": loss} if loss else {})},
                 status=status)
        if us is None:
            r["summary"] = None
        else:
            r["summary"]["avg_stage_us"] = us
        made.append(r)
    path.write_text("".join(json.dumps(r) + "\n" for r in records + made))
    md = report.write(results)[1].read_text()  # (html, md)
    assert "## The seeds' claims on long links" in md and "## Long-haul: ms per call by link" in md
    table = md.split("## Long-haul: ms per call by link")[1].split("##")[0]
    assert "| RTT 0.2 ms (ms) | RTT 10 ms (ms) | RTT 100 ms (ms) | RTT 10 ms, loss 1 % (ms) |" in table
    assert "| 1.0 | 3.0 | timed out | 9.0 |" in table
    assert (results / "long-haul.png").stat().st_size > 1000

"""A run says where it is: case i of N and the round, the time spent, the time left as the
cases done predict it, and each case's result, as plain lines (logs) or a rich bar (a
terminal)."""

import io

from rich.console import Console

from experiments.running import progress
from experiments.running.records import Record
from experiments.spec import Case

CASE = {"app": "rxelab", "op": "alltoall", "algorithm": "pairwise", "nodes": 3,
        "size": 65536, "stages": 50, "tight": True, "transport": "tcp"}
RECORD = Record.model_validate({**CASE, "status": "ok",
                                "summary": {"avg_stage_us": 57165.0, "tight": True}})


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def steps(cases=2, rounds=2):
    return [(r, i, Case(**{**CASE, "size": 1024 << (10 * i)})) for r in range(rounds) for i in range(cases)]


def test_time_left_counts_each_case_at_its_own_earlier_time():
    now = FakeClock()
    est = progress.Estimate(steps(), now)
    assert est.left() is None, "no estimate before a case is done"
    est.begin()
    now.t += 10
    est.end(0)
    assert est.left() == 30, "three steps left at the mean of one"
    est.begin()
    now.t += 50
    est.end(1)
    assert est.left() == 60, "round 2: case 0 took 10 s, case 1 took 50 s"
    assert est.elapsed() == 60


def test_lines_say_the_case_the_round_the_result_and_the_times():
    now, said = FakeClock(), []
    shown = progress.Lines(steps(), 2, said.append, now)
    with shown:
        shown.begin(0, 0, steps()[0][2])
        now.t += 75
        shown.end(0, RECORD)
    assert said[0] == "[1/2, round 1/2] rxelab alltoall/pairwise 3 nodes 1 KiB x 50 back to back"
    assert said[1] == "    ok: 57.2 ms/call (75 s; 1:15 so far, about 3:45 left)"


def test_one_round_is_not_called_a_round_and_hours_read_as_hours():
    assert progress.Lines(steps(3, 1), 1).where(2, 0) == "[3/3]"
    assert progress.clock(3 * 3600 + 61) == "3:01:01" and progress.clock(59.6) == "1:00"


def test_the_bar_prints_results_above_it_and_leaves_nothing_behind():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, highlight=False)
    now = FakeClock()
    bar = progress.Bar(steps(), 2, console, now)
    with bar:
        for rnd, i, case in steps():
            bar.begin(i, rnd, case)
            now.t += 5
            bar.end(i, RECORD)
        assert bar.progress.tasks[0].completed == 4
        assert "last: ok 57.2 ms/call" in bar.progress.tasks[0].description
    text = out.getvalue()
    assert text.count("ok: 57.2 ms/call") == 4
    assert "[2/2, round 2/2] rxelab alltoall/pairwise 3 nodes 1 MiB" in text


def test_error_text_that_looks_like_markup_is_shown_as_it_is_and_the_bar_ends_on_errors():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, highlight=False)
    now = FakeClock()
    bar = progress.Bar(steps(1, 1), 1, console, now)
    failed = Record.model_validate({**CASE, "status": "failed",
                                    "error": "[/usr/bin/ssh] [rank 0] exit 255", "summary": {}})
    try:
        with bar:
            bar.begin(0, 0, Case(**CASE))
            bar.end(0, failed)
            bar.begin(0, 0, Case(**CASE))  # the bar shows the last result: the markup-like text
            bar.progress.refresh()
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert not bar.progress.live.is_started, "the bar is stopped when the run is interrupted"
    assert "failed: [/usr/bin/ssh] [rank 0] exit 255" in out.getvalue()


def test_a_failure_s_several_lines_of_output_are_said_in_one():
    said = []
    shown = progress.Lines(steps(1, 1), 1, said.append, FakeClock())
    shown.begin(0, 0, Case(**CASE))
    shown.end(0, Record(**CASE, status="failed", error="  them. Please check network\n  connectivity\n---"))
    assert said[1].startswith("    failed: them. Please check network connectivity --- (")
    assert len(said) == 2 and "\n" not in said[1]

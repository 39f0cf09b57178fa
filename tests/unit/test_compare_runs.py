"""fab compare: two lab runs of one spec, rxelab's time over each MPI's taken round by round;
a ratio moved only when the two runs' ranges of rounds do not overlap, and a slower one fails
the check in one line."""

from __future__ import annotations

import json

import pytest
from invoke import Context
from invoke.exceptions import Exit

import fabfile
from experiments.report import compare_runs


def record(case, app, transport, algorithm, size, round_, avg_us, status="ok"):
    summary = {"avg_stage_us": avg_us, "min_stage_us": avg_us, "max_stage_us": avg_us,
               "total_seconds": avg_us * 1e-4, "wrong": 0}
    return {"case": case, "app": app, "op": "alltoall", "algorithm": algorithm, "nodes": 3,
            "size": size, "stages": 100, "tight": True, "transport": transport, "round": round_,
            "status": status, "summary": summary if status == "ok" else None}


def write_run(path, rxelab_us, ucx_us, tcp_us, size=1024):
    """A run of three rounds: rxelab's, UCX's and TCP's time per round."""
    path.mkdir()
    recs = []
    for k, (mine, ucx, tcp) in enumerate(zip(rxelab_us, ucx_us, tcp_us, strict=True)):
        recs += [record(0, "rxelab", "tcp", "parallel", size, k, mine),
                 record(1, "mpi", "ucx", "mpi-default", size, k, ucx),
                 record(2, "mpi", "tcp", "mpi-default", size, k, tcp)]
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (path / "environment.json").write_text("{}")
    return path


def test_the_ratio_is_taken_round_by_round_so_a_drift_of_the_lab_cancels(tmp_path):
    # the second run's lab is 40 % slower for everyone: no ratio moved
    before = write_run(tmp_path / "a", [100, 110, 90], [120, 130, 110], [80, 90, 70])
    after = write_run(tmp_path / "b", [140, 154, 126], [168, 182, 154], [112, 126, 98])
    changes = compare_runs.compare(before, after)
    assert {c.case.against for c in changes} == {"mpi-ucx", "mpi-tcp"}
    assert all(c.verdict == "within spread" for c in changes), changes
    ucx = next(c for c in changes if c.case.against == "mpi-ucx")
    assert ucx.before.rounds == pytest.approx((100 / 120, 110 / 130, 90 / 110))
    assert ucx.after.median == pytest.approx(ucx.before.median)


def test_a_ratio_beyond_the_rounds_spread_is_slower_or_faster_and_a_slower_one_fails(tmp_path):
    before = write_run(tmp_path / "a", [100, 104, 98], [120, 120, 120], [80, 80, 80])
    worse = write_run(tmp_path / "b", [130, 128, 135], [120, 120, 120], [80, 80, 80])
    better = write_run(tmp_path / "c", [60, 62, 64], [120, 120, 120], [80, 80, 80])
    assert {c.verdict for c in compare_runs.compare(before, worse)} == {"slower"}
    assert {c.verdict for c in compare_runs.compare(before, better)} == {"faster"}
    with pytest.raises(Exit) as failed:
        fabfile.compare(Context(), before=str(before), after=str(worse))
    assert failed.value.code == 1
    assert "slower beyond the rounds' spread" in str(failed.value.message)
    assert "0.83x -> 1.08x" in str(failed.value.message)
    fabfile.compare(Context(), before=str(before), after=str(better))  # no exit: faster is fine


def test_overlapping_ranges_are_within_spread(tmp_path):
    before = write_run(tmp_path / "a", [100, 130, 90], [120, 120, 120], [80, 80, 80])
    after = write_run(tmp_path / "b", [125, 140, 128], [120, 120, 120], [80, 80, 80])
    assert {c.verdict for c in compare_runs.compare(before, after)} == {"within spread"}


def test_a_round_that_did_not_end_ok_is_left_out_of_the_ratios(tmp_path):
    run = write_run(tmp_path / "a", [100, 100, 100], [100, 100, 100], [100, 100, 100])
    lines = (run / "records.jsonl").read_text().splitlines()
    lines[1] = json.dumps(record(1, "mpi", "ucx", "mpi-default", 1024, 0, 0, status="timeout"))
    (run / "records.jsonl").write_text("\n".join(lines) + "\n")
    ucx = next(r for c, r in compare_runs.load(run).items() if c.against == "mpi-ucx")
    assert len(ucx.rounds) == 2


def test_what_cannot_be_compared_is_said_in_one_line(tmp_path):
    with pytest.raises(compare_runs.CompareError, match="no records.jsonl"):
        compare_runs.load(tmp_path)
    a = write_run(tmp_path / "a", [1, 1, 1], [1, 1, 1], [1, 1, 1])
    b = write_run(tmp_path / "b", [1, 1, 1], [1, 1, 1], [1, 1, 1], size=4096)
    with pytest.raises(compare_runs.CompareError, match="share no case"):
        compare_runs.compare(a, b)
    only_mpi = tmp_path / "m"
    only_mpi.mkdir()
    mpi = record(1, "mpi", "ucx", "mpi-default", 1, 0, 5)
    (only_mpi / "records.jsonl").write_text(json.dumps(mpi) + "\n")
    (only_mpi / "environment.json").write_text("{}")
    with pytest.raises(compare_runs.CompareError, match="no rxelab case"):
        compare_runs.load(only_mpi)
    with pytest.raises(Exit) as failed:
        fabfile.compare(Context(), before=str(tmp_path / "nowhere"), after=str(a))
    assert failed.value.code == 1 and "not a lab run's directory" in str(failed.value.message)


def test_the_hand_loop_is_a_reference_of_its_own_not_an_rxelab_case(tmp_path):
    """A run with the hand loop (pyverbs) gives rxelab's time over the floor too; the floor is
    never compared as if it were the library."""
    run = write_run(tmp_path / "a", [120, 120, 120], [100, 100, 100], [80, 80, 80])
    with (run / "records.jsonl").open("a") as out:
        for k in range(3):
            out.write(json.dumps(record(3, "rxelab", "tcp", "hand-loop", 1024, k, 96)) + "\n")
    found = compare_runs.load(run)
    assert {c.against for c in found} == {"mpi-ucx", "mpi-tcp", "pyverbs"}
    assert all(c.algorithm == "parallel" for c in found)
    floor = next(r for c, r in found.items() if c.against == "pyverbs")
    assert floor.median == pytest.approx(1.25)

"""One meaning per flag name across the fab tasks (issue 59). Before, `-r/--results` was the
directory the runs go in for run-experiment, simulate and calibrate but one run's directory for
report and validate; `-a` was --accept-new-host-keys but --after in compare, `-n` --no-report
but calibrate's --name, `-b` --beside but compare's --before. Now --results is where the runs
are, everywhere; --run is one run's directory; compare has no short flags."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Context
from invoke.exceptions import Exit

import fabfile
from experiments import report as report_mod

REPO = Path(__file__).resolve().parents[2]


def tasks():
    return [t for t in vars(fabfile).values() if type(t).__name__ == "Task"]


def flags() -> list[tuple[str, str, str, str]]:
    """(task, long flag, short flag or "", help) of every flag of every task."""
    out = []
    for t in tasks():
        fresh = copy.copy(t)  # Invoke's get_arguments() pops each flag's help from the task
        fresh.help = dict(t.help)
        for a in fresh.get_arguments():
            longs = [n for n in a.names if len(n) > 1]
            shorts = [n for n in a.names if len(n) == 1]
            out.append((t.name, longs[0].replace("_", "-"), shorts[0] if shorts else "", a.help))
    return out


def test_each_short_flag_stands_for_one_long_flag_in_every_task() -> None:
    meant: dict[str, set[str]] = {}
    for _, long, short, _ in flags():
        if short:
            meant.setdefault(short, set()).add(long)
    assert {s: sorted(ls) for s, ls in meant.items() if len(ls) > 1} == {}
    assert meant["r"] == {"results"} and meant["u"] == {"run"}


def test_results_means_the_directory_the_runs_are_in_wherever_it_is_a_flag():
    said = {(task, h) for task, long, _, h in flags() if long == "results"}
    assert {task for task, _ in said} == {"run_experiment", "report", "simulate", "calibrate",
                                          "validate"}
    assert {h for _, h in said} == {fabfile.RESULTS_DIR}
    assert "the directory the runs are in" in fabfile.RESULTS_DIR
    runs = {task for task, long, _, _ in flags() if long == "run"}
    assert runs == {"report", "validate", "calibrate"}, "one run's directory: --run"


def a_run(where, records=1):
    where.mkdir(parents=True)
    (where / "records.jsonl").write_text("{}\n" * records)
    return where


def test_a_run_given_as_results_is_refused_naming_run_in_every_task(tmp_path):
    run = a_run(tmp_path / "20260101-000000-smoke")
    said = f"--results {run} is one run's directory: name it with --run {run}"
    for call in (lambda: fabfile.report(Context(), results=str(run)),
                 lambda: fabfile.validate(Context(), results=str(run)),
                 lambda: fabfile.simulate(Context(), results=str(run)),
                 lambda: fabfile.run_experiment(Context(), results=str(run)),
                 lambda: fabfile.calibrate(Context(), results=str(run))):
        with pytest.raises(Exit) as refused:
            call()
        assert refused.value.code == 1 and said in str(refused.value.message)
    assert sorted(p.name for p in run.iterdir()) == ["records.jsonl"], "nothing written"


def test_report_takes_the_named_run_or_the_newest_under_results(tmp_path, monkeypatch):
    reported = []
    monkeypatch.setattr(report_mod, "write", lambda out: reported.append(out) or (out, out))
    older = a_run(tmp_path / "root" / "20260101-000000-smoke")
    newer = a_run(tmp_path / "root" / "20260102-000000-smoke")
    fabfile.report(Context(), results=str(tmp_path / "root"))
    fabfile.report(Context(), run=str(older))
    assert reported == [newer, older]
    with pytest.raises(Exit, match="no results under .*empty yet"):
        fabfile.report(Context(), results=str(tmp_path / "empty"))


def fab(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fabric", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_a_renamed_flag_names_its_new_spelling():
    for task, old, new in (("calibrate", "--measured", "--run"), ("calibrate", "-n", "-p (--profile)"),
                           ("compare", "-a", "--after")):
        done = fab(task, *(["--before", "y"] if task == "compare" else []), old, "x")
        assert done.returncode == 1
        assert f"No idea what '{old}' is! ({old} is now {new}: `fab --help {task}`)" \
            in done.stderr
    done = fab("deploy", "--name", "x")  # renamed in calibrate only
    assert done.returncode == 1 and "is now" not in done.stderr


def test_a_results_root_is_the_directory_its_runs_are_under(tmp_path):
    root = tmp_path / "root"
    a_run(root / "20260101-000000-smoke")
    assert fabfile._results_root(str(root)) == root
    assert fabfile._results_root(None) == fabfile.RESULTS

"""A careless user's typo gets the name they meant: a fab task or flag, a spec key; `fab --list`
shows every task's whole first sentence."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest

import fabfile
from experiments import did_you_mean
from experiments import report as report_mod
from experiments import spec as spec_mod
from experiments.simulation import spec as sim_spec
from experiments.spec import document
from tests.unit.doc_tables import missing_tests

REPO = Path(__file__).resolve().parents[2]
FAB = Path(sys.executable).parent / "fab"


def fab(*argv):
    return subprocess.run([str(FAB), *argv], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("argv, meant", [(["run-experimnt"], "'run-experiment'"),
                                         (["simulat"], "'simulate'"),
                                         (["report", "--reslts", "x"], "'--results'")])
def test_a_misspelled_task_or_flag_names_the_closest(argv, meant):
    done = fab(*argv)
    assert done.returncode == 1
    assert f"(did you mean {meant}?)" in done.stderr and "fab --list" in done.stderr


@pytest.mark.slow
def test_a_word_like_no_task_gets_no_guess():
    done = fab("xyzzy")
    assert done.returncode == 1 and "did you mean" not in done.stderr
    assert "No idea what 'xyzzy' is!" in done.stderr


@pytest.mark.slow
def test_fab_list_shows_each_task_s_whole_first_sentence():
    listed = " ".join(fab("--list").stdout.split())
    tasks = [t for t in vars(fabfile).values() if type(t).__name__ == "Task"]
    assert len(tasks) >= 7
    for t in tasks:
        first = t.__doc__.strip().split("\n\n")[0]
        assert "\n" not in first and first.endswith("."), f"{t.name}: one line, one sentence"
        assert " ".join(first.split()) in listed, t.name


def test_a_misspelled_spec_key_names_the_closest(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\ndescription = "d"\n[[runs]]\napp = "rxelab"\nop = "alltoall"\n'
                   'nodes = [2]\nsizes = [1024]\nalgoritms = ["pairwise"]\n')
    with pytest.raises(spec_mod.SpecError, match=r"unknown key 'algoritms' \(did you mean 'algorithms'\?\)"):
        spec_mod.load(str(bad))
    sim = tmp_path / "sim.toml"
    sim.write_text('name = "x"\ndescription = "d"\n[[runs]]\ncollective = "alltoall"\n'
                   'ranks = [8]\nsizes = [1024]\nplatfrom = "cluster"\n')
    with pytest.raises(sim_spec.SpecError, match=r"\(did you mean 'platform'\?\)"):
        sim_spec.load(str(sim))


def test_keys_are_looked_up_in_the_table_the_error_is_in():
    assert "kill" in did_you_mean.keys_at(document.SpecDoc, ("elastic", "events", 0, "kil"))
    assert "sizes" in did_you_mean.keys_at(document.SpecDoc, ("runs", 3, "sizs"))
    assert did_you_mean.keys_at(document.SpecDoc, ("nowhere", "x")) == []
    assert did_you_mean.hint("zzzz", ["sizes"]) == ""


def test_a_report_that_cannot_be_written_keeps_the_results_and_says_how_to_retry(tmp_path, capsys):
    run = tmp_path / "20261127-000000-x"
    run.mkdir()
    (run / "records.jsonl").write_text("{}\n")  # no environment.json, a record with nothing
    kept = sorted(p.name for p in run.iterdir())
    assert fabfile._write_report(run) is False
    said = capsys.readouterr().out
    assert "error: the report was not written" in said
    assert f"fab report --run {run}" in said
    assert sorted(p.name for p in run.iterdir()) == kept, "the results untouched"


def test_every_row_of_the_experiments_failure_table_names_tests_that_exist():
    assert missing_tests("## Running experiments", 4) == []


def test_any_failure_of_the_report_keeps_the_run_s_verdict(tmp_path, capsys, monkeypatch):
    def broken(results):
        raise ZeroDivisionError("a round of no time")
    monkeypatch.setattr(report_mod, "write", broken)
    assert fabfile._write_report(tmp_path) is False
    assert "the report was not written (a round of no time)" in capsys.readouterr().out


def test_every_flag_of_every_task_has_help():
    tasks = [t for t in vars(fabfile).values() if type(t).__name__ == "Task"]
    missing = []
    for t in tasks:
        fresh = copy.copy(t)  # Invoke's get_arguments() pops each flag's help from the task
        fresh.help = dict(t.help)
        missing += [(t.name, a.name) for a in fresh.get_arguments() if not a.help]
    assert missing == []

"""`fab simulate`: a simulation spec checked whole before anything runs, every case a row,
the replay agreeing with the LogGP line where no link is shared, and a clear error (never a
traceback) for a bad spec or profile."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.simulation import costs as costs_mod
from experiments.simulation import replayer
from experiments.simulation import run as sim_run
from experiments.simulation import spec as sim_spec
from infra.config import REPO
from tests.unit.doc_tables import missing_tests

needs_simgrid = pytest.mark.skipif(
    not (replayer.HEADER.exists() and shutil.which("g++") and shutil.which("smpicc")),
    reason="SimGrid (libsimgrid-dev) or g++ missing: `bash infra/install-deps.sh`")

RUN = """
[[runs]]
collective = "alltoall"
algorithms = ["sequential", "pairwise"]
pairs = [1, 2]
mpi = ["mpi-bruck"]
ranks = [4, 6]
sizes = [1024]
"""


def write(tmp_path: Path, text: str, name: str = "t") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\n' + text)
    return path


def test_cases_cross_ranks_sizes_algorithms_and_windows(tmp_path):
    s = sim_spec.load(str(write(tmp_path, RUN)))
    labels = [(c.algorithm, c.pairs, c.ranks, c.source) for c in s.cases]
    assert labels == [(a, k, n, src) for n in (4, 6) for a, k, src in (
        ("sequential", 1, "rxelab"), ("sequential", 2, "rxelab"), ("pairwise", 1, "rxelab"),
        ("mpi-bruck", 1, "smpi"))]


def test_lab_cases_place_ranks_on_vms(tmp_path):
    s = sim_spec.load(str(write(tmp_path, RUN + 'platform = "lab"\nranks_per_node = 2\n')))
    assert {c.per_node for c in s.cases} == {2}
    assert "p=6 (2 per VM)" in s.cases[-1].label()


@pytest.mark.parametrize(("text", "said"), [
    (RUN.replace('"alltoall"', '"alltoal"'), "collective 'alltoal'"),
    (RUN.replace('"pairwise"', '"pairwize"'), "no algorithm pairwize"),
    (RUN.replace('"mpi-bruck"', '"mpi-ring"'), "no MPI label mpi-ring"),
    (RUN.replace("ranks = [4, 6]", "ranks = [1]"), "ranks"),
    (RUN.replace("ranks = [4, 6]", "ranks = [5000]"), "ranks"),
    (RUN.replace("sizes = [1024]", "sizes = [-1]"), "sizes"),
    (RUN.replace('"alltoall"', '"allreduce"').replace('["sequential", "pairwise"]', '["ring"]')
     .replace('["mpi-bruck"]', "[]").replace("pairs = [1, 2]\n", "").replace("[1024]", "[6]"),
     "whole elements"),
    (RUN.replace('["sequential", "pairwise"]', '["pairwise"]'), "pairs sets the window"),
    (RUN + 'platform = "mesh"\n', "platform"),
    (RUN + "colour = 1\n", "colour"),
    (RUN + "ranks_per_node = 2\n", "ranks_per_node places ranks on the lab"),
    (RUN + 'platform = "lab"\nranks_per_node = 0\n', "ranks_per_node"),
    (RUN + "bandwidth = true\n", "bandwidth"),
    (RUN.replace("sizes = [1024]", 'sizes = ["1024"]'), "sizes"),
    (RUN.replace("sizes = [1024]", "sizes = [1048576]").replace("ranks = [4, 6]", "ranks = [4096]"),
     "2 GiB"),
    (RUN.replace('algorithms = ["sequential", "pairwise"]\npairs = [1, 2]\nmpi = ["mpi-bruck"]\n', ""),
     "names none"),
])
def test_a_bad_spec_is_one_error_naming_what(tmp_path, text, said):
    with pytest.raises(sim_spec.SpecError, match=said):
        sim_spec.load(str(write(tmp_path, text)))


def test_unknown_spec_names_the_shipped_ones():
    with pytest.raises(sim_spec.SpecError, match="shipped: .*smoke"):
        sim_spec.load("no-such-spec")


@pytest.mark.slow
@needs_simgrid
def test_a_run_writes_a_row_per_case_and_agrees_with_loggp(tmp_path):
    s = sim_spec.load(str(write(tmp_path, RUN)))
    out = sim_run.write(s, tmp_path / "results", quiet=True)
    rows = [json.loads(line) for line in (out / "simulated.jsonl").read_text().splitlines()]
    assert [(r["algorithm"], r["pairs"], r["ranks"]) for r in rows] == \
        [(c.algorithm, c.pairs, c.ranks) for c in s.cases]
    assert all(r["status"] == "ok" and r["seconds"] > 0 and r["placeholder"] for r in rows)
    for r in rows:
        if r["algorithm"] == "pairwise":
            assert r["seconds"] == pytest.approx(r["loggp_s"], rel=1e-6)
            assert r["messages"] == r["ranks"] * (r["ranks"] - 1)  # eager: one per block
    seq = {(r["pairs"], r["ranks"]): r["seconds"] for r in rows if r["algorithm"] == "sequential"}
    assert seq[(2, 6)] < seq[(1, 6)]  # two pairs at once finish sooner than one
    assert json.loads((out / "profile.json").read_text())["name"] == "placeholder"


@pytest.mark.slow
@needs_simgrid
def test_fab_simulate_runs_a_spec_and_refuses_a_bad_one(tmp_path):
    fab = [sys.executable, "-m", "fabric"]
    ok = subprocess.run([*fab, "simulate", "--spec", str(write(tmp_path, RUN)), "--results",
                         str(tmp_path / "r")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "results:" in ok.stdout and "placeholder costs" in ok.stdout
    bad = subprocess.run([*fab, "simulate", "--spec", str(write(tmp_path, RUN + "colour = 1\n",
                                                                 "bad"))],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "colour" in bad.stderr and "Traceback" not in bad.stderr
    missing = write(tmp_path, 'profile = "nowhere"\n' + RUN, "nop")
    bad = subprocess.run([*fab, "simulate", "--spec", str(missing)], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "nowhere.json" in bad.stderr and "Traceback" not in bad.stderr


def test_a_named_profile_is_read(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(costs_mod.PLACEHOLDER.to_json().replace('"placeholder"', '"mine"'))
    s = sim_spec.load(str(write(tmp_path, f'profile = "{path}"\n' + RUN)))
    assert sim_run.profile_of(s).name == "mine"


@pytest.mark.parametrize("name", sorted(p.stem for p in sim_spec.SPECS.glob("*.toml")))
def test_shipped_simulation_specs_load(name):
    s = sim_spec.load(name)
    assert s.name == name and s.cases


def test_a_profile_not_calibrated_yet_says_how_to_make_it(tmp_path):
    s = sim_spec.load(str(write(tmp_path, f'profile = "{tmp_path}/lab2.json"\n' + RUN)))
    with pytest.raises(costs_mod.ProfileError, match="fab calibrate --profile lab2"):
        sim_run.profile_of(s)


def test_every_row_of_the_simulators_failure_table_names_tests_that_exist():
    """The simulator's "when things go wrong" rows (docs/troubleshooting.md) are contracts: each names the
    test that holds it, and that test exists."""
    assert missing_tests("## The simulator", 7) == []

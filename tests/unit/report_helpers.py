"""What the report's tests share: a fresh copy of the results recorded once on the 3-node lab
(tests/fixtures/results-mini: every all-to-all algorithm and two MPI ones at two sizes,
perftest, load samples), for a test to rewrite as it needs, and a report row made by hand.
Kept apart so that each test file holds one promise of the report and none copies the
fixture."""

import shutil
from pathlib import Path

import pytest

from experiments.report import view

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "results-mini"


@pytest.fixture(name="results")
def results_fixture(tmp_path):
    """Named results in the tests; a module that imports results_fixture has it."""
    dest = tmp_path / "run"
    shutil.copytree(FIXTURE, dest)
    return dest


def row(contender, algorithm, size, ms, lo=None, hi=None, rounds=3, **kw):
    """A case's row as the report keeps it: ms per call and the rounds' range (ms)."""
    r = {"contender": contender, "algorithm": algorithm, "op": "alltoall", "nodes": 3, "ranks": 3,
         "stages": 50, "mode": "back to back", "network": "none", "active_mtu": 4096,
         "data": "pattern", "compression": "none", "size": size, "avg_us": ms * 1e3,
         "round_min_us": (lo if lo is not None else ms) * 1e3,
         "round_max_us": (hi if hi is not None else ms) * 1e3, "rounds": rounds, "status": "ok",
         "pairs": None, "case": 0, "round": 0, "wrong": 0, "loss": 0.0, "loss_only": True,
         "app": contender}
    return view.Row(**{**r, **kw})


# rxelab's two algorithms against MPI over UCX at 1 KiB and 1 MiB, three rounds each
RUN = [row("rxelab", "pairwise", 1024, 10, 9, 11), row("rxelab", "parallel", 1024, 12, 11, 13),
       row("mpi-ucx", "mpi-default", 1024, 20, 18, 22),
       row("rxelab", "pairwise", 1 << 20, 100, 90, 130), row("rxelab", "parallel", 1 << 20, 80, 70, 95),
       row("mpi-ucx", "mpi-default", 1 << 20, 100, 85, 120)]

"""What the report's tests share: a fresh copy of the results recorded once on the 3-node lab
(tests/fixtures/results-mini: every all-to-all algorithm and two MPI ones at two sizes,
perftest, load samples), for a test to rewrite as it needs. Kept apart so that each test file
holds one promise of the report and none copies the fixture."""

import shutil
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "results-mini"


@pytest.fixture(name="results")
def results_fixture(tmp_path):
    """Named results in the tests; a module that imports results_fixture has it."""
    dest = tmp_path / "run"
    shutil.copytree(FIXTURE, dest)
    return dest

"""The code base stays lint-clean: ruff and mypy over the whole tree (the library, infra,
experiments, apps, fabfile.py and the tests; both configured in pyproject.toml)."""

import shutil
import subprocess
import sys

import pytest

from infra.config import REPO


@pytest.mark.skipif(shutil.which("ruff") is None and not (REPO / ".venv/bin/ruff").exists(),
                    reason="ruff not installed (make deps installs it)")
def test_ruff_is_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("mypy") is None and not (REPO / ".venv/bin/mypy").exists(),
                    reason="mypy not installed (make deps installs it)")
def test_mypy_is_clean_on_the_whole_tree():
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr

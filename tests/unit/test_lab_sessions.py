"""Only the labs of ended test sessions are reaped: a live session's labs, labs under no lock
and this session's own labs are left alone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.state import LabState, mkdir_private
from tests import lab_sessions


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A pretend pytest-of-<user>, removed after the test: its pretend labs must not look
    abandoned to the next real session's reaper."""
    yield tmp_path / "pytest-of-someone"
    shutil.rmtree(tmp_path / "pytest-of-someone", ignore_errors=True)


def base(root: Path, *parts: str, lock: bool = True) -> Path:
    d = root.joinpath(*parts)
    d.mkdir(parents=True)
    if lock:
        (d / lab_sessions.LOCK).touch()
    return d


def lab(under: Path, *parts: str, running: bool = True) -> Path:
    state = under.joinpath(*parts)
    LabState(state).claim()
    if running:
        mkdir_private(LabState(state).run)
        LabState(state).pidfile("node1").write_text("1\n")
    return state


def test_a_free_lock_marks_an_ended_session_and_a_held_one_a_live_one(root: Path) -> None:
    ended = base(root, "pytest-1", "popen-gw0")
    ended_serial = base(root, "pytest-2")
    live = base(root, "pytest-3", "popen-gw1")
    unlocked = base(root, "pytest-4", lock=False)
    own = base(root, "pytest-5", "popen-gw0")
    shared, side = lab(ended, "lab0", "state"), lab(ended, "test_two_labs0", "duo")
    serial = lab(ended_serial, "lab0", "state")
    lab(live, "lab0", "state")
    lab(unlocked, "lab0", "state")
    lab(own, "lab0", "state")
    (ended / "lab1" / "state").mkdir(parents=True)  # no marker: not a lab
    inner = base(live, "test_x0", "pytest-of-x", "pytest-1")  # a free lock deeper down is no base's
    lab(inner, "lab0", "state")
    lab(ended, "lab2", "state", running=False)  # torn down: nothing to reap
    tf = lab(ended, "lab3", "state", running=False)
    mkdir_private(LabState(tf).terraform)
    (LabState(tf).terraform / "terraform.tfstate").write_text("{}")
    held = lab_sessions.hold(live)
    mine = lab_sessions.hold(own)
    try:
        found = lab_sessions.abandoned(root, own)
    finally:
        held.close()
        mine.close()
    assert found == [shared, tf, side, serial]


def test_a_lock_held_by_another_process_counts_as_live_until_that_process_ends(
        root: Path, tmp_path: Path) -> None:
    other = base(root, "pytest-1")
    state = lab(other, "lab0", "state")
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, pathlib; from tests import lab_sessions; "
         f"f = lab_sessions.hold(pathlib.Path({str(other)!r})); print('held', flush=True); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        assert lab_sessions.abandoned(root, tmp_path / "own") == []
    finally:
        child.kill()
        child.wait(timeout=10)
    assert lab_sessions.abandoned(root, tmp_path / "own") == [state]


def test_the_sessions_root_is_pytests_per_user_directory(tmp_path: Path) -> None:
    basetemp = tmp_path / "pytest-of-me" / "pytest-7" / "popen-gw0"
    assert lab_sessions.sessions_root(basetemp) == tmp_path / "pytest-of-me"
    assert lab_sessions.sessions_root(Path("/srv/ci/elsewhere")) is None

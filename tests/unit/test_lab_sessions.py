"""Only the labs of ended test sessions are reaped: a live session's lab, a directory without
a lock and this session's own lab are left alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import lab_sessions


def lab_dir(root: Path, *parts: str, lock: bool = True) -> Path:
    d = root.joinpath(*parts)
    (d / "state").mkdir(parents=True)
    if lock:
        (d / lab_sessions.LOCK).touch()
    return d


def test_a_free_lock_marks_an_ended_session_and_a_held_one_a_live_one(tmp_path: Path) -> None:
    root = tmp_path / "pytest-of-someone"
    ended = lab_dir(root, "pytest-1", "popen-gw0", "lab0")
    ended_serial = lab_dir(root, "pytest-2", "lab0")
    live = lab_dir(root, "pytest-3", "popen-gw1", "lab0")
    unlocked = lab_dir(root, "pytest-4", "lab0", lock=False)
    own = lab_dir(root, "pytest-5", "popen-gw0", "lab0")
    held = lab_sessions.hold(live)
    mine = lab_sessions.hold(own)
    try:
        found = lab_sessions.abandoned(root, own)
    finally:
        held.close()
        mine.close()
    assert found == [ended / "state", ended_serial / "state"]
    assert unlocked / "state" not in found


def test_a_lock_held_by_another_process_counts_as_live_until_that_process_ends(tmp_path: Path) -> None:
    root = tmp_path / "pytest-of-someone"
    other = lab_dir(root, "pytest-1", "lab0")
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from tests import lab_sessions; f = lab_sessions.hold("
         f"__import__('pathlib').Path({str(other)!r})); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        assert lab_sessions.abandoned(root, tmp_path / "own") == []
    finally:
        child.kill()
        child.wait(timeout=10)
    assert lab_sessions.abandoned(root, tmp_path / "own") == [other / "state"]


def test_the_sessions_root_is_pytests_per_user_directory(tmp_path: Path) -> None:
    base = tmp_path / "pytest-of-me" / "pytest-7" / "popen-gw0"
    assert lab_sessions.sessions_root(base) == tmp_path / "pytest-of-me"
    assert lab_sessions.sessions_root(Path("/srv/ci/elsewhere")) is None

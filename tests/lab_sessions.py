"""Which test labs belong to sessions that are gone.

A test session killed outright (SIGKILL, the runner's machine restarted) cannot tear its lab
down; the namespace it leaves under the test lab's name then stops every later session's
`make provision`, on a shared CI host too. A session therefore holds an exclusive lock on its
lab directory for as long as it lives: a lab directory whose lock can be taken belongs to a
session that has ended, and only its own state directory removes what it made (the network
checks its labels, as for any lab). Directories without a lock (older sessions, or no lab at
all) are never touched."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO

LOCK = "session.lock"


def hold(lab_dir: Path) -> IO[bytes]:
    """Take this session's lock on its lab directory; keep the returned file open for the
    session's life (the kernel releases it when the process ends, however it ends)."""
    f = (lab_dir / LOCK).open("wb")
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return f


def sessions_root(basetemp: Path) -> Path | None:
    """pytest's per-user directory (pytest-of-<user>) above this session's base directory."""
    for p in (basetemp, *basetemp.parents):
        if p.name.startswith("pytest-of-"):
            return p
    return None


def abandoned(root: Path, own: Path) -> list[Path]:
    """State directories of labs whose session's lock is free: that session has ended."""
    found = []
    for lock in sorted([*root.glob(f"pytest-*/lab*/{LOCK}"),
                        *root.glob(f"pytest-*/popen-gw*/lab*/{LOCK}")]):
        lab_dir = lock.parent
        if lab_dir == own or not (lab_dir / "state").is_dir():
            continue
        with lock.open("rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live session holds it
            fcntl.flock(f, fcntl.LOCK_UN)
        found.append(lab_dir / "state")
    return found

"""Which test labs belong to sessions that are gone.

A test session killed outright (SIGKILL, the runner's machine restarted) cannot tear its labs
down; the namespace it leaves under a test lab's name then stops every later session's
`make provision`, on a shared CI host too. Each test process therefore holds an exclusive lock
on its pytest base directory for as long as it lives: a lab under a base directory whose lock
can be taken belongs to a session that has ended, and only that lab's own state directory
removes what it made (the network checks its labels, as for any lab). Labs under no lock
(older sessions, a user's own labs) are never touched."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO

from infra.state import MARKER, LabState

LOCK = "session.lock"


def hold(basetemp: Path) -> IO[bytes]:
    """Take this test process's lock on its base directory; keep the returned file open for
    the session's life (the kernel releases it when the process ends, however it ends)."""
    f = (basetemp / LOCK).open("wb")
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return f


def sessions_root(basetemp: Path) -> Path | None:
    """pytest's per-user directory (pytest-of-<user>) above this session's base directory."""
    for p in (basetemp, *basetemp.parents):
        if p.name.startswith("pytest-of-"):
            return p
    return None


def ended(lock: Path) -> bool:
    with lock.open("rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live session holds it
        fcntl.flock(f, fcntl.LOCK_UN)
    return True


def holds_something(state_dir: Path) -> bool:
    """A lab whose VMs or Terraform resources may still exist (a qemu pid file, a Terraform
    state): one torn down, or never provisioned, has nothing to reap."""
    state = LabState(state_dir)
    return state.is_lab() and (any(state.run.glob("*.pid"))
                               or (state.terraform / "terraform.tfstate").is_file())


def abandoned(root: Path, own: Path) -> list[Path]:
    """State directories of labs under `root` made by test sessions that have ended, which
    may still hold something (never under `own`, this session's base directory)."""
    found = []
    for marker in sorted(root.glob(f"pytest-*/**/{MARKER}")):
        state_dir = marker.parent
        if own in state_dir.parents or not holds_something(state_dir):
            continue
        parts = state_dir.relative_to(root).parts  # pytest-N[/popen-gwK]/...: a base's lock
        lock = next((root.joinpath(*parts[:depth], LOCK) for depth in (2, 1)
                     if len(parts) > depth and root.joinpath(*parts[:depth], LOCK).is_file()),
                    None)
        if lock is not None and ended(lock):
            found.append(state_dir)
    return found

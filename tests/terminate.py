"""A test session stopped by SIGTERM (a CI job cancelled, `timeout`, a machine shutting down)
tears its fixtures down as on Ctrl-C, so the shared lab's VMs, taps and namespaces go with it.
Python's default for SIGTERM ends the process at once, without a `finally`: the lab then
waited for the next session's reap (tests/lab_sessions.py), and on a machine where no session
came, for good.

Only the first SIGTERM interrupts: the teardown it starts (`make destroy`, bounded by its own
timeout) is not cut short by a second one. SIGKILL still ends the process at once; the reap is
for that."""

from __future__ import annotations

import os
import signal
import subprocess
from types import FrameType


class Terminated(KeyboardInterrupt):
    """pytest treats a KeyboardInterrupt as an interrupted session: it stops running tests,
    finalizes every fixture, and exits 2."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, _already_stopping)
    raise Terminated("SIGTERM: the session stops and tears down what it started")


def _already_stopping(signum: int, frame: FrameType | None) -> None:
    """A handler, not SIG_IGN: an ignored signal stays ignored in the programs the teardown
    starts, and those must still be stoppable."""


def install() -> None:
    """From the conftest's pytest_configure: in the main process and in each xdist worker."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a caller's own handler is theirs
        signal.signal(signal.SIGTERM, _interrupt)


def stop_make(proc: subprocess.Popen[str], grace_s: float = 120) -> None:
    """Pass SIGTERM on to a make target the session was waiting for (provision and destroy
    stop their own programs on it), and kill its group if make has not ended after `grace_s`."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:  # the group has ended already
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

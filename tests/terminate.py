"""A test session stopped by SIGTERM (a CI job cancelled, `timeout`, a machine shutting down)
tears its fixtures down as on Ctrl-C, so the shared lab's VMs, taps and namespaces go with it.
Python's default for SIGTERM ends the process at once, without a `finally`: the lab then
waited for the next session's reap (tests/lab_sessions.py), and on a machine where no session
came, for good.

Only the first SIGTERM interrupts: the teardown it starts is not cut short by a second one,
nor by a SIGINT. Under xdist the controller, interrupted too, ends its workers about 15 s
later whatever they are doing (execnet sends each a SIGINT after 5 s, then `os._exit`): so the
teardown's `make destroy` runs in a session of its own and is not stopped with the test
process (tests/conftest.py, `Lab.make`), and goes on to its end if the worker is killed
meanwhile. SIGKILL still ends a session at once; the reap is for that."""

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
    signal.signal(signal.SIGINT, _already_stopping)
    raise Terminated("SIGTERM: the session stops and tears down what it started")


def _already_stopping(signum: int, frame: FrameType | None) -> None:
    """A handler, not SIG_IGN: an ignored signal stays ignored in the programs the teardown
    starts, and those must still be stoppable."""


def install() -> None:
    """From the conftest's pytest_configure: in the main process and in each xdist worker."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a caller's own handler is theirs
        signal.signal(signal.SIGTERM, _interrupt)


def stop_make(proc: subprocess.Popen[str], grace_s: float = 120) -> None:
    """Pass SIGTERM on to a make target the session was waiting for (provision stops its own
    programs on it), and kill its group if make has not ended after `grace_s` or the wait is
    itself interrupted."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:  # the group has ended already
        pass
    try:
        proc.wait(timeout=grace_s)
    except BaseException as e:  # the grace ran out, or another interrupt: nothing is left behind
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise

"""A remote command waited for as long as its node shows progress, not for a fixed time.

On a busy host a node's venv and pip took past any timeout tuned on a quiet one; a dead or
frozen node must still not hold a deploy for ever. So the command runs beside a ticker that
prints the node's busy CPU time every few seconds: a node that prints nothing of its own, and
whose CPU stays idle (or whose ticks stop coming: gone, or its SSH stalled), for the stall
window is failed, naming the step and the setting that extends the window. A command may
also print `STEP_MARK <what>` lines, shown as the node's progress.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infra.lab_settings import CAP_STALLS
from infra.run import BUSY_SHARE

TICK_MARK = "@rxelab-tick"
STEP_MARK = "@rxelab-step"
TICK_S = 5
USER_HZ = 100  # /proc/stat's unit (Linux's USER_HZ on every architecture we meet)
# user + nice + system + irq + softirq: what a working node spends (idle and iowait are not)
_BUSY = "awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat"


class Stalled(Exception):
    """The node showed no progress for the stall window, or the command passed its cap."""


def wrapped(command: str) -> str:
    """The command beside its ticker; the ticker ends with it and holds none of its output."""
    ticker = (f'while :; do sleep {TICK_S} >/dev/null 2>&1; '
              f'echo "{TICK_MARK} $({_BUSY} 2>/dev/null)"; done')
    return (f"( {ticker} ) & ticker=$!; sh -c {shlex.quote(command)}; rc=$?; "
            "kill $ticker 2>/dev/null; exit $rc")


@dataclass
class Output:
    """What the command printed, the ticks and step marks taken out."""

    stdout: str
    exited: int


class _Progress:
    def __init__(self, on_step: Callable[[str], None]) -> None:
        self.on_step = on_step
        self.moved = time.monotonic()
        self.last_busy: tuple[float, int] | None = None  # (when, busy ticks then)
        self.kept: list[str] = []
        self.partial = ""

    def feed(self, text: str) -> None:
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        for line in lines:
            self.line(line)

    def line(self, line: str) -> None:
        now = time.monotonic()
        if line.startswith(TICK_MARK):
            try:
                busy = int(float(line.split()[1]))
            except (IndexError, ValueError):
                return
            if self.last_busy is not None and \
                    busy - self.last_busy[1] >= BUSY_SHARE * USER_HZ * (now - self.last_busy[0]):
                self.moved = now
            self.last_busy = (now, busy)
        elif line.startswith(STEP_MARK):
            self.moved = now
            self.on_step(line.removeprefix(STEP_MARK).strip())
        else:
            self.moved = now
            self.kept.append(line)


def run(connection: Any, command: str, *, what: str, stall: float, setting: str,
        on_step: Callable[[str], None] = lambda step: None) -> Output:
    """Run command on the connection's node (Fabric), waiting while the node moves; raise
    Stalled naming `what` and `setting` when it stands still for `stall` seconds."""
    promise = connection.run(wrapped(command), hide=True, warn=True, asynchronous=True)
    runner = promise.runner
    progress = _Progress(on_step)
    began, seen = time.monotonic(), 0
    try:
        while not (runner.process_is_finished or runner.has_dead_threads):
            time.sleep(0.2)
            chunks = runner.stdout[seen:]  # appended to by Fabric's reader thread
            seen += len(chunks)
            progress.feed("".join(chunks))
            now = time.monotonic()
            if now - progress.moved > stall:
                raise Stalled(f"{what}: no progress for {stall:.0f} s (no output, the node's CPU "
                              f"idle or no answer); a slow node that works is waited for: if it "
                              f"needs longer, set {setting}=<seconds>")
            if now - began > CAP_STALLS * stall:
                raise Stalled(f"{what}: still running after {now - began:.0f} s "
                              f"({CAP_STALLS} x {setting}); set {setting}=<seconds> to wait longer")
    except BaseException:
        runner.stop()  # closes the channel: the remote shell gets a hang-up
        raise
    result = promise.join()
    progress.feed("".join(runner.stdout[seen:]) + "\n")
    return Output("\n".join(progress.kept), result.exited)

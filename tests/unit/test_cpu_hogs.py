"""The CPU hogs beside the shared lab end with the process that started them, even when it
ends without a word (xdist ends a SIGTERMed worker with os._exit): before, a CI job cancelled
while the lab booted left four spinning for hours, and the next run went beside eight."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from infra import run as runner
from infra.config import REPO

STARTER = """
import os, sys
sys.path[:0] = [sys.argv[1]]
from tests import cpu_hogs
hogs = cpu_hogs.Hogs(2).__enter__()
print(" ".join(str(p.pid) for p in hogs.procs), flush=True)
sys.stdin.readline()
os._exit(0)  # no __exit__, no finally
"""
GONE_S = 30  # a hog notices its parent gone at its next loop turn: microseconds, on any host


def test_hogs_end_when_their_starter_ends_without_stopping_them():
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(REPO)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in starter.stdout.readline().split()]
    try:
        # a hog between its fork and its exec has no command line yet: wait (bounded) for it
        started = time.monotonic() + GONE_S
        while not all(runner.process_is(p, Path(sys.executable).name) for p in pids) \
                and time.monotonic() < started:
            time.sleep(0.05)
        assert len(pids) == 2 and all(runner.process_is(p, Path(sys.executable).name) for p in pids)
        starter.stdin.write("\n")
        starter.stdin.flush()
        starter.wait(30)
        deadline = time.monotonic() + GONE_S
        while (alive := [p for p in pids if _spinning(p)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive, f"hogs {alive} still spin {GONE_S} s after their starter ended"
    finally:
        for p in pids:
            if _spinning(p):
                os.kill(p, 9)
        if starter.poll() is None:
            starter.kill()
            starter.wait()


def _spinning(pid: int) -> bool:
    """Alive and not a zombie (an orphan is reaped by init, or by us if we are its reaper)."""
    fields = runner.stat_fields(pid)
    return fields is not None and fields[0] != "Z"

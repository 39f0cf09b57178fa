"""Every `fab` task that talks to nodes, against nodes that let us in and then never answer
(issue 53): each ends, in bounded time, with one line per node naming what it waited for and
the setting that extends the wait - never a traceback, never a hang. Before, a deploy step past
its fixed 300 s ended in a 60-line `CommandTimedOut` traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.unit.fakenode import frozen_nodes

pytestmark = pytest.mark.slow  # fab against frozen nodes: every task waits out its stall window

REPO = Path(__file__).resolve().parents[2]
FAB = [sys.executable, "-m", "fabric"]
STALL_S = 10  # RXELAB_STALL's least


def fab(args: list[str], env: dict[str, str],
        results: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    r = subprocess.run([*FAB, *args], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300, stdin=subprocess.DEVNULL)
    return r, time.monotonic() - began


def test_every_node_task_ends_in_one_line_per_node_when_the_nodes_freeze(tmp_path):
    with frozen_nodes(tmp_path) as served:
        env = {**os.environ, "RXELAB_STALL": str(STALL_S), "INVENTORY": str(served.inventory)}
        env.pop("INVOKE_DEBUG", None)
        results = tmp_path / "results"
        tasks = {
            "deploy": ["deploy"],
            "run-experiment": ["run-experiment", "--spec", "smoke", "--results", str(results)],
            "calibrate": ["calibrate", "--profile", "frozen", "--results", str(results)],
            "status": ["status"],
        }
        with ThreadPoolExecutor(len(tasks)) as pool:
            done = dict(zip(tasks, pool.map(lambda a: fab(a, env, results), tasks.values()),
                            strict=True))
    for name, (r, took) in done.items():
        out = r.stdout + r.stderr
        assert "Traceback" not in out, f"{name}:\n{out[-3000:]}"
        if name == "status":  # a table with a row per node that says so, and no failure
            assert r.returncode == 0, out[-2000:]
            assert out.count("no answer") == 3, out[-2000:]
            continue
        assert r.returncode == 1, f"{name}: exit {r.returncode}\n{out[-2000:]}"
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert lines[0] == "error: some nodes cannot run the experiments:", f"{name}: {lines}"
        for i in (1, 2, 3):
            (line,) = [ln for ln in lines if ln.strip().startswith(f"frozen{i}:")]
            assert f"no progress for {STALL_S} s" in line and "RXELAB_STALL=" in line, line
        assert len(lines) == 4, f"{name}: one line per node: {lines}"
        assert took < 120, f"{name} took {took:.0f} s against a stall window of {STALL_S} s"

"""What the simulator's tests share: the mark for a machine without SimGrid's headers or a
compiler, and a replay of moves written by hand in the replayer's input format."""

from __future__ import annotations

import ctypes.util
import shutil
import subprocess

import pytest

from experiments.simulation import replayer

needs_simgrid = pytest.mark.skipif(
    not (replayer.HEADER.exists() and shutil.which("g++") and ctypes.util.find_library("jemalloc")),
    reason="SimGrid's headers (libsimgrid-dev), g++ or jemalloc missing: `bash infra/install-deps.sh`")


def replay_moves(tmp_path, platform, moves: str) -> list[float]:
    """When each rank ended, replaying moves written by hand (the replayer's input format)."""
    (tmp_path / "p.xml").write_text(platform.xml())
    head = f"ranks {platform.ranks} hosts {platform.hosts} per {platform.per_node} flops 1e9\n"
    if platform.kind == "lab":
        head += (f"vms {platform.cores} {platform.byte_cpu:.6e} {platform.loop_byte_cpu:.6e} "
                 f"{platform.path_byte:.6e} {platform.wake:.6e}\n")
    (tmp_path / "m.txt").write_text(head + moves)
    done = subprocess.run([str(replayer.binary()), str(tmp_path / "p.xml"), str(tmp_path / "m.txt"),
                           *platform.config()], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [float(line.split()[2]) for line in done.stdout.splitlines() if line.startswith("rank")]

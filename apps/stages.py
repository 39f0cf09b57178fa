"""What both demo apps share, so their outputs are comparable line for line: the data each
stage sends, the check of what arrived, and the output format (JSON lines; `#` lines are for
people). One parser (parse_output) reads the output of either app.

Runs on the nodes with the system Python and numpy; of rxelab only its pure-Python
description of the collectives (rxelab.ops), no RDMA and no MPI import here.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
from rxelab import ops

OPS = tuple(ops.COLLECTIVES)
DEFAULT_STAGES = 10
DEFAULT_SIZE = 4096


def buffers(op: str, stage: int, rank: int, p: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """What a rank sends in a stage and what it must end up with (rxelab.ops' test data, the
    stage number as salt). size: bytes per peer (alltoall, allgather), of the vector
    (allreduce, bcast) or of each rank's result block (reduce_scatter)."""
    c = ops.COLLECTIVES[op]
    return c.data(rank, p, size // np.dtype(c.dtype).itemsize, c.dtype, stage, "sum")


def arguments(description: str, algorithms: Iterable[str], default_algorithm: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--op", choices=OPS, default="allgather",
                    help="allgather (the seed's all-to-all broadcast, default) or another "
                         f"collective: {', '.join(OPS)} (each moves its description's dtype)")
    ap.add_argument("--stages", type=int, default=DEFAULT_STAGES,
                    help=f"how many times the collective runs (the seed used 100, 1000, 10000; "
                         f"default {DEFAULT_STAGES})")
    ap.add_argument("--size", type=int, default=DEFAULT_SIZE,
                    help=f"bytes each rank contributes per peer (default {DEFAULT_SIZE})")
    ap.add_argument("--algorithm", choices=list(algorithms), default=default_algorithm)
    ap.add_argument("--warmup", type=int, default=1, help="unrecorded stages first (default 1)")
    ap.add_argument("--quiet", action="store_true", help="no per-stage lines, only the summary")
    return ap


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.stages < 1:
        ap.error("--stages must be at least 1")
    if args.size < 0:
        ap.error("--size must be 0 or more")
    dtype = np.dtype(ops.COLLECTIVES[args.op].dtype)
    if args.size % dtype.itemsize:
        ap.error(f"--size of {args.op} must be a multiple of {dtype.itemsize} ({dtype} elements)")
    if args.warmup < 0:
        ap.error("--warmup must be 0 or more")


def report(app: str, args: argparse.Namespace, p: int, table: np.ndarray, extra: dict[str, Any]) -> list[str]:
    """Lines rank 0 prints: one per stage (max time over ranks, wrong bytes summed), then the
    summary. table has one row per rank: [t_stage0, wrong_stage0, t_stage1, ...]."""
    per = table.reshape(p, args.stages, 2)
    times = per[:, :, 0].max(axis=0)
    wrong = per[:, :, 1].sum(axis=0)
    lines = []
    if not args.quiet:
        for s in range(args.stages):
            lines.append(json.dumps({"record": "stage", "app": app, "stage": s,
                                     "seconds": float(times[s]), "wrong": int(wrong[s])}))
    total = float(times.sum())
    lines.append(json.dumps({
        "record": "summary", "app": app, "op": args.op, "algorithm": args.algorithm,
        "ranks": p, "size": args.size, "stages": args.stages, "warmup": args.warmup,
        "total_seconds": total, "avg_stage_us": total / args.stages * 1e6,
        "min_stage_us": float(times.min()) * 1e6, "max_stage_us": float(times.max()) * 1e6,
        "wrong": int(wrong.sum()), "ok": bool(wrong.sum() == 0), **extra,
    }))
    lines.append(f"# {app} {args.op}/{args.algorithm}: {p} ranks, {args.size} B, {args.stages} stages "
                 f"in {total:.3f} s ({total / args.stages * 1e6:.0f} us/stage), "
                 + ("all data verified" if wrong.sum() == 0 else f"{int(wrong.sum())} WRONG BYTES"))
    return lines


class Progress:
    """Rank 0 says how far it got, at most once a second, so a run stopped at its deadline
    still leaves figures: stages done and the time they took (rank 0's own clock)."""

    def __init__(self, app: str, every: float = 1.0) -> None:
        self.app, self.every = app, every
        self.done, self.seconds, self.last = 0, 0.0, time.monotonic()

    def stage(self, seconds: float) -> None:
        self.done += 1
        self.seconds += seconds
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            print(json.dumps({"record": "progress", "app": self.app, "stages_done": self.done,
                              "seconds": self.seconds}), flush=True)


def parse_output(text: str) -> list[dict[str, Any]]:
    """Records from either app's output (launcher prefixes like `[0] ` are allowed)."""
    records = []
    for line in text.splitlines():
        body = line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line
        body = body.strip()
        if body.startswith("{"):
            try:
                rec = json.loads(body)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("record") in ("stage", "summary", "progress"):
                records.append(rec)
    return records

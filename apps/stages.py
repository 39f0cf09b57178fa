"""What both demo apps share, so their outputs are comparable line for line: the data each
stage sends, the check of what arrived, and the output format (JSON lines; `#` lines are for
people). One parser (parse_output) reads the output of either app.

Runs on the nodes with the system Python and numpy; of rxelab only its pure-Python
description of the collectives (rxelab.ops), no RDMA and no MPI import here.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from rxelab import ops

OPS = tuple(ops.COLLECTIVES)
DEFAULT_STAGES = 10
DEFAULT_SIZE = 4096


def buffers(op: str, stage: int, rank: int, p: int, size: int,
            data: str = "pattern") -> tuple[np.ndarray, np.ndarray]:
    """What a rank sends in a stage and what it must end up with (rxelab.ops' test data of
    kind `data`, the stage number as salt). size: bytes as the collective's description
    counts them (its `unit`: rxelab.ops.units())."""
    c = ops.COLLECTIVES[op]
    return c.data(rank, p, size // np.dtype(c.dtype).itemsize, c.dtype, stage, "sum", data)


Check = Callable[[int], Any]  # stage -> per element, how far a result may be from the exact one


def count_wrong(got: np.ndarray, want: np.ndarray, tolerance: Any = None) -> int:
    """Elements not as they must be: exactly, or within a lossy codec's bound (rxelab.ops'
    one count)."""
    return ops.count_wrong(got, want, tolerance)


def arguments(description: str, algorithms: Iterable[str], default_algorithm: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    known = tuple(ops.COLLECTIVES)  # as registered now (a test may add one)
    ap.add_argument("--op", choices=known, default="allgather",
                    help="allgather (the seed's all-to-all broadcast, default) or another "
                         f"collective: {', '.join(known)} (each moves its description's dtype)")
    ap.add_argument("--stages", type=int, default=DEFAULT_STAGES,
                    help=f"how many times the collective runs (the seed used 100, 1000, 10000; "
                         f"default {DEFAULT_STAGES})")
    ap.add_argument("--size", type=int, default=DEFAULT_SIZE,
                    help=f"bytes each rank contributes per peer (default {DEFAULT_SIZE})")
    ap.add_argument("--algorithm", choices=list(algorithms), default=default_algorithm)
    ap.add_argument("--warmup", type=int, default=1, help="unrecorded stages first (default 1)")
    ap.add_argument("--data", choices=ops.PATTERNS, default="pattern",
                    help="what the buffers hold: a short repeated pattern (default), zeros, "
                         "sparse (1 in 100 set) or random (how well it compresses)")
    ap.add_argument("--quiet", action="store_true", help="no per-stage lines, only the summary")
    ap.add_argument("--tight", action="store_true",
                    help="back to back: the stages run on the same data with nothing between "
                         "them (as a training step's collectives do), the time per call is each "
                         "rank's whole span over the stages (the slowest rank's), and the data "
                         "is checked after the last stage only")
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
    summary. table has one row per rank: [t_stage0, wrong_stage0, t_stage1, ...]. Stages one
    after another each wait for the slowest rank, so the total is the sum of each stage's
    slowest; back to back (--tight) ranks drift apart between calls and wait only where the
    data needs it, so the total is the slowest rank's own span."""
    per = table.reshape(p, args.stages, 2)
    times = per[:, :, 0].max(axis=0)
    wrong = per[:, :, 1].sum(axis=0)
    tight = bool(getattr(args, "tight", False))
    total = float(per[:, :, 0].sum(axis=1).max()) if tight else float(times.sum())
    lines = []
    if not args.quiet:
        for s in range(args.stages):
            lines.append(json.dumps({"record": "stage", "app": app, "stage": s,
                                     "seconds": float(times[s]), "wrong": int(wrong[s])}))
    lines.append(json.dumps({
        "record": "summary", "app": app, "op": args.op, "algorithm": args.algorithm,
        "ranks": p, "size": args.size, "stages": args.stages, "warmup": args.warmup,
        "tight": tight, "data": getattr(args, "data", "pattern"),
        "total_seconds": total, "avg_stage_us": total / args.stages * 1e6,
        "min_stage_us": float(times.min()) * 1e6, "max_stage_us": float(times.max()) * 1e6,
        "wrong": int(wrong.sum()), "ok": bool(wrong.sum() == 0), **extra,
    }))
    lines.append(f"# {app} {args.op}/{args.algorithm}: {p} ranks, {args.size} B, {args.stages} "
                 f"{'calls back to back' if tight else 'stages'} "
                 f"in {total:.3f} s ({total / args.stages * 1e6:.0f} us/stage), "
                 + ("all data verified" if wrong.sum() == 0 else f"{int(wrong.sum())} WRONG BYTES"))
    return lines


PROC_STAT = "/proc/stat"


def node_cpu() -> tuple[int, int] | None:
    """This node's CPU time so far, busy and in all (clock ticks over all its CPUs, from
    /proc/stat's first line): busy is user, nice, system, irq and softirq; idle, iowait and
    steal (a hypervisor's other guests) are not. None where there is no such line."""
    try:
        with open(PROC_STAT) as f:
            fields = f.readline().split()
        ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    if fields[:1] != ["cpu"] or len(ticks) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, _steal = ticks
    return user + nice + system + irq + softirq, sum(ticks)


def busy_between(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float:
    """The share of the node's CPUs busy between two node_cpu() readings (NaN without both,
    or when no tick passed)."""
    if before is None or after is None or after[1] <= before[1]:
        return float("nan")
    return (after[0] - before[0]) / (after[1] - before[1])


def cpu_per_call(cpu: list[float], calls: int) -> dict[str, float]:
    """This process's user and system CPU microseconds per timed call (run's `cpu`): what a
    call costs the rank beside what it takes of the clock. Back to back (--tight) it is the
    calls' own; stage by stage it includes putting data in and checking it."""
    if len(cpu) != 2 or calls < 1:
        return {}
    return {"cpu_user_us": round(cpu[0] / calls * 1e6, 1),
            "cpu_sys_us": round(cpu[1] / calls * 1e6, 1)}


def run(args: argparse.Namespace, rank: int, p: int, collective: Callable[[np.ndarray, np.ndarray], Any],
        barrier: Callable[[], Any], app: str, tolerance: Check | None = None,
        busy: list[float] | None = None, cpu: list[float] | None = None) -> np.ndarray:
    """The stages of either app on the same buffers (as a training loop has them), each timed:
    this rank's [seconds, wrong elements] per stage. Stage by stage, each stage puts new data
    in and checks what came out; back to back (--tight), the data goes in once, the calls
    follow one another from a common start (a barrier) and the last one is checked. A result
    is checked exactly, or within tolerance(stage) where a lossy codec rounds it. `busy`, when
    given, gets the share of this node's CPUs that was busy from the first timed call to the
    end of the last, checks included stage by stage (the simulator's calibration, which runs
    back to back: what a byte costs the CPU, under TCG). `cpu`, when given, gets this
    process's user and system CPU seconds over the same span (getrusage: every thread)."""
    data = getattr(args, "data", "pattern")
    described = ops.COLLECTIVES[args.op]
    send, want = buffers(args.op, 0, rank, p, args.size, data)
    recv = np.zeros_like(want)
    mine = np.zeros(args.stages * 2, np.float64)
    progress = Progress(app) if rank == 0 else None
    tight = bool(getattr(args, "tight", False))
    started = ended = None
    for s in range(-args.warmup, args.stages):
        if not tight:  # new data every stage
            fresh, want = buffers(args.op, max(s, 0), rank, p, args.size, data)
            np.copyto(send, fresh)
        elif s == 0:
            barrier()
        if s == 0:
            started = node_cpu()
            used = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        collective(send, recv)
        took = time.perf_counter() - t0
        if s == args.stages - 1:
            ended = node_cpu()
            if cpu is not None:
                now = resource.getrusage(resource.RUSAGE_SELF)
                cpu.extend((now.ru_utime - used.ru_utime, now.ru_stime - used.ru_stime))
        if s >= 0:
            mine[2 * s] = took
            if not tight or s == args.stages - 1:
                mine[2 * s + 1] = ops.wrong(described, send, recv, want,
                                            tolerance(0 if tight else s) if tolerance else None)
            if progress:
                progress.stage(took)
    if busy is not None:
        busy.append(busy_between(started, ended))
    return mine


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

"""Benchmark of the collectives, run by every rank of a job (like OSU's osu_alltoall):

    python3 -m rxelab.launch --hosts node1,node2,node3 -- python3 -m rxelab.bench \\
        --op alltoall --algorithms sequential,pairwise,parallel -b 1K -e 1M -f 4

Rank 0 prints a `#` header (rxelab's version, the command line, the date, every rank's host,
the path MTU, the settings: rxelab.bench_report), then per algorithm OSU-style
rows (size per peer, avg/min/max latency over ranks, iterations) with nccl-tests' algbw and
busbw (busbw = algbw * (n-1)/n), what a call cost a rank's CPU (user and system microseconds,
getrusage, the mean over ranks) and how often a rank slept on the completion channel per call,
and the #wrong bytes of a checked last iteration. Its flags speak OSU's, nccl-tests' and
perftest's dialects (rxelab.bench_flags; `--help` ends with the table). With
--perftest, ib_write_bw and ib_send_bw between rank 0 and rank 1 give the link's limit in the
same units (ib_write_bw_bidir, `ib_write_bw -b`, runs both directions at once and reports
their sum, which is what a 2-rank all-to-all's algbw compares to). --json FILE adds a header
record and then one JSON line per row as it is measured (never overwriting an existing file).

Under emulation (TCG) absolute times are not hardware numbers; ratios measured in one run are.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import resource
import subprocess
import sys
import time
from typing import Any

import numpy as np

import rxelab
from rxelab import bench_flags, bench_report, codecs, ops, settings
from rxelab.bench_report import Report
from rxelab.console import one_line_errors
from rxelab.errors import RdmaError
from rxelab.perftest import BANDWIDTH as PERFTEST_TOOLS
from rxelab.perftest import argv as perftest_argv
from rxelab.perftest import command as perftest_command
from rxelab.perftest import parse as parse_perftest

MB = 1e6
# rxelab.handloop: the floor's name (an rxelab case's algorithm in a spec), what it does, and
# its largest block (eager: one slot)
HAND_LOOP = "hand-loop"
HAND_OPS = ("alltoall", "allgather")
HAND_MAX = 65536


def measure(comm: Any, op: str, algo: str, size: int, iters: int, warmup: int,
            compression: str | None = None, hand: Any = None,
            check: bool = True) -> dict[str, Any]:
    """size: bytes as the collective's description counts them (its `unit`: rxelab.ops.units()).
    With `hand`, the calls are the hand-written loop's (rxelab.handloop), checked alike;
    check=False leaves the last call's data unchecked (its "wrong" is None)."""
    p, r = comm.size, comm.rank
    coll = ops.COLLECTIVES[op]
    dtype = coll.dtype
    count = size // np.dtype(dtype).itemsize
    send, want = coll.data(r, p, count, dtype, 0, "sum")
    recv = np.zeros_like(want)
    fresh = send.copy() if coll.in_place else None  # a call overwrites it: put back each time
    times, peak_inflight, peak_pinned = [], 0, 0
    user = system = 0.0  # this rank's CPU seconds in the timed calls (getrusage: all threads)
    sleeps = 0
    for i in range(warmup + iters):
        if fresh is not None:  # the root's data again, the others' buffer cleared
            np.copyto(send, fresh)
        recv.fill(0)
        comm.barrier()
        used = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        stats = hand.run(op, send, recv) if hand is not None else \
            ops.run(comm, op, algo, send, recv, compression=compression)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            now = resource.getrusage(resource.RUSAGE_SELF)
            user += now.ru_utime - used.ru_utime
            system += now.ru_stime - used.ru_stime
            sleeps += stats.sleeps
            peak_inflight = max(peak_inflight, stats.peak_inflight)
            peak_pinned = max(peak_pinned, stats.peak_pinned)
    codec = codecs.lookup(compression)
    bound = None
    if codec is not None and codec.lossy:  # within the codec's bound, not exactly
        bound = codecs.error_bound(codec, coll.inputs(r, p, count, dtype))
    wrong = ops.wrong(coll, send, recv, want, bound) if check else 0
    mine = np.array([float(np.mean(times)), float(np.min(times)), float(np.max(times)),
                     wrong, peak_inflight, peak_pinned, user / iters, system / iters,
                     sleeps / iters], np.float64)
    every = np.zeros(p * mine.size, np.float64)
    comm.allgather(mine, every, algorithm="ring")  # the library reports on itself
    rows = every.reshape(p, mine.size)
    avg_per_rank = rows[:, 0]
    t = float(avg_per_rank.max())  # the collective ends when its slowest rank does
    algbw = coll.algbw_bytes(size, p) / t / MB if t > 0 else 0.0
    return {
        "op": op, "algorithm": algo, "size": size, "ranks": p, "iterations": iters, "warmup": warmup,
        "avg_us": float(avg_per_rank.mean()) * 1e6, "min_us": float(avg_per_rank.min()) * 1e6,
        "max_us": float(avg_per_rank.max()) * 1e6, "algbw_MBps": algbw,
        "busbw_MBps": algbw * coll.busbw(p), "wrong": int(rows[:, 3].sum()) if check else None,
        "peak_inflight": int(rows[:, 4].max()), "peak_pinned": int(rows[:, 5].max()),
        # per call, the mean over ranks: what it cost the CPU, and how often a rank slept
        "cpu_user_us": float(rows[:, 6].mean()) * 1e6, "cpu_sys_us": float(rows[:, 7].mean()) * 1e6,
        "sleeps": float(rows[:, 8].mean()),
    }


def compute(seconds: float) -> float:
    """Work for about `seconds` in numpy (which lets the progress thread run); its duration."""
    a = np.ones((96, 96))
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a = np.dot(a, a) * 1e-3
    return time.perf_counter() - t0


def overlap(comm: Any, op: str, algo: str, size: int, iters: int) -> dict[str, Any]:
    """OSU's nonblocking measure: t_pure (the collective alone), t_cpu (compute alone, about
    t_pure long), t_total (start it, compute, wait); overlap = 100 * (1 - (t_total - t_cpu) /
    t_pure), how much of the communication the computation hid."""
    p, r = comm.size, comm.rank
    coll = ops.COLLECTIVES[op]
    dtype = coll.dtype
    send, want = coll.data(r, p, size // np.dtype(dtype).itemsize, dtype, 0, "sum")
    recv = np.zeros_like(want)
    pure, cpu, total = [], [], []
    for _ in range(iters):
        comm.barrier()
        t0 = time.perf_counter()
        ops.run(comm, op, algo, send, recv)
        pure.append(time.perf_counter() - t0)
    t_pure = float(np.mean(pure))
    for _ in range(iters):
        comm.barrier()
        t0 = time.perf_counter()
        req = comm.start(op, *coll.given(send, recv), algorithm=algo,
                         **coll.arguments(p, rank=r, send=send))
        cpu.append(compute(t_pure))
        req.wait()
        total.append(time.perf_counter() - t0)
    t_cpu, t_total = float(np.mean(cpu)), float(np.mean(total))
    hidden = 100.0 * (1 - (t_total - t_cpu) / t_pure) if t_pure > 0 else 0.0
    return {"op": op, "algorithm": algo, "size": size, "ranks": p, "iterations": iters,
            "pure_us": t_pure * 1e6, "cpu_us": t_cpu * 1e6, "total_us": t_total * 1e6,
            "overlap_pct": max(0.0, min(100.0, hidden))}


def perftest(comm: Any, tool: str, m: int, iters: int) -> dict[str, Any] | None:
    """A perftest between rank 0 (client) and rank 1 (server), m bytes per message."""
    dev = comm.dev
    base = perftest_argv(tool, dev.name, dev.port, dev.gid_index, m, iters,
                         qp_timeout=int(comm.options["qp_timeout"]))
    result = None
    if comm.rank == 1:
        server = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        comm.barrier()
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    elif comm.rank == 0:
        gid = comm.conns[1].remote.gid
        ip = ipaddress.IPv6Address(gid).ipv4_mapped
        comm.barrier()
        time.sleep(1.0)  # the server needs a moment to listen
        out = subprocess.run([*base, str(ip or gid)], capture_output=True, text=True, timeout=120)
        found = parse_perftest(tool, out.stdout)
        if found is not None:
            result = {"op": tool, "algorithm": "perftest", "size": m, "ranks": 2,
                      "iterations": found["iterations"], "avg_us": 0.0, "min_us": 0.0,
                      "max_us": 0.0, "algbw_MBps": found["bw_MBps"],
                      "busbw_MBps": found["bw_MBps"], "wrong": 0}
    else:
        comm.barrier()
    comm.barrier()
    return result


@one_line_errors("bench")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = bench_flags.parser()
    args = ap.parse_args(argv)
    algos, sizes = bench_flags.checked(ap, args, HAND_OPS)
    try:
        with rxelab.init(transport=args.transport, device=args.device, port=args.ib_port,
                         gid_index=args.gid_index,
                         **{"timeout": 120.0, **settings.from_flags(args)}) as comm:
            report, why = None, None
            try:
                report = Report(comm.rank == 0, args.json)
            except OSError as err:  # rank 0 alone writes it: every rank learns below
                why = f"--json {args.json}: {err.strerror or err}"
            seen = bench_report.gather(comm, report is not None)
            if report is None or not seen.ready:
                print(f"bench: {why or 'rank 0 cannot write its --json file'}", file=sys.stderr)
                return 2
            try:
                wrong = measure_all(comm, args, algos, sizes, report, seen,
                                    bench_report.command_line(bench_flags.PROG, argv))
            finally:
                report.close()
    except RdmaError as err:
        print(f"bench: {err}", file=sys.stderr)
        return 2
    return 1 if wrong else 0


def measure_all(comm: Any, args: argparse.Namespace, algos: list[str], sizes: list[int],
                report: Report, seen: bench_report.Gathered, command: str) -> int:
    """Every measure the flags ask for, reported as it comes; the count of wrong elements."""
    report.header(bench_report.describe(comm, command, bench_flags.calls_said(args), seen))
    check = args.check == 1

    def calls(m: int) -> bench_flags.Calls:
        return bench_flags.calls(m, args)

    rows = []
    for algo in algos:
        report.section(f"{args.op}/{algo}")
        for m in sizes:
            r = measure(comm, args.op, algo, m, calls(m).timed, calls(m).warmup,
                        args.compression, check=check)
            rows.append(r)
            report.row(r)
    small = [m for m in sizes if 0 < m <= HAND_MAX]
    if args.hand_loop and args.op in HAND_OPS and small:
        report.section(f"{args.op}/{HAND_LOOP} (pyverbs by hand, eager: the floor)")
        from rxelab.handloop import HandLoop  # pyverbs: only when asked for
        hand = HandLoop(comm, max(small), timeout=float(comm.options["timeout"]))
        try:
            for m in small:
                r = measure(comm, args.op, HAND_LOOP, m, calls(m).timed, calls(m).warmup,
                            hand=hand, check=check)
                rows.append(r)
                report.row(r)
        finally:
            hand.close()
    if args.overlap:
        for algo in algos:
            report.section(f"i{args.op}/{algo}: overlap with computation",
                           bench_report.OVERLAP_HEADER)
            for m in sizes:
                report.row(overlap(comm, args.op, algo, m, max(2, calls(m).timed // 2)),
                           "overlap")
    if args.perftest and comm.size >= 2:
        for tool in PERFTEST_TOOLS:
            shown = perftest_command(tool)
            report.section(f"{tool}{f' ({shown})' if shown != tool else ''} (rank 0 -> rank 1: "
                           "the link's limit)")
            for m in sizes:
                found = perftest(comm, tool, m, 200 if m <= 65536 else 50)
                if found is not None:
                    rows.append(found)
                    report.row(found)
    return sum(r["wrong"] or 0 for r in rows)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

"""Benchmark of the collectives, run by every rank of a job (like OSU's osu_alltoall):

    python3 -m rxelab.launch --hosts node1,node2,node3 -- python3 -m rxelab.bench \\
        --op alltoall --algorithms sequential,pairwise,parallel --sizes 1,1024,65536,1048576

Rank 0 prints a `#` preamble (versions, device, parameters), then per algorithm OSU-style
rows (size per peer, avg/min/max latency over ranks, iterations) with nccl-tests' algbw and
busbw (busbw = algbw * (n-1)/n), what a call cost a rank's CPU (user and system microseconds,
getrusage, the mean over ranks) and how often a rank slept on the completion channel per call,
and the #wrong bytes of a checked last iteration. With
--perftest, ib_write_bw and ib_send_bw between rank 0 and rank 1 give the link's limit in the
same units (ib_write_bw_bidir, `ib_write_bw -b`, runs both directions at once and reports
their sum, which is what a 2-rank all-to-all's algbw compares to). --json FILE adds one JSON
line per row (never overwriting an existing file).

Under emulation (TCG) absolute times are not hardware numbers; ratios measured in one run are.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import platform
import resource
import subprocess
import sys
import time
from typing import Any

import numpy as np

import rxelab
from rxelab import codecs, ops, settings
from rxelab.console import one_line_errors
from rxelab.errors import RdmaError
from rxelab.perftest import BANDWIDTH as PERFTEST_TOOLS
from rxelab.perftest import argv as perftest_argv
from rxelab.perftest import command as perftest_command
from rxelab.perftest import parse as parse_perftest

MB = 1e6
DEFAULT_SIZES = (1, 16, 1024, 16384, 65536, 262144, 1048576)
# rxelab.handloop: the floor's name (an rxelab case's algorithm in a spec), what it does, and
# its largest block (eager: one slot)
HAND_LOOP = "hand-loop"
HAND_OPS = ("alltoall", "allgather")
HAND_MAX = 65536
MAX_SIZE = 1 << 30  # bytes per call: buffers beyond it are not a benchmark on these machines


def measure(comm: Any, op: str, algo: str, size: int, iters: int, warmup: int,
            compression: str | None = None, hand: Any = None) -> dict[str, Any]:
    """size: bytes as the collective's description counts them (its `unit`: rxelab.ops.units()).
    With `hand`, the calls are the hand-written loop's (rxelab.handloop), checked alike."""
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
    wrong = ops.wrong(coll, send, recv, want, bound)
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
        "busbw_MBps": algbw * coll.busbw(p), "wrong": int(rows[:, 3].sum()),
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


HEADER = (f"{'# Size':<10}{'Avg Latency(us)':>17}{'Min Latency(us)':>17}{'Max Latency(us)':>17}"
          f"{'Iterations':>12}{'algbw(MB/s)':>13}{'busbw(MB/s)':>13}{'CPU usr(us)':>12}"
          f"{'CPU sys(us)':>12}{'Sleeps':>8}{'#wrong':>8}")


def row(r: dict[str, Any]) -> str:
    if r["algorithm"] == "perftest":  # perftest reports bandwidth only
        return (f"{r['size']:<10}{'-':>17}{'-':>17}{'-':>17}"
                f"{r['iterations']:>12}{r['algbw_MBps']:>13.2f}{r['busbw_MBps']:>13.2f}"
                f"{'-':>12}{'-':>12}{'-':>8}{'-':>8}")
    return (f"{r['size']:<10}{r['avg_us']:>17.2f}{r['min_us']:>17.2f}{r['max_us']:>17.2f}"
            f"{r['iterations']:>12}{r['algbw_MBps']:>13.2f}{r['busbw_MBps']:>13.2f}"
            f"{r['cpu_user_us']:>12.0f}{r['cpu_sys_us']:>12.0f}{r['sleeps']:>8.1f}{r['wrong']:>8}")


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


def preamble(comm: Any, args: argparse.Namespace) -> list[str]:
    try:
        rdma_core = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "python3-pyverbs"],
                                   capture_output=True, text=True, timeout=10).stdout or "?"
    except OSError:
        rdma_core = "?"
    dev = comm.dev
    where = (f"device {dev.name} port {dev.port} gid index {dev.gid_index} mtu enum {dev.mtu_enum}"
             if comm.transport == "verbs" else f"transport {comm.transport} from {comm.fabric.host}")
    return [
        "# rxelab collective benchmark",
        f"# kernel {platform.release()}, python {platform.python_version()}, pyverbs {rdma_core}",
        f"# {where}, ranks {comm.size}",
        f"# iterations {args.iterations} (sizes > 64 KiB: {max(2, args.iterations // 4)}), "
        f"warm-up {args.warmup}",
        "# settings " + " ".join(f"{k}={settings.show(v)}" for k, v in comm.options.items()),
        f"# size = bytes ({ops.units()}); latency = per-rank average over iterations; algbw and "
        "busbw as nccl-tests define them (busbw = algbw * the collective's factor, over "
        f"{comm.size} ranks: "
        + ", ".join(f"{c.name} {c.busbw(comm.size):.3g}" for c in ops.COLLECTIVES.values()) + ")",
    ]


def sizes_list(text: str) -> list[int]:
    """--sizes: comma-separated whole numbers of bytes."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated whole numbers of bytes, "
                                         "e.g. 1024,65536") from None
    if not sizes or any(s < 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: at least one size, none below 0")
    if max(sizes) > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes at most {MAX_SIZE} (1 GiB)")
    return sizes


def size_range(text: str) -> tuple[int, int]:
    """-m [MIN:]MAX as OSU's benchmarks take it."""
    lo, _, hi = text.rpartition(":")
    try:
        low, high = (int(lo) if lo else -1), int(hi)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: [MIN:]MAX in bytes, e.g. 1024:1048576") from None
    if high < 0 or (lo and not 0 <= low <= high):
        raise argparse.ArgumentTypeError(f"{text!r}: 0 <= MIN <= MAX")
    if high > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"{text!r}: MAX at most {MAX_SIZE} (1 GiB)")
    return low, high


def powers(low: int, high: int) -> list[int]:
    """OSU's sizes from MIN to MAX: MIN, then doubling (0 is followed by 1)."""
    out, m = [], low
    while m <= high:
        out.append(m)
        m = m * 2 if m else 1
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=list(ops.COLLECTIVES), default="alltoall",
                    help="the collective (default: alltoall)")
    ap.add_argument("--algorithms", default=None, help="comma-separated (default: all)")
    sizes_group = ap.add_mutually_exclusive_group()
    sizes_group.add_argument("--sizes", type=sizes_list, default=None,
                             help="comma-separated sizes in bytes, as the op counts them (per "
                                  "peer for all-to-all, the vector for allreduce; whole elements "
                                  "of its dtype); default: 1,16,1024,16384,65536,262144,1048576 "
                                  "(those that are whole elements)")
    sizes_group.add_argument("-m", "--message-size", type=size_range, default=None,
                             metavar="[MIN:]MAX",
                             help="as OSU's -m: powers of two from MIN (default: one element) "
                                  "to MAX bytes (at most 1 GiB), those of whole elements")
    ap.add_argument("--iterations", type=int, default=10,
                    help="timed calls per size (default 10; sizes above 64 KiB a quarter, at "
                         "least 2)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls first (default 2)")
    settings.add_flags(ap, defaults={"timeout": 120.0})
    ap.add_argument("--perftest", action="store_true", help="add ib_write_bw/ib_send_bw rows")
    ap.add_argument("--overlap", action="store_true",
                    help="also the nonblocking variant: how much computation hides it (OSU's "
                         "overlap %%)")
    ap.add_argument("--hand-loop", action="store_true",
                    help="also the same calls as a hand-written pyverbs loop (alltoall and "
                         "allgather up to 64 KiB): the floor of time and CPU per call")
    ap.add_argument("--json", default=None, help="also write JSON lines here (never overwrites)")
    ap.add_argument("--transport", choices=settings.TRANSPORTS, default=None,
                    help=f"what the collectives run over (default: ${settings.TRANSPORT_ENV}, "
                         "else verbs); --perftest and --hand-loop are verbs'")
    ap.add_argument("--compression", choices=codecs.NAMES, default=None,
                    help="code rendezvous blocks (rxelab.codecs; fp16/bf16 for float sums only, "
                         "whose #wrong counts elements beyond the codec's bound)")
    return ap


def chosen_sizes(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """The sizes to measure, each a whole number of the op's elements (else a usage error)."""
    element = np.dtype(ops.COLLECTIVES[args.op].dtype).itemsize
    if args.message_size is not None:  # a range keeps its sizes of whole elements (0:N)
        low, high = args.message_size
        sizes = [s for s in powers(element if low < 0 else low, high) if s % element == 0]
    elif args.sizes is not None:
        sizes = args.sizes
    else:
        sizes = [s for s in DEFAULT_SIZES if s % element == 0]
    broken = [s for s in sizes if s % element]
    if broken:
        ap.error(f"{args.op} moves {np.dtype(ops.COLLECTIVES[args.op].dtype).name} elements of "
                 f"{element} bytes: {', '.join(map(str, broken))} bytes is not a whole number of "
                 "them")
    if not sizes:
        ap.error(f"no size up to {args.message_size[1]} bytes holds one {element}-byte element")
    return sizes


@one_line_errors("bench")
def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    known = ops.COLLECTIVES[args.op].algorithms
    algos = args.algorithms.split(",") if args.algorithms else list(known)
    bad = [a for a in algos if a not in known]
    if bad:
        ap.error(f"unknown algorithms {bad}: {args.op} has {', '.join(known)}")
    if args.hand_loop and args.op not in HAND_OPS:
        ap.error(f"--hand-loop does {' and '.join(HAND_OPS)}, not {args.op}")
    if args.transport not in (None, "verbs") and (args.perftest or args.hand_loop):
        ap.error(f"--perftest and --hand-loop measure verbs, not --transport {args.transport}")
    if args.iterations < 1 or args.warmup < 0:
        ap.error("--iterations must be >= 1 and --warmup >= 0")
    sizes = chosen_sizes(ap, args)
    try:
        with rxelab.init(transport=args.transport,
                         **{"timeout": 120.0, **settings.from_flags(args)}) as comm:
            out = None
            if comm.rank == 0:
                print("\n".join(preamble(comm, args)), flush=True)
                if args.json:
                    out = open(args.json, "x")  # closed below; "x": never overwrite
            rows = []
            for algo in algos:
                if comm.rank == 0:
                    print(f"# {args.op}/{algo}\n{HEADER}", flush=True)
                for m in sizes:
                    iters = args.iterations if m <= 65536 else max(2, args.iterations // 4)
                    r = measure(comm, args.op, algo, m, iters, args.warmup, args.compression)
                    rows.append(r)
                    if comm.rank == 0:
                        print(row(r), flush=True)
            small = [m for m in sizes if 0 < m <= HAND_MAX]
            if args.hand_loop and args.op in HAND_OPS and small:
                if comm.rank == 0:
                    print(f"# {args.op}/{HAND_LOOP} (pyverbs by hand, eager: the floor)\n{HEADER}",
                          flush=True)
                from rxelab.handloop import HandLoop  # pyverbs: only when asked for
                hand = HandLoop(comm, max(small), timeout=float(comm.options["timeout"]))
                try:
                    for m in small:
                        r = measure(comm, args.op, HAND_LOOP, m, args.iterations, args.warmup,
                                    hand=hand)
                        rows.append(r)
                        if comm.rank == 0:
                            print(row(r), flush=True)
                finally:
                    hand.close()
            if args.overlap:
                for algo in algos:
                    if comm.rank == 0:
                        print(f"# i{args.op}/{algo}: overlap with computation\n"
                              f"{'# Size':<10}{'Pure(us)':>14}{'Compute(us)':>14}{'Total(us)':>14}"
                              f"{'Overlap(%)':>12}", flush=True)
                    for m in sizes:
                        o = overlap(comm, args.op, algo, m, max(2, args.iterations // 2))
                        if comm.rank == 0:
                            print(f"{m:<10}{o['pure_us']:>14.1f}{o['cpu_us']:>14.1f}"
                                  f"{o['total_us']:>14.1f}{o['overlap_pct']:>12.1f}", flush=True)
            if args.perftest and comm.size >= 2:
                for tool in PERFTEST_TOOLS:
                    if comm.rank == 0:
                        run = perftest_command(tool)
                        print(f"# {tool}{f' ({run})' if run != tool else ''} (rank 0 -> rank 1: "
                              f"the link's limit)\n{HEADER}", flush=True)
                    for m in sizes:
                        found = perftest(comm, tool, m, 200 if m <= 65536 else 50)
                        if found is not None:
                            rows.append(found)
                            print(row(found), flush=True)
            if out is not None:
                for r in rows:
                    out.write(json.dumps(r) + "\n")
                out.close()
            wrong = sum(r["wrong"] for r in rows)
    except (RdmaError, FileExistsError) as err:
        print(f"bench: {err}", file=sys.stderr)
        return 2
    return 1 if wrong else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

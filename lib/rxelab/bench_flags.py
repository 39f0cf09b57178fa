"""rxelab-bench's command line, in the dialects of the tools a newcomer already types: OSU's
(-m, -i, -x), nccl-tests' (-b, -e, -f, -n, -w, -c) and perftest's (-d, --ib-port,
--gid-index). Where two tools give one letter two meanings, the letter keeps one and the other
gets a long name; the help's epilog says which. Everything is checked here, in words, before
a rank starts; what the flags amount to (the sizes, the calls per size) is worked out here
too, so the benchmark itself only measures.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rxelab import codecs, ops, settings, transports
from rxelab.errors import ConfigError

PROG = "rxelab-bench"  # its console script; `python3 -m rxelab.bench` is the same program
DESCRIPTION = ("Benchmark of the collectives, run by every rank of a job (like OSU's "
               "osu_alltoall): OSU-style rows with nccl-tests' algbw and busbw.")
DEFAULT_SIZES = (1, 16, 1024, 16384, 65536, 262144, 1048576)
MAX_SIZE = 1 << 30  # bytes per call: buffers beyond it are not a benchmark on these machines
MAX_SIZES = 1000  # sizes in one run: more is a typo (--stepbytes 1), not a benchmark
# OSU's defaults for collectives: 1000 timed calls after 100 warm-up ones up to 8 KiB
# (LARGE_MESSAGE_SIZE), 100 after 10 above; -i and -x set both, as OSU's do
LARGE_MESSAGE_SIZE = 8192
CALLS, CALLS_LARGE = 1000, 100
WARMUP, WARMUP_LARGE = 100, 10
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

DIALECTS = """\
dialects (one letter, one meaning here; the other tool's meaning under a long name):
  what                  OSU         nccl-tests       perftest    rxelab-bench
  sizes                 -m MIN:MAX  -b MIN -e MAX    -           -m, or -b/-e, or --sizes
  step between sizes    (doubles)   -f N | -i N      -           -f N | --stepbytes N
  timed calls per size  -i N        -n N             -n N        -i N = -n N (--iterations)
  warm-up calls         -x N        -w N             -           -x N = -w N (--warmup)
  min/max columns       -f          -                -           --full (always printed)
  check the data        -c          -c 0|1           -           -c [0|1] (--check; default 1)
  RDMA device           -           (-d: datatype)   -d NAME     -d NAME (--device, --ib-dev)
  its port              -           -                -i N        --ib-port N
  the port's GID index  -           -                -x N        --gid-index N
Sizes take nccl-tests' suffixes (8, 128K, 128M, 1G: K = 1024) and mean what --sizes means
(per peer for all-to-all). -b defaults to one element, -e to 1M, -f to 2 (nccl-tests' -f 1
with -i N is --stepbytes N here). Calls per size default to OSU's: 1000 timed after 100
warm-up up to 8 KiB, 100 after 10 above; -i/-x set every size's, as OSU's do. The default
sizes on 3 ranks of one busy 2-core host over tcp: allreduce (2 algorithms) about 25 s,
alltoall (4) about a minute; under emulation (TCG) several times that: -i 100 -x 10 is a
quick look.
"""


def parse_size(text: str) -> int:
    """A size as nccl-tests takes it: whole bytes, or K, M, G (binary) after the number."""
    m = re.fullmatch(r"\s*(\d+)\s*([KkMmGg]?)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of bytes, with K, M or G "
                                         "after it as nccl-tests takes them (e.g. 8, 128M)")
    size = int(m.group(1)) * UNITS[m.group(2).upper()]
    if size > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes at most {MAX_SIZE} (1G)")
    return size


def whole(low: int, what: str) -> Callable[[str], int]:
    """argparse's type for a whole number from `low`, said as `what` when it is not."""
    def check(text: str) -> int:
        if not re.fullmatch(r"\d+", text.strip()) or int(text) < low:
            raise argparse.ArgumentTypeError(f"{text!r}: {what}, a whole number from {low}")
        return int(text)
    return check


def step_factor(text: str) -> int:
    """-f N: a whole factor of at least 2 (nccl-tests' -f 1 means: step by -i bytes)."""
    if text.strip() == "1":
        raise argparse.ArgumentTypeError("'1': nccl-tests' -f 1 steps by -i bytes; say "
                                         "--stepbytes N here (-f takes a factor from 2)")
    return whole(2, "the factor between sizes")(text)


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
    return steps(low, high, 2, 0, 1)


def steps(low: int, high: int, factor: int, step: int, element: int) -> list[int]:
    """nccl-tests' sizes: from low to high, times factor (or plus step where factor is 0);
    0 is followed by one element (or the step)."""
    out, m = [], low
    while m <= high:
        out.append(m)
        m = (m * factor if factor else m + step) if m else (element if factor else step)
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=DIALECTS,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("-b", "--minbytes", type=parse_size, default=None, metavar="SIZE",
                    help="as nccl-tests' -b: the smallest size (default: one element)")
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=None, metavar="SIZE",
                    help="as nccl-tests' -e: the largest size (default 1M)")
    ap.add_argument("-f", "--stepfactor", type=step_factor, nargs="?",
                    default=None, const=0, metavar="N",
                    help="as nccl-tests' -f: each size N times the last (default 2); OSU's -f "
                         "(full) is --full here")
    ap.add_argument("--stepbytes", type=whole(1, "the bytes between sizes"), default=None,
                    metavar="N", help="nccl-tests' -i: each size N bytes above the last")
    ap.add_argument("-i", "-n", "--iterations", "--iters", dest="iterations", default=None,
                    type=int, metavar="N",
                    help=f"timed calls per size, every size (OSU's -i, nccl-tests' and "
                         f"perftest's -n; default OSU's: {CALLS} up to {LARGE_MESSAGE_SIZE} "
                         f"bytes, {CALLS_LARGE} above)")
    ap.add_argument("-x", "-w", "--warmup", "--warmup_iters", dest="warmup", default=None,
                    type=int, metavar="N",
                    help=f"untimed calls first, every size (OSU's -x, nccl-tests' -w; default "
                         f"{WARMUP} up to {LARGE_MESSAGE_SIZE} bytes, {WARMUP_LARGE} above)")
    ap.add_argument("-c", "--check", type=int, choices=(0, 1), nargs="?", const=1, default=1,
                    help="1: count the wrong elements of each size's last call (#wrong); 0: "
                         "do not (OSU's -c alone is 1; default 1)")
    ap.add_argument("--full", action="store_true",
                    help="OSU's -f: rows always carry OSU's full columns (min and max latency "
                         "over ranks, iterations); accepted so OSU's command lines work")
    ap.add_argument("-d", "--device", "--ib-dev", default=None, metavar="NAME",
                    help=f"the RDMA device (perftest's -d; tcp, quic: the address to listen "
                         f"on; default ${settings.DEVICE_ENV}, else the first with an ACTIVE "
                         "port)")
    ap.add_argument("--ib-port", type=whole(1, "the RDMA device's port"), default=None,
                    metavar="N", help=f"its port (perftest's -i; default ${settings.IB_PORT_ENV}, "
                                      "else its first ACTIVE port)")
    ap.add_argument("--gid-index", type=whole(0, "the port's GID index"), default=None,
                    metavar="N", help=f"the port's GID index (perftest's -x; default "
                                      f"${settings.GID_INDEX_ENV}, else its RoCE v2 IPv4 GID)")
    settings.add_flags(ap, defaults={"timeout": 120.0})
    ap.add_argument("--perftest", action="store_true", help="add ib_write_bw/ib_send_bw rows")
    ap.add_argument("--overlap", action="store_true",
                    help="also the nonblocking variant: how much computation hides it (OSU's "
                         "overlap %%)")
    ap.add_argument("--hand-loop", action="store_true",
                    help="also the same calls as a hand-written pyverbs loop (alltoall and "
                         "allgather up to 64 KiB): the floor of time and CPU per call")
    ap.add_argument("--json", default=None,
                    help="also write JSON lines here, a header record first, then each row as "
                         "it is measured (never overwrites)")
    ap.add_argument("--transport", choices=settings.TRANSPORTS, default=None,
                    help=f"what the collectives run over (default: ${settings.TRANSPORT_ENV}, "
                         "else verbs); --perftest and --hand-loop are verbs'")
    ap.add_argument("--compression", choices=codecs.NAMES, default=None,
                    help="code rendezvous blocks (rxelab.codecs; fp16/bf16 for float sums only, "
                         "whose #wrong counts elements beyond the codec's bound)")
    return ap


def nccl_sizes(ap: argparse.ArgumentParser, args: argparse.Namespace, element: int) -> list[int]:
    """-b/-e with -f or --stepbytes, as nccl-tests steps them (checked in words)."""
    if args.stepfactor == 0:  # -f without N: OSU's -f
        ap.error("-f N is nccl-tests' step factor here (e.g. -b 8 -e 128M -f 2); OSU's -f "
                 "(full rows) is --full")
    if args.stepfactor is not None and args.stepbytes is not None:
        ap.error("-f (a factor) or --stepbytes (an increment) steps the sizes, not both")
    low = element if args.minbytes is None else args.minbytes
    high = DEFAULT_SIZES[-1] if args.maxbytes is None else args.maxbytes
    if low > high:
        ap.error(f"-b {low} is above -e {high}: the smallest size must not exceed the largest")
    if args.stepbytes is not None and (high - low) // args.stepbytes + 1 > MAX_SIZES:
        ap.error(f"--stepbytes {args.stepbytes} from {low} to {high} makes "
                 f"{(high - low) // args.stepbytes + 1} sizes: at most {MAX_SIZES}")
    factor = 0 if args.stepbytes is not None else args.stepfactor or 2
    return steps(low, high, factor, args.stepbytes or 0, element)


def chosen_sizes(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """The sizes to measure, each a whole number of the op's elements (else a usage error)."""
    element = np.dtype(ops.COLLECTIVES[args.op].dtype).itemsize
    nccl = [f for f, v in (("-b", args.minbytes), ("-e", args.maxbytes), ("-f", args.stepfactor),
                           ("--stepbytes", args.stepbytes)) if v is not None]
    if nccl and (args.sizes is not None or args.message_size is not None):
        ap.error(f"{'/'.join(nccl)} (nccl-tests' sizes) and "
                 f"{'--sizes' if args.sizes is not None else '-m'}: one way of saying the sizes")
    if args.message_size is not None:  # a range keeps its sizes of whole elements (0:N)
        low, high = args.message_size
        sizes = [s for s in powers(element if low < 0 else low, high) if s % element == 0]
    elif nccl:
        sizes = nccl_sizes(ap, args, element)
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


@dataclass(frozen=True)
class Calls:
    """How many calls a size gets: timed ones after untimed warm-up ones."""

    timed: int
    warmup: int


def calls(size: int, args: argparse.Namespace) -> Calls:
    """OSU's counts for the size, unless -i/-x said (for every size, as OSU's do)."""
    large = size > LARGE_MESSAGE_SIZE
    return Calls(args.iterations if args.iterations is not None else CALLS_LARGE if large else CALLS,
                 args.warmup if args.warmup is not None else WARMUP_LARGE if large else WARMUP)


def calls_said(args: argparse.Namespace) -> str:
    """The calls per size as the header says them."""
    timed = (f"{args.iterations}" if args.iterations is not None
             else f"{CALLS} up to {LARGE_MESSAGE_SIZE} bytes, {CALLS_LARGE} above")
    warm = (f"{args.warmup}" if args.warmup is not None
            else f"{WARMUP} up to {LARGE_MESSAGE_SIZE} bytes, {WARMUP_LARGE} above")
    return f"iterations {timed}; warm-up {warm}"


def checked(ap: argparse.ArgumentParser, args: argparse.Namespace,
            hand_ops: tuple[str, ...]) -> tuple[list[str], list[int]]:
    """The algorithms and sizes to measure, once every flag is checked (a usage error,
    saying why, otherwise)."""
    known = ops.COLLECTIVES[args.op].algorithms
    algos = args.algorithms.split(",") if args.algorithms else list(known)
    bad = [a for a in algos if a not in known]
    if bad:
        ap.error(f"unknown algorithms {bad}: {args.op} has {', '.join(known)}")
    if args.hand_loop and args.op not in hand_ops:
        ap.error(f"--hand-loop does {' and '.join(hand_ops)}, not {args.op}")
    try:
        transport = transports.choose(args.transport)
    except ConfigError as err:
        ap.error(str(err))
    if transport != "verbs" and (args.perftest or args.hand_loop):
        ap.error(f"--perftest and --hand-loop measure verbs, not transport {transport}")
    if transport != "verbs" and (args.ib_port is not None or args.gid_index is not None):
        ap.error(f"--ib-port and --gid-index choose an RDMA port; transport {transport} has "
                 "none (-d names the address it listens on)")
    if (args.iterations is not None and args.iterations < 1) or \
            (args.warmup is not None and args.warmup < 0):
        ap.error("--iterations must be >= 1 and --warmup >= 0")
    return algos, chosen_sizes(ap, args)

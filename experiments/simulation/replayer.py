"""Runs rxelab.trace recordings on a SimGrid platform with the s4u replayer
(experiments/simulator/replay.cpp, built once per source into the cache by g++ against
Debian's libsimgrid-dev): writes the moves with their CPU costs, runs it, reads the simulated
time back. SimGrid's Python binding would do the same at 27-55 us of CPU per blocking call
(thread contexts): too slow for the O(p^2) messages of an all-to-all at p = 1024."""

from __future__ import annotations

import ctypes.util
import hashlib
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rxelab import trace as tr

from experiments.simulation.costs import Costs
from experiments.simulation.platforms import FLOPS, Platform
from infra import owned_paths
from infra.config import cache_dir
from infra.errors import LabError

SOURCE = Path(__file__).resolve().parent.parent / "simulator" / "replay.cpp"
INPUT = SOURCE.with_name("recording.hpp")  # the replayer's input, read and checked (included)
LAB_VMS = SOURCE.with_name("lab_vms.hpp")  # the lab machine's VMs (included)
MIRROR = SOURCE.with_name("mirror.hpp")  # rank 0 standing for all (included)
IN_FLIGHT = SOURCE.with_name("in_flight.hpp")  # bytes in flight as the library counts them
INCLUDES = (INPUT, LAB_VMS, MIRROR, IN_FLIGHT)
HEADER = Path("/usr/include/simgrid/s4u.hpp")
VERSION = Path("/usr/include/simgrid/version.h")
DEFAULT_TIMEOUT = 600.0
DATA = (tr.EAGER, tr.WRITE)  # the kinds of message that carry a block's bytes
BUSY_S = 100.0  # simulated seconds of a busy neighbour's CPU loop: longer than any call


class SimulationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Replayed:
    seconds: float  # simulated, from the call's start to the last rank's end
    rank_seconds: tuple[float, ...]
    wall: float  # of the replay: its input written, the replayer run
    peak_inflight: tuple[float, ...] = ()  # per rank: bytes sent and not yet known arrived


def cached_program(source: Path, argv: Callable[[str], list[str]],
                   includes: tuple[Path, ...] = ()) -> Path:
    """Where `built` keeps a program: named by the hash of the source and the files it
    includes, of how it is built and of SimGrid's version (public inputs: anyone can work the
    name out, so what is found there is run only if it is the caller's own)."""
    digest = hashlib.sha256(source.read_bytes())
    for included in includes:
        digest.update(included.read_bytes())
    digest.update(" ".join(argv("")).encode())  # another link line (an allocator) builds anew
    if VERSION.exists():  # a SimGrid upgrade builds anew: the old binary links the old library
        digest.update(VERSION.read_bytes())
    return cache_dir() / "simulator" / f"{source.stem}-{digest.hexdigest()[:16]}"


def built(source: Path, argv: Callable[[str], list[str]], missing: str | None, what: str,
          includes: tuple[Path, ...] = ()) -> Path:
    """A program compiled from source on first use and kept in the cache (cached_program):
    argv(output) compiles it; `missing` says what to install when its compiler is not there
    (None: it is)."""
    name = cached_program(source, argv, includes).name
    try:
        # the cache all the way up, and a program found there, the caller's own: its name is
        # public, and what another user put there would run as the caller (refused, not
        # rebuilt: a cache others could write holds more than this program). The directory
        # as checked, resolved once: not a name that could lead elsewhere by the next use.
        out = owned_paths.cache_subdir("simulator") / name
        if os.path.lexists(out):
            owned_paths.check_owned_file(out, "run", hint=owned_paths.CACHE_HINT)
            return out
        if missing is not None:
            raise SimulationError(f"{what} needs {missing}: run `bash infra/install-deps.sh`")
        out = owned_paths.cache_subdir("simulator", make=True) / name
    except LabError as err:
        raise SimulationError(str(err)) from None
    with tempfile.NamedTemporaryFile(dir=out.parent, prefix=".build-", delete=False) as tmp:
        pass
    try:
        done = subprocess.run(argv(tmp.name), capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise SimulationError(f"building {what} failed:\n{done.stderr[-2000:]}")
        os.chmod(tmp.name, 0o755)  # writable by the caller alone, whatever the umask
        os.replace(tmp.name, out)  # whole or not at all, also with two builds at once
    finally:
        if os.path.exists(tmp.name):
            os.unlink(tmp.name)
    return out


def binary() -> Path:
    """The replayer, built on first use (a few seconds), linked with jemalloc: SimGrid
    allocates and frees an object for nearly every simcall, and glibc's allocator took a
    quarter of the replay's time (perf: _int_malloc, unlink_chunk, malloc_consolidate).
    jemalloc replayed the p = 1024, 1 MiB pairwise all-to-all in 30 s instead of 49 s, the
    same simulated times to the last digit."""
    argv, missing = recipe()
    return built(SOURCE, argv, missing, "the replayer", INCLUDES)


def recipe() -> tuple[Callable[[str], list[str]], str | None]:
    """How the replayer is compiled (argv(output)), and what to install first (None: nothing)."""
    compiler = shutil.which("g++")
    allocator = ctypes.util.find_library("jemalloc")
    missing = [what for what, there in (("g++", compiler),
                                        ("SimGrid's headers (Debian: libsimgrid-dev)",
                                         HEADER.exists()),
                                        ("jemalloc (Debian: libjemalloc2)", allocator))
               if not there]
    return (lambda out: [str(compiler), "-O2", "-std=c++17", "-o", out, str(SOURCE), "-lsimgrid",
                         f"-l:{allocator}"],
            " and ".join(missing) if missing else None)


MEMORY_SHARE = 0.75  # of this machine's memory a simulator process may take


def memory_limit() -> int:
    """Bytes of private memory a simulator process gets (RLIMIT_DATA: SMPI's shared buffers are
    file mappings, not counted): a case too big for this machine
    fails alone (SMPI's Bruck at p = 128 with 1 MiB blocks allocates p^2 MiB in one process)
    instead of swapping the host to a halt."""
    return int(MEMORY_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def limited() -> None:
    """preexec_fn of a simulator process: its private memory capped (memory_limit), never
    above a limit the caller already has."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = memory_limit()
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft == resource.RLIM_INFINITY or soft > limit:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def out_of_memory(stderr: str, returncode: int) -> bool:
    """Whether a simulator process died for want of memory (its own words for it)."""
    return any(w in stderr for w in ("Cannot allocate memory", "bad_alloc", "Out of memory",
                                     "out of memory", "Memory allocation of"))


def key(src: int, what: int, tag: int) -> int:
    """A message's name for its receiver: sender, kind and tag (matched first in, first out
    among equal names, as rxelab.trace.Trace.matched pairs them)."""
    return (src << 48) | (what << 32) | tag


def mirrored(t: tr.Trace, platform: Platform, busy: int = 0) -> bool:
    """Whether rank 0's replay alone gives every rank's (experiments/simulator/mirror.hpp):
    on a cluster (every host and its links like every other, a rank each) a recording whose
    every rank does what rank 0 does, turned by its number."""
    return platform.kind == "cluster" and platform.per_node == 1 and not busy \
        and t.turns_of_rank_0()


def write_moves(t: tr.Trace, costs: Costs, platform: Platform, path: Path,
                busy: int = 0, mirror: bool | None = False) -> None:
    """The replayer's input: every rank's moves with the CPU seconds each costs (at full
    speed: a second is FLOPS flops). A call's own fixed cost is charged where the call
    starts. Each size's costs are written out once (a p = 1024 all-to-all has 5 M moves of a
    handful of sizes). `busy` ranks more, after the trace's, each a CPU loop (BUSY_S of
    computation, far past any call: the calibration's busy neighbours). `mirror`: rank 0's
    moves alone, refused where they do not stand for all (`mirrored`); None: where they do."""
    if mirror is None:
        mirror = mirrored(t, platform, busy)
    elif mirror and not mirrored(t, platform, busy):
        raise SimulationError(f"{t.collective}/{t.algorithm} at p={t.p} on {platform.kind}: "
                              "rank 0 does not stand for every rank there")
    send_cost = _memo(lambda n: f"{costs.send_cpu(n):.6e}")
    recv_cost = _memo(lambda n: f"{costs.recv_cpu(n):.6e}")
    local_cost = {tr.COPY: _memo(lambda n: f"C {costs.copy_per_byte * n:.6e}"),
                  tr.REDUCE: _memo(lambda n: f"C {costs.reduce_per_byte * n:.6e}")}
    with open(path, "w") as f:
        f.write(f"ranks {t.p + busy} hosts {platform.hosts} per {platform.per_node} "
                f"flops {FLOPS:.6g}\n")
        if platform.kind == "lab":
            f.write(f"vms {platform.cores} {platform.byte_cpu:.6e} {platform.loop_byte_cpu:.6e} "
                    f"{platform.path_byte:.6e} {platform.wake:.6e}\n")
        if mirror:
            f.write("mirror\n")
        call = f"C {costs.call:.6e}"
        for r, moves in enumerate(t.ranks[:1] if mirror else t.ranks):
            waited = {i for m in moves if m.kind == tr.WAIT for i in m.ids}
            lines = []
            for m in moves:
                if m.kind == tr.SEND:
                    lines.append(f"S {m.peer} {m.nbytes} {key(r, m.what, m.tag)} "
                                 f"{int(m.ids[0] in waited)} {int(m.what in DATA)} "
                                 f"{send_cost(m.nbytes)}")
                elif m.kind == tr.RECV:
                    lines.append(f"R {key(m.peer, m.what, m.tag)} {recv_cost(m.nbytes)}")
                elif m.kind == tr.WAIT:
                    lines.append(f"W {len(m.ids)} {' '.join(map(str, m.ids))}")
                elif m.kind == tr.CALL:
                    if costs.call:
                        lines.append(call)
                else:
                    lines.append(local_cost[m.kind](m.nbytes))
            f.write(f"rank {r} {len(lines)}\n")
            f.write("\n".join(lines))
            f.write("\n")
        for r in range(t.p, t.p + busy):
            f.write(f"rank {r} 1\nC {BUSY_S:.6e}\n")


def _memo(text: Callable[[int], str]) -> Callable[[int], str]:
    known: dict[int, str] = {}

    def at(n: int) -> str:
        got = known.get(n)
        if got is None:
            got = known[n] = text(n)
        return got
    return at


def replay(t: tr.Trace, platform: Platform, costs: Costs,
           timeout: float = DEFAULT_TIMEOUT, busy: int = 0, mirror: bool | None = None) -> Replayed:
    """The trace replayed; with `busy` CPU loops beside it (a rank each, after the trace's),
    its seconds are its own ranks' (the loops run on). By rank 0 alone where it stands for all
    (`mirror` None: where `mirrored` says so; False: every rank, as a check)."""
    if platform.ranks != t.p + busy:
        loops = f" and {busy} loops" if busy else ""
        raise SimulationError(f"a trace of {t.p} ranks{loops} on a platform for {platform.ranks}")
    program = binary()  # a recording whose waits do not pair up fails in it (exit status 3)
    with tempfile.TemporaryDirectory(prefix="rxelab-sim-") as tmp:
        where = Path(tmp)
        started = time.monotonic()
        (where / "platform.xml").write_text(platform.xml())
        write_moves(t, costs, platform, where / "moves.txt", busy, mirror=mirror)
        try:
            done = subprocess.run([str(program), str(where / "platform.xml"),
                                   str(where / "moves.txt"), *platform.config(),
                                   "--log=root.thres:critical"],
                                  capture_output=True, text=True, timeout=timeout,
                                  preexec_fn=limited)
        except subprocess.TimeoutExpired:
            raise SimulationError(f"the replay of {t.collective}/{t.algorithm} at p={t.p} ran "
                                  f"past {timeout:g} s") from None
        wall = time.monotonic() - started
    if done.returncode != 0:
        if out_of_memory(done.stderr, done.returncode):
            raise SimulationError(f"the replay of {t.collective}/{t.algorithm} at p={t.p} ran out "
                                  f"of the {memory_limit() >> 30} GiB a simulation may take")
        raise SimulationError(f"the replay failed ({done.returncode}): {done.stderr[-2000:]}")
    total, ranks = None, {}
    for line in done.stdout.splitlines():
        word, *rest = line.split()
        if word == "time":
            total = float(rest[0])
        elif word == "rank":
            ranks[int(rest[0])] = float(rest[1]), float(rest[2])
    if total is None or len(ranks) != t.p + busy:
        raise SimulationError(f"the replay said no time: {done.stdout[-500:]}{done.stderr[-500:]}")
    if busy:
        total = max(ranks[r][0] for r in range(t.p))
    return Replayed(total, tuple(ranks[r][0] for r in range(t.p)), wall,
                    tuple(ranks[r][1] for r in range(t.p)))

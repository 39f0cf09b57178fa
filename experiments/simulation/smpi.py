"""The MPI reference in the same simulator: SMPI runs SimGrid's copies of the MPI libraries'
collective algorithms (Open MPI's choice, Bruck, ring, ...) in experiments/simulator/
mpi_bench.c, built once by smpicc, on the same platform, with the profile's per-message
costs as SMPI's own send and receive overheads (smpi/os for blocking sends, smpi/ois for
the isends the algorithms mostly make, smpi/or). Those are delays, not
computation: on the `lab` platform MPI's ranks do not compete for the cores as rxelab's do
(said with every such row)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from rxelab import ops

from experiments.simulation.costs import Costs, Segment
from experiments.simulation.platforms import Platform
from experiments.simulation.replayer import (
    DEFAULT_TIMEOUT,
    Replayed,
    SimulationError,
    built,
    limited,
    memory_limit,
    out_of_memory,
)

SOURCE = Path(__file__).resolve().parent.parent / "simulator" / "mpi_bench.c"


# How an SMPI row differs from a replayed one (every row says it)
CAVEATS = ["SMPI's reductions cost no time (simulate-computation off); the replay charges "
           "the profile's reduce_per_byte",
           "the profile's per-call cost is charged to rxelab only",
           "alltoallv: equal counts here, the test data's uneven ones in the replay"]
LAB_CAVEAT = ("the lab platform: SMPI's overheads are delays, so MPI's ranks do not compete for "
              "the host's cores as rxelab's do, nor spend the profile's wake")


def binary() -> Path:
    return built(SOURCE, compile_argv,
                 None if shutil.which("smpicc") else "SMPI's smpicc (Debian: libsimgrid-dev)",
                 "the MPI reference")


def compile_argv(out: str) -> list[str]:
    """How the MPI reference is compiled into `out` (part of its name in the cache)."""
    return [str(shutil.which("smpicc")), "-O2", "-o", out, str(SOURCE)]


def overheads(segments: tuple[Segment, ...]) -> str:
    """Costs' segments as SMPI's: "from:fixed:per_byte" for sizes from `from` up."""
    starts = [0] + [s.upto + 1 for s in segments[:-1]]
    return ";".join(f"{start}:{s.fixed:.6g}:{s.per_byte:.6g}" for start, s in
                    zip(starts, segments, strict=True))


def run(collective: str, label: str, platform: Platform, costs: Costs, size: int, calls: int = 1,
        timeout: float = DEFAULT_TIMEOUT) -> Replayed:
    c = ops.collective(collective)
    if c.mpi is None or label not in c.mpi.smpi:
        raise SimulationError(f"{collective} has no MPI label {label!r}")
    program = binary()
    with tempfile.TemporaryDirectory(prefix="rxelab-smpi-") as tmp:
        where = Path(tmp)
        (where / "platform.xml").write_text(platform.xml(vms=False))
        (where / "hosts").write_text("".join(f"h{platform.host_of(r)}\n"
                                             for r in range(platform.ranks)))
        argv = ["smpirun", "-np", str(platform.ranks), "-platform", str(where / "platform.xml"),
                "-hostfile", str(where / "hosts"),
                f"--cfg=smpi/{collective}:{c.mpi.smpi[label]}",
                *platform.config(vms=False), "--cfg=smpi/simulate-computation:no",
                "--cfg=smpi/privatization:no", f"--cfg=smpi/os:{overheads(costs.send)}",
                f"--cfg=smpi/ois:{overheads(costs.send)}", f"--cfg=smpi/or:{overheads(costs.recv)}",
                "--log=root.thres:critical",
                str(program), collective, str(size), str(calls)]
        started = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  cwd=where, preexec_fn=limited)
        except subprocess.TimeoutExpired:
            raise SimulationError(f"SMPI's {collective} {label} at p={platform.ranks} ran past "
                                  f"{timeout:g} s") from None
        wall = time.monotonic() - started
    found = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("time ")]
    if done.returncode != 0 and out_of_memory(done.stderr, done.returncode):
        raise SimulationError(f"SMPI's {collective} {label} at p={platform.ranks} ran out of the "
                              f"{memory_limit() >> 30} GiB a simulation may take (SMPI allocates "
                              "every rank's buffers in one process)")
    if done.returncode != 0 or not found:
        raise SimulationError(f"SMPI's {collective} {label} failed ({done.returncode}): "
                              f"{(done.stderr or done.stdout)[-1500:]}")
    return Replayed(float(found[0]), (), wall)

"""A simulation spec's cases, one after another: rxelab's algorithms recorded (rxelab.trace)
and replayed, SMPI's MPI algorithms run, on each case's platform with the spec's cost
profile; a row per case for simulated.jsonl, and the LogGP line where the schedule has no
contention to model."""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rxelab import settings, trace
from rxelab.errors import ConfigError
from rxelab.messages import CTRL

from experiments.simulation import costs as costs_mod
from experiments.simulation import figures, replayer, smpi
from experiments.simulation.costs import Costs, Profile
from experiments.simulation.platforms import Platform
from experiments.simulation.spec import Case, Spec, profile_path


def profile_of(spec: Spec) -> Profile:
    return costs_mod.PLACEHOLDER if spec.profile is None else costs_mod.load(profile_path(spec.profile))


def platform_of(case: Case, profile: Profile) -> Platform:
    if case.platform == "lab":
        lab = profile.lab(case.ranks, case.per_node)
        return replace(lab, bandwidth=case.bandwidth or lab.bandwidth,
                       latency=case.latency or lab.latency)
    return Platform(case.platform, case.ranks,
                    case.bandwidth if case.bandwidth is not None else profile.bandwidth,
                    case.latency if case.latency is not None else profile.latency,
                    oversubscription=case.oversubscription)


def loggp(case: Case, platform: Platform, costs: Costs) -> float | None:
    """The time of a schedule whose steps never share a link, from the model's own terms (a
    message: the sender's overhead, the latency, its bytes over the bandwidth, the receiver's
    overhead): a check of the replay where both apply (one rank per host: a cluster)."""
    if platform.kind != "cluster" or case.source != "rxelab":
        return None
    p, m, L, B = case.ranks, case.size, platform.latency, platform.bandwidth
    limit = settings.BY_NAME["eager_limit"].default

    def message(n: float) -> float:
        return costs.send_cpu(int(n)) + L + n / B + costs.recv_cpu(int(n))

    def step(n: float, just_in_time: bool = False) -> float:
        """A block; by rendezvous, advertised in the same step: the advertisement first."""
        return message(n) + (message(CTRL.size) if just_in_time and n > limit else 0.0)
    name = (case.collective, case.algorithm)
    if name in (("alltoall", "pairwise"), ("allgather", "ring")):  # advertised up front
        return case.calls * (costs.call + (p - 1) * step(m) + costs.copy_per_byte * m)
    if name == ("allreduce", "ring"):
        chunk = m / p
        return case.calls * (costs.call + costs.copy_per_byte * m
                             + (p - 1) * (step(chunk, True) + costs.reduce_per_byte * chunk)
                             + (p - 1) * step(chunk, True))
    if name == ("bcast", "binomial"):
        return case.calls * (costs.call + math.ceil(math.log2(p)) * step(m))
    return None


def simulate(case: Case, profile: Profile) -> dict[str, Any]:
    platform = platform_of(case, profile)
    row: dict[str, Any] = {"collective": case.collective, "algorithm": case.algorithm,
                           "source": case.source, "pairs": case.pairs, "ranks": case.ranks,
                           "size": case.size, "calls": case.calls, "platform": case.platform,
                           "oversubscription": case.oversubscription, "per_node": case.per_node,
                           "platform_text": platform.describe(), "profile": profile.name,
                           "placeholder": profile.placeholder}
    try:
        if case.source == "smpi":
            got = smpi.run(case.collective, case.algorithm, platform, profile.costs, case.size,
                           case.calls)
            row.update(record_s=0.0, caveats=smpi.CAVEATS + (
                [smpi.LAB_CAVEAT] if case.platform == "lab" else []))
        else:
            started = time.monotonic()
            t = trace.record(case.collective, case.algorithm, case.ranks, case.size,
                             pairs=case.pairs, calls=case.calls)
            row["record_s"] = time.monotonic() - started
            sends = [m for moves in t.ranks for m in moves if m.kind == trace.SEND]
            # memory per rank at most: pinned (the connections' slots and what the calls
            # registered), and of it what the calls registered
            row.update(events=t.events, messages=len(sends), bytes=sum(m.nbytes for m in sends),
                       pinned_bytes=max(t.peak_pinned()), registered_bytes=max(t.pinned))
            got = replayer.replay(t, platform, profile.costs)
            row.update(peak_inflight_bytes=max(got.peak_inflight))
    except (replayer.SimulationError, ConfigError, MemoryError) as err:
        row.update(status="failed", error=str(err) or type(err).__name__)
        return row
    row.update(status="ok", seconds=got.seconds / case.calls, wall_s=got.wall,
               loggp_s=(None if (f := loggp(case, platform, profile.costs)) is None
                        else f / case.calls))
    return row


def run(spec: Spec, say: Callable[[int, Case, dict[str, Any] | None], None],
        profile: Profile | None = None) -> Iterator[dict[str, Any]]:
    """Every case's row; say(i, case, None) before a case and say(i, case, row) after it."""
    profile = profile or profile_of(spec)
    for i, case in enumerate(spec.cases):
        say(i, case, None)
        row = simulate(case, profile)
        say(i, case, row)
        yield row


def write(spec: Spec, root: Path, quiet: bool = False) -> Path:
    """Run the spec into a new directory under root (its rows in simulated.jsonl, the spec
    and the profile beside them), showing each case as it goes: case i/N, elapsed, the time
    left estimated from the cases done, the last result."""
    profile = profile_of(spec)  # a bad profile, or no compiler, is said before anything runs
    if any(c.source == "rxelab" for c in spec.cases):
        replayer.binary()
    if any(c.source == "smpi" for c in spec.cases):
        smpi.binary()
    out = root / f"{time.strftime('%Y%m%d-%H%M%S')}-simulate-{spec.name}"
    out.mkdir(parents=True)
    shutil.copy(spec.source, out / "spec.toml")
    (out / "profile.json").write_text(profile.to_json())
    console = Console(quiet=quiet, highlight=False)
    if profile.placeholder:
        console.print("profile: placeholder costs (round numbers, not measured): run "
                      "`fab calibrate` on the lab and name its profile in the spec")
    columns = (TextColumn("[{task.completed}/{task.total}]"), BarColumn(),
               TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
               TextColumn("{task.description}"))
    with open(out / "simulated.jsonl", "x") as rows, \
            Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("", total=len(spec.cases))

        def say(i: int, case: Case, row: dict[str, Any] | None) -> None:
            if row is None:
                progress.update(task, description=case.label())
                return
            progress.advance(task)
            console.print(f"[{i + 1}/{len(spec.cases)}] {case.label()}: " + (
                f"{row['seconds'] * 1e3:.4g} ms per call (recorded in {row['record_s']:.1f} s, "
                f"replayed in {row['wall_s']:.1f} s)"
                if row["status"] == "ok" else f"failed: {row['error']}"))
        done = []
        for row in run(spec, say, profile):
            rows.write(json.dumps(row) + "\n")
            rows.flush()
            done.append(row)
    figures.write(out, done)
    return out


def failures(out: Path) -> list[str]:
    """What failed in a simulation's results, a line each."""
    with open(out / "simulated.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return [f"{r['collective']}/{r['algorithm']} p={r['ranks']} {r['size']} B: {r['error']}"
            for r in rows if r.get("status") != "ok"]

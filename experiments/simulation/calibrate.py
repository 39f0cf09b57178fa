"""A cost profile fitted to the lab's own microbenchmarks (the `calibrate` run spec), so that
the replay of each of them on the `lab` platform takes what the lab took; nothing else is
fitted, and `fab validate` then predicts other cases with it unchanged.

What each measurement gives, in order (each from the median of its alternated rounds):
- ib_send_lat: the link's latency; ib_write_bw one way and both ways at once: its bandwidth
  (a byte's whole cost, where the nodes did not measure their CPU); ib_write_bw on one node:
  rxe's loopback, a message between two ranks of one VM;
- the share of its CPUs each node saw busy during the exchanges of 64 KiB and 1 MiB below:
  what a byte costs the CPU on each side; and the time the bigger took more: the rate of
  each VM's data path (sent and received together), the rest of a transfer's time;
- a 0-byte call on one rank: a call's own cost; a 1 MiB call on one rank: the copy of its own
  block, per byte;
- the library's exchange between two ranks at each size (a 2-rank all-to-all: one message
  each way at once, eager or by rendezvous as the library sends it): the per-message CPU at
  that size, solved so the replay of that very call takes the lab's time (the replay is
  affine in it: two replays solve it, a third is reported beside the lab's time), half on
  the sending side and half on the
  receiving; between the sizes measured, linear (SMPI's os/or are piecewise linear too);
- a 2-rank ring allreduce of 1 MiB: the reduction's cost per byte, solved the same way.
Costs only grow with size, so the exchanges' medians are first made to grow with it too: sizes
measured out of order (a bigger one faster, as a noisy lab gives) are fitted to their pooled
mean (isotonic regression, pool adjacent violators), not to the first of them; a size whose
target the replay still passes at the smaller size's cost keeps that cost. The profile's
notes say both."""

from __future__ import annotations

import json
import os
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rxelab import trace

from experiments.figure_style import size_text
from experiments.simulation import costs as costs_mod
from experiments.simulation import replayer
from experiments.simulation.costs import Costs, Profile
from experiments.simulation.fitting import CalibrationError, interpolated, isotonic, out_of_order, solve
from experiments.simulation.platforms import Platform

SPEC = "calibrate"
CALLS = 4  # back-to-back calls per replay: the lab's were back to back too


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    rounds: int


def measurements(records: Iterable[dict[str, Any]]) -> dict[tuple[Any, ...], Spread]:
    """The calibrate run's figures by what they are: ("call", op, algorithm, ranks, size) ->
    seconds per call; ("link", tool, size) -> MB/s (ib_write_bw, both ways summed) or
    microseconds (ib_send_lat); ("loop", tool, size): the same within one node; ("busy", op,
    algorithm, ranks, size): the share of a node's CPUs busy during the calls. Over the
    rounds that finished well."""
    got: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for r in records:
        s = r.get("summary") or {}
        if r.get("status") != "ok":
            continue
        if r["app"] == "perftest":
            value = s.get("lat_us", s.get("bw_MBps"))
            if value is not None:
                where = "loop" if r.get("nodes") == 1 else "link"  # one node: rxe's loopback
                got[(where, r["algorithm"], r["size"])].append(float(value))
        elif r["app"] == "rxelab" and s.get("tight"):
            what = (r["op"], r["algorithm"], s["ranks"], r["size"])
            got[("call", *what)].append(s["avg_stage_us"] * 1e-6)
            shares = s.get("node_busy")
            busy = [b for b in (shares if isinstance(shares, list) else [])
                    if isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b <= 1]
            if busy:  # the share of its node's CPUs each rank saw busy (runs since 2026-11-27)
                got[("busy", *what)].append(statistics.fmean(busy))
    return {k: Spread(statistics.median(v), min(v), max(v), len(v)) for k, v in got.items()}


def costs(points: list[tuple[int, float]], call: float, copy: float, reduce: float) -> Costs:
    """Per-message CPU `points` split in halves, sender's and receiver's."""
    half = interpolated([(s, c / 2) for s, c in points])
    return Costs(half, half, copy_per_byte=copy, reduce_per_byte=reduce, call=call)


def replayed(collective: str, algorithm: str, p: int, size: int, platform: Platform,
             c: Costs) -> float:
    t = trace.record(collective, algorithm, p, size, calls=CALLS)
    return replayer.replay(t, platform, c).seconds / CALLS


def need(m: dict[tuple[Any, ...], Spread], key: tuple[Any, ...]) -> Spread:
    if key not in m:
        what = " ".join(str(k) for k in key[1:])
        raise CalibrationError(f"the calibration has no good round of {what}: rerun it "
                               "(`fab calibrate`, or the spec that includes it; the run's "
                               "report says what failed)")
    return m[key]


BUSY_FROM, BUSY_TO = 1 << 16, 1 << 20  # the exchanges whose CPU gives a byte's
PATH_ROUNDS = 3  # corrections of the data path's rate (each a fit of the per-message costs)


def cpu_per_byte(m: dict[tuple[Any, ...], Spread], node_cpus: int, copy: float,
                 notes: list[str]) -> float | None:
    """The CPU seconds a byte costs each side: what the 1 MiB exchange kept a node's CPUs busy
    per call beyond what the 64 KiB one did, less the copy of the node's own block, over the
    bytes more it sent and received (the per-message cost between the two: flat in every lab
    fit so far). None, said in `notes`, where the calibration did not measure it or it came
    out 0."""
    at = [m.get((what, "alltoall", "pairwise", 2, size))
          for size in (BUSY_FROM, BUSY_TO) for what in ("busy", "call")]
    if not all(at):
        notes.append("the calibration did not measure its nodes' CPU during the exchanges of "
                     "64 KiB and 1 MiB (a run from before the nodes reported it, or without "
                     "/proc/stat): a byte's whole cost is charged to the CPU")
        return None
    busy0, call0, busy1, call1 = (s.median for s in at if s is not None)
    more = BUSY_TO - BUSY_FROM
    cpu = ((busy1 * call1 - busy0 * call0) * node_cpus - copy * more) / (2 * more)
    if cpu <= 0:
        notes.append("the 1 MiB exchange kept the nodes' CPUs no busier than the 64 KiB one: "
                     "a byte's whole cost is charged to the CPU")
        return None
    return cpu


def per_message(m: dict[tuple[Any, ...], Spread], sizes: list[int], platform: Platform,
                call: float, copy: float) -> tuple[list[tuple[int, float]], dict[str, Any],
                                                   list[str]]:
    """The per-message CPU at each size the exchange was measured at, solved so each replay
    takes the lab's time on `platform`; with each fit beside its lab figure, and notes."""
    points: list[tuple[int, float]] = []
    fitted, notes = {}, []
    labs = [m[("call", "alltoall", "pairwise", 2, size)] for size in sizes]
    targets = isotonic([lab.median for lab in labs])
    pooled: set[int] = set()
    for first, last in out_of_order(targets, [lab.median for lab in labs]):
        pooled.update(range(first + 1, last + 1))  # said once, below, for the whole run
        notes.append(f"the exchanges of {sizes[first]} B to {sizes[last]} B were measured out of "
                     f"order (a bigger message faster): fitted to their pooled median "
                     f"{targets[first] * 1e3:.3f} ms (costs only grow with size)")
    for i, (size, lab, target) in enumerate(zip(sizes, labs, targets, strict=True)):
        floor = points[-1][1] if points else 0.0  # no cheaper than a smaller message

        def at(x: float, size: int = size, floor: float = floor) -> float:
            return replayed("alltoall", "pairwise", 2, size, platform,
                            costs([*points, (size, floor + x)], call, copy, 0.0))
        x, then = solve(target, at)
        if x == 0.0 and points and i not in pooled and then > target * (1 + 1e-3):
            notes.append(f"the exchange of {size} B: its {target * 1e3:.3f} ms is below the "
                         f"replay's {then * 1e3:.3f} ms at the next smaller size's cost; kept at "
                         "that cost (costs only grow with size)")
        points.append((size, floor + x))
        fitted[f"exchange {size} B"] = _row(lab, then)
    return points, fitted, notes


def path_rate(m: dict[tuple[Any, ...], Spread]) -> float | None:
    """Bytes/s through a VM's data path, sent and received, first guess: what the 1 MiB
    exchange moved more than the 64 KiB one (each node sends and receives the difference)
    over the time it took more (fit() then corrects it by the replay, whose bigger message
    also takes a rendezvous). The library's own rate, not perftest's (which busy-polls, and
    took 49 ms for the 2 MiB the library's exchange moved in 34.6, 2026-11-27): a profile
    then replays its own calibration. None where the bigger exchange was not slower."""
    more = m[("call", "alltoall", "pairwise", 2, BUSY_TO)].median \
        - m[("call", "alltoall", "pairwise", 2, BUSY_FROM)].median
    return 2 * (BUSY_TO - BUSY_FROM) / more if more > 0 else None


def fit(records: Iterable[dict[str, Any]], name: str, node_cpus: int = 1,
        host_cpus: int | None = None) -> Profile:
    m = measurements(records)
    latency = need(m, ("link", "ib_send_lat", 1)).median * 1e-6
    bandwidth = need(m, ("link", "ib_write_bw", 1 << 20)).median * 1e6
    duplex = need(m, ("link", "ib_write_bw_bidir", 1 << 20)).median * 1e6
    looped = m.get(("loop", "ib_write_bw", 1 << 20))  # calibrate runs before 2026-11-27 lack it
    loop = looped.median * 1e6 if looped else None
    call = need(m, ("call", "alltoall", "pairwise", 1, 0)).median
    copy = max(0.0, need(m, ("call", "alltoall", "pairwise", 1, 1 << 20)).median - call) / (1 << 20)
    sizes = sorted(k[4] for k in m if k[:4] == ("call", "alltoall", "pairwise", 2))
    if len(sizes) < 2 or sizes[0] != 0:
        raise CalibrationError(f"the exchange between two ranks was measured at {sizes or 'no'}"
                               " sizes: it needs 0 B and at least one more")
    notes: list[str] = []
    if loop is None:
        notes.append("no ib_write_bw within one node (a calibrate run older than the loopback "
                     "case): two ranks of one VM are charged both sides of each byte there")
    per_byte = cpu_per_byte(m, node_cpus, copy, notes)
    path = path_rate(m) if per_byte else None
    if per_byte and path is None:
        notes.append("the 1 MiB exchange took no longer than the 64 KiB one: a byte's whole "
                     "cost is charged to the CPU")
        per_byte = None
    link = Profile(name, costs([(0, 0.0)], call, copy, 0.0), bandwidth, latency, node_cpus,
                   host_cpus, duplex, loop_bandwidth=loop, cpu_per_byte=per_byte,
                   path_bandwidth=path if per_byte else None)
    points, fitted, said = per_message(m, sizes, link.lab(2), call, copy)
    if per_byte and path:  # the rate the replay of the 1 MiB exchange needs, at 64 KiB's cost
        target = m[("call", "alltoall", "pairwise", 2, BUSY_TO)].median
        for _ in range(PATH_ROUNDS):
            flat = [p for p in points if p[0] <= BUSY_FROM] + [(BUSY_TO, dict(points)[BUSY_FROM])]
            took = replayed("alltoall", "pairwise", 2, BUSY_TO, link.lab(2),
                            costs(flat, call, copy, 0.0))
            seconds = 1 / path + (target - took) / (2 * BUSY_TO)  # a byte on each side's path
            if seconds <= 0:
                break
            path = 1 / seconds
            link = replace(link, path_bandwidth=path)
            points, fitted, said = per_message(m, sizes, link.lab(2), call, copy)
    platform = link.lab(2)
    notes += said
    at = dict(points)
    if per_byte and at.get(BUSY_TO, 0.0) > at.get(BUSY_FROM, 0.0) * (1 + 1e-6):
        notes.append(f"the per-message cost grew from {size_text(BUSY_FROM)} to "
                     f"{size_text(BUSY_TO)} ({at[BUSY_FROM] * 1e3:.3f} to {at[BUSY_TO] * 1e3:.3f} "
                     "ms): the CPU per byte, measured as if it did not, counts that growth "
                     "twice")
    reduce_lab = need(m, ("call", "allreduce", "ring", 2, 1 << 20))

    def with_reduce(x: float) -> float:
        return replayed("allreduce", "ring", 2, 1 << 20, platform, costs(points, call, copy, x))
    reduce, then = solve(reduce_lab.median, lambda x: with_reduce(x * 1e-6))
    reduce *= 1e-6  # solved in microseconds per byte: a probe of a millisecond per byte is absurd
    if reduce == 0.0:
        notes.append("the 1 MiB ring allreduce: as fast as its messages alone; reduce costs 0")
    fitted["allreduce ring 1 MiB"] = _row(reduce_lab, then)
    measured = {
        "call_s": call, "copy_s_per_byte": copy,
        "per_message_s": {str(s): c for s, c in points},
        "fit": fitted, "notes": notes,
        "medians": {" ".join(map(str, k)): vars(v) for k, v in sorted(m.items(), key=str)},
    }
    return replace(link, costs=costs(points, call, copy, reduce), measured=measured)


def _row(lab: Spread, replay: float) -> dict[str, float]:
    return {"lab_s": lab.median, "lab_low_s": lab.low, "lab_high_s": lab.high,
            "replay_s": replay}


def cpus(environment: dict[str, Any]) -> tuple[int, int | None]:
    """A node's CPUs, and the machine's cores where the nodes are this machine's VMs (None:
    they are not)."""
    found = [h.get("cpus") for h in (environment.get("hosts") or {}).values()]
    if not found or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0
                            for c in found):
        raise CalibrationError("the nodes did not say how many CPUs they have (nproc)")
    host = environment.get("lab_host_cpus")
    return min(found), (host if isinstance(host, int) and host > 0 else None)


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name) or name.endswith(".json"):
        raise CalibrationError(f"profile name {name!r}: a letter or digit, then up to 63 "
                               "letters, digits, '.', '_' or '-'")
    return name


def holds_calibration(environment: Any) -> bool:
    """Whether a run's environment.json says it ran the calibrate spec's cases: its own run,
    or a spec that includes it (the validation spec does: both then meet the same lab)."""
    if not isinstance(environment, dict):
        return False
    includes = environment.get("includes")
    return environment.get("spec") == SPEC or (isinstance(includes, list) and SPEC in includes)


def fit_run(out: Path, name: str) -> Profile:
    """The profile of a run's directory (its records and environment) that ran the calibrate
    spec's cases."""
    try:
        records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()
                   if line.strip()]
        environment = json.loads((out / "environment.json").read_text())
    except (OSError, ValueError) as err:
        raise CalibrationError(f"{out} is not a run's directory: {err}") from None
    spec = environment.get("spec") if isinstance(environment, dict) else None
    if not holds_calibration(environment):
        raise CalibrationError(f"{out} is a run of spec {spec!r}, which neither is nor includes "
                               f"{SPEC!r}")
    if not isinstance(environment.get("hosts"), dict):
        raise CalibrationError(f"{out}: its environment.json names no hosts: not a run of this "
                               "rxelab")
    if environment["spec"] != SPEC:  # another spec's run: the cases its include brought in
        records = [r for r in records if isinstance(r, dict) and r.get("included") == SPEC]
    try:
        profile = fit(records, name, *cpus(environment))
    except (KeyError, TypeError, AttributeError) as err:
        raise CalibrationError(f"{out}: a record without {err}: not a run of this rxelab") \
            from None
    profile.measured["run"] = str(out)
    return profile


def save(profile: Profile, path: Path) -> None:
    """Written whole (a new file renamed over the old): a file there that reads as a profile
    is replaced (profiles are this command's output); anything else is left alone."""
    if path.exists() or path.is_symlink():
        try:
            costs_mod.load(path)
        except costs_mod.ProfileError:
            raise CalibrationError(f"{path} exists and is not a profile: not replaced") from None
        if path.is_symlink():
            raise CalibrationError(f"{path} is a symbolic link: not replaced")
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(profile.to_json())
        os.replace(tmp, path)
    except OSError as err:
        raise CalibrationError(f"writing {path}: {err}") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def describe(profile: Profile) -> list[str]:
    """What a person reads of a fit: the link, the per-call costs, and each measurement
    beside its replay."""
    m = profile.measured
    bidir = profile.duplex_bandwidth
    lines = [f"link: {profile.latency * 1e6:.0f} us, {profile.bandwidth / 1e6:.1f} MB/s one way"
             + (f", {bidir / 1e6:.1f} MB/s both ways at once" if bidir else "")
             + (f"; {profile.loop_bandwidth / 1e6:.1f} MB/s within a node"
                if profile.loop_bandwidth else ""),
             f"a call: {profile.costs.call * 1e6:.0f} us; a copy: "
             f"{profile.costs.copy_per_byte * 1e9:.2f} ns/B; a reduction: "
             f"{profile.costs.reduce_per_byte * 1e9:.2f} ns/B; {profile.node_cpus} CPU per node"
             + (f", {profile.host_cpus} cores under all of them" if profile.host_cpus else ""),
             (f"a byte: {profile.cpu_per_byte * 1e9:.1f} ns of CPU on each side, through each "
              f"VM's data path at {profile.path_bandwidth / 1e6:.1f} MB/s (sent and received)"
              if profile.cpu_per_byte and profile.path_bandwidth
              else "a byte: all of the link's time charged to the CPU on each side"),
             "per message (sender and receiver together): " + ", ".join(
                 f"{size_text(int(s))} {c * 1e6:.0f} us" for s, c in m["per_message_s"].items())]
    for what, row in m["fit"].items():
        lines.append(f"  {what}: lab {row['lab_s'] * 1e3:.3f} ms "
                     f"({row['lab_low_s'] * 1e3:.3f}-{row['lab_high_s'] * 1e3:.3f}), "
                     f"replay {row['replay_s'] * 1e3:.3f} ms")
    lines += [f"note: {n}" for n in m.get("notes", [])]
    return lines

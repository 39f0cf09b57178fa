"""The fits on the library's 2-rank exchange that `fab calibrate` makes (calibrate.py says
what each measurement gives): a byte's CPU from the nodes' busy share, each VM's data path's
rate, and the per-message CPU by size, solved so each exchange's replay takes the lab's time.
Each is a replay of the library's own recorded call on the `lab` platform: the fits find
costs, the replayer says what they make of a call."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from rxelab import trace

from experiments.simulation import replayer
from experiments.simulation.costs import Costs, Profile
from experiments.simulation.fitting import interpolated, isotonic, out_of_order, solve
from experiments.simulation.platforms import Platform

CALLS = 4  # back-to-back calls per replay: the lab's were back to back too


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    rounds: int


def costs(points: list[tuple[int, float]], call: float, copy: float, reduce: float) -> Costs:
    """Per-message CPU `points` split in halves, sender's and receiver's."""
    half = interpolated([(s, c / 2) for s, c in points])
    return Costs(half, half, copy_per_byte=copy, reduce_per_byte=reduce, call=call)


def replayed(collective: str, algorithm: str, p: int, size: int, platform: Platform,
             c: Costs) -> float:
    t = trace.record(collective, algorithm, p, size, calls=CALLS)
    return replayer.replay(t, platform, c).seconds / CALLS


PING_PONG = ("allgather", "star")  # 2 ranks: one block there, both back; then the next call
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
                call: float, copy: float
                ) -> tuple[list[tuple[int, float]], dict[str, Any], list[str]]:
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
        fitted[f"exchange {size} B"] = lab_row(lab, then)
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


class Exchanges(NamedTuple):
    """The exchanges' fit: the profile with the data path's rate, the per-message costs by
    size, each exchange beside its replay, and notes."""
    link: Profile
    points: list[tuple[int, float]]
    fitted: dict[str, Any]
    notes: list[str]


def refit(m: dict[tuple[Any, ...], Spread], sizes: list[int], first: Profile, call: float,
          copy: float) -> Exchanges:
    """The per-message costs (and each VM's data path's rate, where `first` has one) that
    replay the exchanges."""
    link, rate = first, first.path_bandwidth
    points, fitted, said = per_message(m, sizes, link.lab(2), call, copy)
    if first.cpu_per_byte and rate:  # the rate the 1 MiB exchange's replay needs, at 64 KiB's
        target = m[("call", "alltoall", "pairwise", 2, BUSY_TO)].median  # per-message cost
        for _ in range(PATH_ROUNDS):
            flat = [p for p in points if p[0] <= BUSY_FROM] + [(BUSY_TO, dict(points)[BUSY_FROM])]
            took = replayed("alltoall", "pairwise", 2, BUSY_TO, link.lab(2),
                            costs(flat, call, copy, 0.0))
            seconds = 1 / rate + (target - took) / (2 * BUSY_TO)  # a byte on each side's path
            if seconds <= 0:
                break
            rate = 1 / seconds
            link = replace(link, path_bandwidth=rate)
            points, fitted, said = per_message(m, sizes, link.lab(2), call, copy)
    return Exchanges(link, points, fitted, said)


BESIDE = ("alltoall", "pairwise", 2)  # the exchange the calibration also runs beside busy nodes


def wake(m: dict[tuple[Any, ...], Spread], profile: Profile,
         notes: list[str]) -> tuple[float | None, dict[str, Any]]:
    """The CPU seconds a rank that blocked spends to run again when the lab's VMs outnumber
    its cores and the other VMs want every core, solved so the replay of the exchange beside
    busy nodes (a CPU loop on each of the lab's next nodes) takes the lab's time, with the
    rest of `profile` as fitted; with that fit beside its lab figure, and the same exchange beside
    more busy nodes, where the run has it, replayed as a check. One figure, scaled in the
    replay by the share of the machine's cores the other VMs want at each wake-up
    (lab_vms.hpp): measured with one node busy (the calibrate spec's case, the only one
    fitted), it stands for a lab of any size. None, said in `notes`, where it cannot be
    measured: the calibration did not run that case (or it failed in every round), its VMs
    did not outnumber the cores (none paid to run again), or the exchange alone already did
    (the per-message costs hold it); 0, said too, where the exchange beside busy nodes was no
    slower than its replay without it."""
    found = sorted(k for k in m if k[:4] == ("beside", *BESIDE))
    fitted_on = [k for k in found if k[5] == 1]
    if not fitted_on:
        notes.append("no exchange beside one busy node (a calibration run from before that "
                     "case, or one where it failed in every round): a blocked rank runs again "
                     "at once")
        return None, {}
    key = fitted_on[0]
    size, loaded = key[4], key[5]
    platform = profile.lab(2 + loaded)
    if profile.lab(2).crowded or not platform.crowded:
        notes.append(f"the exchange beside {loaded} busy node(s): {platform.hosts} VMs of "
                     f"{platform.cores} CPU(s) on {platform.machine_cores_or_all} cores, where "
                     + ("two VMs already outnumber the cores (the per-message costs hold the "
                        "cost)" if profile.lab(2).crowded else "no VM waits for a core")
                     + ": what a blocked rank spends to run again is not measured, and not "
                     "charged")
        return None, {}
    t = trace.record(*BESIDE[:2], 2, size, calls=CALLS)

    def at(x: float) -> float:
        return replayer.replay(t, replace(platform, wake=x), profile.costs,
                               busy=loaded).seconds / CALLS
    lab = m[key]
    x, then = solve(lab.median, at)
    if x == 0.0:
        notes.append(f"the exchange beside {loaded} busy node(s): its {lab.median * 1e3:.3f} ms "
                     f"is no slower than its replay without a wake-up cost ({then * 1e3:.3f} "
                     "ms): a blocked rank runs again at once")
    rows = {f"exchange {size} B beside {loaded} busy": lab_row(lab, then)}
    for other in (k for k in found if k != key):  # validation-p8's two: replayed, not fitted
        rows.update(beside_check(m[other], other[4], other[5], profile, x, notes))
    return x, rows


def beside_check(lab: Spread, size: int, loaded: int, profile: Profile, woken: float,
                 notes: list[str]) -> dict[str, Any]:
    """An exchange beside another number of busy nodes than the fit's, replayed with the
    fitted wake beside its lab figure: whether one figure, shared out by how many VMs want
    the cores, holds for a fuller machine. A note where the replay falls outside the lab's
    min-max; nothing where that many VMs would not outnumber the cores."""
    platform = replace(profile.lab(2 + loaded), wake=woken)
    if not platform.crowded:
        return {}
    t = trace.record(*BESIDE[:2], 2, size, calls=CALLS)
    got = replayer.replay(t, platform, profile.costs, busy=loaded).seconds / CALLS
    if not lab.low <= got <= lab.high:
        notes.append(f"the exchange of {size} B beside {loaded} busy nodes (not fitted): lab "
                     f"{lab.median * 1e3:.3f} ms ({lab.low * 1e3:.3f}-{lab.high * 1e3:.3f}), "
                     f"replayed {got * 1e3:.3f} ms ({got / lab.median:.2f}x)")
    return {f"exchange {size} B beside {loaded} busy (not fitted)": lab_row(lab, got)}


def lab_row(lab: Spread, replay: float) -> dict[str, float]:
    return {"lab_s": lab.median, "lab_low_s": lab.low, "lab_high_s": lab.high,
            "replay_s": replay}

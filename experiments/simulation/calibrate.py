"""A cost profile fitted to the lab's own microbenchmarks (the `calibrate` run spec), so that
the replay of each of them on the `lab` platform takes what the lab took; nothing else is
fitted, and `fab validate` then predicts other cases with it unchanged.

What each measurement gives (each from the median of its alternated rounds):
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
  that size, solved so the replay of that very call takes the lab's time (fitting.solve:
  where the replay is affine in it, two replays solve it and a third is reported beside
  the lab's time), half on the sending side and half on the receiving; between the sizes
  measured, linear (SMPI's os/or are piecewise linear too);
- a 2-rank ring allreduce of 1 MiB: the reduction's cost per byte, solved the same way;
- the 1 KiB exchange again with a CPU loop on a third node (`busy_neighbours = 1`):
  where the VMs then outnumber the machine's cores, the CPU a rank that blocked spends to
  run again once its message came with the other VMs wanting every core (its VM is put back
  on a core the others held; with fewer wanted, that share of it), solved the same way with
  the rest of the profile as fitted (exchanges.wake);
- the library's ping-pong (PING_PONG: a 2-rank star allgather, the leaf's block there and
  both back, calls back to back: one rank always waits for the other's answer): not fitted,
  replayed with the profile beside the lab's time, a check of what the exchange (both ranks
  send at once) cannot show; a note names each size whose replay falls outside the lab's
  min-max. (Fitting the share of a send's cost spent after its message left to it did not
  pay: docs/validation-history.md.)
Costs only grow with size, so the exchanges' medians are first made to grow with it too: sizes
measured out of order (a bigger one faster, as a noisy lab gives) are fitted to their pooled
mean (isotonic regression, pool adjacent violators), not to the first of them; a size whose
target the replay still passes at the smaller size's cost keeps that cost. The profile's
notes say both."""

from __future__ import annotations

import os
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from experiments.readable import size_text
from experiments.report import Environment, NotARecord, Record, read_records
from experiments.simulation import costs as costs_mod
from experiments.simulation.costs import Profile
from experiments.simulation.exchanges import (
    BUSY_FROM,
    BUSY_TO,
    PING_PONG,
    Spread,
    costs,
    cpu_per_byte,
    lab_row,
    path_rate,
    refit,
    replayed,
    wake,
)
from experiments.simulation.fitting import CalibrationError, solve

SPEC = "calibrate"
T = TypeVar("T")
def measurements(records: Iterable[Record]) -> dict[tuple[Any, ...], Spread]:
    """The calibrate run's figures by what they are: ("call", op, algorithm, ranks, size) ->
    seconds per call; ("link", tool, size) -> MB/s (ib_write_bw, both ways summed) or
    microseconds (ib_send_lat); ("loop", tool, size): the same within one node; ("busy", op,
    algorithm, ranks, size): the share of a node's CPUs busy during the calls; ("beside", op,
    algorithm, ranks, size, nodes loaded): seconds per call with that many nodes busy beside
    (busy_neighbours), never taken for the call alone. Over the rounds that finished well."""
    got: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for r in records:
        s = r.summary
        if r.status != "ok" or s is None:
            continue
        if r.app == "perftest":
            value = s.lat_us if s.lat_us is not None else s.bw_MBps
            if value is not None:
                where = "loop" if r.nodes == 1 else "link"  # one node: rxe's loopback
                got[(where, r.algorithm, r.size)].append(float(value))
        elif r.app == "rxelab" and s.tight:
            what = (r.op, r.algorithm, _said(s.ranks, "ranks"), r.size)
            if r.busy_neighbours:  # beside busy nodes: a figure of its own
                if r.busy_hosts:
                    got[("beside", *what, len(r.busy_hosts))].append(
                        _said(s.avg_stage_us, "avg_stage_us") * 1e-6)
                continue
            got[("call", *what)].append(_said(s.avg_stage_us, "avg_stage_us") * 1e-6)
            busy = [b for b in s.node_busy or () if 0 <= b <= 1]
            if busy:  # the share of its node's CPUs each rank saw busy (runs since 2026-11-27)
                got[("busy", *what)].append(statistics.fmean(busy))
    return {k: Spread(statistics.median(v), min(v), max(v), len(v)) for k, v in got.items()}


def _said(value: T | None, name: str) -> T:
    """A figure every app's summary says: KeyError (not a run of this rxelab) where it is not."""
    if value is None:
        raise KeyError(name)
    return value


def need(m: dict[tuple[Any, ...], Spread], key: tuple[Any, ...]) -> Spread:
    if key not in m:
        what = " ".join(str(k) for k in key[1:])
        raise CalibrationError(f"the calibration has no good round of {what}: rerun it "
                               "(`fab calibrate`, or the spec that includes it; the run's "
                               "report says what failed)")
    return m[key]


def fit(records: Iterable[Record], name: str, node_cpus: int = 1,
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
    first = Profile(name, costs([(0, 0.0)], call, copy, 0.0), bandwidth, latency, node_cpus,
                    host_cpus, duplex, loop_bandwidth=loop, cpu_per_byte=per_byte,
                    path_bandwidth=path if per_byte else None)
    link, points, fitted, said = refit(m, sizes, first, call, copy)
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
    fitted["allreduce ring 1 MiB"] = lab_row(reduce_lab, then)
    final = costs(points, call, copy, reduce)
    woken, row = wake(m, replace(link, costs=final), notes)
    fitted.update(row)
    for size in sorted(k[4] for k in m if k[:4] == ("call", *PING_PONG, 2)):
        pong = m[("call", *PING_PONG, 2, size)]
        row = lab_row(pong, replayed(*PING_PONG, 2, size, platform, final))
        fitted[f"ping-pong {size} B"] = row
        if not pong.low <= row["replay_s"] <= pong.high:
            notes.append(f"the ping-pong of {size_text(size)} (a 2-rank star allgather, not "
                         f"fitted): lab {pong.median * 1e3:.3f} ms ({pong.low * 1e3:.3f}-"
                         f"{pong.high * 1e3:.3f}), replayed {row['replay_s'] * 1e3:.3f} ms "
                         f"({row['replay_s'] / pong.median:.2f}x)")
    measured = {
        "call_s": call, "copy_s_per_byte": copy, "wake_s": woken,
        "per_message_s": {str(s): c for s, c in points},
        "fit": fitted, "notes": notes,
        "medians": {" ".join(map(str, k)): vars(v) for k, v in sorted(m.items(), key=str)},
    }
    return replace(link, costs=final, measured=measured, wake=woken)


def cpus(environment: Environment) -> tuple[int, int | None]:
    """A node's CPUs, and the machine's cores where the nodes are this machine's VMs (None:
    they are not)."""
    found = [h.cpus for h in (environment.hosts or {}).values()]
    counted = [c for c in found if c is not None and c > 0]
    if not found or len(counted) < len(found):
        raise CalibrationError("the nodes did not say how many CPUs they have (nproc)")
    host = environment.lab_host_cpus
    return min(counted), (host if host is not None and host > 0 else None)


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name) or name.endswith(".json"):
        raise CalibrationError(f"profile name {name!r}: a letter or digit, then up to 63 "
                               "letters, digits, '.', '_' or '-'")
    return name


def holds_calibration(environment: Environment) -> bool:
    """Whether a run's environment.json says it ran the calibrate spec's cases: its own run,
    or a spec that includes it (the validation spec does: both then meet the same lab)."""
    return environment.spec == SPEC or SPEC in environment.includes


def fit_run(out: Path, name: str) -> Profile:
    """The profile of a run's directory (its records and environment) that ran the calibrate
    spec's cases."""
    try:
        lines = (out / "records.jsonl").read_text()
        environment = Environment.read((out / "environment.json").read_text())
    except (OSError, ValueError) as err:
        raise CalibrationError(f"{out} is not a run's directory: {err}") from None
    spec = environment.spec
    if not holds_calibration(environment):
        raise CalibrationError(f"{out} is a run of spec {spec!r}, which neither is nor includes "
                               f"{SPEC!r}")
    if environment.hosts is None:
        raise CalibrationError(f"{out}: its environment.json names no hosts: not a run of this "
                               "rxelab")
    try:
        records = read_records(lines)
    except NotARecord as err:
        raise CalibrationError(f"{out}: a record without {err}: not a run of this rxelab") from None
    except ValueError as err:
        raise CalibrationError(f"{out} is not a run's directory: {err}") from None
    if environment.spec != SPEC:  # another spec's run: the cases its include brought in,
        # and its own beside two or more busy nodes (validation-p8's: a check, not fitted)
        records = [r for r in records if r.included == SPEC or r.busy_neighbours >= 2]
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
             (f"a blocked rank, where the VMs outnumber the cores: spends up to "
              f"{profile.wake * 1e3:.3f} ms of CPU running again once what it waited for "
              "came (all of it with the other VMs wanting every core)" if profile.wake
              else "a blocked rank: runs again at once"),
             "per message (sender and receiver together): " + ", ".join(
                 f"{size_text(int(s))} {c * 1e6:.0f} us" for s, c in m["per_message_s"].items())]
    for what, row in m["fit"].items():
        lines.append(f"  {what}: lab {row['lab_s'] * 1e3:.3f} ms "
                     f"({row['lab_low_s'] * 1e3:.3f}-{row['lab_high_s'] * 1e3:.3f}), "
                     f"replay {row['replay_s'] * 1e3:.3f} ms")
    lines += [f"note: {n}" for n in m.get("notes", [])]
    return lines

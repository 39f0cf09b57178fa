"""What an elastic scenario's records (elastic.jsonl) say: per change of members, how long the
survivors took to notice, agree and rebuild, how many steps were redone, and the time per
step before and after; Open MPI's time from the same kill to the end of its job; and a plot of
the time per step over the run with the events marked.

Times between nodes are measured on the host's clock (when each line arrived); times within a
rank (detection from its step's start, agreement, rebuild) are the app's own.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TypedDict

from experiments.report import plots
from experiments.running.scenario_records import ElasticEvent, ElasticRecord

Record = ElasticRecord
# what a spec calls it, how the run's verdict and the report name it (experiments.report.SCENARIOS)
NAME, WHAT, HEADING = "elastic", "the elastic scenario", "Changes of members"


class Change(TypedDict, total=False):
    """A change of members of an rxelab run, a row of the report's table: its cause (kind,
    time, step, who) always; what followed (outcome), and what it cost where one followed."""

    kind: str
    time: float
    step: int | None
    who: str
    outcome: str
    size: int | None
    host_s: float
    done: float
    agree_s: float | None
    build_s: float | None
    detect_s: float | None
    redone: int | None
    lost: list[int] | None


class MpiOutcome(TypedDict):
    exit: int | str | None
    steps_done: int
    abort_s: float | None


def load(results: Path) -> list[Record]:
    return ElasticRecord.load(results / "elastic.jsonl")


def steps_of(rec: Record) -> list[ElasticEvent]:
    """The steps the job's rank 0 reported, in the order they came."""
    return [e for e in rec.events if e.event == "step"]


def _at(e: ElasticEvent) -> float:
    return e.arrived or 0.0  # when it arrived: every event the scenario kept says so


def changes(rec: Record) -> list[Change]:
    """Each change of members of an rxelab run: what caused it (a kill, a partition, a join),
    and what it cost."""
    events = sorted(rec.events, key=_at)
    causes = [Change(kind="kill", time=_at(e), step=e.step, who=f"rank {e.id}")
              for e in events if e.event == "dying"]
    causes += [Change(kind=a.kind, time=a.time, step=a.step, who=a.node)
               for a in rec.actions if a.kind in ("partition", "join")]
    out: list[Change] = []
    used: set[int | None] = set()  # generations already put down to a cause
    for cause in sorted(causes, key=lambda c: c["time"]):
        kind = "admit" if cause["kind"] == "join" else "shrink"
        after = [e for e in events if e.event == kind and _at(e) >= cause["time"]
                 and e.generation not in used]
        if not after:
            out.append({**cause, "outcome": "no change of members followed"})
            continue
        first = after[0]
        used.add(first.generation)
        same = [e for e in after if e.generation == first.generation]
        resumed = min(e.step or 0 for e in same)
        row: Change = {**cause, "outcome": f"{kind} to {first.size} ranks", "size": first.size,
                       "host_s": _at(first) - cause["time"], "done": max(_at(e) for e in same),
                       "agree_s": _most(same, "agree_s"), "build_s": _most(same, "build_s")}
        if kind == "shrink":
            row["detect_s"] = _most(same, "detect_s")
            row["redone"] = (cause["step"] or 0) - resumed + 1 if cause["kind"] == "kill" else None
            row["lost"] = first.lost
        out.append(row)
    return out


def _most(events: list[ElasticEvent], key: str) -> float | None:
    """The slowest rank's figure, where the ranks gave one."""
    values: list[float] = [v for e in events if (v := getattr(e, key)) is not None]
    return max(values) if values else None


def step_times(rec: Record) -> tuple[float | None, float | None]:
    """Median seconds per step before the first event and after the last change."""
    steps = steps_of(rec)
    # after the last change of members is complete (its last rank's line), not its cause
    marks: list[float] = ([c["done"] if "done" in c else c["time"] for c in changes(rec)]
                          if rec.contender == "rxelab" else [])
    first = min((a.time for a in rec.actions), default=None)
    kills = [_at(e) for e in rec.events if e.event == "dying"]
    start = min([t for t in [first, *kills] if t is not None], default=None)
    before = [e.seconds or 0.0 for e in steps if start is None or _at(e) < start]
    after = [e.seconds or 0.0 for e in steps if marks and _at(e) > max(marks)]
    return (statistics.median(before) if before else None,
            statistics.median(after) if after else None)


def mpi_outcome(rec: Record) -> MpiOutcome:
    dying = [_at(e) for e in rec.events if e.event == "dying"]
    steps = steps_of(rec)
    ended = rec.ended if isinstance(rec.ended, float) and rec.exit != "timeout" else None
    return {"exit": rec.exit, "steps_done": len(steps),
            "abort_s": ended - dying[0] if dying and ended is not None else None}


def summary_lines(records: list[Record]) -> list[str]:
    lines = []
    for rec in records:
        if rec.contender == "rxelab":
            done = [e for e in rec.events if e.event == "done"]
            digests = {e.params for e in done}
            before, after = step_times(rec)
            lines.append(
                f"rxelab elastic: {len(done)} ranks finished all {rec.spec.steps} steps "
                f"(exit {rec.exit}); their parameters "
                + ("agree" if len(digests) == 1 else f"DIFFER ({len(digests)} versions)")
                + (f"; {_ms(before)} per step before the first event, {_ms(after)} after the last"
                   if before and after else "") + ".")
            for c in changes(rec):
                lines.append(_change_line(c))
        else:
            out = mpi_outcome(rec)
            steps = f"after {out['steps_done']} of {rec.spec.steps} steps"
            if out["exit"] == "timeout":
                lines.append(f"{rec.contender}: the job did not end by its deadline ({steps}).")
            elif out["abort_s"] is not None:
                lines.append(f"{rec.contender}: the job ended {out['abort_s']:.1f} s after the "
                             f"kill (exit {out['exit']}), {steps}: every rank's work stopped.")
            else:
                lines.append(f"{rec.contender}: the job ended (exit {out['exit']}), {steps}.")
    return lines


def _change_line(c: Change) -> str:
    if "host_s" not in c:
        return f"{c['kind']} of {c['who']} at step {c['step']}: {c['outcome']}."
    parts = [f"{c['kind']} of {c['who']} at step {c['step']}: {c['outcome']} "
             f"{c['host_s']:.1f} s later (host clock)"]
    if c.get("detect_s") is not None:
        parts.append(f"noticed {c['detect_s']:.1f} s into the step")
    if c.get("agree_s") is not None:
        parts.append(f"agreement {c['agree_s']:.2f} s")
    if c.get("build_s") is not None:
        parts.append(f"new mesh {c['build_s']:.2f} s")
    if c.get("redone") is not None:
        parts.append(f"{c['redone']} step(s) redone")
    return "; ".join(parts) + "."


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def table(records: list[Record]) -> tuple[list[str], list[list[str]]]:
    head = ["contender", "event", "at step", "outcome", "until the job went on (s)",
            "noticed after (s)", "agreement (s)", "new mesh (s)", "steps redone"]
    rows = []
    for rec in records:
        if rec.contender == "rxelab":
            for c in changes(rec):
                rows.append(["rxelab", f"{c['kind']} {c['who']}", str(c["step"]), c["outcome"],
                             *[_s(c.get(k)) for k in ("host_s", "detect_s", "agree_s", "build_s")],
                             "-" if c.get("redone") is None else str(c["redone"])])
        else:
            out = mpi_outcome(rec)
            rows.append([rec.contender, "kill", "-", f"job ended (exit {out['exit']})",
                         _s(out["abort_s"]) + " (to the end)", "-", "-", "-",
                         f"all after step {out['steps_done']}"])
    return head, rows


def _s(v: object) -> str:
    return "-" if v is None else f"{v:.2f}"


def figure(records: list[Record]) -> bytes | None:
    return plots.elastic_steps(records, [changes(r) if r.contender == "rxelab" else []
                                         for r in records])


def not_run(records: list[Record]) -> list[str]:
    """Every elastic job runs (nothing in it is skipped for want of anything)."""
    return []


def problems(records: list[Record]) -> list[str]:
    """What makes an elastic run a failure: a wrong result anywhere, rxelab's job not ending
    well, survivors that disagree, or nobody finishing. (Open MPI's job ending is its result.)"""
    out = []
    for rec in records:
        wrong = [e for e in rec.events if e.event == "wrong"]
        if wrong:
            out.append(f"{rec.contender}: {wrong[0].error}")
        if rec.contender != "rxelab":
            continue
        done = [e for e in rec.events if e.event == "done"]
        if rec.exit != 0 or not done:
            out.append(f"rxelab: the elastic job ended with {rec.exit} and "
                       f"{len(done)} ranks done: {rec.tail[-300:]}")
        elif len({e.params for e in done}) != 1:
            out.append("rxelab: the survivors' parameters differ")
        for a in rec.actions:
            if not a.ok:
                out.append(f"rxelab: the {a.kind} of {a.node} did not happen: "
                           f"{a.error or ''}")
        for n in rec.newcomers:
            if n.exit not in (0, None):
                out.append(f"rxelab: a newcomer ended with {n.exit}: {n.tail[-300:]}")
    return out

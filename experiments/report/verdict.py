"""A run's verdict, decided here rather than in the fabfile: what `fab run-experiment` says of
a finished run, and whether the run failed. Each scenario judges its own run (report.SCENARIOS);
a run of cases fails on any wrong data, and on a case that failed on an unimpaired network. A
case that failed under impairment is a finding of the study (the report shows it), not a failure
of the run, and a contender the nodes lack is said, not failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from experiments import report
from experiments.running.records import Record
from experiments.spec import Spec, contender


@dataclass(frozen=True)
class Verdict:
    said: list[str] = field(default_factory=list)  # lines for the user, in order
    failure: str | None = None  # the one line of a run that failed


def of_scenarios(spec: Spec, out: Path) -> Verdict:
    """The verdict of the spec's scenario, if it has one (an empty Verdict otherwise)."""
    said: list[str] = []
    for scenario in report.SCENARIOS:
        if getattr(spec, scenario.NAME) is None:
            continue
        told = scenario.load(out)
        wrong, lacking = scenario.problems(told), scenario.not_run(told)
        said.append(f"results: {out}" + (f" ({'; '.join(wrong)})" if wrong else "")
                    + (f" (not run: {lacking[0]})" if lacking else ""))
        if wrong:
            return Verdict(said, f"{scenario.WHAT} did not end well: " + "; ".join(wrong))
    return Verdict(said)


def of_cases(out: Path, records: list[Record]) -> Verdict:
    """The verdict of the run's cases."""
    skipped = [r for r in records if r.status == "skipped"]  # a contender the nodes lack
    bad = [r for r in records if r.status not in ("ok", "skipped")]
    said = [f"results: {out} ({len(records) - len(bad) - len(skipped)}/{len(records)} cases ok"
            + (f", {len(skipped)} not run" if skipped else "") + ")"]
    for who in sorted({contender(r) for r in skipped}):
        first = next(r for r in skipped if contender(r) == who)
        said.append(f"{who} cases were not run: {'skipped' if first.error is None else first.error}")
    broken = [r for r in bad if r.status == "wrong" or not any(r.netem.values())]
    if broken:
        return Verdict(said, f"{len(broken)} cases did not verify: " + ", ".join(
            f"{contender(r)} {r.op}/{r.algorithm} ({r.status})" for r in broken))
    if bad:
        said.append(f"{len(bad)} cases under impairment did not finish (see the report): "
                    + ", ".join(f"{contender(r)} {r.algorithm} {r.netem} ({r.status})" for r in bad))
    return Verdict(said)


def of_run(spec: Spec, out: Path, records: list[Record]) -> Verdict:
    """The scenario's verdict, then the cases'; the first failure ends it."""
    scenario = of_scenarios(spec, out)
    if scenario.failure:
        return scenario
    cases = of_cases(out, records)
    return Verdict([*scenario.said, *cases.said], cases.failure)

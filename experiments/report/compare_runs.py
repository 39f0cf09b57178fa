"""Two lab runs of the same cases compared as ratios, to say whether rxelab moved against the
MPIs beyond what the rounds themselves spread (`fab compare`; the `regression` spec is made
for it). Labs under TCG drift 10-50 % from one run to the next, for every contender alike, so
absolute times of two runs say little; rxelab's time over MPI's, taken round by round inside
one run, cancels most of that drift. A ratio moved when the two runs' ranges of per-round
ratios do not overlap."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from experiments import report
from experiments.report.view import Row

REFERENCES = ("mpi-ucx", "mpi-tcp", "pyverbs")  # what rxelab's time is divided by (pyverbs: the
# hand loop's, rxelab.handloop, where a run has it)


class CompareError(Exception):
    """A run that cannot be compared, said in one line."""


@dataclass(frozen=True)
class Case:
    """A call that both runs measured: rxelab's algorithm against one reference."""

    number: int  # the case's number in its spec: runs of one spec number their cases alike
    op: str
    size: int
    mode: str
    network: str
    nodes: int
    contender: str
    algorithm: str
    against: str

    def label(self) -> str:
        return (f"case {self.number}: {self.op} {self.size} B {self.contender}/{self.algorithm} "
                f"over {self.against} ({self.mode}, {self.nodes} nodes, {self.network})")


@dataclass(frozen=True)
class Ratios:
    """One run's ratios of a case, round by round (rounds where both ended ok)."""

    rounds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    @property
    def low(self) -> float:
        return min(self.rounds)

    @property
    def high(self) -> float:
        return max(self.rounds)


@dataclass(frozen=True)
class Change:
    case: Case
    before: Ratios
    after: Ratios

    @property
    def verdict(self) -> str:
        if self.after.low > self.before.high:
            return "slower"
        if self.after.high < self.before.low:
            return "faster"
        return "within spread"


def ratios(rows: list[Row]) -> dict[Case, Ratios]:
    """Each rxelab case's time over each reference's, in the same round of one run."""
    by_round: dict[tuple[str, int, str, str, int, str, str, int], dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r.status == "ok" and r.avg_us:
            key = (r.op, r.size, r.mode, r.network, r.nodes, r.contender, r.algorithm, r.case)
            by_round[key][r.round] = float(r.avg_us)
    out = {}
    for key, times in by_round.items():
        op, size, mode, network, nodes, who, algorithm, number = key
        if not who.startswith("rxelab"):
            continue
        for against in REFERENCES:
            refs = [ref for k, ref in by_round.items()
                    if k[:5] == key[:5] and k[5] == against]
            for ref in refs:
                both = sorted(set(times) & set(ref))
                if both:
                    case = Case(number, op, size, mode, network, nodes, who, algorithm, against)
                    out[case] = Ratios(tuple(times[k] / ref[k] for k in both))
    return out


def load(run: Path) -> dict[Case, Ratios]:
    try:
        if not (run / "records.jsonl").is_file():
            raise CompareError(f"{run}: not a lab run's directory (no records.jsonl)")
        _, records, _ = report.load(run)
    except (OSError, ValueError) as err:
        raise CompareError(f"{run}: {err}") from None
    found = ratios(report.rows(records))
    if not found:
        raise CompareError(f"{run}: no rxelab case beside {' or '.join(REFERENCES)} to compare")
    return found


def compare(before: Path, after: Path) -> list[Change]:
    old, new = load(before), load(after)
    changes = [Change(case, old[case], new[case]) for case in old if case in new]
    if not changes:
        raise CompareError(f"{before} and {after} share no case")
    return sorted(changes, key=lambda c: (c.case.op, c.case.size, c.case.number,
                                          c.case.against))


def table(changes: list[Change], before: Path, after: Path) -> str:
    lines = [f"# rxelab against the MPIs: {before.name} -> {after.name}", "",
             "Each cell: rxelab's time over the reference's, the median of the rounds (their "
             "range). 'slower' or 'faster': the two runs' ranges do not overlap.", "",
             "| call | rxelab | over | before | after | verdict |",
             "| --- | --- | --- | --- | --- | --- |"]
    for c in changes:
        k = c.case
        lines.append(f"| {k.op} {k.size} B ({k.mode}) | {k.contender}/{k.algorithm} | "
                     f"{k.against} | {_cell(c.before)} | {_cell(c.after)} | {c.verdict} |")
    return "\n".join(lines) + "\n"


def _cell(r: Ratios) -> str:
    return f"{r.median:.2f}x ({r.low:.2f}-{r.high:.2f}, {len(r.rounds)} rounds)"

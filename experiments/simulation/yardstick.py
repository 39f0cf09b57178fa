"""The lab against itself: how close another lab run of the same cases comes to a run, by the
same measures as the simulator's predictions (inside the min-max of the run's rounds, the
algorithms' order, the error). A prediction cannot be asked to match a run more closely than
the lab matches itself, and with few rounds the min-max is narrow: a case's true median falls
outside n rounds' min-max whenever all n land on one side of it, with probability 2^(1-n)
(a quarter for 3 rounds), however exact the prediction."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from experiments.simulation.validate import Row


class YardstickError(ValueError):
    pass


@dataclass(frozen=True)
class Score:
    cases: int
    within: int  # predictions inside the run's min-max
    orders: int  # (op, p, nodes, size) with two algorithms or more
    same: int  # of them, the whole order the run's
    first: int  # the fastest the run's
    error: float  # geometric mean of predicted/lab or its inverse, whichever is above 1


def error(ratios: Sequence[float]) -> float:
    """The geometric mean of each ratio or its inverse, whichever is above 1 (1: exact)."""
    return math.exp(statistics.fmean(abs(math.log(r)) for r in ratios)) if ratios else math.nan


def score(table: Sequence[Row], rankings: Callable[[list[Row]], list[dict[str, Any]]]) -> Score:
    order = rankings(list(table))
    return Score(len(table), sum(r.within for r in table), len(order),
                 sum(g["same"] for g in order), sum(g["same_first"] for g in order),
                 error([r.ratio for r in table]))


def chance_outside(rounds: int) -> float:
    """The chance that a case's true median falls outside the min-max of `rounds` rounds
    (all of them on one side of it)."""
    return 2.0 ** (1 - rounds) if rounds >= 1 else 1.0


def beside(table: Sequence[Row], other: dict[tuple[str, str, int, int, int], list[float]]
           ) -> list[Row]:
    """This run's rows, for the cases the other run has too, with the other run's median as
    the prediction."""
    return [replace(r, predicted_s=statistics.median(other[key]))
            for r in table
            if (key := (r.op, r.algorithm, r.ranks, r.nodes, r.size)) in other and other[key]]


def spec_of(run: Path) -> str | None:
    try:
        return json.loads((run / "environment.json").read_text()).get("spec")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as err:
        raise YardstickError(f"{run}/environment.json: {err}") from None


def other_run(run: Path) -> Path | None:
    """The newest other run beside `run` (same results directory) of the same spec, or None:
    the lab's own second opinion on the same cases."""
    spec = spec_of(run)
    if spec is None:
        return None
    try:
        candidates = sorted((p for p in run.resolve().parent.iterdir()
                             if p.is_dir() and p.resolve() != run.resolve()
                             and (p / "records.jsonl").exists()), reverse=True)
    except OSError as err:
        raise YardstickError(f"looking beside {run}: {err}") from None
    for p in candidates:
        try:
            if spec_of(p) == spec:
                return p
        except YardstickError:
            continue  # a broken run beside this one is not a yardstick
    return None

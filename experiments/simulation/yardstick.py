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

from experiments.report import Environment

if TYPE_CHECKING:
    from experiments.simulation.validate import Row


class YardstickError(ValueError):
    pass


@dataclass(frozen=True)
class Score:
    """One predictor's marks against a run, the simulator's and another run's alike, so the
    two read side by side."""

    cases: int
    within: int  # predictions inside the run's min-max
    orders: int  # (op, p, nodes, size) with two algorithms or more
    same: int  # of them, the whole order the run's
    first: int  # the fastest the run's
    error: float  # geometric mean of predicted/lab or its inverse, whichever is above 1


def error(ratios: Sequence[float]) -> float:
    """One figure for misses both ways: 0.5 and 2 are the same miss, which an arithmetic mean
    of the ratios (1.25) would hide and a mean of 0.5 and 1.5 (1.0) would call exact."""
    return math.exp(statistics.fmean(abs(math.log(r)) for r in ratios)) if ratios else math.nan


def score(table: Sequence[Row], rankings: Callable[[list[Row]], list[dict[str, Any]]]) -> Score:
    """The marks `fab validate` gives, from its rows and its ranking (validate.rankings,
    passed in: validate imports this module)."""
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
    return [replace(r, predicted_s=statistics.median(other[r.key]))
            for r in table if other.get(r.key)]


def _environment(run: Path) -> Environment:
    """The run's environment.json; one that says nothing where the file is missing (a run made
    before the runner wrote it), an error where it is broken."""
    try:
        said = json.loads((run / "environment.json").read_text())
    except FileNotFoundError:
        return Environment()
    except (OSError, ValueError) as err:
        raise YardstickError(f"{run}/environment.json: {err}") from None
    if not isinstance(said, dict):
        raise YardstickError(f"{run}/environment.json: {type(said).__name__}, not a table")
    return Environment.model_validate(said)


def spec_of(run: Path) -> str | None:
    """The spec a run was made from: only a run of the same spec measured the same cases the
    same way."""
    return _environment(run).spec or None


def run_id_of(run: Path) -> str | None:
    """The id the runner gave a run: a directory with this run's id is a copy of it, which
    would score the lab against itself."""
    return _environment(run).run_id or None


def candidates(run: Path) -> list[Path]:
    """The other runs of the same spec in `run`'s results directory, the lab's own second
    opinions: the runs before it, newest first (a run's report then does not change when a
    later run is made), then those after it, oldest first. Runs that do not say their spec
    are left out, and so are copies of `run` (its run id)."""
    spec = spec_of(run)
    if spec is None:
        return []
    own_id = run_id_of(run)
    here = run.absolute()
    try:
        others = [p for p in here.parent.iterdir()
                  if p.name != here.name and p.is_dir() and (p / "records.jsonl").is_file()]
    except OSError as err:
        raise YardstickError(f"looking beside {run}: {err}") from None
    same = []
    for p in others:
        try:
            if spec_of(p) == spec and (own_id is None or run_id_of(p) != own_id):
                same.append(p)
        except YardstickError:
            continue  # a broken run beside this one is no yardstick
    before = sorted((p for p in same if p.name < here.name), key=lambda p: p.name, reverse=True)
    after = sorted((p for p in same if p.name > here.name), key=lambda p: p.name)
    return before + after

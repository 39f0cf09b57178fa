"""The simulator checked against the lab: every rxelab case of a lab run whose calls went back
to back (the `validation` spec's, or the `latency` spec's second half) predicted on the `lab`
platform with a calibrated profile, unchanged, beside the lab's median and the spread of its
rounds. A prediction is good when it falls inside that spread; the algorithms' order at each
size and p is good when it is the lab's. Beside it, the same measures for another lab run of
the same spec (experiments.simulation.yardstick): how close the lab comes to itself."""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jinja2
from rxelab import trace
from rxelab.errors import ConfigError

from experiments.readable import size_text
from experiments.report import Environment, NotARecord, Record, read_records
from experiments.simulation import calibrate, replayer, yardstick
from experiments.simulation.calibrate import SPEC
from experiments.simulation.costs import Profile
from experiments.simulation.exchanges import CALLS  # as many calls a replay as the fit's

TEMPLATE = Path(__file__).resolve().parent.parent / "simulator" / "validation.md.j2"


class CannotValidate(ValueError):
    """A run (or the runs under a directory) that cannot be set beside predictions: said in one
    line by `fab validate`. Not pydantic's ValidationError, which a spec's checks raise."""


@dataclass(frozen=True)
class Row:
    op: str
    algorithm: str
    ranks: int
    nodes: int
    size: int
    lab_s: float  # median of the rounds, seconds per call
    low_s: float
    high_s: float
    rounds: int
    predicted_s: float

    @property
    def within(self) -> bool:
        return self.low_s <= self.predicted_s <= self.high_s

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.lab_s

    @property
    def key(self) -> tuple[str, str, int, int, int]:
        """As lab_cases names a case."""
        return self.op, self.algorithm, self.ranks, self.nodes, self.size


def lab_cases(records: list[Record]) -> dict[tuple[str, str, int, int, int], list[float]]:
    """(op, algorithm, ranks, nodes, size) -> seconds per call of each good round: rxelab's
    calls back to back with the library's defaults (no impairment, compression, option or busy
    neighbours), but for those the calibrate spec's include brought in (a profile is fitted on
    them)."""
    got: dict[tuple[str, str, int, int, int], list[float]] = defaultdict(list)
    for r in records:
        if r.included == SPEC or r.busy_neighbours:  # beside busy nodes: unmodelled
            continue
        s = r.summary
        if r.app != "rxelab" or r.status != "ok" or s is None or not s.tight:
            continue
        if any(r.netem.values()) or r.compression not in (None, "none") \
                or (r.model_extra or {}).get("library") or r.pairs not in (None, 1) or r.mtu:
            continue  # (no record says `library`: a case with an init() option is not left out)
        us = s.avg_stage_us
        if us is None or not us > 0 or not math.isfinite(us):
            continue  # a round that timed nothing is no measurement (nor a ratio's divisor)
        if s.ranks is None:
            raise KeyError("ranks")  # an app's summary always says it: not a run of this rxelab
        got[(r.op, r.algorithm, s.ranks, r.nodes, r.size)].append(us * 1e-6)
    return got


def predict(op: str, algorithm: str, ranks: int, nodes: int, size: int,
            profile: Profile) -> float:
    platform = profile.lab(ranks, -(-ranks // nodes))
    t = trace.record(op, algorithm, ranks, size, calls=CALLS)
    return replayer.replay(t, platform, profile.costs).seconds / CALLS


def rows(records: list[Record], profile: Profile) -> list[Row]:
    out = []
    for (op, algorithm, ranks, nodes, size), seconds in sorted(lab_cases(records).items()):
        try:
            predicted = predict(op, algorithm, ranks, nodes, size, profile)
        except ConfigError as err:
            raise CannotValidate(f"{op}/{algorithm} at p={ranks}: {err}") from None
        out.append(Row(op, algorithm, ranks, nodes, size, statistics.median(seconds),
                       min(seconds), max(seconds), len(seconds), predicted))
    if not out:
        raise CannotValidate("the run has no rxelab case with calls back to back (tight) that "
                              "finished: run `fab run-experiment --spec validation`")
    return out


def rankings(table: list[Row]) -> list[dict[str, Any]]:
    """At each (op, p, nodes, size): the algorithms from fastest, by the lab's medians and by the
    predictions."""
    groups: dict[tuple[str, int, int, int], list[Row]] = defaultdict(list)
    for r in table:
        groups[(r.op, r.ranks, r.nodes, r.size)].append(r)
    out = []
    for (op, ranks, nodes, size), rs in sorted(groups.items()):
        if len(rs) < 2:
            continue
        lab = [r.algorithm for r in sorted(rs, key=lambda r: r.lab_s)]
        predicted = [r.algorithm for r in sorted(rs, key=lambda r: r.predicted_s)]
        out.append({"op": op, "ranks": ranks, "nodes": nodes, "size": size, "lab": lab,
                    "predicted": predicted, "same": lab == predicted,
                    "same_first": lab[0] == predicted[0]})
    return out


def by_ranks(table: list[Row]) -> list[dict[str, Any]]:
    """Per p (and nodes): the marks (yardstick.Score) and the predicted/lab ratios' median
    and range."""
    out = []
    for ranks, nodes in sorted({(r.ranks, r.nodes) for r in table}):
        rs = [r for r in table if (r.ranks, r.nodes) == (ranks, nodes)]
        ratios = [r.ratio for r in rs]
        out.append({"ranks": ranks, "nodes": nodes, **asdict(yardstick.score(rs, rankings)),
                    "ratio": statistics.median(ratios), "low": min(ratios), "high": max(ratios)})
    return out


def newest(root: Path) -> Path:
    """The newest run under root with an rxelab case whose calls went back to back, other
    than a calibration (a profile is not validated on what it was fitted to)."""
    try:
        runs = sorted((p for p in root.glob("*") if (p / "records.jsonl").exists()), reverse=True)
        for run in runs:
            about = run / "environment.json"
            if about.exists() and f'"spec": "{SPEC}"' in about.read_text():
                continue
            if '"tight": true' in (run / "records.jsonl").read_text():
                return run
    except (OSError, UnicodeDecodeError) as err:
        raise CannotValidate(f"reading the runs under {root}: {err}") from None
    raise CannotValidate(f"no lab run under {root} has rxelab calls back to back: run "
                          "`fab run-experiment --spec validation` first")


def named_run(path: Path) -> Path:
    """A run directory named on the command line, or CannotValidate saying what it is not
    (a results root given for a run: the run under it to name instead)."""
    try:
        if (path / "records.jsonl").is_file():
            return path
        found, a_file = path.is_dir(), path.is_file()
    except OSError as err:
        raise CannotValidate(f"{path}: {err}") from None
    if a_file and path.name == "records.jsonl":
        raise CannotValidate(f"{path} is a run's records: name its directory, `--run "
                              f"{path.parent}`")
    hint = ""
    if found:
        try:
            hint = f"; the newest run under it: `--run {newest(path)}`"
        except CannotValidate:
            pass
    raise CannotValidate(f"{path} is not a lab run's directory (no records.jsonl){hint}")


def own_profile(run: Path) -> Profile | None:
    """The profile fitted on the run's own calibration cases (a spec that includes the
    calibrate spec runs them in each of its rounds), saved beside it as profile.json; None
    where the run has none."""
    try:
        environment = Environment.read((run / "environment.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise CannotValidate(f"{run}/environment.json: {err}") from None
    if not calibrate.holds_calibration(environment):
        return None
    try:
        profile = calibrate.fit_run(run, calibrate.check_name(run.name[:64]))
    except calibrate.CalibrationError as err:
        raise CannotValidate(f"the run's own calibration cannot be fitted: {err}; or "
                              "predict with another run's profile (`fab validate --profile "
                              "lab`)") from None
    try:
        calibrate.save(profile, run / "profile.json")
    except calibrate.CalibrationError as err:
        raise CannotValidate(f"keeping the run's own profile: {err}") from None
    return profile


def _records(run: Path) -> list[Record]:
    """A run's records.jsonl, or CannotValidate naming the run."""
    try:
        return read_records((run / "records.jsonl").read_text())
    except NotARecord as err:
        raise CannotValidate(f"{run}: a record without {err}: not a run of this rxelab") from None
    except (OSError, ValueError) as err:
        raise CannotValidate(f"{run} is not a run's directory: {err}") from None


def _beside(table: list[Row], other: Path) -> list[Row]:
    try:
        return yardstick.beside(table, lab_cases(_records(other)))
    except (KeyError, TypeError, AttributeError) as err:
        raise CannotValidate(f"{other}: a record without {err}: not a run of this rxelab") \
            from None


def against_itself(run: Path, table: list[Row], other: Path | None) -> dict[str, Any] | None:
    """Another run's medians scored as predictions of this run's cases (those both ran),
    beside the simulator's score on the same cases: the yardstick of how close a prediction
    can come. `other` None: the first of yardstick.candidates that reads and shares a case
    (a broken or unrelated run is passed over); None when there is none."""
    if other is not None:
        if other.resolve() == run.resolve():
            raise CannotValidate(f"{other}: the run itself, not another run of its cases")
        try:
            same_id = yardstick.run_id_of(run)
            if same_id is not None and yardstick.run_id_of(other) == same_id:
                raise CannotValidate(f"{other}: a copy of the run itself (run id {same_id}), "
                                      "not another run of its cases")
        except yardstick.YardstickError as err:
            raise CannotValidate(str(err)) from None
        lab = _beside(table, other)
        if not lab:
            raise CannotValidate(f"{other} ran none of {run.name}'s cases (calls back to "
                                  "back): nothing to set beside it")
    else:
        try:
            candidates = yardstick.candidates(run)
        except yardstick.YardstickError as err:
            raise CannotValidate(str(err)) from None
        for candidate in candidates:
            try:
                lab = _beside(table, candidate)
            except CannotValidate:
                continue
            if lab:
                other = candidate
                break
        else:
            return None
    theirs = {r.key for r in lab}
    mine = [r for r in table if r.key in theirs]
    rounds = min(r.rounds for r in mine)
    return {"run": other.name, "lab": yardstick.score(lab, rankings),
            "simulator": yardstick.score(mine, rankings), "rounds": rounds,
            "outside": yardstick.chance_outside(rounds)}


def write(run: Path, profile: Profile, beside: Path | None = None) -> Path:
    """validation.jsonl and validation.md in the run's directory; the Markdown's path.
    `beside`: the lab run set beside it as the lab's own prediction (None: the first of
    yardstick.candidates that shares a case, where there is one)."""
    records = _records(run)
    try:
        table = rows(records, profile)
    except (KeyError, TypeError, AttributeError) as err:
        raise CannotValidate(f"{run}: a record without {err}: not a run of this rxelab") from None
    order = rankings(table)
    itself = against_itself(run, table, beside)
    try:
        return _write(run, profile, table, order, itself)
    except OSError as err:
        raise CannotValidate(f"writing the validation into {run}: {err}") from None


def _write(run: Path, profile: Profile, table: list[Row], order: list[dict[str, Any]],
           itself: dict[str, Any] | None) -> Path:
    """Both files rendered first, then each put in place whole (a failure leaves the old)."""
    template = jinja2.Template(TEMPLATE.read_text(), undefined=jinja2.StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True)
    md = template.render(rows=table, rankings=order, profile=profile, run=run.name,
                         score=yardstick.score(table, rankings), size=size_text,
                         per_p=by_ranks(table), placeholder=profile.placeholder,
                         itself=itself, own=profile.measured.get("run") == str(run))
    jsonl = "".join(json.dumps({**asdict(r), "within": r.within, "profile": profile.name}) + "\n"
                    for r in table)
    for name, text in (("validation.jsonl", jsonl), ("validation.md", md)):
        # a file of its own (mkstemp's), so what a failure removes is what this call made
        fd, part = tempfile.mkstemp(dir=run, prefix=f".{name}.", suffix=".part")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(part, run / name)
        finally:
            if os.path.exists(part):
                os.unlink(part)
    return run / "validation.md"

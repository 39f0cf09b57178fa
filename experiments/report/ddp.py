"""What a DDP scenario's records (ddp.jsonl) say: per bucket size, each variant's time per
step (the median of its rounds, with their min-max) and per gradient bucket, against Gloo with
the same hook; whether every rank ended with the same parameters and rxelab's matched Gloo's;
and a plot of the time per step by bucket size with the rounds' spread as error bars.

A ratio whose spreads overlap (rxelab's slowest round faster than Gloo's fastest, or not) is
marked as within the spread: under emulation the rounds drift more than many gaps.
"""

from __future__ import annotations

from pathlib import Path

from experiments.report import plots
from experiments.running.scenario_records import DdpRecord

Record = DdpRecord
# what a spec calls it, how the run's verdict and the report name it (experiments.report.SCENARIOS)
NAME, WHAT, HEADING = "ddp", "the DDP scenario", "DDP against Gloo"
HEAD = ["bucket cap", "variant", "buckets", "ms/step (min-max)", "ms per bucket",
        "vs Gloo", "parameters"]


def load(results: Path) -> list[Record]:
    return DdpRecord.load(results / "ddp.jsonl")


def ok(records: list[Record]) -> list[Record]:
    return [r for r in records if r.status == "ok"]


def rival(rec: Record, records: list[Record]) -> Record | None:
    """The Gloo variant a record is compared with (its own reference), at the same bucket cap."""
    want = rec.reference
    return next((r for r in ok(records) if r.variant == want
                 and r.bucket_mb == rec.bucket_mb), None)


def ratio(rec: Record, records: list[Record]) -> tuple[float, bool] | None:
    """rxelab's step time over Gloo's, and whether the two rounds' spreads are apart."""
    other = rival(rec, records)
    if other is None or not other.step_ms:
        return None
    apart = rec.step_ms_max < other.step_ms_min or rec.step_ms_min > other.step_ms_max
    return rec.step_ms / other.step_ms, apart


def _mb(v: float | None) -> str:
    """A bucket cap; none for FSDP's variants, which shard instead of bucketing."""
    return "-" if v is None else f"{v:g} MB"


def _at(v: float | None) -> str:
    return "" if v is None else f" at {_mb(v)}"


def _ratio(found: tuple[float, bool] | None) -> str:
    if found is None:
        return "-"
    return f"{found[0]:.2f}x" + ("" if found[1] else " (within spread)")


def table(records: list[Record]) -> tuple[list[str], list[list[str]]]:
    rows = []
    for r in records:
        if r.status != "ok":
            rows.append([_mb(r.bucket_mb), r.variant or "-", "-", r.status or "?", "-", "-",
                         (r.error or "")[:200]])
            continue
        buckets = " / ".join(f"{v:.0f}" for _, v in sorted(r.bucket_ms.items(),
                                                           key=lambda kv: int(kv[0])))
        same = "same on every rank" if r.same_on_every_rank else "DIFFER between ranks"
        match = ("" if r.matches is None else
                 f"; {'matches' if r.matches else 'DOES NOT MATCH'} {r.reference} "
                 f"(max diff {r.max_abs_diff:.2g})")
        rows.append([_mb(r.bucket_mb), r.variant or "-", str(len(r.bucket_bytes) or "-"),
                     f"{r.step_ms:.0f} ({r.step_ms_min:.0f}-{r.step_ms_max:.0f})",
                     buckets, _ratio(ratio(r, records)), same + match])
    return HEAD, rows


def summary_lines(records: list[Record]) -> list[str]:
    """The headline per bucket cap: rxelab's plain allreduce against Gloo's, then the others."""
    out = []
    good = ok(records)
    if good:
        first = good[0]
        out.append(f"DDP on {first.ranks} ranks, a model of {(first.params or 0) / 1e6:.2f} M "
                   f"parameters, {first.steps} timed steps x {first.rounds} alternated rounds "
                   "per variant")
    for mb in dict.fromkeys(r.bucket_mb for r in records):
        here = [r for r in good if r.bucket_mb == mb and r.backend == "rxelab"]
        parts = [f"{r.variant} {_ratio(ratio(r, records))} of {r.reference}"
                 for r in here if r.reference is not None]
        if parts:
            out.append(("sharded (FSDP)" if mb is None else f"buckets of {_mb(mb)}") + ": "
                       + "; ".join(parts) + " (time per step)")
    bad = problems(records)
    if bad:
        out.append("PROBLEMS: " + "; ".join(bad))
    return out


def figure(records: list[Record]) -> bytes | None:
    """DDP's variants by bucket cap (FSDP's, with none, are in the table)."""
    return plots.ddp_steps([r for r in ok(records) if r.bucket_mb is not None])


def not_run(records: list[Record]) -> list[str]:
    """Why jobs were skipped (no torch, or what this torch's FSDP needs): said, no failure."""
    return [r.error or "" for r in records if r.status == "skipped"]


def problems(records: list[Record]) -> list[str]:
    """What makes a DDP run a failure: a job that failed, parameters that differ between ranks
    or from Gloo's beyond the tolerance. (Skipped jobs and variants, for want of torch or of
    what this torch's FSDP needs, are said, not failures.)"""
    out = []
    for r in records:
        if r.status == "failed":
            out.append(f"buckets of {_mb(r.bucket_mb)}: the job failed "
                       f"(exit {r.exit}): {(r.error or '')[-300:]}")
        elif r.status == "ok":
            if not r.same_on_every_rank:
                out.append(f"{r.variant}{_at(r.bucket_mb)}: parameters differ between ranks")
            if r.matches is False:
                out.append(f"{r.variant}{_at(r.bucket_mb)}: parameters do not match "
                           f"{r.reference}'s (max diff {r.max_abs_diff:.2g})")
    return out

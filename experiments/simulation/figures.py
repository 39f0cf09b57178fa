"""What a simulation's rows say at a glance (`fab simulate` writes them beside simulated.jsonl):
- time.png: time per call against the number of ranks, a panel per platform and size, a line
  per algorithm (rxelab's solid, SMPI's MPI algorithms dashed), colours fixed per algorithm;
- memory.png: what each of rxelab's algorithms pins per rank and keeps in flight, against p;
- summary.md: per platform and size, a table of p against every algorithm, the fastest marked,
  and how the strictly sequential schedule (and its windows) stands against the fastest."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import jinja2
import matplotlib.pyplot as plt

from experiments.readable import size_text
from experiments.report.figure_style import MPI_ORDER, colour, plain_log, png

Row = dict[str, Any]
TEMPLATE = Path(__file__).resolve().parent.parent / "simulator" / "summary.md.j2"


def label(r: Row) -> str:
    """rxelab's algorithm (with its window where it has one), or SMPI's MPI label."""
    return r["algorithm"] + (f" k={r['pairs']}" if r.get("pairs", 1) != 1 else "")


def _colour(name: str) -> Any:
    return colour(name, "smpi" if name in MPI_ORDER else "rxelab")


def _panels(rows: list[Row]) -> dict[tuple[str, int, str, int], list[Row]]:
    """Good rows by (collective, size, platform, oversubscription)."""
    out: dict[tuple[str, int, str, int], list[Row]] = defaultdict(list)
    for r in rows:
        if r.get("status") == "ok":
            out[(r["collective"], r["size"], r["platform"], r["oversubscription"])].append(r)
    return dict(sorted(out.items()))


def platform_text(kind: str, oversubscription: int) -> str:
    return f"fat tree {oversubscription}:1" if kind == "fat-tree" else kind


def _log2_ranks(ax: Any, ranks: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks)
    ax.set_xticklabels([str(p) for p in ranks])
    ax.set_xlabel("ranks")


def time_figure(rows: list[Row]) -> bytes | None:
    panels = {k: v for k, v in _panels(rows).items() if len({r["ranks"] for r in v}) > 1}
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, ((collective, size, kind, over), rs) in zip(axes[0], panels.items(), strict=True):
        lines: dict[str, list[Row]] = defaultdict(list)
        for r in rs:
            lines[label(r)].append(r)
        for name, points in sorted(lines.items(), key=lambda kv: (kv[0] in MPI_ORDER, kv[0])):
            points.sort(key=lambda r: r["ranks"])
            ax.plot([r["ranks"] for r in points], [r["seconds"] * 1e3 for r in points],
                    marker="o", markersize=3, color=_colour(name), label=name,
                    linestyle="--" if points[0]["source"] == "smpi" else "-")
        _log2_ranks(ax, sorted({r["ranks"] for r in rs}))
        ax.set_yscale("log")
        plain_log(ax)
        ax.set_ylabel("ms per call (simulated)")
        ax.set_title(f"{collective} {size_text(size)}, {platform_text(kind, over)}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    handles: dict[str, Any] = {}
    for ax in axes[0]:
        for h, name in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(name, h)
    fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=min(len(handles), 8),
               bbox_to_anchor=(0.5, 0.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return png(fig)


def memory_figure(rows: list[Row]) -> bytes | None:
    """Per rank against p, of rxelab's algorithms at the spec's largest size on its first
    platform: bytes pinned (the connections' slots grow with p, whatever the algorithm) and
    bytes in flight (what the schedule lets out at once)."""
    good = [r for r in rows if r.get("status") == "ok" and r["source"] == "rxelab"
            and "pinned_bytes" in r]
    if len({r["ranks"] for r in good}) < 2:
        return None
    collective, kind, over = good[0]["collective"], good[0]["platform"], good[0]["oversubscription"]
    size = max(r["size"] for r in good if r["collective"] == collective)
    good = [r for r in good if (r["collective"], r["platform"], r["oversubscription"], r["size"])
            == (collective, kind, over, size)]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    lines: dict[str, list[Row]] = defaultdict(list)
    for r in good:
        lines[label(r)].append(r)
    for ax, field, what in ((axes[0], "pinned_bytes", "MiB pinned per rank"),
                            (axes[1], "peak_inflight_bytes", "MiB in flight per rank, at most")):
        for name, points in sorted(lines.items()):
            points.sort(key=lambda r: r["ranks"])
            ax.plot([r["ranks"] for r in points], [r[field] / (1 << 20) for r in points],
                    marker="o", markersize=3, color=_colour(name), label=name)
        _log2_ranks(ax, sorted({r["ranks"] for r in good}))
        ax.set_yscale("log")
        plain_log(ax)
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_title(f"{collective} {size_text(size)}: pinned (slots + registered)", fontsize=9)
    axes[1].set_title(f"{collective} {size_text(size)}: in flight", fontsize=9)
    axes[1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    return png(fig)


def tables(rows: list[Row]) -> list[dict[str, Any]]:
    """Per panel: its algorithms, and a row per p with each algorithm's ms, the fastest, and
    the strictly sequential schedule's time over the fastest's."""
    out = []
    for (collective, size, kind, over), rs in _panels(rows).items():
        names = sorted({label(r) for r in rs}, key=lambda n: (n in MPI_ORDER, n))
        by_p: dict[int, dict[str, float]] = defaultdict(dict)
        for r in rs:
            by_p[r["ranks"]][label(r)] = r["seconds"]
        lines = []
        for p, times in sorted(by_p.items()):
            best = min(times, key=times.__getitem__)
            lines.append({"p": p, "ms": {n: times.get(n) for n in names}, "best": best,
                          "sequential": (times["sequential"] / times[best]
                                         if "sequential" in times else None)})
        out.append({"title": f"{collective} {size_text(size)} on {platform_text(kind, over)}",
                    "names": names, "lines": lines})
    return out


def write(out: Path, rows: list[Row]) -> list[Path]:
    """The figures and the summary of a simulation's rows, in its directory."""
    written = []
    for name, make in (("time.png", time_figure), ("memory.png", memory_figure)):
        data = make(rows)
        if data is not None:
            (out / name).write_bytes(data)
            written.append(out / name)
    template = jinja2.Template(TEMPLATE.read_text(), undefined=jinja2.StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True)
    (out / "summary.md").write_text(template.render(
        tables=tables(rows), figures=[p.name for p in written],
        placeholder=any(r.get("placeholder") for r in rows),
        failed=[r for r in rows if r.get("status") != "ok"], label=label, size=size_text))
    written.append(out / "summary.md")
    return written

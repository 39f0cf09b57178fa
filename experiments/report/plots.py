"""The report's figures, from its flat rows (experiments/report/__init__.py) and the raw records: each
function returns PNG bytes, or nothing when the run has no data for that figure.

A reader looks at pictures first, so each answers one question: how latency and bandwidth
scale with size; how the seed's repeated collective adds up over stages, and how its calls
spread; how much memory each algorithm pins; how steady the network load is; how each
contender degrades under loss.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import matplotlib.ticker
from rxelab import ops

from experiments.readable import size_text
from experiments.report.figure_style import legend_outside, plain_log, png, size_axis
from experiments.report.figure_style import style as series_style
from experiments.report.headline import contender_title
from experiments.report.link import NOT_OVER_RXE, Link
from experiments.report.summary import load_moved
from experiments.report.view import Row, spread
from experiments.running.records import Load, Record, Sample
from experiments.running.scenario_records import DdpRecord, ElasticRecord

if TYPE_CHECKING:  # report/elastic.py draws with these figures: its rows only for the types
    from experiments.report.elastic import Change


def series_name(r: Row) -> str:
    return f"{r.contender} {r.algorithm}"


def _style(r: Row) -> dict[str, Any]:
    return series_style(r.contender, r.algorithm)


def _yerr(rows: list[Row], scale: float = 1.0) -> list[list[float]] | None:
    """The rounds' spread of each row's time (min-max of the rounds) as error bars; none when
    every row is of one round."""
    if all(r.rounds < 2 for r in rows):
        return None
    return [[(r.avg_us - spread(r)[0]) / scale for r in rows],
            [(spread(r)[1] - r.avg_us) / scale for r in rows]]


def _by(rows: list[Row], *keys: str) -> dict[tuple, list[Row]]:
    out: dict[tuple, list[Row]] = defaultdict(list)
    for r in rows:
        out[tuple(getattr(r, k) for k in keys)].append(r)  # fields of Row
    return out


def size_scaling(flat: list[Row], link: Link) -> dict[str, bytes]:
    """Latency and busbw against size, one figure per (op, nodes, network, MTU), both on log
    axes (a curve that is small at 1 KiB stays apart from its neighbours); the busbw figure
    draws the link's line (report/link.py, the line "% of link" divides by) and marks the
    series rxe did not carry, which that line does not bound."""
    out: dict[str, bytes] = {}
    for (op, nodes, net, mtu), rs in sorted(_by(flat, "op", "nodes", "network", "active_mtu").items(),
                                            key=lambda kv: str(kv[0])):
        if len({r.size for r in rs}) < 2:
            continue
        suffix = f"{op}-{nodes}n" + ("" if net == "none" else f"-{_slug(net)}") + \
            (f"-mtu{mtu}" if len({r.active_mtu for r in flat}) > 1 else "")
        for metric, ylabel, name in (("avg_us", "ms per call", "latency"),
                                     ("busbw", "busbw (MB/s)", "busbw")):
            fig, ax = plt.subplots(figsize=(6.5, 4))
            modes = len({r.mode for r in rs}) > 1
            for label, series in sorted(_by(rs, "contender", "algorithm", "mode").items()):
                series = sorted((r for r in series if getattr(r, metric) > 0), key=lambda r: r.size)
                if not series:
                    continue
                scale = 1e3 if metric == "avg_us" else 1.0
                apart = f" ({NOT_OVER_RXE})" if name == "busbw" and link.rate_MBps \
                    and not series[0].over_rxe else ""
                ax.errorbar([r.size for r in series], [getattr(r, metric) / scale for r in series],
                            yerr=_yerr(series, scale) if metric == "avg_us" else None, capsize=2,
                            label=" ".join(label if modes else label[:2]) + apart,
                            **_style(series[0]))
            if name == "busbw" and link.rate_MBps:
                ax.axhline(link.rate_MBps, color="grey", linestyle=":", label=link.label)
            described = ops.COLLECTIVES.get(op)
            size_axis(ax, {r.size for r in rs}, described.axis if described else "bytes")
            ax.set_yscale("log")
            plain_log(ax)
            ax.set_ylabel(ylabel + " (log scale)")
            ax.set_title(f"{op}, {nodes} nodes, network: {net}"
                         + (f", RoCE MTU {mtu}" if mtu != "-" else "")
                         + (" (bars: rounds' min-max)" if name == "latency" and
                            any(r.rounds > 1 for r in rs) else ""), fontsize=9)
            ax.grid(True, which="major", alpha=0.3)
            legend_outside(ax)
            out[f"{name}-{suffix}.png"] = png(fig)
    return out


def ratio_to(flat: list[Row], rival: str) -> bytes | None:
    """Each contender's time per call over the rival's (mpi-ucx: MPI over UCX) at the same size, op, nodes,
    network, MTU and way of calling: below 1 is faster. One panel per op."""
    theirs = {(r.op, r.nodes, r.network, r.active_mtu, r.mode, r.size): r
              for r in flat if r.contender == rival and r.status == "ok"
              and r.avg_us > 0 and spread(r)[0] > 0}
    mine = [r for r in flat if r.contender != rival and r.status == "ok" and theirs.get(
        (r.op, r.nodes, r.network, r.active_mtu, r.mode, r.size))]
    by_op = _by(mine, "op")
    if not any(len({r.size for r in rs}) > 1 for rs in by_op.values()):
        return None
    fig, axes = plt.subplots(len(by_op), 1, figsize=(7.5, 3.6 * len(by_op)), squeeze=False)
    for ax, ((op,), rs) in zip(axes[:, 0], sorted(by_op.items()), strict=True):
        for label, series in sorted(_by(rs, "contender", "algorithm", "mode", "nodes",
                                        "network", "active_mtu").items(), key=str):
            series.sort(key=lambda r: r.size)
            base = [theirs[(r.op, r.nodes, r.network, r.active_mtu, r.mode,
                            r.size)] for r in series]
            ys = [r.avg_us / b.avg_us for r, b in zip(series, base, strict=True)]
            err = None
            if any(r.rounds > 1 for r in [*series, *base]):
                # the ratio's spread: our fastest round over their slowest, and the reverse
                err = [[y - spread(r)[0] / spread(b)[1] for y, r, b in zip(ys, series, base, strict=True)],
                       [spread(r)[1] / spread(b)[0] - y for y, r, b in zip(ys, series, base, strict=True)]]
            ax.errorbar([r.size for r in series], ys, yerr=err, capsize=2,
                        label=" ".join(str(x) for x in label[:3]), **_style(series[0]))
        ax.axhline(1.0, color="grey", linestyle=":")
        described = ops.COLLECTIVES.get(op)
        size_axis(ax, {r.size for r in rs}, described.axis if described else "bytes")
        ax.set_ylabel(f"time per call / {contender_title(rival)}'s")
        ax.set_title(f"{op}: time relative to {contender_title(rival)} (below 1: faster; bars: "
                     "rounds' spread)", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        legend_outside(ax)
    return png(fig)


def memory(flat: list[Row]) -> bytes | None:
    """Peak pinned memory and peak bytes in flight, grouped by algorithm, one bar colour per
    size (or stage count where sizes are equal), on a log axis that starts a factor 4 below the
    smallest bar, so that 1 KiB's bars show beside 1 MiB's and two equal bars read as equal;
    each bar says its value."""
    rows = [r for r in flat if r.peak_inflight is not None]
    if not rows:
        return None
    variant = "size" if len({r.size for r in rows}) > 1 else "stages"
    algos = sorted({f"{r.op}/{r.algorithm}" for r in rows})
    variants = sorted({getattr(r, variant) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.2 * len(algos) + 5), 3.8))
    width = 0.8 / len(variants)
    colours = plt.get_cmap("viridis")
    for ax, metric, title in ((axes[0], "peak_pinned", "peak pinned memory"),
                              (axes[1], "peak_inflight", "peak bytes in flight")):
        ax.set_yscale("log", base=2)
        shown = [float(v) for r in rows if (v := getattr(r, metric))]
        for k, v in enumerate(variants):
            heights = []
            for a in algos:
                match = [getattr(r, metric) for r in rows if f"{r.op}/{r.algorithm}" == a
                         and getattr(r, variant) == v and getattr(r, metric)]
                heights.append(float(max(match)) if match else float("nan"))
            bars = ax.bar([i - 0.4 + width * (k + 0.5) for i in range(len(algos))], heights, width,
                          color=colours(k / max(1, len(variants) - 1) * 0.9),
                          label=size_text(v) if variant == "size" else f"{v} stages")
            ax.bar_label(bars, [size_text(h) if math.isfinite(h) else "" for h in heights],
                         rotation=90, fontsize=6, padding=2)
        if shown:  # from a factor 4 below the smallest bar; room above the tallest's label
            ax.set_ylim(2 ** (math.floor(math.log2(min(shown))) - 2),
                        2 ** (math.ceil(math.log2(max(shown))) + 3))
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=2, numticks=8))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: size_text(y)))
        ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xticks(range(len(algos)), algos, rotation=25, ha="right", fontsize=8)
        ax.set_ylabel("bytes (log scale)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, axis="y", which="major", alpha=0.3)
    legend_outside(axes[1], title="size per peer" if variant == "size" else None)
    fig.tight_layout()
    return png(fig)


def stages(flat: list[Row]) -> bytes | None:
    """The seed's table as a picture: total time against the number of stages, per contender."""
    counts = sorted({r.stages for r in flat})
    if len(counts) < 2:
        return None
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label, series in sorted(_by(flat, "contender", "algorithm", "size", "op", "nodes",
                                    "network").items()):
        series.sort(key=lambda r: r.stages)
        # total seconds scale with the time per call: the rounds' spread of that, as a share
        err = _yerr(series)
        ax.errorbar([r.stages for r in series], [r.total_s for r in series],
                    yerr=None if err is None else
                    [[e / r.avg_us * r.total_s if r.avg_us else 0.0
                      for e, r in zip(side, series, strict=True)] for side in err],
                    capsize=2, label=f"{label[0]} {label[3]}/{label[1]} {label[4]} nodes "
                                     f"{size_text(label[2])}"
                                     + ("" if label[5] == "none" else f", {label[5]}"),
                    **_style(series[0]))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("stages (collectives in a row)")
    ax.set_ylabel("total seconds")
    ax.set_title("total time against stages (lower is better)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return png(fig)


def distributions(flat: list[Row], min_stages: int = 100) -> bytes | None:
    """How the calls of long runs spread: a box per contender, one panel per stage count."""
    long_runs = [r for r in flat if r.stage_seconds and r.stages >= min_stages]
    if not long_runs:
        return None
    groups = sorted(_by(long_runs, "op", "size", "stages").items())[:3]
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4), squeeze=False)
    for ax, ((op, size, n), rs) in zip(axes[0], groups, strict=True):
        rs.sort(key=series_name)
        ax.boxplot([[s * 1e3 for s in r.stage_seconds or ()] for r in rs], showfliers=True,
                   flierprops={"markersize": 2})
        ax.set_xticks(range(1, len(rs) + 1), [series_name(r) for r in rs], rotation=30,
                      ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("ms per call")
        ax.set_title(f"{op} {size} B per peer, {n} stages", fontsize=9)
    fig.tight_layout()
    return png(fig)


def loss(flat: list[Row]) -> bytes | None:
    """Time per call against packet loss, one line per contender; a case that ran out of time
    is drawn at the time its finished stages took, with an x."""
    rows = [r for r in flat if r.loss_only]
    if len({r.loss for r in rows}) < 2:
        return None
    fig, ax = plt.subplots(figsize=(9, 5))
    for label, series in sorted(_by(rows, "contender", "algorithm", "op", "size").items()):
        series.sort(key=lambda r: r.loss)
        line = ax.errorbar([r.loss for r in series], [r.avg_us / 1e3 for r in series],
                           yerr=_yerr(series, 1e3), capsize=2,
                           label=f"{label[0]} {label[2]}/{label[1]} {size_text(label[3])}",
                           **_style(series[0])).lines
        late = [r for r in series if r.status == "timeout"]
        ax.scatter([r.loss for r in late], [r.avg_us / 1e3 for r in late], marker="x", s=80,
                   color=line[0].get_color())
    ax.set_xscale("symlog", linthresh=0.1)
    losses = sorted({r.loss for r in rows})
    ax.set_xticks(losses, [f"{x:g}" for x in losses])
    ax.set_yscale("log")
    ax.set_xlabel("packet loss on every data NIC (%)")
    ax.set_ylabel("ms per call")
    ax.set_title("time per call against loss (x: ran out of time)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return png(fig)


def pairs_dial(flat: list[Row], load_ratio: dict[int, float]) -> bytes | None:
    """The seed's trade-off as a curve: the sequential schedule with at most k pairs at once,
    against k: time per call, peak pinned memory, peak bytes in flight, and the data NICs'
    peak-to-mean load (where it was sampled)."""
    rows = [r for r in flat if r.pairs]
    if len({r.pairs for r in rows}) < 2:
        return None
    panels = [("avg_us", "ms per call", 1e3), ("peak_pinned", "peak pinned (MB)", 1e6),
              ("peak_inflight", "peak in flight (MB)", 1e6)]
    if any(r.case in load_ratio for r in rows):
        panels.append(("load", "NIC peak-to-mean", 1.0))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4), squeeze=False)
    for ax, (key, label, scale) in zip(axes[0], panels, strict=True):
        for (op, size, n), series in sorted(_by(rows, "op", "size", "ranks").items()):
            series.sort(key=lambda r: r.pairs or 0)
            ys = [(load_ratio.get(r.case, 0.0) if key == "load" else (getattr(r, key) or 0) / scale)
                  for r in series]
            ax.plot([r.pairs for r in series], ys, marker="o", label=f"{op} {size} B, {n} ranks")
        ax.set_xlabel("pairs at once (k)")
        ax.set_ylabel(label)
        ax.set_xscale("log", base=2)
    legend_outside(axes[0][-1])
    fig.suptitle("sequential schedule, at most k pairs at once (k = 1: strictly sequential)")
    fig.tight_layout()
    return png(fig)


def load_over_time(records: list[Record], loads: list[Load],
                   peak_to_mean: Callable[[list[Sample]], tuple[list[float], list[float], float]]
                   ) -> bytes | None:
    if not loads:
        return None
    by_case: dict[int, list[Load]] = defaultdict(list)
    for entry in loads:
        by_case[entry.case].append(entry)
    shown = [c for c in sorted(by_case) if any(load_moved(e.samples) for e in by_case[c])][:8]
    if not shown:
        return None
    fig, axes = plt.subplots(len(shown), 1, figsize=(6.5, 1.6 * len(shown) + 0.6), sharey=True,
                             squeeze=False)
    case_of = {r.case: r for r in records}
    for ax, case in zip(axes[:, 0], shown, strict=True):
        worst, curves, starts, ends = 0.0, [], [], []
        for entry in by_case[case]:
            ts, rates, ratio = peak_to_mean(entry.samples)
            peak = max(rates, default=0.0)
            busy_t = [t for t, x in zip(ts, rates, strict=True) if peak and x > 0.1 * peak]
            if busy_t:
                starts.append(busy_t[0])
                ends.append(busy_t[-1])
            curves.append((entry.node, ts, rates))
            worst = max(worst, ratio)
        t0 = min(starts) - 1 if starts else 0.0
        for node, ts, rates in curves:
            ax.plot([t - t0 for t in ts], rates, label=node, linewidth=0.8)
        if ends:
            ax.set_xlim(0, max(ends) - t0 + 1)
        r = case_of.get(case)
        op, algorithm, size = (r.op, r.algorithm, r.size) if r else (None, None, 0)
        ax.set_title(f"{op}/{algorithm}, {size_text(size)} per peer: "
                     f"peak/mean {worst:.2f}", fontsize=8)
        legend_outside(ax)
    axes[-1, 0].set_xlabel("seconds (from the first busy sample, minus 1)")
    axes[len(shown) // 2, 0].set_ylabel("data NIC MB/s (tx+rx)")
    fig.tight_layout()
    return png(fig)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-").replace("--", "-")


def elastic_steps(records: list[ElasticRecord], changes: list[list[Change]]) -> bytes | None:
    """Time per step over the run (seconds since each job started), one line per contender,
    with each change of members marked where it happened."""
    if not any(r.events for r in records):
        return None
    fig, ax = plt.subplots(figsize=(9, 4))
    colors = {"kill": "red", "partition": "purple", "join": "green"}
    for rec, marks in zip(records, changes, strict=True):
        steps = [e for e in rec.events if e.event == "step"]
        if not steps:
            continue
        t0 = rec.started
        ax.plot([(e.arrived or 0.0) - t0 for e in steps], [(e.seconds or 0.0) * 1000 for e in steps],
                marker=".", linestyle="-" if rec.contender == "rxelab" else "--",
                label=f"{rec.contender} (step time)")
        for e in rec.events:
            if rec.contender != "rxelab" and e.event == "dying":
                ax.axvline((e.arrived or 0.0) - t0, color="red", linestyle=":", alpha=0.6)
        if rec.contender != "rxelab" and isinstance(rec.ended, float):
            ax.axvline(rec.ended - t0, color="black", linestyle="--", alpha=0.6,
                       label=f"{rec.contender} job ended")
        for c in marks:
            ax.axvline(c["time"] - t0, color=colors.get(c["kind"], "grey"), alpha=0.6,
                       label=f"{c['kind']} {c['who']} (step {c['step']})")
    ax.set_xlabel("seconds since the job started (host clock)")
    ax.set_ylabel("ms per step (rank 0)")
    ax.set_title("Elastic training: time per step, and what happened")
    ax.grid(alpha=0.3)
    legend_outside(ax)
    return png(fig)


def ddp_steps(records: list[DdpRecord]) -> bytes | None:
    """DDP's time per step by bucket cap, one bar per variant, the rounds' min-max as error
    bars (a gap inside them is not a gap)."""
    if not records:
        return None
    caps = sorted({r.bucket_mb or 0.0 for r in records})  # DDP's: each has a cap
    variants = list(dict.fromkeys(r.variant or "" for r in records))
    width = 0.8 / len(variants)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(caps) * len(variants) / 2), 4))
    for k, v in enumerate(variants):
        xs, ys, lo, hi = [], [], [], []
        for i, cap in enumerate(caps):
            r = next((x for x in records if (x.variant or "") == v
                      and (x.bucket_mb or 0.0) == cap), None)
            if r is not None:
                xs.append(i + (k - (len(variants) - 1) / 2) * width)
                ys.append(r.step_ms)
                lo.append(r.step_ms - r.step_ms_min)
                hi.append(r.step_ms_max - r.step_ms)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=v,
               hatch="//" if v.startswith("gloo") else None)
    ax.set_xticks(range(len(caps)), [f"{c:g} MB" for c in caps])
    ax.set_xlabel("DDP bucket cap")
    ax.set_ylabel("time per step (ms), median of rounds")
    ax.set_title("DDP: rxelab against Gloo (error bars: the rounds' min-max)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return png(fig)

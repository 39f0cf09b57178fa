"""The report of one results directory: tables in OSU style with algbw/busbw, plots made with
matplotlib, and a plain-words summary; written as self-contained HTML (plots inlined) and as
Markdown (plots beside it). Reads only the results directory, so it can be made anywhere,
any time after the run.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MPI_RDMA_NOTE = (
    'MPI over RDMA on rxe: none of the ways tried makes this Open MPI use rxe0, so the MPI '
    'comparison runs over TCP. Open MPI 4.1.4 with UCX 1.13.1 (Debian 12), tried on the lab: (1) '
    '`--mca pml ucx -x UCX_NET_DEVICES=rxe0:1` picks ud_verbs, which aborts in the first MPI_Barrier'
    ' with "UD endpoint ... unhandled timeout error" (signal 6), also with UCX_IB_GID_INDEX=1; (2) '
    '`-x UCX_TLS=rc_verbs,self,sm` (or `rc_verbs,tcp,...`) fails in MPI_Init with "no auxiliary '
    'transport ... Destination is unreachable": RC wire-up needs UD as its auxiliary transport; (3) '
    '`--mca btl openib` with `btl_openib_cpc_include rdmacm` is refused: this build has only the '
    'udcm connection manager ("valid names: udcm"), and RoCE needs rdmacm; (4) `--mca pml cm --mca '
    'mtl ofi` with the verbs;ofi_rxm provider: "PML cm cannot be selected". MPICH with libfabric\'s '
    'verbs provider is not in the image and was not tried.'
)
EMULATION_NOTE = ("Absolute numbers here come from VMs under emulation (TCG) and are not hardware "
                  "numbers; the ratios between algorithms measured in the same run are what carry over.")


def load(results: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    env = json.loads((results / "environment.json").read_text())
    records = [json.loads(x) for x in (results / "records.jsonl").read_text().splitlines() if x]
    loads_path = results / "load.jsonl"
    loads = [json.loads(x) for x in loads_path.read_text().splitlines() if x] if loads_path.exists() else []
    return env, records, loads


def bandwidth(size: int, ranks: int, seconds: float) -> tuple[float, float]:
    """nccl-tests' model: algbw = size*ranks/time, busbw = algbw*(n-1)/n (MB/s)."""
    if seconds <= 0 or ranks < 1:
        return 0.0, 0.0
    algbw = size * ranks / seconds / 1e6
    return algbw, algbw * (ranks - 1) / ranks


def rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per collective case that produced a summary."""
    out = []
    for r in records:
        s = r.get("summary")
        if r["app"] == "perftest" or not s:
            continue
        t = s["avg_stage_us"] / 1e6
        algbw, busbw = bandwidth(r["size"], r["nodes"], t)
        out.append({"app": r["app"], "op": r["op"], "algorithm": r["algorithm"], "nodes": r["nodes"],
                    "size": r["size"], "stages": r["stages"], "avg_us": s["avg_stage_us"],
                    "min_us": s["min_stage_us"], "max_us": s["max_stage_us"],
                    "total_s": s["total_seconds"], "algbw": algbw, "busbw": busbw,
                    "wrong": s["wrong"], "peak_pinned": s.get("peak_pinned"),
                    "peak_inflight": s.get("peak_inflight")})
    return out


def peak_to_mean(samples: list[dict[str, Any]]) -> tuple[list[float], list[float], float]:
    """Throughput over time (MB/s, tx+rx; times are the samples' wall clock) from cumulative
    byte counters, and its peak/mean over the busy samples."""
    ts, rates = [], []
    for a, b in zip(samples, samples[1:], strict=False):
        dt = b["t"] - a["t"]
        if dt <= 0 or a.get("tx_bytes") is None or b.get("tx_bytes") is None:
            continue
        moved = (b["tx_bytes"] - a["tx_bytes"]) + (b["rx_bytes"] - a["rx_bytes"])
        ts.append(b["t"])  # wall-clock: nodes' curves line up (as far as their clocks agree)
        rates.append(moved / dt / 1e6)
    busy = busy_samples(rates)
    ratio = max(busy) / (sum(busy) / len(busy)) if busy else 0.0
    return ts, rates, ratio


def busy_samples(rates: list[float]) -> list[float]:
    """The samples of the collective itself: above a tenth of the peak (the launch's own
    small TCP traffic on the data NIC stays below it)."""
    peak = max(rates, default=0.0)
    return [x for x in rates if peak > 0 and x > 0.1 * peak]


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def plots(flat: list[dict[str, Any]], records: list[dict[str, Any]],
          loads: list[dict[str, Any]]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in flat:
        groups[(r["op"], r["nodes"])].append(r)
    limit = [r["summary"]["bw_MBps"] for r in records
             if r["app"] == "perftest" and r.get("summary", {}).get("bw_MBps")]
    for (op, nodes), rs in sorted(groups.items()):
        sizes = sorted({r["size"] for r in rs})
        if len(sizes) < 2:
            continue
        for metric, ylabel, name in (("avg_us", "latency per call (us)", "latency"),
                                     ("busbw", "busbw (MB/s)", "busbw")):
            fig, ax = plt.subplots(figsize=(6.5, 4))
            for (app, algo), series in sorted(_by_algorithm(rs).items()):
                series.sort(key=lambda r: r["size"])
                ax.plot([r["size"] for r in series], [r[metric] for r in series], marker="o",
                        label=f"{app} {algo}", linestyle="--" if app == "mpi" else "-")
            if name == "busbw" and limit:
                ax.axhline(max(limit), color="grey", linestyle=":", label="perftest ib_write_bw")
            ax.set_xscale("log", base=2)
            if name == "latency":
                ax.set_yscale("log")
            ax.set_xlabel("bytes per peer")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{op}, {nodes} nodes")
            ax.legend(fontsize=7)
            out[f"{name}-{op}-{nodes}n.png"] = _png(fig)
    mem = [r for r in flat if r.get("peak_inflight") is not None]
    if mem:
        fig, ax = plt.subplots(figsize=(6.5, 3.5))
        labels = [f"{r['op']}/{r['algorithm']}\n{r['size']} B" for r in mem]
        x = range(len(mem))
        ax.bar([i - 0.2 for i in x], [r["peak_pinned"] / 1e6 for r in mem], 0.4, label="peak pinned")
        ax.bar([i + 0.2 for i in x], [r["peak_inflight"] / 1e6 for r in mem], 0.4, label="peak in flight")
        ax.set_xticks(list(x), labels, fontsize=6)
        ax.set_ylabel("MB")
        ax.set_title("memory per algorithm")
        ax.legend(fontsize=7)
        out["memory.png"] = _png(fig)
    if loads:
        by_case: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for entry in loads:
            by_case[entry["case"]].append(entry)
        shown = sorted(by_case)[:8]
        fig, axes = plt.subplots(len(shown), 1, figsize=(6.5, 1.6 * len(shown) + 0.6), sharey=True,
                                 squeeze=False)
        case_of = {r["case"]: r for r in records}
        for ax, case in zip(axes[:, 0], shown, strict=True):
            worst, curves, starts, ends = 0.0, [], [], []
            for entry in by_case[case]:
                ts, rates, ratio = peak_to_mean(entry["samples"])
                peak = max(rates, default=0.0)
                busy_t = [t for t, x in zip(ts, rates, strict=True) if peak and x > 0.1 * peak]
                if busy_t:
                    starts.append(busy_t[0])
                    ends.append(busy_t[-1])
                curves.append((entry["node"], ts, rates))
                worst = max(worst, ratio)
            t0 = min(starts) - 1 if starts else 0.0
            for node, ts, rates in curves:
                ax.plot([t - t0 for t in ts], rates, label=node, linewidth=0.8)
            if ends:
                ax.set_xlim(0, max(ends) - t0 + 1)
            r = case_of.get(case, {})
            ax.set_title(f"{r.get('op')}/{r.get('algorithm')}, {r.get('size')} B per peer: "
                         f"peak/mean {worst:.2f}", fontsize=8)
            ax.legend(fontsize=6, loc="upper right")
        axes[-1, 0].set_xlabel("seconds (from the first busy sample, minus 1)")
        axes[len(shown) // 2, 0].set_ylabel("data NIC MB/s (tx+rx)")
        fig.tight_layout()
        out["load.png"] = _png(fig)
    return out


def _by_algorithm(rs: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    d: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rs:
        d[(r["app"], r["algorithm"])].append(r)
    return d


def summary_lines(flat: list[dict[str, Any]], records: list[dict[str, Any]],
                  loads: list[dict[str, Any]]) -> list[str]:
    lines = []
    bad = [r for r in records if r["status"] != "ok"]
    ok = len(records) - len(bad)
    failed = ", ".join(f"{r['app']} {r['algorithm']} ({r['status']})" for r in bad)
    lines.append(f"{ok} of {len(records)} cases ran and verified their data"
                 + (f"; not ok: {failed}" if bad else "."))
    groups: dict[tuple[str, int, int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in flat:
        groups[(r["op"], r["nodes"], r["size"], r["stages"])].append(r)
    for (op, nodes, size, stages), rs in sorted(groups.items()):
        if len(rs) < 2:
            continue
        rs = sorted(rs, key=lambda r: r["avg_us"])
        best, worst = rs[0], rs[-1]
        lines.append(f"{op}, {nodes} nodes, {size} B per peer, {stages} stages: fastest "
                     f"{best['app']} {best['algorithm']} ({best['avg_us']:.0f} us per call), "
                     f"{worst['avg_us'] / best['avg_us']:.1f}x faster than the slowest "
                     f"({worst['app']} {worst['algorithm']}).")
    case_label = {r["case"]: f"{r['op']}/{r['algorithm']}" for r in records}
    ratios: dict[str, list[float]] = defaultdict(list)
    for entry in loads:
        ratios[case_label.get(entry["case"], str(entry["case"]))].append(peak_to_mean(entry["samples"])[2])
    for label, rs in sorted(ratios.items()):
        lines.append(f"Network load of {label}: peak-to-mean ratio {max(rs):.2f} "
                     f"(worst node; lower is steadier).")
    return lines


def seed_table(flat: list[dict[str, Any]]) -> tuple[list[int], list[tuple[str, list[str]]]]:
    """The seed's table: total seconds per (app algorithm) and number of stages, where a run
    has more than one stage count (the seed spec: 100, 1000, 10000)."""
    stage_counts = sorted({r["stages"] for r in flat})
    if len(stage_counts) < 2:
        return [], []
    cells: dict[str, dict[int, float]] = defaultdict(dict)
    for r in flat:
        cells[f"{r['app']} {r['op']}/{r['algorithm']} {r['size']} B"][r["stages"]] = r["total_s"]
    return stage_counts, [(name, [f"{by[n]:.2f}" if n in by else "-" for n in stage_counts])
                          for name, by in sorted(cells.items())]


TABLE_COLS = [("app", "app"), ("op", "op"), ("algorithm", "algorithm"), ("nodes", "nodes"), ("size", "Size"),
              ("stages", "stages"), ("avg_us", "Avg Latency(us)"), ("min_us", "Min Latency(us)"),
              ("max_us", "Max Latency(us)"), ("algbw", "algbw(MB/s)"), ("busbw", "busbw(MB/s)"),
              ("wrong", "#wrong")]


def _fmt(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def write(results: Path) -> tuple[Path, Path]:
    env, records, loads = load(results)
    flat = rows(records)
    images = plots(flat, records, loads)
    summary = summary_lines(flat, records, loads)
    perf = [r for r in records if r["app"] == "perftest" and r.get("summary")]
    title = f"rxelab report: {env.get('spec', results.name)}"
    status = "complete" if env.get("complete") else "INCOMPLETE (interrupted or failed: partial results)"
    facts = [f"results: {results.name} ({status})", f"nodes: {env.get('nodes')}",
             f"kernel: {env.get('kernel')}",
             f"accel: {env.get('accel', '?')}, image: {env.get('image', '?')}",
             f"MTU: {env.get('mtu')}", "packages: " + ", ".join(f"{k} {v}" for k, v in
                                                            env.get("packages", {}).items())]
    for name, data in images.items():
        (results / name).write_bytes(data)
    # Markdown
    md = [f"# {title}", "", f"> {EMULATION_NOTE}", "", *[f"- {f}" for f in facts], "", "## Summary", "",
          *[f"- {x}" for x in summary], "", "## Collectives", "", MPI_RDMA_NOTE, "",
          "| " + " | ".join(h for _, h in TABLE_COLS) + " |",
          "|" + "---|" * len(TABLE_COLS)]
    md += ["| " + " | ".join(_fmt(r[k]) for k, _ in TABLE_COLS) + " |" for r in flat]
    counts, seed_rows = seed_table(flat)
    if seed_rows:
        md += ["", "## Stages (total seconds)", "",
               "| run | " + " | ".join(f"{n} stages" for n in counts) + " |",
               "|---|" + "---|" * len(counts)]
        md += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in seed_rows]
    if perf:
        md += ["", "## Link limit (perftest)", "", "| tool | size | result |", "|---|---|---|"]
        md += [f"| {r['algorithm']} | {r['size']} | "
               + (f"{r['summary']['bw_MBps']:.2f} MB/s" if "bw_MBps" in r["summary"]
                  else f"{r['summary']['lat_us']:.1f} us") + " |" for r in perf]
    md += ["", "## Plots", ""] + [f"![{n}]({n})" for n in images]
    md_path = results / "report.md"
    md_path.write_text("\n".join(md) + "\n")
    # HTML, self-contained
    esc = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:60em;margin:auto}table{border-collapse:"
             "collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
             ".note{background:#fff4d6;padding:.5em}</style></head><body>",
             f"<h1>{esc(title)}</h1><p class='note'>{esc(EMULATION_NOTE)}</p><ul>",
             *[f"<li>{esc(f)}</li>" for f in facts], "</ul><h2>Summary</h2><ul>",
             *[f"<li>{esc(x)}</li>" for x in summary], "</ul><h2>Collectives</h2>",
             f"<p>{esc(MPI_RDMA_NOTE)}</p><table><tr>",
             *[f"<th>{esc(h)}</th>" for _, h in TABLE_COLS], "</tr>"]
    parts += ["<tr>" + "".join(f"<td>{esc(_fmt(r[k]))}</td>" for k, _ in TABLE_COLS) + "</tr>"
              for r in flat]
    parts.append("</table>")
    if seed_rows:
        parts.append("<h2>Stages (total seconds)</h2><table><tr><th>run</th>"
                     + "".join(f"<th>{n} stages</th>" for n in counts) + "</tr>")
        parts += ["<tr><th>" + esc(name) + "</th>" + "".join(f"<td>{c}</td>" for c in cells)
                  + "</tr>" for name, cells in seed_rows]
        parts.append("</table>")
    if perf:
        parts.append("<h2>Link limit (perftest)</h2><table><tr><th>tool</th><th>size</th>"
                     "<th>result</th></tr>")
        for r in perf:
            s = r["summary"]
            val = f"{s['bw_MBps']:.2f} MB/s" if "bw_MBps" in s else f"{s['lat_us']:.1f} us"
            parts.append(f"<tr><td>{esc(r['algorithm'])}</td><td>{r['size']}</td><td>{val}</td></tr>")
        parts.append("</table>")
    parts.append("<h2>Plots</h2>")
    parts += [f"<p><img alt='{esc(n)}' src='data:image/png;base64,{base64.b64encode(d).decode()}'></p>"
              for n, d in images.items()]
    parts.append("</body></html>")
    html_path = results / "report.html"
    html_path.write_text("\n".join(parts))
    return html_path, md_path

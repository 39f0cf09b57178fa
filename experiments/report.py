"""The report of one results directory: tables in OSU style with algbw/busbw, plots made with
matplotlib, and a plain-words summary; written as self-contained HTML (plots inlined) and as
Markdown (plots beside it). Reads only the results directory, so it can be made anywhere,
any time after the run.
"""

from __future__ import annotations

import base64
import html
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from rxelab import ops, perftest

from experiments import compression_report, counters, ddp_report, elastic_report, netem, plots
from experiments.report_summary import BACK_TO_BACK, peak_to_mean, summary_lines
from experiments.run_facts import facts, how_nodes_ran, mpi_rdma_note, text
from experiments.spec import contender, ranks


def _md(text: str) -> str:
    """Text with env values in it, for Markdown: no raw HTML gets through."""
    return html.escape(text, quote=False)


def load(results: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    env = json.loads((results / "environment.json").read_text())
    records = [json.loads(x) for x in (results / "records.jsonl").read_text().splitlines() if x]
    loads_path = results / "load.jsonl"
    loads = [json.loads(x) for x in loads_path.read_text().splitlines() if x] if loads_path.exists() else []
    return env, records, loads


def bandwidth(size: int, ranks: int, seconds: float, op: str = "alltoall") -> tuple[float, float]:
    """nccl-tests' model, per collective: algbw = bytes moved per rank / time, busbw = algbw *
    factor (each description's algbw_bytes and busbw, rxelab.ops), in MB/s."""
    if seconds <= 0 or ranks < 1:
        return 0.0, 0.0
    c = ops.COLLECTIVES[op]
    algbw = c.algbw_bytes(size, ranks) / seconds / 1e6
    return algbw, algbw * c.busbw(ranks)


def rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per collective case that produced figures: a summary, or the stages a
    timed-out case finished (avg only)."""
    out = []
    for r in records:
        if r["app"] == "perftest":
            continue
        s = r.get("summary")
        partial = r.get("partial")
        if s:
            avg, low, high, total = (s["avg_stage_us"], s["min_stage_us"], s["max_stage_us"],
                                     s["total_seconds"])
        elif r["status"] == "timeout" and partial and partial.get("stages_done"):
            total = partial["seconds"]
            avg, low, high = total / partial["stages_done"] * 1e6, None, None
        else:
            continue
        algbw, busbw = bandwidth(r["size"], ranks(r), avg / 1e6, r["op"])
        imp = r.get("netem") or {}
        rxe = r.get("rxe")
        out.append({"contender": contender({"transport": "tcp", **r}), "app": r["app"],
                    "op": r["op"], "algorithm": r["algorithm"], "nodes": r["nodes"],
                    "size": r["size"], "stages": r["stages"], "network": netem.label(imp),
                    "loss": float(imp.get("loss", 0)),
                    "loss_only": not any(v for k, v in imp.items() if k != "loss"),
                    "active_mtu": r.get("active_mtu") or "-", "avg_us": avg, "min_us": low,
                    "max_us": high, "total_s": total, "algbw": algbw, "busbw": busbw,
                    "wrong": s["wrong"] if s else "-", "status": r["status"],
                    "peak_pinned": (s or {}).get("peak_pinned"),
                    "peak_inflight": (s or {}).get("peak_inflight"),
                    "rxe_pkts": counters.total(rxe, "sent_pkts") if rxe else None,
                    "retries": counters.total(rxe, "completer_retry_err") if rxe else None,
                    "stage_seconds": r.get("stage_seconds"), "case": r["case"],
                    "ranks": ranks(r), "pairs": r.get("pairs"),
                    "mode": BACK_TO_BACK if r.get("tight") else "stages",
                    "data": r.get("data") or "pattern",
                    "compression": r.get("compression") or "none",
                    "ratio": (s or {}).get("compression_ratio"),
                    "codec_ms_per_MiB": (s or {}).get("codec_ms_per_MiB"),
                    "wire_per_call": (s or {}).get("wire_bytes_per_call"),
                    "round": r.get("round", 0), "rounds": 1})
    return out


SAME_CASE = ("case", "contender", "op", "algorithm", "nodes", "ranks", "pairs", "size", "stages",
             "network", "active_mtu", "mode", "data")


def medians(flat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per case: of a case run in several rounds, the round with the median time (the
    lower middle of an even count), which says how many rounds it is the median of. Rows of
    one round are each their own median."""
    by_case: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in flat:  # a case's number, and what it is (records put together by hand keep apart)
        by_case[tuple(r[k] for k in SAME_CASE)].append(r)
    out = []
    for rs in by_case.values():
        ranked = sorted(rs, key=lambda r: r["avg_us"])
        out.append({**ranked[(len(ranked) - 1) // 2], "rounds": len(ranked)})
    return out


def link_share(flat: list[dict[str, Any]], link_MBps: float | None) -> None:
    """Each row's "% of link": the bytes each rank must send (and receive) for its collective
    over the rate the link carries (`share_rate`): busbw over that rate (nccl-tests' busbw is
    exactly those bytes per second). One rank per node only: ranks sharing a node share its
    link."""
    for r in flat:
        alone = r["ranks"] == r["nodes"]
        r["link_pct"] = 100 * r["busbw"] / link_MBps if link_MBps and alone and r["busbw"] else None


def link_rate(records: list[dict[str, Any]], tool: str = "ib_write_bw") -> float | None:
    """The link's rate in this run (MB/s): the tool's best, where it ran (ib_write_bw_bidir's
    is both directions' sum)."""
    limit = [r["summary"]["bw_MBps"] for r in records
             if r["app"] == "perftest" and r["algorithm"] == tool
             and r.get("summary", {}).get("bw_MBps")]
    return max(limit) if limit else None


def share_rate(records: list[dict[str, Any]]) -> tuple[float | None, str]:
    """What "% of link" divides by, and how to say it. Every rank of a collective sends and
    receives at once, and rxe spends the CPU of both ends on every byte, so where the run
    measured both directions at once (ib_write_bw -b) the rate is each direction's share of
    that; else one direction alone (ib_write_bw), which a collective cannot reach."""
    both, one = link_rate(records, perftest.BIDIR), link_rate(records, "ib_write_bw")
    if both:
        alone = f"; one direction alone {one:.1f} MB/s" if one else ""
        return both / 2, (f"% of link: busbw over {both / 2:.1f} MB/s, each direction's share of "
                          f"{perftest.command(perftest.BIDIR)} (both directions at once, as in a "
                          f"collective){alone}")
    if one:
        return one, f"% of link: busbw over ib_write_bw's {one:.1f} MB/s (one direction alone)"
    return None, ""


def figures(flat: list[dict[str, Any]], records: list[dict[str, Any]],
            loads: list[dict[str, Any]]) -> dict[str, bytes]:
    out = plots.size_scaling(flat, link_rate(records))
    load_ratio: dict[int, float] = {}
    for entry in loads:
        ratio = peak_to_mean(entry["samples"])[2]
        load_ratio[entry["case"]] = max(load_ratio.get(entry["case"], 0.0), ratio)
    for name, png in (("pairs.png", plots.pairs_dial(flat, load_ratio)),
                      ("stages.png", plots.stages(flat)),
                      ("ratio-to-ucx.png", plots.ratio_to(flat, "mpi-ucx")),
                      ("distribution.png", plots.distributions(flat)),
                      ("loss.png", plots.loss(flat)), ("memory.png", plots.memory(flat)),
                      ("load.png", plots.load_over_time(records, loads, peak_to_mean))):
        if png is not None:
            out[name] = png
    return out


def seed_table(flat: list[dict[str, Any]]) -> tuple[list[int], list[tuple[str, list[str]]]]:
    """The seed's table: total seconds per (contender algorithm) and number of stages, where a
    run has more than one stage count (the seed spec: 100, 1000, 10000)."""
    stage_counts = sorted({r["stages"] for r in flat})
    if len(stage_counts) < 2:
        return [], []
    cells: dict[str, dict[int, float]] = defaultdict(dict)
    for r in flat:
        cells[f"{r['contender']} {r['op']}/{r['algorithm']} {r['size']} B"][r["stages"]] = r["total_s"]
    return stage_counts, [(name, [f"{by[n]:.2f}" if n in by else "-" for n in stage_counts])
                          for name, by in sorted(cells.items())]


TABLE_COLS = [("contender", "contender"), ("op", "op"), ("algorithm", "algorithm"),
              ("nodes", "nodes"), ("ranks", "ranks"), ("pairs", "pairs at once"), ("size", "Size"),
              ("stages", "stages"), ("mode", "calls"), ("rounds", "rounds"), ("data", "data"),
              ("network", "network"),
              ("active_mtu", "RoCE MTU"), ("avg_us", "Avg Latency(us)"), ("min_us", "Min Latency(us)"),
              ("max_us", "Max Latency(us)"), ("algbw", "algbw(MB/s)"), ("busbw", "busbw(MB/s)"),
              ("link_pct", "% of link"),
              ("wrong", "#wrong"), ("rxe_pkts", "rxe pkts"), ("retries", "rxe retries"),
              ("status", "status")]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.2f}"
    return "-" if v is None else str(v)


def write(results: Path) -> tuple[Path, Path]:
    env, records, loads = load(results)
    flat = medians(rows(records))
    rate, rate_note = share_rate(records)
    link_share(flat, rate)
    images = figures(flat, records, loads)
    summary = summary_lines(flat, records, loads)
    scenario = elastic_report.load(results)
    if scenario:
        summary = [*elastic_report.summary_lines(scenario), *summary[1:]]
        if (png := elastic_report.figure(scenario)) is not None:
            images = {"elastic.png": png, **images}
    el_head, el_rows = elastic_report.table(scenario)
    trained = ddp_report.load(results)
    if trained:
        summary = [*ddp_report.summary_lines(trained), *summary[1:]]
        if (png := ddp_report.figure(trained)) is not None:
            images = {"ddp.png": png, **images}
        el_head, el_rows = ddp_report.table(trained)
    perf = [r for r in records if r["app"] == "perftest" and r.get("summary")]
    title = f"rxelab report: {text(env.get('spec')) or results.name}"
    fact_lines = facts(env, results) + ([rate_note] if rate_note else [])
    note = how_nodes_ran(env)[1]
    mpi_note = mpi_rdma_note(env)
    for name, data in images.items():
        (results / name).write_bytes(data)
    counts, seed_rows = seed_table(flat)
    # Markdown
    md = [f"# {_md(title)}", "", *([f"> {_md(note)}", ""] if note else []),
          *[f"- {_md(f)}" for f in fact_lines], "",
          "## Summary", "", *[f"- {x}" for x in summary], ""]
    if el_rows:
        heading = "DDP against Gloo" if trained else "Changes of members"
        md += [f"## {heading}", "", "| " + " | ".join(el_head) + " |",
               "|" + "---|" * len(el_head)]
        md += ["| " + " | ".join(_md(c) for c in row) + " |" for row in el_rows]
        md.append("")
    if flat:
        md += ["## Collectives", "", _md(mpi_note), "",
               "| " + " | ".join(h for _, h in TABLE_COLS) + " |",
               "|" + "---|" * len(TABLE_COLS)]
        md += ["| " + " | ".join(_fmt(r[k]) for k, _ in TABLE_COLS) + " |" for r in flat]
    coded = compression_report.table(flat)
    if coded:
        md += ["", "## Compression", "", "| " + " | ".join(compression_report.HEAD) + " |",
               "|" + "---|" * len(compression_report.HEAD)]
        md += ["| " + " | ".join(_md(c) for c in row) + " |" for row in coded]
    if seed_rows:
        md += ["", "## Stages (total seconds)", "",
               "| run | " + " | ".join(f"{n} stages" for n in counts) + " |",
               "|---|" + "---|" * len(counts)]
        md += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in seed_rows]
    if perf:
        md += ["", "## Link limit (perftest)", "", "| tool | size | result |", "|---|---|---|"]
        md += [f"| {r['algorithm']} | {r['size']} | {_perf(r['summary'])} |" for r in perf]
    md += ["", "## Plots", ""] + [f"![{n}]({n})" for n in images]
    md_path = results / "report.md"
    md_path.write_text("\n".join(md) + "\n")
    # HTML, self-contained
    esc = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:72em;margin:auto}table{border-collapse:"
             "collapse;font-size:.75em}td,th{border:1px solid #ccc;padding:2px 4px;text-align:right}"
             ".wide{overflow-x:auto}"
             ".note{background:#fff4d6;padding:.5em}img{max-width:100%}</style></head><body>",
             f"<h1>{esc(title)}</h1>" + (f"<p class='note'>{esc(note)}</p>" if note else "") + "<ul>",
             *[f"<li>{esc(f)}</li>" for f in fact_lines], "</ul><h2>Summary</h2><ul>",
             *[f"<li>{esc(x)}</li>" for x in summary], "</ul>"]
    first = [n for n in ("ddp.png", "elastic.png", "stages.png", "loss.png", "pairs.png")
             if n in images]
    parts += [_img(n, images[n]) for n in first]  # the answer first, as a picture
    if el_rows:
        parts += [f"<h2>{'DDP against Gloo' if trained else 'Changes of members'}</h2>"
                  "<div class='wide'><table><tr>",
                  *[f"<th>{esc(h)}</th>" for h in el_head], "</tr>"]
        parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in el_rows]
        parts.append("</table></div>")
    if flat:
        parts += ["<h2>Collectives</h2>", f"<p>{esc(mpi_note)}</p><div class='wide'><table><tr>",
                  *[f"<th>{esc(h)}</th>" for _, h in TABLE_COLS], "</tr>"]
        parts += ["<tr>" + "".join(f"<td>{esc(_fmt(r[k]))}</td>" for k, _ in TABLE_COLS)
                  + "</tr>" for r in flat]
        parts.append("</table></div>")
    if coded:
        parts += ["<h2>Compression</h2><div class='wide'><table><tr>",
                  *[f"<th>{esc(h)}</th>" for h in compression_report.HEAD], "</tr>"]
        parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in coded]
        parts.append("</table></div>")
    if seed_rows:
        parts.append("<h2>Stages (total seconds)</h2><table><tr><th>run</th>"
                     + "".join(f"<th>{n} stages</th>" for n in counts) + "</tr>")
        parts += ["<tr><th>" + esc(name) + "</th>" + "".join(f"<td>{c}</td>" for c in cells)
                  + "</tr>" for name, cells in seed_rows]
        parts.append("</table>")
    if perf:
        parts.append("<h2>Link limit (perftest)</h2><table><tr><th>tool</th><th>size</th>"
                     "<th>result</th></tr>")
        parts += [f"<tr><td>{esc(r['algorithm'])}</td><td>{r['size']}</td>"
                  f"<td>{_perf(r['summary'])}</td></tr>" for r in perf]
        parts.append("</table>")
    parts.append("<h2>Plots</h2>")
    parts += [_img(n, d) for n, d in images.items() if n not in first]
    parts.append("</body></html>")
    html_path = results / "report.html"
    html_path.write_text("\n".join(parts))
    return html_path, md_path


def _perf(s: dict[str, Any]) -> str:
    return f"{s['bw_MBps']:.2f} MB/s" if "bw_MBps" in s else f"{s['lat_us']:.1f} us"


def _img(name: str, data: bytes) -> str:
    return (f"<p><img alt='{html.escape(name)}' "
            f"src='data:image/png;base64,{base64.b64encode(data).decode()}'></p>")

"""The report of one results directory: tables in OSU style with algbw/busbw, plots made with
matplotlib, and a plain-words summary; written as self-contained HTML (plots inlined) and as
Markdown (plots beside it). Reads only the results directory, so it can be made anywhere,
any time after the run.
"""

from __future__ import annotations

import base64
import html
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import jinja2
from rxelab import ops

from experiments.readable import size_text
from experiments.report import compression, ddp, elastic, headline, link, long_haul, plots
from experiments.report import view as view
from experiments.report.run_facts import facts, how_nodes_ran, mpi_rdma_note, run_status, text
from experiments.report.summary import BACK_TO_BACK, peak_to_mean, summary_lines
from experiments.report.view import Row
from experiments.running import counters
from experiments.running.records import (
    Environment,
    Load,
    NotARecord,
    Record,
    Summary,
    read_records,
)
from experiments.spec import contender, netem, ranks

# what a run records, for experiments/simulation (which reads runs through the report)
__all__ = ["Environment", "Load", "NotARecord", "Record", "Row", "Summary", "bandwidth", "load",
           "medians", "read_records", "rows", "write"]

TEMPLATES = Path(__file__).resolve().parent / "templates"


def _md(value: Any) -> str:
    """A value in Markdown: no raw HTML, link, image or heading gets through (a value from the
    results is text: its line breaks become spaces, its brackets stay brackets)."""
    text = html.escape(str(value), quote=False)
    return text.replace("[", "\\[").replace("]", "\\]").replace("\n", " ")


def load(results: Path) -> tuple[Environment, list[Record], list[Load]]:
    """A run's environment.json, records.jsonl and load.jsonl (experiments.running.records)."""
    env = Environment.read((results / "environment.json").read_text())
    records = read_records((results / "records.jsonl").read_text())
    loads_path = results / "load.jsonl"
    loads = [Load.from_json(x) for x in loads_path.read_text().splitlines() if x] \
        if loads_path.exists() else []
    return env, records, loads


def bandwidth(size: int, ranks: int, seconds: float, op: str = "alltoall") -> tuple[float, float]:
    """nccl-tests' model, per collective: algbw = bytes moved per rank / time, busbw = algbw *
    factor (each description's algbw_bytes and busbw, rxelab.ops), in MB/s."""
    if seconds <= 0 or ranks < 1:
        return 0.0, 0.0
    c = ops.COLLECTIVES[op]
    algbw = c.algbw_bytes(size, ranks) / seconds / 1e6
    return algbw, algbw * c.busbw(ranks)


def rows(records: list[Record]) -> list[Row]:
    """One flat row per collective case that produced figures: a summary, or the stages a
    timed-out case finished (avg only)."""
    out = []
    for r in records:
        if r.app == "perftest":
            continue
        s, partial = r.summary, r.partial
        if s is not None and s.avg_stage_us is not None and s.total_seconds is not None:
            avg, low, high, total = s.avg_stage_us, s.min_stage_us, s.max_stage_us, s.total_seconds
        elif r.status == "timeout" and partial and partial.stages_done:
            total = partial.seconds
            avg, low, high = total / partial.stages_done * 1e6, None, None
        else:
            continue
        algbw, busbw = bandwidth(r.size, ranks(r), avg / 1e6, r.op)
        imp, rxe = r.netem, r.rxe
        got = s if s is not None else Summary()  # a timed-out case's: no figure
        out.append(Row(
            contender=contender(r), app=r.app, op=r.op, algorithm=r.algorithm, nodes=r.nodes,
            size=r.size, stages=r.stages, network=network(imp, r.busy_hosts),
            loss=float(imp.get("loss", 0)), rtt_ms=2 * float(imp.get("delay_ms", 0)),
            loss_only=not any(v for k, v in imp.items() if k != "loss"),
            active_mtu=r.active_mtu or "-", avg_us=avg, min_us=low, max_us=high, total_s=total,
            algbw=algbw, busbw=busbw, wrong="-" if s is None else s.wrong, status=r.status,
            peak_pinned=got.peak_pinned, peak_inflight=got.peak_inflight,
            rxe_pkts=counters.total(rxe, "sent_pkts") if rxe else None,
            retries=counters.total(rxe, "completer_retry_err") if rxe else None,
            stage_seconds=r.stage_seconds, case=r.case, ranks=ranks(r), pairs=r.pairs,
            mode=BACK_TO_BACK if r.tight else "stages", data=r.data or "pattern",
            compression=r.compression or "none", ratio=got.compression_ratio,
            codec_ms_per_MiB=got.codec_ms_per_MiB, wire_per_call=got.wire_bytes_per_call,
            cpu_us=cpu_per_call(got), round=r.round, rounds=1, over_rxe=link.over_rxe(r)))
    return out


def cpu_per_call(s: Summary) -> float | None:
    """Rank 0's user and system CPU per call (us), where the app said both."""
    if s.cpu_user_us is None or s.cpu_sys_us is None:
        return None
    return float(s.cpu_user_us) + float(s.cpu_sys_us)


def network(imp: netem.Impairment, busy: list[str] | None) -> str:
    """What a case ran in: its impairment (netem's label, "none") and the nodes busy beside it
    (busy_neighbours), so a case beside busy nodes never reads as the same case alone."""
    if not isinstance(busy, list) or not busy:
        return netem.label(imp)
    loaded = f"{len(busy)} node{'s' if len(busy) > 1 else ''} busy beside"
    return f"{netem.label(imp)}, {loaded}" if any(imp.values()) else loaded


def medians(flat: list[Row]) -> list[Row]:
    """One row per case: of a case run in several rounds, the round it stands for among its
    rounds that ended ok (all of them when none did): the median, and of an even count the
    faster of the two middle rounds (view.MIDDLE_ROUND: a real round, whose every figure is
    that round's), with how many rounds there were and their range. Rows of one round are
    each their own."""
    by_case: dict[tuple[object, ...], list[Row]] = defaultdict(list)
    for r in flat:  # a case's number, and what it is (records put together by hand keep apart)
        by_case[(r.case, r.contender, r.op, r.algorithm, r.nodes, r.ranks, r.pairs, r.size,
                 r.stages, r.network, r.active_mtu, r.mode, r.data)].append(r)
    out = []
    for rs in by_case.values():
        good = [r for r in rs if r.status == "ok"]  # a round that ran out of time is no peer
        ranked = sorted(good or rs, key=lambda r: r.avg_us)
        out.append(replace(ranked[(len(ranked) - 1) // 2], rounds=len(ranked),
                           round_min_us=ranked[0].avg_us, round_max_us=ranked[-1].avg_us))
    return out


def figures(flat: list[Row], records: list[Record], loads: list[Load]) -> dict[str, bytes]:
    out = plots.size_scaling(flat, link.measured(records))
    load_ratio: dict[int, float] = {}
    for entry in loads:
        ratio = peak_to_mean(entry.samples)[2]
        load_ratio[entry.case] = max(load_ratio.get(entry.case, 0.0), ratio)
    for name, png in (("pairs.png", plots.pairs_dial(flat, load_ratio)),
                      ("stages.png", plots.stages(flat)),
                      ("ratio-to-ucx.png", plots.ratio_to(flat, "mpi-ucx")),
                      ("distribution.png", plots.distributions(flat)),
                      ("loss.png", plots.loss(flat)), ("memory.png", plots.memory(flat)),
                      ("load.png", plots.load_over_time(records, loads, peak_to_mean))):
        if png is not None:
            out[name] = png
    return out


def seed_table(flat: list[Row]) -> tuple[list[int], list[tuple[str, list[str]]]]:
    """The seed's table: total seconds per (contender algorithm) and number of stages, where a
    run has more than one stage count (the seed spec: 100, 1000, 10000)."""
    stage_counts = sorted({r.stages for r in flat})
    if len(stage_counts) < 2:
        return [], []
    cells: dict[str, dict[int, float]] = defaultdict(dict)
    for r in flat:  # the same case at more stage counts: nodes and network tell cases apart
        where = "" if r.network == "none" else f", {r.network}"
        cells[f"{r.contender} {r.op}/{r.algorithm} {r.nodes} nodes "
              f"{size_text(r.size)}{where}"][r.stages] = r.total_s
    return stage_counts, [(name, [f"{by[n]:.2f}" if n in by else "-" for n in stage_counts])
                          for name, by in sorted(cells.items())]


class ScenarioReport(Protocol):
    """What the report and the run's verdict (fabfile) read of a scenario's records: its
    module (report/elastic.py, report/ddp.py) is one."""

    NAME: str  # the spec's table, and the file: <NAME>.jsonl, <NAME>.png
    WHAT: str  # in the verdict: "<WHAT> did not end well"
    HEADING: str  # its section of the report
    def load(self, results: Path, /) -> list[Any]: ...
    def summary_lines(self, records: list[Any], /) -> list[str]: ...  # first in the summary
    def figure(self, records: list[Any], /) -> bytes | None: ...
    def table(self, records: list[Any], /) -> tuple[list[str], list[list[str]]]: ...
    def problems(self, records: list[Any], /) -> list[str]: ...  # what fails the run
    def not_run(self, records: list[Any], /) -> list[str]: ...  # skipped, and why: no failure


SCENARIOS: tuple[ScenarioReport, ...] = (elastic, ddp)


def write(results: Path) -> tuple[Path, Path]:
    env, records, loads = load(results)
    flat = medians(rows(records))
    measured = link.measured(records)
    link.share(flat, measured)
    images = figures(flat, records, loads)
    summary = summary_lines(flat, records, loads)
    sections = []
    for scenario in SCENARIOS:
        said = scenario.load(results)
        if not said:
            continue
        summary = [*scenario.summary_lines(said), *summary[1:]]
        if (png := scenario.figure(said)) is not None:
            images = {f"{scenario.NAME}.png": png, **images}
        head, table = scenario.table(said)
        if table:
            sections.append({"heading": scenario.HEADING, "head": head, "rows": table})
    coded = compression.table(flat)
    if coded:
        sections.append({"heading": "Compression", "head": compression.HEAD, "rows": coded})
    if far := long_haul.points(flat, records):
        summary = [*summary, *long_haul.lines(far)]
        for heading, (head, table) in (("The seeds' claims on long links", long_haul.claims(far)),
                                       ("Long-haul: ms per call by link", long_haul.table(far))):
            if table:
                sections.append({"heading": heading, "head": head, "rows": table})
        if (png := long_haul.figure(far)) is not None:
            images = {"long-haul.png": png, **images}
    for name, data in images.items():
        (results / name).write_bytes(data)
    shared = view.constants(flat)
    counts, seed_rows = seed_table(flat)
    first = [n for n in ("long-haul.png", "ddp.png", "elastic.png", "stages.png", "loss.png", "pairs.png",
                         "ratio-to-ucx.png") if n in images]
    page = {
        "title": f"rxelab report: {text(env.spec) or results.name}",
        "constants": [(head, value) for key, head, value in shared if key != "status"]
        + [("status", run_status(env, records))],
        "headlines": headline.headlines(flat, {k for k, _, _ in shared}),
        "note": how_nodes_ran(env)[1], "sections": sections,
        "incomplete": not env.complete,
        "tables": view.compact(flat, {k for k, _, _ in shared}),
        "cpu_tables": view.cpu_tables(flat, {k for k, _, _ in shared}),
        "summary": summary, "facts": facts(env, results), "middle_round": view.MIDDLE_ROUND,
        "seed": {"counts": counts, "rows": seed_rows} if seed_rows else None,
        "perf": [(r.algorithm, size_text(r.size), _perf(r.summary))
                 for r in records if r.app == "perftest" and r.summary],
        "full": dict(zip(("head", "rows"), view.full_table(flat, {h for _, h, _ in shared}),
                         strict=True)) if flat else None,
        "mpi_note": mpi_rdma_note(env), "full_note": view.NOTE_FULL, "link_note": measured.note}
    md_path, html_path = results / "report.md", results / "report.html"
    md_path.write_text(_template("report.md.j2", markdown=True).render(
        **page, images=bool(images), image_names=[*first, *(n for n in images if n not in first)]))
    html_path.write_text(_template("report.html.j2").render(
        **page, first_images=[(n, _data_uri(images[n])) for n in first],
        images=[(n, _data_uri(d)) for n, d in images.items() if n not in first]))
    return html_path, md_path


def _template(name: str, markdown: bool = False) -> jinja2.Template:
    """HTML escapes every value; Markdown escapes what a renderer would read as HTML, and a
    table cell its pipes."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, autoescape=not markdown,
                             finalize=_md if markdown else None)
    env.filters["cell"] = _cell
    return env.get_template(name)


def _cell(value: Any) -> str:
    """A Markdown table cell: one line, its backslashes and pipes escaped."""
    return " ".join(str(value).replace("\\", "\\\\").replace("|", "\\|").split())


def _perf(s: Summary) -> str:
    return f"{s.bw_MBps:.2f} MB/s" if s.bw_MBps is not None else f"{s.lat_us:.1f} us"


def _data_uri(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"

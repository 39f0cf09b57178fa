"""What a run says of a case in a line: its label while it runs, its outcome when it ends, and
the last lines of output that explain a failure."""

from __future__ import annotations

from experiments.readable import ms_text, size_text
from experiments.running import counters
from experiments.running.records import Record
from experiments.spec import Case, contender, netem


def label(case: Case) -> str:
    extra = "".join([f", {case.ranks_per_node} ranks per node" if case.ranks_per_node else "",
                     f", pairs={case.pairs}" if case.pairs else "",
                     f", {case.data} data" if case.data else "",
                     f", MTU {case.mtu}" if case.mtu else "",
                     f", {netem.label(case.netem)}" if any(case.netem.values()) else "",
                     f", {case.busy_neighbours} busy beside" if case.busy_neighbours else ""])
    return (f"{contender(case)} {case.op}/{case.algorithm} {case.nodes} nodes "
            f"{size_text(case.size)} x {case.stages}{' back to back' if case.tight else ''}"
            f"{extra}")


def outcome(record: Record) -> str:
    shown = record.summary
    moved = counters.total(record.rxe, "sent_pkts")
    pkts = f", {moved} rxe packets" if record.rxe else ""
    if shown is not None and shown.avg_stage_us is not None:
        return f"{ms_text(shown.avg_stage_us)} ms/{'call' if shown.tight else 'stage'}{pkts}"
    if shown is not None:
        return (f"{shown.bw_MBps:.2f} MB/s{pkts}" if shown.bw_MBps is not None
                else f"{shown.lat_us or 0:.2f} us{pkts}")
    partial = record.partial
    done = f" ({partial.stages_done} stages done)" if partial else ""
    return " ".join((record.error or "").split())[:200] + done  # one line, however it broke


def tail(text: str, lines: int = 15) -> str:
    """The last lines that say something: not the JSON records, not `#` notes."""
    said = [x for x in text.strip().splitlines()
            if not x.split("] ", 1)[-1].lstrip().startswith(("{", "#"))]
    return "\n".join(said[-lines:]) or "no output"

"""What a run says of a case in a line: its label while it runs, its outcome when it ends, and
the last lines of output that explain a failure."""

from __future__ import annotations

from typing import Any

from experiments.readable import ms_text, size_text
from experiments.running import counters
from experiments.spec import contender, netem


def label(case: dict[str, Any]) -> str:
    extra = "".join([f", {case['ranks_per_node']} ranks per node" if case.get("ranks_per_node") else "",
                     f", pairs={case['pairs']}" if case.get("pairs") else "",
                     f", {case['data']} data" if case.get("data") else "",
                     f", MTU {case['mtu']}" if case.get("mtu") else "",
                     f", {netem.label(case['netem'])}" if any(case.get("netem", {}).values()) else "",
                     f", {case['busy_neighbours']} busy beside" if case.get("busy_neighbours") else ""])
    return (f"{contender(case)} {case['op']}/{case['algorithm']} {case['nodes']} nodes "
            f"{size_text(case['size'])} x {case['stages']}{' back to back' if case.get('tight') else ''}"
            f"{extra}")


def outcome(record: dict[str, Any]) -> str:
    shown = record.get("summary", {})
    moved = counters.total(record.get("rxe", {}), "sent_pkts")
    pkts = f", {moved} rxe packets" if record.get("rxe") else ""
    if "avg_stage_us" in shown:
        return f"{ms_text(shown['avg_stage_us'])} ms/{'call' if shown.get('tight') else 'stage'}{pkts}"
    if shown:
        return (f"{shown['bw_MBps']:.2f} MB/s{pkts}" if "bw_MBps" in shown
                else f"{shown.get('lat_us', 0):.2f} us{pkts}")
    partial = record.get("partial")
    done = f" ({partial['stages_done']} stages done)" if partial else ""
    return " ".join(record.get("error", "").split())[:200] + done  # one line, however it broke


def tail(text: str, lines: int = 15) -> str:
    """The last lines that say something: not the JSON records, not `#` notes."""
    said = [x for x in text.strip().splitlines()
            if not x.split("] ", 1)[-1].lstrip().startswith(("{", "#"))]
    return "\n".join(said[-lines:]) or "no output"

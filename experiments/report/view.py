"""What the report shows, in the order a reader wants it, built once from the flat rows for both
templates (report.html.j2, report.md.j2): compact tables (a row per size, contenders side by
side), the constants every row shares, and the full table without them (the headline above
them is report/headline.py's). A difference inside the rounds' spread is marked as such, never
called a win."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from experiments.readable import ms_text, size_text


@dataclass
class Row:
    """A case's figures as the report shows them, one per round (experiments.report.rows makes
    them from the records); of a case run in rounds, report.medians keeps the round it stands
    for (MIDDLE_ROUND), with how many rounds there were and their range."""

    contender: str  # experiments.spec.contender
    app: str
    op: str
    algorithm: str
    nodes: int
    size: int
    avg_us: float  # per call, the slowest rank's
    status: str
    network: str = "none"  # its impairment and the nodes busy beside it, as a reader reads them
    mode: str = "stages"  # or back to back
    data: str = "pattern"
    compression: str = "none"
    stages: int = 1
    ranks: int = 0
    case: int = 0
    round: int = 0
    pairs: int | None = None
    active_mtu: int | str = "-"
    loss: float = 0.0
    loss_only: bool = True  # no impairment but loss
    rtt_ms: float = 0.0  # the round trip netem added (two nodes' delays)
    min_us: float | None = None
    max_us: float | None = None
    total_s: float = 0.0
    algbw: float = 0.0
    busbw: float = 0.0
    wrong: int | str | None = "-"
    peak_pinned: int | None = None
    peak_inflight: int | None = None
    rxe_pkts: int | None = None
    retries: int | None = None
    stage_seconds: list[float] | None = None
    ratio: float | None = None  # compression's
    codec_ms_per_MiB: float | None = None
    wire_per_call: float | None = None
    rounds: int = 1
    round_min_us: float | None = None
    round_max_us: float | None = None
    link_pct: float | None = None  # report/link.py's share
    link_note: str = ""  # ...or why a row has none (not over rxe)
    over_rxe: bool = True  # rxe carried its bytes (report/link.py's over_rxe)
    cpu_us: float | None = None  # rank 0's user + system CPU per call


# what one compact table shares (its cases differ only in contender, algorithm and size)
SETTING = ("op", "nodes", "ranks", "stages", "mode", "network", "active_mtu", "data", "compression")
SETTING_LABELS = {"nodes": "{} nodes", "ranks": "{} ranks", "stages": "{} calls",
                  "network": "network {}", "active_mtu": "RoCE MTU {}", "data": "{} data",
                  "compression": "compression {}"}
# the full table: (key, heading, how a value reads)
FULL_COLUMNS: list[tuple[str, str, str]] = [
    ("contender", "contender", "text"), ("op", "op", "text"), ("algorithm", "algorithm", "text"),
    ("nodes", "nodes", "text"), ("ranks", "ranks", "text"), ("pairs", "pairs at once", "text"),
    ("size", "size", "size"), ("stages", "calls", "text"), ("mode", "timed", "text"),
    ("rounds", "rounds", "text"), ("data", "data", "text"), ("network", "network", "text"),
    ("compression", "compression", "text"), ("active_mtu", "RoCE MTU", "text"),
    ("avg_us", "ms per call", "ms"), ("spread", "rounds' range (ms)", "text"),
    ("min_us", "fastest call (ms)", "ms"), ("max_us", "slowest call (ms)", "ms"),
    ("algbw", "algbw (MB/s)", "num"), ("busbw", "busbw (MB/s)", "num"),
    ("link_pct", "% of link", "num"), ("cpu_us", "CPU per call (ms, rank 0)", "ms"),
    ("wrong", "#wrong", "text"), ("rxe_pkts", "rxe pkts", "text"),
    ("retries", "rxe retries", "text"), ("status", "status", "text")]
CONSTANT_KEYS = ("op", "nodes", "ranks", "pairs", "stages", "mode", "rounds", "data", "network",
                 "compression", "active_mtu", "wrong", "status")
# the round a case of several rounds stands for, as every table and line of the report says it
MIDDLE_ROUND = ("each case's median round; of an even count of rounds, the faster of the two "
                "middle ones (of 2 rounds, the faster)")
NOTE_FULL = ("ms per call: the slowest rank's average over the calls of its round (rounds: "
             f"{MIDDLE_ROUND}); "
             "fastest/slowest call: over those calls (the bench's own Min/Max Latency are over "
             "ranks, as OSU's -f); rounds' range: the lowest and highest round's ms per call.")


def middle_of(rounds: int) -> str:
    """Which of a case's rounds its row is, in a few words (MIDDLE_ROUND)."""
    if rounds % 2:
        return f"the median of {rounds} rounds"
    if rounds == 2:
        return "the faster of 2 rounds"
    return f"the faster middle one of {rounds} rounds"


def series_name(r: Row) -> str:
    k = f" k={r.pairs}" if (r.pairs or 1) > 1 else ""
    return f"{r.contender} {r.algorithm}{k}"


def ours_(r: Row) -> bool:
    """rxelab's own rows, its variants too (rxelab-eager0: rendezvous only; rxelab-zstd)."""
    return r.contender.startswith("rxelab")


def overlap(a: Row, b: Row) -> bool:
    """Whether two cases, each run in several rounds, have overlapping ranges of rounds: no
    real difference between them. A case of one round has no spread to judge by."""
    if a.rounds < 2 or b.rounds < 2:
        return False
    (alo, ahi), (blo, bhi) = spread(a), spread(b)
    return alo <= bhi and blo <= ahi


def spread(r: Row) -> tuple[float, float]:
    """The lowest and highest round's time per call (us); a case of one round: its own."""
    low, high = r.round_min_us, r.round_max_us
    return (float(r.avg_us if low is None else low), float(r.avg_us if high is None else high))


def range_text(r: Row) -> str:
    lo, hi = spread(r)
    return "-" if r.rounds < 2 else f"{ms_text(lo)}-{ms_text(hi)}"


def _value(r: Row, key: str, how: str) -> str:
    if key == "spread":
        return range_text(r)
    if key == "link_pct" and r.link_pct is None and r.link_note:
        return r.link_note
    v = getattr(r, key)  # a column of FULL_COLUMNS: a field of Row
    if v is None or v == "":
        return "-"
    if how == "size":
        return size_text(v)
    if how == "ms":
        return ms_text(v)
    if how == "num" and isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3g}"
    return str(v)


@dataclass
class Cell:
    text: str  # ms per call
    range: str  # the rounds' range, or ""
    best: bool = False
    inside: bool = False  # its range overlaps the best's: no real difference


@dataclass
class Table:
    title: str
    series: list[str]
    rows: list[tuple[str, list[Cell | None]]]  # (size, a cell per series)



def settings(flat: list[Row]) -> dict[tuple, list[Row]]:
    out: dict[tuple, list[Row]] = defaultdict(list)
    for r in flat:
        out[tuple(getattr(r, k) for k in SETTING)].append(r)
    return dict(sorted(out.items(), key=lambda kv: order(kv[0])))


def order(key: tuple) -> tuple:
    """A sort key that puts numbers in numeric order (2 nodes before 16) and text after them."""
    return tuple((0, x, "") if isinstance(x, (int, float)) and not isinstance(x, bool)
                 else (1, 0, str(x)) for x in key)


def constants(flat: list[Row]) -> list[tuple[str, str, str]]:
    """(key, heading, value) of every describing column that is the same on every row: said
    once in the report's header, not in a column."""
    if not flat:
        return []
    out = []
    for key, head, how in FULL_COLUMNS:
        if key not in CONSTANT_KEYS:
            continue
        values = {_value(r, key, how) for r in flat}
        if len(values) == 1 and (value := values.pop()) != "-":
            out.append((key, head, value))
    return out


def setting_title(key: tuple, shared: set[str]) -> str:
    """The op and whatever of its setting is not already a constant of the whole run."""
    values = dict(zip(SETTING, key, strict=True))
    parts = [str(values["op"])]
    for k in SETTING[1:]:
        if k in shared or values[k] in (None, "-", "none", "pattern"):
            continue
        if k == "stages":
            parts.append(f"{values[k]} calls")
        elif k == "mode":
            parts.append("back to back" if values[k] != "stages" else "as stages")
        else:
            parts.append(SETTING_LABELS[k].format(values[k]))
    return ", ".join(parts)


def _by_setting(flat: list[Row], shared: set[str]
                ) -> list[tuple[str, list[str], list[tuple[int, dict[str, Row]]]]]:
    """The cases that ended ok per setting: its title, its series (rxelab's first) and, per
    size, each series' row."""
    out = []
    for key, rs in settings([r for r in flat if r.status == "ok"]).items():
        names = sorted({series_name(r) for r in rs},
                       key=lambda n: (not n.startswith("rxelab"), n))
        by_size: dict[int, dict[str, Row]] = defaultdict(dict)
        for r in rs:
            by_size[r.size][series_name(r)] = r
        out.append((setting_title(key, shared), names, sorted(by_size.items())))
    return out


def compact(flat: list[Row], shared: set[str]) -> list[Table]:
    """Per setting: a row per size, a column per series, the best of each row marked and
    those whose rounds overlap the best's marked as inside its spread."""
    out = []
    for title, names, sizes in _by_setting(flat, shared):
        rows = []
        for size, here in sizes:
            best = min(here.values(), key=lambda r: r.avg_us)
            cells: list[Cell | None] = []
            for n in names:
                found = here.get(n)
                if found is None:
                    cells.append(None)
                    continue
                rng = range_text(found)
                cells.append(Cell(ms_text(found.avg_us), "" if rng == "-" else rng,
                                  found is best, found is not best and overlap(found, best)))
            rows.append((size_text(size), cells))
        out.append(Table(title, names, rows))
    return out


def cpu_tables(flat: list[Row], shared: set[str]) -> list[Table]:
    """compact's tables with rank 0's CPU per call (user + system, of MIDDLE_ROUND) in
    place of time: under TCG a call's time is mostly CPU, so a contender that is slower and
    busier is CPU-bound, one slower but idle waits on something. None when no case said it."""
    if not any(r.cpu_us is not None for r in flat):
        return []
    out = []
    for title, names, sizes in _by_setting(flat, shared):
        rows = []
        for size, here in sizes:
            cells: list[Cell | None] = []
            for n in names:
                found = here.get(n)
                cells.append(None if found is None or found.cpu_us is None
                             else Cell(ms_text(found.cpu_us), ""))
            rows.append((size_text(size), cells))
        out.append(Table(title, names, rows))
    return out



def full_table(flat: list[Row], shared_heads: set[str]) -> tuple[list[str], list[list[str]]]:
    """Every case, without the columns the header states and those empty on every row."""
    cols = [(k, h, how) for k, h, how in FULL_COLUMNS if h not in shared_heads
            and any(_value(r, k, how) != "-" for r in flat)]
    return [h for _, h, _ in cols], [[_value(r, k, how) for k, _, how in cols] for r in flat]

"""The long-haul study's answers (issue 58, spec long-haul): each contender's time per call as
the round trip grows and as loss grows, per collective and size; where one collapses or
fails; where quic beats tcp and rxe, and by how much; what bf16 on the wire buys; and the
seeds' three claims held against those figures. Only cases on a delayed link count (a netem
delay): a loss-only study (spec lossy) is the Summary's.

Reads the report's rows (one per case: the round it stands for, view.MIDDLE_ROUND) and, for a
case that ended without figures in every round, its records.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from experiments.readable import size_text
from experiments.report import figure_style as fs
from experiments.report.view import Row
from experiments.spec import contender

COLLAPSE = 10.0  # a call this many times slower than on the contender's shortest link: collapsed
PAYS = 0.9  # a codec whose median time is at most this share of the uncoded one's pays
TCP_BASED = ("rxelab-tcp", "mpi-tcp", "gloo")  # contenders whose data rides kernel TCP
BASE_HEAD = ["op", "size", "contender"]
# a colour per transport (a study of transports: rxelab's algorithm is one here), bf16 dashed
COLOURS = {"rxelab": "#1f77b4", "rxelab-tcp": "#ff7f0e", "rxelab-quic": "#2ca02c",
           "gloo": "#8c564b", "mpi-ucx": "#000000", "mpi-tcp": "#7f7f7f"}
MARKERS = {"rxelab": "o", "rxelab-tcp": "s", "rxelab-quic": "^", "gloo": "D", "mpi-ucx": "v",
           "mpi-tcp": "P"}


@dataclass(frozen=True)
class Point:
    """One contender's case on one link: its time per call, or why it has none."""

    contender: str
    op: str
    size: int
    rtt_ms: float
    loss: float
    ms: float | None  # None: failed or timed out (status says which)
    status: str

    @property
    def link(self) -> tuple[float, float]:
        return self.rtt_ms, self.loss


def link_label(link: tuple[float, float]) -> str:
    rtt, loss = link
    return f"RTT {rtt:g} ms" + (f", loss {loss:g} %" if loss else "")


def points(flat: list[Row], records: list[Any]) -> list[Point]:
    """Every case on a delayed link: the rows (each its case's middle round), then the cases with
    no figures at all."""
    out = [Point(r.contender, r.op, r.size, r.rtt_ms, r.loss,
                 r.avg_us / 1e3 if r.status == "ok" else None, r.status)
           for r in flat if r.rtt_ms > 0]
    seen = {(p.contender, p.op, p.size, p.link) for p in out}
    for rec in records:
        rtt = 2 * float(rec.netem.get("delay_ms", 0))
        if rtt <= 0 or rec.app == "perftest":
            continue
        key = (contender(rec), rec.op, rec.size, (rtt, float(rec.netem.get("loss", 0))))
        if key not in seen:
            seen.add(key)
            out.append(Point(key[0], rec.op, rec.size, rtt, key[3][1], None, rec.status))
    return out


def _base(pts: list[Point]) -> dict[tuple[str, str, int], float]:
    """Each contender's time on its shortest lossless link, per op and size."""
    out: dict[tuple[str, str, int], tuple[float, float]] = {}
    for p in pts:
        if p.ms is not None and p.loss == 0:
            key = (p.contender, p.op, p.size)
            if key not in out or p.rtt_ms < out[key][0]:
                out[key] = (p.rtt_ms, p.ms)
    return {k: v[1] for k, v in out.items()}


def collapsed(p: Point, base: dict[tuple[str, str, int], float]) -> bool:
    """Failed, or COLLAPSE times its shortest link's time."""
    if p.ms is None:
        return True
    first = base.get((p.contender, p.op, p.size))
    return first is not None and p.ms >= COLLAPSE * first


def table(pts: list[Point]) -> tuple[list[str], list[list[str]]]:
    """A row per op, size and contender; a column per link (round trip, then loss)."""
    links = sorted({p.link for p in pts}, key=lambda link: (link[1] > 0, link))
    base = _base(pts)
    cells = {(p.op, p.size, p.contender, p.link): p for p in pts}
    rows = []
    for op, size, who in sorted({(p.op, p.size, p.contender) for p in pts}):
        row = [op, size_text(size), who]
        for link in links:
            p = cells.get((op, size, who, link))
            if p is None:
                row.append("-")
            elif p.ms is None:
                row.append("failed" if p.status != "timeout" else "timed out")
            else:
                row.append(f"{p.ms:.1f}" + (" (collapsed)" if collapsed(p, base) else ""))
        rows.append(row)
    return BASE_HEAD + [f"{link_label(link)} (ms)" for link in links], rows


def _ratios(pts: list[Point], mine: str, theirs: str) -> list[tuple[float, Point]]:
    """mine's time over theirs' wherever both have one: (ratio, mine's point)."""
    by = {(p.contender, p.op, p.size, p.link): p for p in pts}
    out = []
    for p in pts:
        if p.contender == mine and p.ms is not None:
            other = by.get((theirs, p.op, p.size, p.link))
            if other is not None and other.ms:
                out.append((p.ms / other.ms, p))
    return out


def _where(p: Point) -> str:
    return f"{p.op} {size_text(p.size)}, {link_label(p.link)}"


def beats(pts: list[Point], mine: str, theirs: str) -> str | None:
    """One line: in how many cases mine takes less time than theirs, and the best and worst."""
    seen = sorted(_ratios(pts, mine, theirs), key=lambda x: x[0])
    if not seen:
        return None
    won = [x for x in seen if x[0] < 1]
    best, worst = seen[0], seen[-1]
    return (f"{mine} is faster than {theirs} in {len(won)} of {len(seen)} cases on long links; "
            f"at best it takes {best[0]:.2f}x {theirs}'s time ({_where(best[1])}), at worst "
            f"{worst[0]:.2f}x ({_where(worst[1])}).")


def lines(pts: list[Point]) -> list[str]:
    """The Summary's words: quic against tcp and rxe, bf16 against none, and who collapsed."""
    out = [line for mine, theirs in (("rxelab-quic", "rxelab-tcp"), ("rxelab-quic", "rxelab"),
                                     ("rxelab-tcp", "gloo"), ("rxelab-tcp", "mpi-tcp"))
           if (line := beats(pts, mine, theirs)) is not None]
    for plain in ("rxelab", "rxelab-tcp", "rxelab-quic"):
        coded = plain.replace("rxelab", "rxelab-bf16", 1)
        if (line := beats(pts, coded, plain)) is not None:
            out.append(line)
    base = _base(pts)
    for who in sorted({p.contender for p in pts}):
        down = sorted((p for p in pts if p.contender == who and collapsed(p, base)),
                      key=lambda p: (p.link, p.size))
        if down:
            out.append(f"{who} collapsed (failed, or {COLLAPSE:g}x its time on its shortest "
                       f"link) in {len(down)} cases, first at {_where(down[0])}.")
    return out


def _penalty(pts: list[Point], who: str, size: int, op: str) -> tuple[float, float] | None:
    """(time at the longest round trip / at the shortest, time at the most loss / lossless at
    that round trip) of one contender's op at one size."""
    mine = [p for p in pts if p.contender == who and p.op == op and p.size == size and p.ms]
    clean = sorted((p for p in mine if p.loss == 0), key=lambda p: p.rtt_ms)
    lossy = sorted((p for p in mine if p.loss > 0), key=lambda p: p.loss)
    if len(clean) < 2 or not lossy:
        return None
    at = next((p for p in clean if p.rtt_ms == lossy[-1].rtt_ms), None)
    if at is None or not clean[0].ms or not at.ms or clean[-1].ms is None or lossy[-1].ms is None:
        return None
    return clean[-1].ms / clean[0].ms, lossy[-1].ms / at.ms


def claims(pts: list[Point]) -> tuple[list[str], list[list[str]]]:
    """The seeds' three claims, each with what the lab measured and whether it holds here."""
    rows: list[list[str]] = []
    op = "allreduce" if any(p.op == "allreduce" for p in pts) else "alltoall"
    sizes = sorted({p.size for p in pts if p.op == op})
    if not sizes:
        return [], []
    size = sizes[-1]
    where = f"{op} {size_text(size)}"
    tcp = {who: pen for who in TCP_BASED if (pen := _penalty(pts, who, size, op))}
    if tcp:
        worst = max(pen[1] for pen in tcp.values())
        said = "; ".join(f"{who}: {pen[0]:.1f}x from the shortest to the longest round trip, "
                         f"{pen[1]:.1f}x at the most loss" for who, pen in tcp.items())
        rows.append(["TCP suffers badly at high latency and loss", f"{where}: {said}",
                     "holds" if worst >= 2 else "does not hold here (less than 2x at the most loss)"])
    else:
        rows.append(["TCP suffers badly at high latency and loss", "not measured", "-"])
    quic, mine = _penalty(pts, "rxelab-quic", size, op), tcp.get("rxelab-tcp")
    vs = _ratios([p for p in pts if p.op == op and p.size == size], "rxelab-quic", "rxelab-tcp")
    if quic and mine and vs:
        far = max(vs, key=lambda x: (x[1].rtt_ms, x[1].loss))
        near = min(vs, key=lambda x: (x[1].loss, x[1].rtt_ms))
        hidden = (f"; on the shortest link it takes {near[0]:.1f}x rxelab-tcp's time: its own "
                  "cost, not the link's, sets its pace" if near[0] >= 3 else "")
        rows.append(["QUIC keeps transfers efficient there",
                     f"{where}: rxelab-quic {quic[0]:.1f}x over the round trips, {quic[1]:.1f}x "
                     f"at the most loss (rxelab-tcp: {mine[0]:.1f}x, {mine[1]:.1f}x); at "
                     f"{link_label(far[1].link)} it takes {far[0]:.2f}x rxelab-tcp's time{hidden}",
                     "holds" if quic[1] < mine[1] and far[0] < 1 else "does not hold here"])
    else:
        rows.append(["QUIC keeps transfers efficient there", "not measured", "-"])
    here = [p for p in pts if p.op == op and p.size == size]
    coded = {plain: [r for r, _ in _ratios(here, plain.replace("rxelab", "rxelab-bf16", 1), plain)]
             for plain in ("rxelab-tcp", "rxelab-quic", "rxelab")}
    medians = {plain: statistics.median(rs) for plain, rs in coded.items() if rs}
    if medians:
        paid = [plain for plain, m in medians.items() if m <= PAYS]
        said = ", ".join(f"{plain} {m:.2f}x ({len(coded[plain])} links)" for plain, m in medians.items())
        rows.append(["Compression saves bandwidth on such links",
                     f"{where}, bf16 on the wire (half the bytes), its median time over the "
                     f"uncoded one's: {said}",
                     f"holds for {', '.join(paid)}" if paid else
                     "does not hold here (the coding costs about what the bytes it saves do)"])
    else:
        rows.append(["Compression saves bandwidth on such links", "not measured", "-"])
    return ["claim", "what the lab measured", "verdict"], rows


def figure(pts: list[Point]) -> bytes | None:
    """Time per call against the round trip (no loss) and against loss (at the lossy links'
    round trip), a column per size of the op with the most sizes; a failed case is an x at
    the top of its panel."""
    if not pts:
        return None
    op = max({p.op for p in pts}, key=lambda o: (len({p.size for p in pts if p.op == o}), o))
    mine = [p for p in pts if p.op == op]
    sizes = sorted({p.size for p in mine})
    lossy_rtt = statistics.mode([p.rtt_ms for p in mine if p.loss > 0] or [0.0])
    losses = sorted({p.loss for p in mine if p.rtt_ms == lossy_rtt})

    def at(p: Point, along: str) -> float:
        return p.rtt_ms if along == "rtt_ms" else float(losses.index(p.loss))

    fig, axes = fs.plt.subplots(2, len(sizes), figsize=(3.2 * len(sizes) + 1.5, 6.4),
                                squeeze=False)
    for col, size in enumerate(sizes):
        for row, (along, keep) in enumerate((("rtt_ms", lambda p: p.loss == 0),
                                             ("loss", lambda p: p.rtt_ms == lossy_rtt))):
            ax = axes[row][col]
            for who in sorted({p.contender for p in mine}):
                series = sorted((p for p in mine if p.contender == who and p.size == size
                                 and keep(p)), key=lambda p: getattr(p, along))
                good = [p for p in series if p.ms is not None]
                style = _style(who)
                if good:
                    ax.plot([at(p, along) for p in good], [p.ms for p in good], label=who, **style)
                for p in series:
                    if p.ms is None:
                        ax.plot([at(p, along)], [1], marker="x", color=style["color"],
                                transform=ax.get_xaxis_transform(), clip_on=False)
            ax.set_yscale("log")
            fs.plain_log(ax)
            if along == "rtt_ms":
                ax.set_xlabel("round trip (ms)")
            else:  # 0, 0.01, 0.1, 1 %: evenly spaced, as read
                ax.set_xticks(range(len(losses)), [f"{x:g}" for x in losses])
                ax.set_xlabel(f"loss (%) at RTT {lossy_rtt:g} ms")
            ax.set_title(f"{op} {size_text(size)}", fontsize=9)
            if col == 0:
                ax.set_ylabel("ms per call")
    fs.legend_outside(axes[0][-1])
    fig.tight_layout()
    return fs.png(fig)


def _style(who: str) -> dict[str, Any]:
    """The transport's colour and marker; a bf16 variant dashed, its marker hollow."""
    base = who.replace("-bf16", "", 1)
    coded = base != who
    return {"color": COLOURS.get(base, "#9467bd"), "marker": MARKERS.get(base, "x"),
            "markersize": 5, "linestyle": "--" if coded else "-",
            "markerfacecolor": "none" if coded else COLOURS.get(base, "#9467bd")}

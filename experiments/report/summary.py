"""The report's plain words: one line per finding (what ran and verified, who led each group of
cases and by how much, what impairment did, how busy the links were), read from the records
alone, and the load samples' peak over mean."""

from __future__ import annotations

from collections import defaultdict

from rxelab import ops

from experiments.readable import ms_text, size_text
from experiments.report import compression
from experiments.report.headline import contender_title, time_change
from experiments.report.view import Row, middle_of, order, ours_, overlap
from experiments.running import counters
from experiments.running.records import Load, Record, Sample
from experiments.spec import contender, netem

BACK_TO_BACK = "back to back"  # how a case timed call by call is named


def peak_to_mean(samples: list[Sample]) -> tuple[list[float], list[float], float]:
    """Throughput over time (MB/s, tx+rx; times are the samples' wall clock) from cumulative
    byte counters, and its peak/mean over the busy samples."""
    ts, rates = [], []
    for a, b in zip(samples, samples[1:], strict=False):
        dt = b.t - a.t
        if dt <= 0 or a.tx_bytes is None or b.tx_bytes is None or a.rx_bytes is None \
                or b.rx_bytes is None:
            continue
        moved = (b.tx_bytes - a.tx_bytes) + (b.rx_bytes - a.rx_bytes)
        ts.append(b.t)  # wall-clock: nodes' curves line up (as far as their clocks agree)
        rates.append(moved / dt / 1e6)
    busy = busy_samples(rates)
    ratio = max(busy) / (sum(busy) / len(busy)) if busy else 0.0
    return ts, rates, ratio


MOVED_MBPS = 1.0  # a case's data NIC peak below this moved too little for its load to say much


def load_moved(samples: list[Sample]) -> bool:
    """Whether the case moved enough on the data NIC for its load's shape to mean something:
    a peak of at least MOVED_MBPS (a 1 KiB all-to-all's few KB sit below the launch's own
    TCP chatter)."""
    return max(peak_to_mean(samples)[1], default=0.0) >= MOVED_MBPS


def busy_samples(rates: list[float]) -> list[float]:
    """The samples of the collective itself: above a tenth of the peak (the launch's own
    small TCP traffic on the data NIC stays below it)."""
    peak = max(rates, default=0.0)
    return [x for x in rates if peak > 0 and x > 0.1 * peak]


def summary_lines(flat: list[Row], records: list[Record], loads: list[Load]) -> list[str]:
    lines = []
    skipped = [r for r in records if r.status == "skipped"]
    bad = [r for r in records if r.status not in ("ok", "skipped")]
    ok = len(records) - len(bad) - len(skipped)
    failed = ", ".join(f"{contender(r)} {r.algorithm} ({r.status})" for r in bad)
    lines.append(f"{ok} of {len(records)} cases ran and verified their data"
                 + (f"; not ok: {failed}" if bad else "."))
    for who in sorted({contender(r) for r in skipped}):
        mine = [r for r in skipped if contender(r) == who]
        lines.append(f"{len(mine)} {who} cases were not run: {_said(mine[0].error, 'skipped')}.")
    ended_badly = [r for r in records if r.after_summary]
    for who in sorted({contender(r) for r in ended_badly}):
        mine = [r for r in ended_badly if contender(r) == who]
        lines.append(f"{len(mine)} {who} cases printed verified figures, then their job did not end "
                     f"well (kept; records' after_summary): {_said(mine[0].after_summary)[:160]}")
    done = [r for r in flat if r.status == "ok"]
    for (op, nodes, size, stages, net, mtu, mode, data), rs in sorted(
            _groups(done).items(), key=lambda kv: order(kv[0])):
        if len(rs) < 2:
            continue
        rs = sorted(rs, key=lambda r: r.avg_us)
        best, worst = rs[0], rs[-1]
        calls = f"{stages} calls back to back" if mode == BACK_TO_BACK else f"{stages} stages"
        where = f"{op}, {nodes} nodes, {size_text(size)} {size_unit(op)}, {calls}" + \
            (f", {data} data" if data != "pattern" else "") + \
            (f", {net}" if net != "none" else "") + (f", RoCE MTU {mtu}" if mtu != "-" else "")
        text = (f"{where}: fastest {best.contender} {best.algorithm} ({ms_text(best.avg_us)} "
                f"ms per call), {worst.avg_us / best.avg_us:.1f}x faster than the slowest "
                f"({worst.contender} {worst.algorithm})")
        ours = min((r for r in rs if ours_(r)), key=lambda r: r.avg_us, default=None)
        ratios = []
        for rival in ("mpi-ucx", "mpi-tcp", "gloo"):
            theirs = min((r for r in rs if r.contender == rival), key=lambda r: r.avg_us,
                         default=None)
            if ours and theirs and theirs.avg_us:
                x = ours.avg_us / theirs.avg_us
                ratios.append(f"{x:.2f}x the time of {contender_title(rival)} ({time_change(x)}"
                              + (", inside the rounds' spread)" if overlap(ours, theirs) else ")"))
        ours_rows = [r for r in rs if ours_(r)]  # sorted: the first is the best
        share = ours_rows[0].link_pct if ours_rows else None
        rounds = f" (times: {middle_of(best.rounds)})" if best.rounds > 1 else ""
        lines.append(text + (f"; best rxelab takes {' and '.join(ratios)}" if ratios else "")
                     + (f", at {share:.0f} % of the link" if share is not None else "") + rounds + ".")
    moved = defaultdict(list)
    for rec in records:
        if rec.rxe and rec.app != "perftest":
            moved[contender(rec)].append(counters.total(rec.rxe, "sent_pkts"))
    if moved:
        lines.append("Packets sent by the RDMA devices per case: " + "; ".join(
            f"{name} {min(v)}-{max(v)}" for name, v in sorted(moved.items()))
            + " (mpi-tcp should be 0: it does not use RDMA).")
    lines += loss_lines(flat, records)
    lines += compression.lines(flat)
    case_label = {rec.case: f"{rec.op}/{rec.algorithm}" for rec in records}
    ratios_by: dict[str, list[float]] = defaultdict(list)
    for entry in loads:
        if load_moved(entry.samples):
            ratios_by[case_label.get(entry.case, str(entry.case))].append(
                peak_to_mean(entry.samples)[2])
    for label, peaks in sorted(ratios_by.items()):
        lines.append(f"Network load of {label}: peak-to-mean ratio {max(peaks):.2f} "
                     f"(worst node; lower is steadier).")
    return lines


def size_unit(op: str) -> str:
    """What a case's size counts: its collective's description says (perftest: per message)."""
    described = ops.COLLECTIVES.get(op)
    return described.unit if described else "per peer"


def _said(text: str | None, otherwise: str = "") -> str:
    """A record's words, or what to say where it has none."""
    return otherwise if text is None else text


def _groups(flat: list[Row]) -> dict[tuple, list[Row]]:
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for r in flat:
        groups[(r.op, r.nodes, r.size, r.stages, r.network, r.active_mtu, r.mode, r.data)].append(r)
    return groups


def loss_lines(flat: list[Row], records: list[Record]) -> list[str]:
    """In plain words, who degrades how: each contender's time per call under each impairment,
    as a multiple of its time on the clean network in the same run."""
    # a case run in rounds speaks once: by its median round (or, with none, its first)
    chosen = {(r.case, r.round) for r in flat}
    with_rows = {r.case for r in flat}
    impaired = [rec for rec in records if any(rec.netem.values())
                and ((rec.case, rec.round) in chosen or (rec.case not in with_rows and rec.round == 0))]
    if not impaired:
        return []
    base = {(r.contender, r.algorithm, r.op, r.size, r.active_mtu, r.mode, r.data):
            r.avg_us for r in flat if r.network == "none" and r.status == "ok"}
    shown = {(r.contender, r.algorithm, r.op, r.size, r.active_mtu, r.mode, r.data,
              r.network): r for r in flat}
    out = []
    by_who: dict[tuple, list[str]] = defaultdict(list)
    for rec in impaired:
        who = (contender(rec), rec.algorithm, rec.op, rec.size, rec.active_mtu or "-",
               BACK_TO_BACK if rec.tight else "stages", rec.data or "pattern")
        net = netem.label(rec.netem)
        row = shown.get((*who, net))
        clean = base.get(who)
        retries = counters.total(rec.rxe, "completer_retry_err")
        extra = f", {retries} retransmission timeouts" if retries else ""
        if rec.status == "timeout":
            done = rec.partial.stages_done if rec.partial else 0
            by_who[who].append(f"{net}: ran out of time ({done} of {rec.stages} stages done{extra})")
        elif rec.status != "ok" or row is None:
            by_who[who].append(f"{net}: {rec.status}")
        elif clean:
            by_who[who].append(f"{net}: {row.avg_us / clean:.1f}x its clean time{extra}")
        else:
            by_who[who].append(f"{net}: {ms_text(row.avg_us)} ms per call{extra}")
    worst = max((r.loss for r in flat if r.loss_only), default=0)
    at_worst = sorted((r.avg_us / base[k], f"{r.contender} {r.algorithm}")
                      for r in flat if r.loss_only and r.loss == worst and r.status == "ok"
                      and (k := (r.contender, r.algorithm, r.op, r.size, r.active_mtu,
                                 r.mode, r.data)) in base)
    if worst and at_worst:
        out.append(f"At {worst:g} % loss, time per call as a multiple of the clean network's: "
                   + ", ".join(f"{who} {x:.1f}x" for x, who in at_worst)
                   + ". RoCE's reliable connection retransmits go-back-N after a timeout; TCP "
                     "retransmits selectively and fast: that is why RoCE fabrics are made lossless.")
    for who, parts in sorted(by_who.items(), key=str):
        data = f", {who[6]} data" if who[6] != "pattern" else ""
        out.append(f"Under impairment, {who[0]} {who[2]}/{who[1]} ({size_text(who[3])} {size_unit(who[2])}"
                   f"{data}): "
                   + "; ".join(parts) + ".")
    return out

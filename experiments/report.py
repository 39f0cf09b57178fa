"""The report of one results directory: tables in OSU style with algbw/busbw, plots made with
matplotlib, and a plain-words summary; written as self-contained HTML (plots inlined) and as
Markdown (plots beside it). Reads only the results directory, so it can be made anywhere,
any time after the run.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from rxelab import ops

from experiments import compression_report, counters, elastic_report, netem, plots
from experiments.spec import contender, ranks

EMULATION_NOTE = ("Absolute numbers here come from VMs under emulation (TCG) and are not hardware "
                  "numbers; the ratios between algorithms measured in the same run are what carry over.")
KVM_NOTE = ("Absolute numbers here come from VMs with hardware virtualization (KVM), not bare "
            "metal; with software RDMA (rxe) in the VMs, as the testbed runs them, they are not "
            "hardware numbers; the ratios between algorithms measured in the same run are what "
            "carry over.")
UNRECORDED_NOTE = ("How the nodes ran (emulated VMs, VMs with hardware virtualization or bare "
                   "metal) was not recorded for this run: read absolute numbers with that in mind.")
UNKNOWN = "unknown"
# Where a version comes from in environment.json: its key under "versions", then the Debian
# package of older runs (under "packages"), whose upstream part is taken.
VERSION_SOURCES = (("rxelab", "rxelab", None), ("Open MPI", "open_mpi", "openmpi-bin"),
                   ("UCX", "ucx", "libucx0"), ("rdma-core", "rdma_core", "rdma-core"))
DGID_CHECK = "UCX_UD_ETH_DGID_CHECK"


def _text(value: Any) -> str | None:
    """An env value as text, or None where the run did not record it ("?", empty, null).
    The text is untrusted (it comes from remote hosts): callers escape it for their output."""
    if value is None or isinstance(value, (dict, list)) and not value:
        return None
    text = str(value).strip()
    return None if text in ("", "?") else text


def _mapping(env: dict[str, Any], key: str) -> dict[str, Any]:
    value = env.get(key)
    return value if isinstance(value, dict) else {}


def upstream_version(debian: str) -> str:
    """The upstream part of a Debian version: no epoch, no Debian revision, no repack suffix
    ("1:4.1.4-3+b1" -> "4.1.4", "1.13.1+dfsg-1" -> "1.13.1", "44.0-2" -> "44.0")."""
    v = debian.split(":", 1)[1] if re.match(r"^\d+:", debian) else debian
    v = v.rsplit("-", 1)[0] if "-" in v else v
    return re.sub(r"[+~](dfsg|ds)\d*$", "", v) or debian


def versions(env: dict[str, Any]) -> dict[str, str]:
    """The rxelab wheel's, Open MPI, UCX, rdma-core and kernel versions of the run, "unknown"
    where not recorded."""
    recorded, packages = _mapping(env, "versions"), _mapping(env, "packages")
    out = {}
    for name, key, package in VERSION_SOURCES:
        v = _text(recorded.get(key))
        if v is None and package and (p := _text(packages.get(package))) is not None:
            v = upstream_version(p)
        out[name] = v or UNKNOWN
    out["kernel"] = _text(recorded.get("kernel")) or _text(env.get("kernel")) or UNKNOWN
    return out


def how_nodes_ran(env: dict[str, Any]) -> tuple[str, str]:
    """(what the facts list says, the caveat above the report or "" for bare metal), from
    "accel" (tcg, kvm, none for bare metal, another hypervisor) and "virtualization"
    (systemd-detect-virt on the first node: qemu means emulation, kvm hardware virtualization)."""
    accel = (_text(env.get("accel")) or "").lower()
    virt = (_text(env.get("virtualization")) or "").lower()
    if accel == "tcg" or virt == "qemu":
        return "VMs under emulation (TCG)", EMULATION_NOTE
    if accel == "kvm" or virt == "kvm":
        return "VMs with hardware virtualization (KVM)", KVM_NOTE
    other = next((x for x in (accel, virt) if x and x != "none"), None)
    if other:
        return (f"virtualized ({other})",
                f"Absolute numbers here come from nodes virtualized by {other}, not bare metal; "
                "the ratios between algorithms measured in the same run are what carry over.")
    if "none" in (accel, virt):
        return "bare metal (no virtualization)", ""
    return "not recorded", UNRECORDED_NOTE


def rdma_devices(env: dict[str, Any]) -> list[str]:
    """The RDMA device names of the run: per node where recorded, else UCX_NET_DEVICES's."""
    named = [d for d in (_text(v) for v in _mapping(env, "rdma_devices").values()) if d]
    if named:
        return sorted(set(named))
    net = _text(_mapping(env, "ucx_settings").get("UCX_NET_DEVICES"))
    return sorted({x.split(":", 1)[0] for x in net.split(",") if x}) if net else []


def mpi_rdma_note(env: dict[str, Any]) -> str:
    """How the mpi-ucx rows ran, as recorded: versions, RDMA device and UCX settings, "unknown"
    where the run did not record them; and why UCX_UD_ETH_DGID_CHECK=n on rxe."""
    ver = versions(env)
    settings = {k: t for k, v in _mapping(env, "ucx_settings").items()
                if (t := _text(v)) is not None}
    devices = ", ".join(rdma_devices(env)) or UNKNOWN
    mca = "--mca pml ucx --mca btl ^openib,uct"
    if settings:
        how = "with `" + " ".join([mca, *(f"-x {k}={v}" for k, v in settings.items())]) + "`"
    else:
        how = f"with `{mca}` and UCX settings that were not recorded for this run ({UNKNOWN})"
    dgid = settings.get(DGID_CHECK)
    if not settings:
        sets = "whether this run set it was not recorded"
    elif dgid is not None and dgid.lower() in ("n", "no", "0", "off", "false"):
        sets = "this run sets it"
    else:
        sets = f"this run did not set it ({DGID_CHECK}={dgid or UNKNOWN})"
    return (f"MPI over RDMA: Open MPI ({ver['Open MPI']}) runs over the RDMA device ({devices}) "
            f"through UCX ({ver['UCX']}) {how} (mpi-ucx rows). On rxe devices, UCX up to 1.18 "
            "takes a RoCE UD packet's IP version from the completion's service level, which rxe "
            "leaves unset, so with an IPv4 GID it drops every UD packet, and UD is what wires up "
            f"RC; {DGID_CHECK}=n skips that check (fixed upstream in UCX 1.19, openucx/ucx PR "
            f"10209); {sets}. Each MPI case's RDMA device packet counters are read before and "
            "after it: an mpi-ucx case that moved no packet counts as failed (devices without "
            "such counters give no reading). mpi-tcp rows run Open MPI's ob1/TCP on the data NIC.")


def facts(env: dict[str, Any], results: Path) -> list[str]:
    """The run's facts, each read from environment.json ("unknown" where not recorded)."""
    def known(key: str) -> str:
        return _text(env.get(key)) or UNKNOWN
    status = "complete" if env.get("complete") else "INCOMPLETE (interrupted or failed: partial results)"
    ver = versions(env)
    ran = how_nodes_ran(env)[0]
    out = [f"results: {results.name} ({status})", f"nodes: {known('nodes')}",
           f"nodes ran as: {ran}; accel: {known('accel')}, systemd-detect-virt: "
           f"{known('virtualization')}, image: {known('image')}",
           "versions: " + ", ".join(f"{k} {v}" for k, v in ver.items()),
           f"launcher: {launcher_fact(env)}",
           f"RoCE path MTU: {known('mtu')} (data NIC MTU {known('netdev_mtu')})"]
    devices = {k: t for k, v in _mapping(env, "rdma_devices").items() if (t := _text(v))}
    netdevs = {k: t for k, v in _mapping(env, "netdevs").items() if (t := _text(v))}
    if devices or netdevs:
        out.append("RDMA devices: " + (", ".join(f"{k} {v}" for k, v in devices.items()) or UNKNOWN)
                   + "; data NICs: " + (", ".join(f"{k} {v}" for k, v in netdevs.items()) or UNKNOWN))
    packages = _mapping(env, "packages")
    if packages:
        out.append("packages: " + ", ".join(f"{k} {v}" for k, v in packages.items()))
    settings = _mapping(env, "ucx_settings")
    out.append("UCX settings of mpi-ucx cases: " + (
        " ".join(f"{k}={v}" for k, v in settings.items()) if settings else UNKNOWN))
    out.append(gloo_fact(env))
    return out


LAUNCHED_BY = {"ssh": "ssh (our launcher, and mpirun, over SSH)",
               "srun": "srun (Slurm started every rank: srun, srun --mpi=pmix for MPI; "
                       "perftest pairs over SSH)"}


def launcher_fact(env: dict[str, Any]) -> str:
    """How the ranks were started, as recorded."""
    said = _text(env.get("launcher"))
    if said is None:  # recorded since 2026-11-25; every run before started over SSH
        return LAUNCHED_BY["ssh"] + ", as every run before launchers were recorded"
    return LAUNCHED_BY.get(said, said)


def gloo_fact(env: dict[str, Any]) -> str:
    """Whether the nodes could run the gloo contender (torch.distributed over Gloo): the torch
    each node reported, or which nodes had none."""
    hosts = {k: v for k, v in _mapping(env, "hosts").items() if isinstance(v, dict)}
    if not any("torch" in h for h in hosts.values()):
        return f"Gloo (torch.distributed): {UNKNOWN}"
    found = {name: _text(h.get("torch")) for name, h in hosts.items()}
    lacking = sorted(name for name, v in found.items() if v is None)
    if lacking:
        return (f"Gloo (torch.distributed): no torch on {', '.join(lacking)}: gloo cases were not "
                "run (a lab built with EXTRAS=torch has it)")
    return "Gloo (torch.distributed): torch " + ", ".join(sorted(set(filter(None, found.values())))) \
        + " on every node, over TCP"


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
    """nccl-tests' model, per collective (rxelab.ops): algbw = bytes moved per rank / time,
    busbw = algbw * factor (alltoall, allgather, reduce_scatter (n-1)/n; allreduce 2(n-1)/n;
    bcast 1), in MB/s."""
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
                    "mtu": r.get("active_mtu") or "-", "avg_us": avg, "min_us": low,
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


BACK_TO_BACK = "back to back"
SAME_CASE = ("case", "contender", "op", "algorithm", "nodes", "ranks", "pairs", "size", "stages",
             "network", "mtu", "mode", "data")


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
    both, one = link_rate(records, "ib_write_bw_bidir"), link_rate(records, "ib_write_bw")
    if both:
        alone = f"; one direction alone {one:.1f} MB/s" if one else ""
        return both / 2, (f"% of link: busbw over {both / 2:.1f} MB/s, each direction's share of "
                          f"ib_write_bw -b (both directions at once, as in a collective){alone}")
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


def summary_lines(flat: list[dict[str, Any]], records: list[dict[str, Any]],
                  loads: list[dict[str, Any]]) -> list[str]:
    lines = []
    skipped = [r for r in records if r["status"] == "skipped"]
    bad = [r for r in records if r["status"] not in ("ok", "skipped")]
    ok = len(records) - len(bad) - len(skipped)
    failed = ", ".join(f"{contender({'transport': 'tcp', **r})} {r['algorithm']} ({r['status']})"
                       for r in bad)
    lines.append(f"{ok} of {len(records)} cases ran and verified their data"
                 + (f"; not ok: {failed}" if bad else "."))
    for who in sorted({contender({"transport": "tcp", **r}) for r in skipped}):
        mine = [r for r in skipped if contender({"transport": "tcp", **r}) == who]
        lines.append(f"{len(mine)} {who} cases were not run: {mine[0].get('error', 'skipped')}.")
    for who in sorted({contender({"transport": "tcp", **r}) for r in records if r.get("after_summary")}):
        mine = [r for r in records if r.get("after_summary") and contender({"transport": "tcp", **r}) == who]
        lines.append(f"{len(mine)} {who} cases printed verified figures, then their job did not end "
                     f"well (kept; records' after_summary): {mine[0]['after_summary'][:160]}")
    done = [r for r in flat if r["status"] == "ok"]
    for (op, nodes, size, stages, net, mtu, mode, data), rs in sorted(_groups(done).items(), key=str):
        if len(rs) < 2:
            continue
        rs = sorted(rs, key=lambda r: r["avg_us"])
        best, worst = rs[0], rs[-1]
        calls = f"{stages} calls back to back" if mode == BACK_TO_BACK else f"{stages} stages"
        where = f"{op}, {nodes} nodes, {size} B {size_unit(op)}, {calls}" + \
            (f", {data} data" if data != "pattern" else "") + \
            (f", {net}" if net != "none" else "") + (f", RoCE MTU {mtu}" if mtu != "-" else "")
        text = (f"{where}: fastest {best['contender']} {best['algorithm']} ({best['avg_us']:.0f} us "
                f"per call), {worst['avg_us'] / best['avg_us']:.1f}x faster than the slowest "
                f"({worst['contender']} {worst['algorithm']})")
        ours = min((r["avg_us"] for r in rs if r["contender"] == "rxelab"), default=None)
        ratios = []
        for rival in ("mpi-ucx", "mpi-tcp", "gloo"):
            theirs = min((r["avg_us"] for r in rs if r["contender"] == rival), default=None)
            if ours and theirs:
                ratios.append(f"{ours / theirs:.2f}x {rival}'s time")
        mine = [r for r in rs if r["contender"] == "rxelab"]  # sorted: the first is the best
        share = mine[0].get("link_pct") if mine else None
        rounds = f" (medians of {best['rounds']} rounds)" if best["rounds"] > 1 else ""
        lines.append(text + (f"; best rxelab takes {' and '.join(ratios)}" if ratios else "")
                     + (f", {share:.0f} % of the link" if share is not None else "") + rounds + ".")
    moved = defaultdict(list)
    for r in records:
        if r.get("rxe") and r["app"] != "perftest":
            moved[contender({"transport": "tcp", **r})].append(counters.total(r["rxe"], "sent_pkts"))
    if moved:
        lines.append("Packets sent by the RDMA devices per case: " + "; ".join(
            f"{name} {min(v)}-{max(v)}" for name, v in sorted(moved.items()))
            + " (mpi-tcp should be 0: it does not use RDMA).")
    lines += loss_lines(flat, records)
    lines += compression_report.lines(flat)
    case_label = {r["case"]: f"{r['op']}/{r['algorithm']}" for r in records}
    ratios_by: dict[str, list[float]] = defaultdict(list)
    for entry in loads:
        ratios_by[case_label.get(entry["case"], str(entry["case"]))].append(
            peak_to_mean(entry["samples"])[2])
    for label, rs in sorted(ratios_by.items()):
        lines.append(f"Network load of {label}: peak-to-mean ratio {max(rs):.2f} "
                     f"(worst node; lower is steadier).")
    return lines


def size_unit(op: str) -> str:
    """What a case's size counts: its collective's description says (perftest: per message)."""
    described = ops.COLLECTIVES.get(op)
    return described.unit if described else "per peer"


def _groups(flat: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in flat:
        groups[(r["op"], r["nodes"], r["size"], r["stages"], r["network"], r["mtu"],
                r["mode"], r["data"])].append(r)
    return groups


def loss_lines(flat: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[str]:
    """In plain words, who degrades how: each contender's time per call under each impairment,
    as a multiple of its time on the clean network in the same run."""
    # a case run in rounds speaks once: by its median round (or, with none, its first)
    chosen = {(r["case"], r["round"]) for r in flat}
    with_rows = {r["case"] for r in flat}
    impaired = [r for r in records if any((r.get("netem") or {}).values())
                and ((r["case"], r.get("round", 0)) in chosen
                     or (r["case"] not in with_rows and r.get("round", 0) == 0))]
    if not impaired:
        return []
    base = {(r["contender"], r["algorithm"], r["op"], r["size"], r["mtu"], r["mode"], r["data"]):
            r["avg_us"] for r in flat if r["network"] == "none" and r["status"] == "ok"}
    shown = {(r["contender"], r["algorithm"], r["op"], r["size"], r["mtu"], r["mode"], r["data"],
              r["network"]): r for r in flat}
    out = []
    by_who: dict[tuple, list[str]] = defaultdict(list)
    for rec in impaired:
        who = (contender({"transport": "tcp", **rec}), rec["algorithm"], rec["op"], rec["size"],
               rec.get("active_mtu") or "-", BACK_TO_BACK if rec.get("tight") else "stages",
               rec.get("data") or "pattern")
        net = netem.label(rec["netem"])
        row = shown.get((*who, net))
        clean = base.get(who)
        retries = counters.total(rec.get("rxe") or {}, "completer_retry_err")
        extra = f", {retries} retransmission timeouts" if retries else ""
        if rec["status"] == "timeout":
            part = rec.get("partial") or {}
            by_who[who].append(f"{net}: ran out of time ({part.get('stages_done', 0)} of "
                               f"{rec['stages']} stages done{extra})")
        elif rec["status"] != "ok" or row is None:
            by_who[who].append(f"{net}: {rec['status']}")
        elif clean:
            by_who[who].append(f"{net}: {row['avg_us'] / clean:.1f}x its clean time{extra}")
        else:
            by_who[who].append(f"{net}: {row['avg_us'] / 1e3:.1f} ms per call{extra}")
    worst = max((r["loss"] for r in flat if r["loss_only"]), default=0)
    at_worst = sorted((r["avg_us"] / base[k], f"{r['contender']} {r['algorithm']}")
                      for r in flat if r["loss_only"] and r["loss"] == worst and r["status"] == "ok"
                      and (k := (r["contender"], r["algorithm"], r["op"], r["size"], r["mtu"],
                                 r["mode"], r["data"])) in base)
    if worst and at_worst:
        out.append(f"At {worst:g} % loss, time per call as a multiple of the clean network's: "
                   + ", ".join(f"{who} {x:.1f}x" for x, who in at_worst)
                   + ". RoCE's reliable connection retransmits go-back-N after a timeout; TCP "
                     "retransmits selectively and fast: that is why RoCE fabrics are made lossless.")
    for who, parts in sorted(by_who.items(), key=str):
        data = f", {who[6]} data" if who[6] != "pattern" else ""
        out.append(f"Under impairment, {who[0]} {who[2]}/{who[1]} ({who[3]} B {size_unit(who[2])}"
                   f"{data}): "
                   + "; ".join(parts) + ".")
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
              ("mtu", "RoCE MTU"), ("avg_us", "Avg Latency(us)"), ("min_us", "Min Latency(us)"),
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
    perf = [r for r in records if r["app"] == "perftest" and r.get("summary")]
    title = f"rxelab report: {_text(env.get('spec')) or results.name}"
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
        md += ["## Changes of members", "", "| " + " | ".join(el_head) + " |",
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
    first = [n for n in ("elastic.png", "stages.png", "loss.png", "pairs.png") if n in images]
    parts += [_img(n, images[n]) for n in first]  # the answer first, as a picture
    if el_rows:
        parts += ["<h2>Changes of members</h2><div class='wide'><table><tr>",
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

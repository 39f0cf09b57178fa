"""What rxelab-bench's rank 0 says: a `#` header that lets a reader redo the run (rxelab's
version, the command line, the date, every rank's host, the path MTU in bytes, the settings),
then OSU-style rows, and their JSON twin: the same header as its first record, then each row
as it is measured, flushed, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import json
import platform
import shlex
import socket
import subprocess
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

import numpy as np

import rxelab
from rxelab import ops, settings

NAME_BYTES = 255  # a host name at most (HOST_NAME_MAX is 64 on Linux; a FQDN 255)
UNKNOWN = -1  # an MTU no one could tell

HEADER = (f"{'# Size':<10}{'Avg Latency(us)':>17}{'Min Latency(us)':>17}{'Max Latency(us)':>17}"
          f"{'Iterations':>12}{'algbw(MB/s)':>13}{'busbw(MB/s)':>13}{'CPU usr(us)':>12}"
          f"{'CPU sys(us)':>12}{'Sleeps':>8}{'#wrong':>8}")
OVERLAP_HEADER = (f"{'# Size':<10}{'Pure(us)':>14}{'Compute(us)':>14}{'Total(us)':>14}"
                  f"{'Overlap(%)':>12}")


@dataclass(frozen=True)
class Header:
    """The facts of a run, as the `#` lines say them and the JSON header record holds them."""

    rxelab: str
    command: str  # as a shell would take it (shlex.join)
    date: str  # UTC, ISO 8601
    kernel: str
    python: str
    pyverbs: str  # rdma-core's python3-pyverbs package, "?" where dpkg does not know it
    transport: str
    where: str  # verbs: the device, port and GID index; else the address listened on
    device: str  # verbs: the RDMA device; tcp, quic: the address listened on
    port: int | None  # verbs: the device's port and the port's GID index (else None)
    gid_index: int | None
    ranks: int
    hosts: list[str]  # every rank's, in rank order
    mtu_bytes: list[int | None]  # every rank's path MTU (None: not known)
    mtu_of: str  # where the MTU comes from
    calls: str  # timed and warm-up calls per size
    settings: dict[str, int | float]


def command_line(prog: str, argv: list[str]) -> str:
    return shlex.join([prog, *argv])


def pyverbs_version() -> str:
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", "python3-pyverbs"],
                              capture_output=True, text=True, timeout=10).stdout or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def interface_mtu(address: str, ip_json: str) -> tuple[int | None, str]:
    """The MTU of the interface that holds `address`, from `ip -j addr show`'s output, and
    its name (None, "" where it is not there)."""
    try:
        links = json.loads(ip_json)
        for link in links:
            if any(a.get("local") == address for a in link.get("addr_info", ())):
                return int(link["mtu"]), str(link["ifname"])
    except (ValueError, TypeError, KeyError, AttributeError):
        pass
    return None, ""


def own_mtu(comm: Any) -> tuple[int | None, str]:
    """This rank's path MTU in bytes: verbs' the port's active MTU (IBV_MTU_256 is 1: 128 <<
    mtu_enum), tcp's and quic's the MTU of the interface they listen on."""
    if comm.transport == "verbs":
        return 128 << int(comm.dev.mtu_enum), "the RDMA port's active MTU"
    address = str(getattr(comm.fabric, "host", ""))
    try:
        out = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None, f"the interface of {address}"
    mtu, name = interface_mtu(address, out)
    return mtu, f"the interface of {address}" + (f" ({name})" if name else "")


@dataclass(frozen=True)
class Gathered:
    """What every rank told the others before the first size."""

    hosts: list[str]  # every rank's host name, in rank order
    mtus: list[int | None]  # every rank's path MTU in bytes (None: not known)
    mtu_of: str  # where this rank's MTU came from
    ready: bool  # rank 0 could start (its --json opened)


def gather(comm: Any, ok: bool) -> Gathered:
    """Every rank's host name and path MTU, and whether rank 0 is ready (`ok`: its --json
    opened), in one allgather every rank makes: a rank 0 that cannot go on is known to all."""
    mtu, of = own_mtu(comm)
    name = socket.gethostname().encode()[:NAME_BYTES]
    mine = np.zeros(8 + 1 + NAME_BYTES, np.uint8)
    mine[:8] = np.frombuffer(np.int64(UNKNOWN if mtu is None else mtu).tobytes(), np.uint8)
    mine[8] = 1 if ok else 0
    mine[9:9 + len(name)] = np.frombuffer(name, np.uint8)
    every = np.zeros(comm.size * mine.size, np.uint8)
    comm.allgather(mine, every, algorithm="ring")
    rows = every.reshape(comm.size, mine.size)
    mtus = [int(np.frombuffer(r[:8].tobytes(), np.int64)[0]) for r in rows]
    hosts = [r[9:].tobytes().rstrip(b"\0").decode(errors="replace") for r in rows]
    return Gathered(hosts, [None if m == UNKNOWN else m for m in mtus], of, bool(rows[0, 8]))


def describe(comm: Any, command: str, calls: str, seen: Gathered) -> Header:
    dev, verbs = comm.dev, comm.transport == "verbs"
    where = (f"device {dev.name} port {dev.port} gid index {dev.gid_index} mtu enum {dev.mtu_enum}"
             if verbs else f"transport {comm.transport} from {comm.fabric.host}")
    return Header(
        rxelab=rxelab.__version__, command=command,
        date=datetime.now(UTC).isoformat(timespec="seconds"), kernel=platform.release(),
        python=platform.python_version(), pyverbs=pyverbs_version(), transport=comm.transport,
        where=where, device=dev.name if verbs else comm.fabric.host,
        port=dev.port if verbs else None, gid_index=dev.gid_index if verbs else None,
        ranks=comm.size, hosts=seen.hosts, mtu_bytes=seen.mtus, mtu_of=seen.mtu_of, calls=calls,
        settings=dict(comm.options))


def hosts_said(hosts: list[str]) -> str:
    """node1 (ranks 0-1), node2 (rank 2): each host once, with its ranks."""
    ranks: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        ranks.setdefault(h, []).append(r)
    out = []
    for h, rs in ranks.items():
        run = rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 2
        said = f"{rs[0]}-{rs[-1]}" if run else ",".join(map(str, rs))
        out.append(f"{h} (rank{'s' if len(rs) > 1 else ''} {said})")
    return ", ".join(out)


def mtu_said(mtus: list[int | None], of: str) -> str:
    known = sorted({m for m in mtus if m is not None})
    if not known:
        return "- (not known)"
    said = f"{known[0]} bytes" + (f" (the smallest of {', '.join(map(str, known))})"
                                  if len(known) > 1 else "")
    unknown = sum(m is None for m in mtus)
    return said + f", {of}" + (f"; {unknown} rank(s) could not tell" if unknown else "")


def lines(h: Header) -> list[str]:
    return [
        "# rxelab collective benchmark",
        f"# rxelab {h.rxelab}, kernel {h.kernel}, python {h.python}, pyverbs {h.pyverbs}",
        f"# command {h.command}",
        f"# date {h.date}",
        f"# {h.where}, ranks {h.ranks}",
        f"# hosts {hosts_said(h.hosts)}",
        f"# path MTU {mtu_said(h.mtu_bytes, h.mtu_of)}",
        f"# {h.calls}",
        "# settings " + " ".join(f"{k}={settings.show(v)}" for k, v in h.settings.items()),
        f"# size = bytes ({ops.units()}); latency = per-rank average over iterations; algbw and "
        "busbw as nccl-tests define them (busbw = algbw * the collective's factor, over "
        f"{h.ranks} ranks: "
        + ", ".join(f"{c.name} {c.busbw(h.ranks):.3g}" for c in ops.COLLECTIVES.values()) + ")",
    ]


def row(r: dict[str, Any]) -> str:
    if r["algorithm"] == "perftest":  # perftest reports bandwidth only
        return (f"{r['size']:<10}{'-':>17}{'-':>17}{'-':>17}"
                f"{r['iterations']:>12}{r['algbw_MBps']:>13.2f}{r['busbw_MBps']:>13.2f}"
                f"{'-':>12}{'-':>12}{'-':>8}{'-':>8}")
    wrong = "-" if r["wrong"] is None else r["wrong"]  # -c 0: not checked
    return (f"{r['size']:<10}{r['avg_us']:>17.2f}{r['min_us']:>17.2f}{r['max_us']:>17.2f}"
            f"{r['iterations']:>12}{r['algbw_MBps']:>13.2f}{r['busbw_MBps']:>13.2f}"
            f"{r['cpu_user_us']:>12.0f}{r['cpu_sys_us']:>12.0f}{r['sleeps']:>8.1f}{wrong:>8}")


def overlap_row(o: dict[str, Any]) -> str:
    return (f"{o['size']:<10}{o['pure_us']:>14.1f}{o['cpu_us']:>14.1f}{o['total_us']:>14.1f}"
            f"{o['overlap_pct']:>12.1f}")


class Report:
    """Rank 0's output: the `#` lines and rows on stdout, and their JSON twin (a header
    record, then a record per row, each flushed as it comes). Other ranks' Report says
    nothing."""

    def __init__(self, speaks: bool, json_path: str | None) -> None:
        self.speaks = speaks
        self.out: TextIO | None = None
        if speaks and json_path:
            self.out = open(json_path, "x")  # "x": never overwrite

    def _json(self, record: dict[str, Any]) -> None:
        if self.out is not None:
            self.out.write(json.dumps(record) + "\n")
            self.out.flush()

    def header(self, h: Header) -> None:
        if self.speaks:
            print("\n".join(lines(h)), flush=True)
            self._json({"record": "header", **asdict(h)})

    def section(self, title: str, columns: str = HEADER) -> None:
        if self.speaks:
            print(f"# {title}\n{columns}", flush=True)

    def row(self, r: dict[str, Any], kind: str = "row") -> None:
        if self.speaks:
            print(overlap_row(r) if kind == "overlap" else row(r), flush=True)
            self._json({"record": kind, **r})

    def close(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None

"""Where compression pays and where it costs: each coded rxelab case beside the same case
uncoded (same op, algorithm, size, data, network and calls, in the same run), with what the
codec did (raw/wire ratio, CPU milliseconds per MiB coded, both ends together) and, where the
run has them, MPI's times for the same op, size and network. Reads the report's rows only.
"""

from __future__ import annotations

from experiments.report.view import Row

HEAD = ["op", "size", "data", "network", "codec", "ms per call", "vs none", "ratio",
        "codec CPU ms/MiB", "MB on the wire per call", "MPI UCX ms", "MPI TCP ms"]


def _key(r: Row) -> tuple[str, str, int, int, str, str, str, str]:
    """The case apart from its codec: rxelab's contender without the codec's suffix (its
    eager limit stays), and everything else that makes a case."""
    suffix = f"-{r.compression}" if r.compression != "none" else ""
    return (r.op, r.algorithm, r.nodes, r.size, r.data, r.network, r.mode,
            r.contender.removesuffix(suffix))


def table(flat: list[Row]) -> list[list[str]]:
    """One row per codec (none first) of every case that ran coded."""
    ours = [r for r in flat if r.app == "rxelab" and r.status == "ok"]
    coded = {_key(r) for r in ours if r.compression != "none"}
    mpi = {(r.contender, r.op, r.size, r.network, r.mode): r.avg_us
           for r in flat if r.app == "mpi" and r.status == "ok"}
    out = []
    for key in sorted(coded, key=str):
        rs = sorted((r for r in ours if _key(r) == key),
                    key=lambda r: (r.compression != "none", r.compression))
        plain = next((r.avg_us for r in rs if r.compression == "none"), None)
        op, algorithm, _, size, data, network, mode, _ = key
        ucx, tcp = (mpi.get((who, op, size, network, mode)) for who in ("mpi-ucx", "mpi-tcp"))
        for r in rs:
            out.append([f"{op}/{algorithm}", str(size), str(data), network, str(r.compression),
                        f"{r.avg_us / 1e3:.1f}",
                        f"{r.avg_us / plain:.2f}x" if plain else "-",
                        _num(r.ratio, ".1f"), _num(r.codec_ms_per_MiB, ".1f"),
                        _num(r.wire_per_call, ".2f", 1e-6),
                        _num(ucx, ".1f", 1e-3), _num(tcp, ".1f", 1e-3)])
    return out


def _num(value: object, spec: str, scale: float = 1.0) -> str:
    """A figure from a node's summary as text; anything that is not a positive number is "-"
    (the summary came from a remote host: never a traceback over it)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return "-"
    return format(value * scale, spec)


def lines(flat: list[Row]) -> list[str]:
    """In plain words: in how many cases each codec beat no compression, its best and worst."""
    rows = table(flat)
    by_codec: dict[str, list[tuple[float, str]]] = {}
    for row in rows:
        if row[4] != "none" and row[6] != "-":
            where = f"{row[0]} {row[1]} B {row[2]} data" + (f", {row[3]}" if row[3] != "none" else "")
            by_codec.setdefault(row[4], []).append((float(row[6][:-1]), where))
    out = []
    for codec, seen in sorted(by_codec.items()):
        seen.sort()
        paid = [x for x in seen if x[0] < 1.0]
        out.append(f"Compression {codec}: faster than none in {len(paid)} of {len(seen)} cases; "
                   f"best {seen[0][0]:.2f}x none's time ({seen[0][1]}), worst {seen[-1][0]:.2f}x "
                   f"({seen[-1][1]}).")
    return out

"""perftest (linux-rdma/perftest) between two nodes: the command line of each tool and what its
output says. The one place both rxelab.bench (--perftest) and the experiments' perftest runs
take them from.

The tools go by one name each: ib_write_bw_bidir is `ib_write_bw -b`, both directions at once
(as every rank of a collective sends and receives at once), reported as their sum.
"""

from __future__ import annotations

import re
from typing import Any

from rxelab.settings import BY_NAME

PORT = 18515  # perftest's TCP port for the pair's exchange of QP numbers
BIDIR = "ib_write_bw_bidir"
LATENCY = "ib_send_lat"
TOOLS: dict[str, tuple[str, ...]] = {  # name -> argv
    "ib_write_bw": ("ib_write_bw",),
    BIDIR: ("ib_write_bw", "-b"),
    "ib_send_bw": ("ib_send_bw",),
    LATENCY: ("ib_send_lat",),
}
BANDWIDTH = tuple(t for t in TOOLS if t != LATENCY)


def command(tool: str) -> str:
    """How the tool is run, as a reader would type it (`ib_write_bw -b`)."""
    return " ".join(TOOLS[tool])


def argv(tool: str, device: str, port: int, gid_index: int, size: int, iterations: int,
         tcp_port: int = PORT, qp_timeout: int | None = None) -> list[str]:
    """One side of the pair (the client adds the server's address): `size` bytes per message,
    bandwidth in Gb/s, and the library's ack timeout (its `qp_timeout` option, by default its
    default): a link limit measured with a shorter one than the library's fails where the
    library does not (perftest's default, 14, is 67 ms; crowded VMs under TCG answer later,
    and rxe gives up)."""
    if qp_timeout is None:
        qp_timeout = int(BY_NAME["qp_timeout"].default)
    out = [*TOOLS[tool], "-d", device, "-i", str(port), "-x", str(gid_index),
           "-F", "-u", str(qp_timeout), "-s", str(max(size, 1 if tool != LATENCY else 2)),
           "-n", str(iterations), "-p", str(tcp_port)]
    return out if tool == LATENCY else [*out, "--report_gbits"]


def parse(tool: str, text: str) -> dict[str, Any] | None:
    """The result row of the tool's output: {"iterations", "lat_us"} (ib_send_lat's typical
    latency) or {"iterations", "bw_MBps"} (the average bandwidth; -b: both directions' sum); None
    without one (the pair did not connect)."""
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0].isdigit() and all(re.fullmatch(r"[\d.]+", x) for x in f[1:5]):
            if tool == LATENCY:  # bytes iters t_min t_max t_typical t_avg ...
                return {"iterations": int(f[1]), "lat_us": float(f[4])}
            # bytes iters bw_peak bw_avg[Gb/s] msg_rate
            return {"iterations": int(f[1]), "bw_MBps": float(f[3]) * 1e9 / 8 / 1e6}
    return None

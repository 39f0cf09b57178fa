"""Samples a node's network load while an experiment runs: the data NIC's byte counters (and
rxe's packet counters where the kernel has them) every --interval seconds, as JSON lines,
until killed or --duration passes. Reads files only (no forks), so it barely perturbs the run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--netdev", default="data0")
    ap.add_argument("--rdma", default="rxe0", help="the RDMA device")
    ap.add_argument("--port", type=int, default=1, help="its port")
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--duration", type=float, default=3600)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    stats = Path("/sys/class/net") / args.netdev / "statistics"
    hw = Path("/sys/class/infiniband") / args.rdma / "ports" / str(args.port) / "hw_counters"
    if not stats.exists():
        print(f"load_sampler: no network device {args.netdev}", file=sys.stderr)
        return 2
    end = time.monotonic() + args.duration
    with open(args.out, "w") as out:
        while time.monotonic() < end:
            sample = {"t": time.time(), "tx_bytes": read_int(stats / "tx_bytes"),
                      "rx_bytes": read_int(stats / "rx_bytes"),
                      "sent_pkts": read_int(hw / "sent_pkts"), "rcvd_pkts": read_int(hw / "rcvd_pkts")}
            out.write(json.dumps(sample) + "\n")
            out.flush()
            time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())

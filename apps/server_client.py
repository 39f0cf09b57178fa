"""rxelab's demo: a server (rank 0) and clients. The server starts, the clients connect, wait
for the server's start signal, then everyone repeats S stages of the all-to-all broadcast
(allgather; --op alltoall for the personalized all-to-all) of M bytes with the chosen
algorithm, verifies every stage's data and reports per-stage and total times.

    python3 -m rxelab.launch --hosts node1,node2,node3 -- python3 apps/server_client.py \\
        --stages 100 --size 65536 --algorithm star

Prints JSON lines (one per stage, then a summary) on the server; apps/mpi_compare.py prints
the same, so one parser reads both.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rxelab
import stages
from rxelab import ops, settings
from rxelab.errors import RdmaError

ALGORITHMS = sorted({a for c in ops.COLLECTIVES.values() for a in c.algorithms})


def main(argv: list[str] | None = None) -> int:
    ap = stages.arguments(__doc__.split("\n\n")[0], ALGORITHMS, "star")
    settings.add_flags(ap)
    ap.add_argument("--pairs", type=int, default=1,
                    help="sequential: at most this many pairs exchange at once (default 1)")
    args = ap.parse_args(argv)
    stages.check_args(ap, args)
    valid = ops.COLLECTIVES[args.op].algorithms
    if args.algorithm not in valid:
        ap.error(f"--algorithm {args.algorithm} is not an {args.op} algorithm: {', '.join(valid)}")
    try:
        with rxelab.init(**settings.from_flags(args)) as comm:
            r, p = comm.rank, comm.size
            start = np.zeros(1, np.uint8)
            if r == 0:
                print(f"# server: {p - 1} clients connected; sending the start signal", flush=True)
                for client in range(1, p):
                    comm.send(np.ones(1, np.uint8), client)
            else:
                comm.recv(start, 0)  # wait for the server's start signal
            peaks = [0, 0]  # pinned, in flight

            def collective(send: np.ndarray, recv: np.ndarray) -> None:
                st = ops.run(comm, args.op, args.algorithm, send, recv, pairs=args.pairs)
                peaks[0] = max(peaks[0], st.peak_pinned)
                peaks[1] = max(peaks[1], st.peak_inflight)

            mine = stages.run(args, r, p, collective, comm.barrier, "rxelab")
            table = np.zeros(p * mine.size, np.float64)
            comm.allgather(mine, table, algorithm="ring")
            every = np.zeros(2 * p, np.float64)
            comm.allgather(np.array(peaks, np.float64), every, "ring")
            if r == 0:
                extra = {"peak_pinned": int(every[0::2].max()), "peak_inflight": int(every[1::2].max())}
                for line in stages.report("rxelab", args, p, table, extra):
                    print(line, flush=True)
                ok = bool(table.reshape(p, args.stages, 2)[:, :, 1].sum() == 0)
            else:
                ok = bool(mine[1::2].sum() == 0)
    except RdmaError as err:
        print(f"server_client: {err}", file=sys.stderr)
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

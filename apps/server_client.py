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
from typing import TYPE_CHECKING, Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rxelab
from rxelab import codecs, ops, settings
from rxelab.bench import HAND_LOOP, HAND_MAX, HAND_OPS
from rxelab.errors import RdmaError

if TYPE_CHECKING:  # the same module as mypy reaches it from the tree (the node runs this file)
    from apps import stages
else:
    import stages


def algorithms() -> list[str]:
    """Every described collective's algorithms (as registered now), and the hand loop."""
    return sorted({a for c in ops.COLLECTIVES.values() for a in c.algorithms} | {HAND_LOOP})


def main(argv: list[str] | None = None) -> int:
    ap = stages.arguments(__doc__.split("\n\n")[0], algorithms(), "star")
    settings.add_flags(ap)
    ap.add_argument("--pairs", type=int, default=1,
                    help="sequential: at most this many pairs exchange at once (default 1)")
    ap.add_argument("--transport", choices=settings.TRANSPORTS, default=None,
                    help="what the collectives run over (default: $RXELAB_TRANSPORT, else verbs)")
    ap.add_argument("--compression", choices=codecs.NAMES, default=codecs.NONE,
                    help="how rendezvous blocks travel: as they are (none, default), lossless "
                         "(lz4, zstd) or, for float sums, rounded to fp16/bf16 on the wire "
                         "(results checked against the codec's error bound)")
    args = ap.parse_args(argv)
    stages.check_args(ap, args)
    described = ops.COLLECTIVES[args.op]
    hand = args.algorithm == HAND_LOOP  # the floor: rxelab.handloop, not the library's call
    valid = [*described.algorithms, *([HAND_LOOP] if args.op in HAND_OPS else [])]
    if hand and not 0 < args.size <= HAND_MAX:
        ap.error(f"--algorithm {HAND_LOOP} moves blocks of 1 to {HAND_MAX} bytes")
    if args.algorithm not in valid:
        ap.error(f"--algorithm {args.algorithm} is not an {args.op} algorithm: {', '.join(valid)}")
    try:
        codec = codecs.lookup(args.compression, "--compression")
        codecs.check_use(codec, args.op, described.reduces, "sum", described.dtype)
    except RdmaError as err:
        ap.error(str(err))
    tolerance = None
    if codec is not None and codec.lossy:
        def tolerance(stage: int) -> np.ndarray:
            n = args.size // np.dtype(described.dtype).itemsize
            return codecs.error_bound(codec, described.inputs(comm.rank, comm.size, n,
                                                             described.dtype, stage, args.data))
    try:
        with rxelab.init(compression=args.compression, transport=args.transport,
                         **settings.from_flags(args)) as comm:
            r, p = comm.rank, comm.size
            start = np.zeros(1, np.uint8)
            if r == 0:
                print(f"# server: {p - 1} clients connected; sending the start signal", flush=True)
                for client in range(1, p):
                    comm.send(np.ones(1, np.uint8), client)
            else:
                comm.recv(start, 0)  # wait for the server's start signal
            # pinned, in flight (peaks); bytes sent, coded (raw, wire), codec CPU s (sums); the
            # node's busy share over the timed calls: in Python numbers, since a numpy
            # operation per call cost 1.5 ms a call under TCG
            figures = [0, 0, 0, 0, 0, 0.0, 0.0]
            waited = [0, 0]  # rank 0's empty polls and sleeps on the channel, every call

            floor = None
            if hand:
                from rxelab.handloop import HandLoop  # pyverbs itself: only for the floor
                floor = HandLoop(comm, args.size, float(comm.options["timeout"]))

            def collective(send: np.ndarray, recv: np.ndarray) -> None:
                st = floor.run(args.op, send, recv) if floor is not None else \
                    ops.run(comm, args.op, args.algorithm, send, recv, pairs=args.pairs)
                if st.peak_pinned > figures[0]:
                    figures[0] = st.peak_pinned
                if st.peak_inflight > figures[1]:
                    figures[1] = st.peak_inflight
                figures[2] += st.bytes_sent
                if st.coded_raw:
                    figures[3] += st.coded_raw
                    figures[4] += st.coded_wire
                    figures[5] += st.codec_seconds
                waited[0] += st.empty_polls
                waited[1] += st.sleeps

            busy: list[float] = []
            cpu: list[float] = []
            try:
                mine = stages.run(args, r, p, collective, comm.barrier, "rxelab", tolerance, busy,
                                  cpu)
            finally:
                if floor is not None:
                    floor.close()
            figures[6] = busy[0]
            table = np.zeros(p * mine.size, np.float64)
            comm.allgather(mine, table, algorithm="ring", compression="none")
            totals = np.array(figures, np.float64)
            every = np.zeros(totals.size * p, np.float64)
            comm.allgather(totals, every, "ring", compression="none")
            if r == 0:
                rows = every.reshape(p, totals.size)
                extra = {"peak_pinned": int(rows[:, 0].max()), "peak_inflight": int(rows[:, 1].max()),
                         **coding(args, rows[:, 2:6].sum(axis=0)),
                         "node_busy": [None if np.isnan(b) else round(float(b), 4)
                                       for b in rows[:, 6]],
                         **stages.cpu_per_call(cpu, args.stages),  # rank 0's, as the others'
                         "sleeps_per_call": round(waited[1] / (args.stages + args.warmup), 2),
                         "empty_polls_per_call": round(waited[0] / (args.stages + args.warmup),
                                                       2)}
                for line in stages.report("rxelab", args, p, table, extra):
                    print(line, flush=True)
                ok = bool(table.reshape(p, args.stages, 2)[:, :, 1].sum() == 0)
            else:
                ok = bool(mine[1::2].sum() == 0)
    except RdmaError as err:
        print(f"server_client: {err}", file=sys.stderr)
        return 2
    return 0 if ok else 1


def coding(args: Any, sums: np.ndarray) -> dict[str, Any]:
    """What compression did, over every rank and call (warm-up included): the codec, the
    ratio of raw to wire bytes of coded blocks, CPU milliseconds per MiB coded (both ends),
    and the bytes each call put on the wire."""
    sent, raw, wire, seconds = (float(x) for x in sums)
    calls = args.stages + args.warmup
    return {"compression": args.compression, "wire_bytes_per_call": sent / calls,
            "compression_ratio": raw / wire if wire else None,
            "codec_ms_per_MiB": seconds * 1e3 / (raw / 2**20) if raw else None}


if __name__ == "__main__":
    sys.exit(main())

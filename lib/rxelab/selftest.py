"""Correctness check of every operation, run by each rank of a job (the tests launch it):

    RANK=r WORLD_SIZE=p MASTER_ADDR=a MASTER_PORT=n python3 -m rxelab.selftest --sizes 0,1,7,4096

Fills buffers with a pattern that names (source rank, destination rank, byte index), runs
every algorithm at every size, checks every byte, and prints one JSON line per check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import rxelab
from rxelab.errors import RdmaError


def pattern(src: int, dst: int, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint32) * 7 + src * 31 + dst * 17) & 0xFF).astype(np.uint8)


def check(name: str, got: np.ndarray, want: np.ndarray) -> dict[str, object]:
    wrong = int(np.count_nonzero(got != want))
    return {"check": name, "ok": wrong == 0, "wrong": wrong, "bytes": int(want.nbytes)}


def run(comm: rxelab.comm.Communicator, sizes: list[int], algorithms: dict[str, list[str]]) -> list[dict]:
    r, p = comm.rank, comm.size
    results = []
    for m in sizes:
        send = np.concatenate([pattern(r, d, m) for d in range(p)]) if p * m else np.zeros(0, np.uint8)
        want = np.concatenate([pattern(s, r, m) for s in range(p)]) if p * m else np.zeros(0, np.uint8)
        for algo in algorithms["alltoall"]:
            recv = np.full(p * m, 0xEE, np.uint8)
            stats = comm.alltoall(send, recv, algorithm=algo)
            results.append({**check(f"alltoall/{algo}/{m}", recv, want),
                            "peak_inflight": stats.peak_inflight, "seconds": stats.seconds})
        counts = [(m + d) % (m + 3) for d in range(p)]  # uneven: v-variant
        rcounts = [(m + r) % (m + 3) for _ in range(p)]
        vsend = np.concatenate([pattern(r, d, c) for d, c in enumerate(counts)] or [np.zeros(0, np.uint8)])
        vwant = np.concatenate([pattern(s, r, c) for s, c in enumerate(rcounts)] or [np.zeros(0, np.uint8)])
        for algo in algorithms["alltoall"]:
            vrecv = np.full(vwant.nbytes, 0xEE, np.uint8)
            comm.alltoallv(vsend, counts, vrecv, rcounts, algorithm=algo)
            results.append(check(f"alltoallv/{algo}/{m}", vrecv, vwant))
        mine = pattern(r, r, m)
        gwant = np.concatenate([pattern(s, s, m) for s in range(p)]) if p * m else np.zeros(0, np.uint8)
        for algo in algorithms["allgather"]:
            grecv = np.full(p * m, 0xEE, np.uint8)
            comm.allgather(mine, grecv, algorithm=algo)
            results.append(check(f"allgather/{algo}/{m}", grecv, gwant))
        if p > 1:  # point to point around the ring, both directions
            right, left = (r + 1) % p, (r - 1) % p
            out = pattern(r, right, m)
            into = np.full(m, 0xEE, np.uint8)
            if r % 2 == 0:
                comm.send(out, right)
                comm.recv(into, left)
            else:
                comm.recv(into, left)
                comm.send(out, right)
            results.append(check(f"sendrecv/{m}", into, pattern(left, r, m)))
            target = np.full(m + 8, 0xEE, np.uint8)
            comm.expose(target, left)
            remote = comm.remote(right)
            comm.write(pattern(r, right, m), remote, offset=8, imm=m & 0xFFFFFF)
            comm.wait_imm(left, m & 0xFFFFFF, m)
            results.append(check(f"write_imm/{m}", target[8:], pattern(left, r, m)))
        comm.barrier()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0,1,7,4096,1048576", help="bytes per peer, comma-separated")
    ap.add_argument("--alltoall", default=",".join(rxelab.ALLTOALL_ALGORITHMS))
    ap.add_argument("--allgather", default=",".join(rxelab.ALLGATHER_ALGORITHMS))
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--window", type=int, default=4 << 20)
    ap.add_argument("--chunk", type=int, default=1 << 20)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",") if x]
    algos = {"alltoall": [a for a in args.alltoall.split(",") if a],
             "allgather": [a for a in args.allgather.split(",") if a]}
    started = time.monotonic()
    try:
        with rxelab.init(timeout=args.timeout, window=args.window, chunk=args.chunk) as comm:
            results = run(comm, sizes, algos)
            rank = comm.rank
    except RdmaError as err:
        print(json.dumps({"error": str(err), "type": type(err).__name__}), flush=True)
        return 2
    for res in results:
        print(json.dumps({"rank": rank, **res}), flush=True)
    bad = [r for r in results if not r["ok"]]
    print(json.dumps({"rank": rank, "summary": True, "checks": len(results), "failed": len(bad),
                      "seconds": round(time.monotonic() - started, 2)}), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

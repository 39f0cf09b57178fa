"""Correctness check of every operation, run by each rank of a job (the tests launch it):

    RANK=r WORLD_SIZE=p MASTER_ADDR=a MASTER_PORT=n python3 -m rxelab.selftest --sizes 0,1,7,4096

Fills buffers with the test data of each collective's description (rxelab.ops), runs every
algorithm at every size, checks every element against the numpy reference, and prints one
JSON line per check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import rxelab
from rxelab import ops, settings
from rxelab.console import one_line_errors
from rxelab.errors import ClosedError


def pattern(src: int, dst: int, n: int) -> np.ndarray:
    return ops.block(src, dst, n)


def check(name: str, got: np.ndarray, want: np.ndarray) -> dict[str, object]:
    wrong = ops.count_wrong(got, want)
    return {"check": name, "ok": wrong == 0, "wrong": wrong, "bytes": int(want.nbytes)}


def run(comm: rxelab.comm.Communicator, sizes: list[int], algorithms: dict[str, list[str]]) -> list[dict]:
    """Every described collective and algorithm at every size (elements of its description's
    dtype), checked against its numpy reference; then point to point and one-sided writes."""
    r, p = comm.rank, comm.size
    results = []
    for m in sizes:
        for name, c in ops.COLLECTIVES.items():
            for algo in algorithms.get(name, c.algorithms):
                send, want = c.data(r, p, m, c.dtype, 0, "sum")
                recv = np.full_like(want, 0xEE)
                stats = ops.run(comm, name, algo, send, recv)
                wrong = ops.wrong(c, send, recv, want)
                results.append({"check": f"{name}/{algo}/{m}", "ok": wrong == 0, "wrong": wrong,
                                "bytes": int(want.nbytes), "peak_inflight": stats.peak_inflight,
                                "seconds": stats.seconds})
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


def bad_input(comm: rxelab.comm.Communicator) -> list[dict]:
    """Every rank makes the same mistakes: each must raise at once, before anything is posted,
    and leave the communicator usable."""
    from rxelab.errors import ConfigError

    p = comm.size
    cases = {
        "size not divisible": lambda: comm.alltoall(np.zeros(p * 4 + 1, np.uint8),
                                                    np.zeros(p * 4 + 1, np.uint8)),
        "mismatched sizes": lambda: comm.alltoall(np.zeros(p * 4, np.uint8), np.zeros(p * 8, np.uint8)),
        "wrong dtype": lambda: comm.alltoall(np.zeros(p * 4, np.int32), np.zeros(p * 4, np.float32)),
        "non-contiguous": lambda: comm.alltoall(np.zeros((p * 4, 2), np.uint8)[:, 0],
                                                np.zeros(p * 4, np.uint8)),
        "read-only receive": lambda: comm.alltoall(np.zeros(p * 4, np.uint8), bytes(p * 4)),
        "not a buffer": lambda: comm.allgather([1, 2, 3], np.zeros(3 * p, np.uint8)),
        "unknown algorithm": lambda: comm.alltoall(np.zeros(p, np.uint8), np.zeros(p, np.uint8),
                                                   algorithm="no-such-algorithm"),
        "bad counts": lambda: comm.alltoallv(np.zeros(4, np.uint8), [1] * (p + 1),
                                             np.zeros(4, np.uint8), [1] * (p + 1)),
        "bad peer": lambda: comm.send(np.zeros(4, np.uint8), comm.rank),
    }
    results = []
    for name, call in cases.items():
        try:
            call()
            results.append({"check": f"bad-input/{name}", "ok": False, "error": "no error raised"})
        except ConfigError as err:
            results.append({"check": f"bad-input/{name}", "ok": True, "error": str(err)})
    send = np.concatenate([pattern(comm.rank, d, 16) for d in range(p)])
    recv = np.zeros(16 * p, np.uint8)
    comm.alltoall(send, recv)  # still usable after all that
    want = np.concatenate([pattern(s, comm.rank, 16) for s in range(p)])
    results.append(check("bad-input/usable-after", recv, want))
    return results


def fault(comm: rxelab.comm.Communicator, victim: int, how: str,
          hang_s: float = 3600) -> list[dict]:
    """Rank `victim` dies (or hangs); every other rank must get a PeerError naming it. A hang
    is timed from the barrier and then ends in death, so a test's job ends when the survivors
    have had their say, not at a launcher timeout that would have to guess the lab's start-up."""
    import os

    from rxelab.errors import PeerError

    comm.barrier()
    if comm.rank == victim:
        if how == "die":
            os._exit(3)
        time.sleep(hang_s)
        os._exit(3)
    p = comm.size
    started = time.monotonic()
    try:
        comm.alltoall(np.zeros(p * 1024, np.uint8), np.zeros(p * 1024, np.uint8),
                      algorithm="parallel")
        return [{"check": f"fault/{how}", "ok": False, "error": "no error raised"}]
    except PeerError as err:
        took = time.monotonic() - started
        named = f"rank {victim}" in str(err)
        try:  # after a failed collective the communicator refuses further work, clearly
            comm.alltoall(np.zeros(p, np.uint8), np.zeros(p, np.uint8))
            refused = False
        except rxelab.ClosedError:
            refused = True
        return [{"check": f"fault/{how}", "ok": named and refused, "error": str(err),
                 "seconds": round(took, 1)}]


@one_line_errors("selftest")
def main(argv: list[str] | None = None) -> int:
    """A failure that is no check's (no RDMA device, a rank that never came) is one line on
    stderr (rxelab.console); stdout holds the checks alone."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0,1,7,4096,1048576", help="bytes per peer, comma-separated")
    for name, c in ops.COLLECTIVES.items():
        ap.add_argument(f"--{name.replace('_', '-')}", default=",".join(c.algorithms),
                        help=f"{name} algorithms to check (default: all)")
    settings.add_flags(ap)
    ap.add_argument("--transport", choices=settings.TRANSPORTS, default=None,
                    help=f"what the collectives run over (default: ${settings.TRANSPORT_ENV}, "
                         "else verbs)")
    ap.add_argument("--mode", choices=["data", "bad-input", "die", "hang"], default="data")
    ap.add_argument("--victim", type=int, default=1, help="the rank that dies or hangs")
    ap.add_argument("--hang-for", type=float, default=3600, metavar="S",
                    help="--mode hang: seconds the victim hangs before it dies")
    args = ap.parse_args(argv)
    if not 0 <= args.hang_for <= 86400:
        ap.error(f"--hang-for {args.hang_for:g}: seconds from 0 to 86400")
    sizes = [int(x) for x in args.sizes.split(",") if x]
    algos = {name: [a for a in getattr(args, name).split(",") if a] for name in ops.COLLECTIVES}
    started = time.monotonic()
    with rxelab.init(transport=args.transport, **settings.from_flags(args)) as comm:
        rank = comm.rank
        if args.mode == "data":
            results = run(comm, sizes, algos)
        elif args.mode == "bad-input":
            results = bad_input(comm)
        else:
            results = fault(comm, args.victim, args.mode, args.hang_for)
    if args.mode == "bad-input":
        try:
            comm.barrier()
            results.append({"check": "bad-input/after-close", "ok": False})
        except ClosedError as err:
            results.append({"check": "bad-input/after-close", "ok": True, "error": str(err)})
    for res in results:
        print(json.dumps({"rank": rank, **res}), flush=True)
    bad = [r for r in results if not r["ok"]]
    print(json.dumps({"rank": rank, "summary": True, "checks": len(results), "failed": len(bad),
                      "seconds": round(time.monotonic() - started, 2)}), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

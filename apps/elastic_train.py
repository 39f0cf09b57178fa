"""Elastic data-parallel training on numpy: every step each rank makes a gradient (a float32
vector of --size bytes), the ranks allreduce it, average it and update their parameters. A rank
that dies (--kill K:R: rank R kills itself with SIGKILL at step K, as kill -9 would)
or a node that drops off the network leaves the others going on, shrunk (rxelab.elastic); every
--admit-every steps the job lets in newcomers (this app started with --join).

    python3 -m rxelab.launch --elastic --hosts node1,node2,node3 --per-host 2 -- \\
        python3 apps/elastic_train.py --steps 60 --admit-every 5 --kill 10:3
    MASTER_ADDR=node1 RXELAB_JOB_TOKEN_FILE=... python3 apps/elastic_train.py --join

Every step's allreduce is checked against the sum over the ranks alive in that step (each
rank's gradient is made from its id and the step, so any rank knows everyone's). Prints JSON
lines: {"record": "elastic", "event": "step" | "shrink" | "admit" | "joined" | "stopped" |
"done", ...} with the step, the world size, times and wall clock; rank 0 of the current
communicator prints the steps, every rank its own changes and its end (with a digest of its
parameters: survivors must agree).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from typing import Any

import numpy as np
import rxelab
from rxelab import elastic, settings
from rxelab.errors import PeerError, RdmaError

LEARNING_RATE = 0.001


def gradient(identity: int, step: int, n: int) -> np.ndarray:
    """What a rank contributes at a step: small whole numbers, so float32 sums are exact."""
    return np.full(n, float((identity % 97 + 1) * (step % 5 + 1)), np.float32)


def arguments() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50, help="training steps (default 50)")
    ap.add_argument("--size", type=int, default=65536,
                    help="gradient bytes, a multiple of 4 (float32; default 65536)")
    ap.add_argument("--admit-every", type=int, default=0,
                    help="let newcomers in every N steps (default 0: never)")
    ap.add_argument("--admit-timeout", type=float, default=0.0,
                    help="seconds an admit waits for a newcomer (default 0: those waiting)")
    ap.add_argument("--expect-newcomers", type=int, default=0, metavar="N",
                    help="newcomers started for this job: while fewer came, each admit point "
                         "waits up to --admit-timeout for them (default 0)")
    ap.add_argument("--quorum", default="majority",
                    help="who may go on after a death: majority (default), any, or a number")
    ap.add_argument("--kill", action="append", default=[], metavar="STEP:RANK",
                    help="rank RANK (its first number) dies at step STEP, as kill -9 would "
                         "(repeatable)")
    ap.add_argument("--join", action="store_true",
                    help="a newcomer: join the running job at MASTER_ADDR/MASTER_PORT")
    ap.add_argument("--join-timeout", type=float, default=300,
                    help="seconds a newcomer waits to be admitted (default 300)")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds of computation each step (sleep; default 0)")
    ap.add_argument("--mpi", action="store_true",
                    help="the same loop with mpi4py (under mpirun): a death ends the job")
    settings.add_flags(ap, ("timeout",))
    return ap


def check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> str | int:
    if args.steps < 1 or args.steps > 10_000_000:
        ap.error("--steps must be 1..10000000")
    if args.size < 4 or args.size % 4 or args.size > 1 << 30:
        ap.error("--size must be a multiple of 4 from 4 to 1 GiB")
    if args.admit_every < 0 or not 0 <= args.admit_timeout <= 3600:
        ap.error("--admit-every must be >= 0 and --admit-timeout 0..3600")
    if not 0 <= args.expect_newcomers <= 64:
        ap.error("--expect-newcomers must be 0..64")
    if args.expect_newcomers and not (args.admit_every and args.admit_timeout):
        ap.error("--expect-newcomers waits at admit points: it needs --admit-every and "
                 "--admit-timeout")
    if not 0 <= args.pause <= 60:
        ap.error("--pause must be 0..60 seconds")
    try:
        args.kill = {int(r): int(k) for k, _, r in (x.partition(":") for x in args.kill)}
    except ValueError:
        ap.error("--kill takes STEP:RANK, whole numbers")
    if any(k < 0 or r < 0 for r, k in args.kill.items()):
        ap.error("--kill takes STEP:RANK, whole numbers >= 0")
    if args.quorum in ("majority", "any"):
        return str(args.quorum)
    if args.quorum.isdigit() and int(args.quorum) >= 1:
        return int(args.quorum)
    ap.error("--quorum must be majority, any or a number of ranks")
    raise AssertionError  # pragma: no cover


def say(**event: Any) -> None:
    sys.stdout.write(json.dumps({"record": "elastic", "time": time.time(), **event}) + "\n")
    sys.stdout.flush()


def die(comm: Any) -> None:
    """As kill -9 would: the process ends at once, its sockets and QPs closed by the kernel."""
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    ap = arguments()
    args = ap.parse_args(argv)
    quorum = check(ap, args)
    n = args.size // 4
    if args.mpi:
        return mpi_loop(args, n)
    options = settings.from_flags(args)
    started = time.monotonic()
    try:
        if args.join:
            comm = rxelab.join(wait=args.join_timeout, **options)
            # a newcomer's id: unlike any old rank's, whatever the job's size now
            identity = 1000 * comm.formed["generation"] + comm.rank
        else:
            comm = rxelab.init(elastic=True, **options)
            identity = comm.rank
    except RdmaError as err:
        print(f"elastic_train: {err}", file=sys.stderr)
        return 2
    say(event="start", id=identity, rank=comm.rank, size=comm.size, pid=os.getpid(),
        host=os.uname().nodename, init_s=time.monotonic() - started)
    params = np.zeros(n, np.float32)
    seen: dict[str, Any] = {"comm": None, "ids": []}

    def step(c: rxelab.comm.Communicator, k: int) -> None:
        if args.kill.get(identity) == k:
            say(event="dying", id=identity, step=k)
            die(c)
        if c is not seen["comm"]:  # who is in this communicator, by id
            ids = np.empty(c.size, np.int64)
            c.allgather(np.array([identity], np.int64), ids)
            seen["comm"], seen["ids"] = c, [int(i) for i in ids]
        if args.pause:
            time.sleep(args.pause)
        grad = gradient(identity, k, n)
        total = np.empty_like(grad)
        c.allreduce(grad, total)
        expected = sum(float(gradient(i, k, 1)[0]) for i in seen["ids"])
        if not np.all(total == expected):
            raise WrongResult(f"step {k}: allreduce gave {total[0]}, the {len(seen['ids'])} "
                              f"ranks {seen['ids']} make {expected}")
        params[:] -= np.float32(LEARNING_RATE) * (total / np.float32(c.size))

    def report(event: dict[str, Any]) -> None:
        if event["event"] == "step" and seen["comm"] is not None and seen["comm"].rank != 0:
            return
        say(id=identity, **{k: v for k, v in event.items() if k != "members"})

    try:
        last = elastic.run(comm, step, args.steps, [params], admit_every=args.admit_every,
                           admit_timeout=args.admit_timeout, quorum=quorum, report=report,
                           expect=args.expect_newcomers)
    except WrongResult as err:
        say(event="wrong", id=identity, error=str(err))
        return 1
    except PeerError as err:  # this side may not go on (no quorum), or the shrink failed
        say(event="stopped", id=identity, error=str(err)[:500])
        return 3
    except RdmaError as err:
        say(event="stopped", id=identity, error=str(err)[:500])
        return 2
    with last:
        say(event="done", id=identity, rank=last.rank, size=last.size, steps=args.steps,
            params=hashlib.sha256(params.tobytes()).hexdigest()[:16],
            seconds=time.monotonic() - started)
    return 0


def mpi_loop(args: argparse.Namespace, n: int) -> int:
    """Open MPI's side of the comparison: the same steps and checks; a death ends the job
    (MPI_ERRORS_ARE_FATAL), which is what this loop is there to show."""
    started = time.monotonic()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    identity, size = comm.Get_rank(), comm.Get_size()
    say(event="start", id=identity, rank=identity, size=size, pid=os.getpid(),
        host=os.uname().nodename, init_s=time.monotonic() - started)
    params = np.zeros(n, np.float32)
    total = np.empty(n, np.float32)
    for k in range(args.steps):
        begun = time.monotonic()
        if args.kill.get(identity) == k:
            say(event="dying", id=identity, step=k)
            die(comm)
        if args.pause:
            time.sleep(args.pause)
        comm.Allreduce(gradient(identity, k, n), total, op=MPI.SUM)
        expected = sum(float(gradient(i, k, 1)[0]) for i in range(size))
        if not np.all(total == expected):
            say(event="wrong", id=identity, error=f"step {k}: {total[0]} != {expected}")
            return 1
        params[:] -= np.float32(LEARNING_RATE) * (total / np.float32(size))
        if identity == 0:
            say(event="step", id=identity, step=k, size=size, seconds=time.monotonic() - begun)
    say(event="done", id=identity, rank=identity, size=size, steps=args.steps,
        params=hashlib.sha256(params.tobytes()).hexdigest()[:16],
        seconds=time.monotonic() - started)
    return 0


class WrongResult(Exception):
    """An allreduce's result is not the sum over the step's members."""


if __name__ == "__main__":
    sys.exit(main())

"""Our own launcher, for clusters without mpirun or srun: starts a job's ranks over SSH with
the environment init() reads (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and a job secret so
no stranger can join), prefixes their output with the rank, and ends with the first failure's
status. The secret reaches each rank on its standard input, never on a command line (`ps`
shows command lines to every user of a host).

    python3 -m rxelab.launch --hosts node1,node2,node3 [--per-host 2] -- python3 app.py ...
    python3 -m rxelab.launch --hosts 'node[1-3]' ...     # Slurm's hostlist syntax
    python3 -m rxelab.launch --hostfile hosts ...        # mpirun's: `node1 slots=2` a line

Ranks are placed host by host (rxelab.hostfile: --per-host on each, or a hostfile line's
slots=); rank 0 runs on the first host, which is also the rendezvous. A host that is this
machine runs its ranks directly, without SSH.

Elastic jobs (rxelab.init(elastic=True)): with --elastic a rank that ends badly does not end
the job (the others shrink and go on), and the job ends well if any rank did. Newcomers are
started by another launcher with --join --master HOST (the job's first host): they get
MASTER_ADDR and MASTER_PORT but no rank. Both launchers then need the same secret:
--secret-file names a file only its owner can read that holds it (`--new-token` prints a
good one: 256 random bits; a secret of less than 128 bits is refused).

No rank outlives its launcher. Each rank runs under a small shell guard that reads a pipe from
the launcher on its standard input: when the launcher ends - normally, on SIGTERM, SIGHUP or
SIGINT, at its --timeout, or killed outright - or the SSH connection drops, the pipe closes
and the guard ends the rank's whole process group (TERM, then KILL after a grace period).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from rxelab import hostfile
from rxelab.bootstrap import MAX_RANKS, job_secret
from rxelab.console import one_line_errors
from rxelab.control.handshake import new_token
from rxelab.errors import ConfigError
from rxelab.settings import CONGESTION_ENV, DEBUG_ENV, LOG_LEVEL_ENV, TRANSPORT_ENV

LOCAL_NAMES = {"localhost", "127.0.0.1"}
GRACE = 5  # seconds between TERM and KILL
# --elastic: how a rank may end without ending the job badly - finished, killed (SIGKILL, as
# the guard or SSH reports it), or stopped on the wrong side of a partition (apps' exit 3)
LOSSES = (0, 3, 137, -9)
# "$@" is the rank's command. setsid gives the rank, and the watcher, a process group of its
# own, so each can be signalled whole. The watcher's `cat` reads the launcher's pipe: it
# returns when the launcher (or the SSH connection) is gone, and the watcher ends the rank.
# (`kill -TERM -PID` signals a process group in dash and bash alike; the pipe is kept as fd 3
# and handed to the watcher explicitly, because a background job's input is /dev/null.)
WATCHER = ("cat >/dev/null; kill -TERM -$0 2>/dev/null; "
           f"for i in $(seq {GRACE * 10}); do kill -0 $0 2>/dev/null || exit 0; sleep 0.1; done; "
           "kill -KILL -$0 2>/dev/null")
GUARD = (
    # the first line of our input is the job's secret; the rest of it is the launcher's pipe
    "IFS= read -r RXELAB_JOB_TOKEN || exit 1; export RXELAB_JOB_TOKEN; "
    "exec 3<&0; "
    'setsid "$@" </dev/null 3<&- & rank=$!; '
    f"setsid sh -c {shlex.quote(WATCHER)} $rank <&3 >/dev/null 2>&1 3<&- & watcher=$!; "
    "exec 3<&-; "
    "trap 'kill -TERM -$rank 2>/dev/null' TERM HUP INT; "
    "while :; do wait $rank; rc=$?; kill -0 $rank 2>/dev/null || break; done; "
    "kill -TERM -$watcher 2>/dev/null; exit $rc"
)


class Stop(Exception):
    """The launcher was told to stop (SIGTERM, SIGHUP)."""


def local_addresses() -> set[str]:
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(out.split())


def is_local(host: str) -> bool:
    return host in LOCAL_NAMES or host == socket.gethostname() or host in local_addresses()


FORWARDED = ("PYTHONPATH", "RXELAB_RUN_ID", TRANSPORT_ENV, CONGESTION_ENV, LOG_LEVEL_ENV, DEBUG_ENV)


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What of the caller's environment goes to every rank, local or remote."""
    return {k: environ[k] for k in FORWARDED if environ.get(k)}


def rank_argv(host: str, env: dict[str, str], command: list[str]) -> list[str]:
    guarded = ["sh", "-c", GUARD, "guard", "env", *[f"{k}={v}" for k, v in env.items()], *command]
    remote = f"cd {shlex.quote(os.getcwd())} 2>/dev/null; exec {shlex.join(guarded)}"
    if is_local(host):
        return ["sh", "-c", remote]
    return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
            host, remote]


@one_line_errors("launch", expected=(FileNotFoundError,))  # FileNotFoundError: no ssh
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="",
                    help="comma-separated host names, in Slurm's hostlist syntax too: "
                         "'node[1-3,7],gpu[01-04]-ib'")
    ap.add_argument("--hostfile", default="", metavar="FILE",
                    help="the hosts, one a line as mpirun's: 'node1 slots=2' (its ranks; "
                         "default --per-host), a hostlist like 'node[1-3] slots=2' too, "
                         "'#' comments; instead of --hosts")
    ap.add_argument("--per-host", type=int, default=1,
                    help="ranks on each host of --hosts, and of a --hostfile line without "
                         f"slots= (default 1; {MAX_RANKS} ranks in all at most)")
    ap.add_argument("--port", type=int, default=29500, help="rendezvous port on the first host")
    ap.add_argument("--timeout", type=float, default=600, help="seconds before the job is stopped")
    ap.add_argument("--elastic", action="store_true",
                    help="a rank that fails does not end the job (the others shrink and go on)")
    ap.add_argument("--join", action="store_true",
                    help="start newcomers to the running job at --master (no ranks: the job "
                         "admits them)")
    ap.add_argument("--master", default="", help="--join: the job's rendezvous host")
    ap.add_argument("--secret-file", default="",
                    help="the job's secret, from a file only its owner can read (default: a "
                         "new random one)")
    ap.add_argument("--new-token", action="store_true",
                    help="print a new job secret (256 random bits) for RXELAB_JOB_TOKEN or "
                         "--secret-file, and exit")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- program and its arguments")
    args = ap.parse_args(argv)
    if args.new_token:
        print(new_token())
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.hosts and args.hostfile:
        ap.error("give --hosts or --hostfile, not both")
    if not command or not (args.hosts or args.hostfile) or args.per_host < 1:
        ap.error("give --hosts or --hostfile, --per-host >= 1 and a command after --")
    if not 1 <= args.port <= 65535:
        ap.error(f"--port {args.port} is outside 1..65535")
    try:
        seats = hostfile.seats(hostfile.read_hostfile(args.hostfile, args.per_host)
                               if args.hostfile else
                               hostfile.from_hostlist(args.hosts, args.per_host))
    except ConfigError as err:
        ap.error(f"--hostfile {err}" if args.hostfile else f"--hosts: {err}")
    world = len(seats)
    if args.join and not (args.master and args.secret_file):
        ap.error("--join needs --master (the job's first host) and --secret-file (its secret)")
    if args.master and not args.join:
        ap.error("--master is the job's host for newcomers: give it with --join")
    try:
        if args.master:  # it reaches the ranks as MASTER_ADDR
            hostfile.check_host(args.master)
    except ConfigError as err:
        ap.error(f"--master: {err}")
    if args.secret_file:
        try:
            token, _ = job_secret({"RXELAB_JOB_TOKEN_FILE": args.secret_file})
        except ConfigError as err:
            ap.error(str(err).replace("RXELAB_JOB_TOKEN_FILE=", "--secret-file "))
    else:
        token = new_token()
    # passed on as they are: where the library is, the id by which an experiment's clean-up
    # finds the processes it started, and the transport every rank must agree on (each rank's
    # init() checks it, in words); the value reaches the remote shell quoted (rank_argv)
    forwarded = forwarded_env(os.environ)

    stopping: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        if stopping:  # already stopping: a second signal must not cut the clean-up short
            return
        stopping.append(signum)
        raise Stop(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    procs: list[subprocess.Popen[str]] = []
    pumps: list[threading.Thread] = []
    status = 0
    try:
        for rank, seat in enumerate(seats):
            env = ({"MASTER_ADDR": args.master, "MASTER_PORT": str(args.port), **forwarded}
                   if args.join else
                   {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": seats[0].host,
                    "MASTER_PORT": str(args.port), "LOCAL_RANK": str(seat.local_rank),
                    **forwarded})
            # stdin: the secret, then a pipe nobody writes to; its end is the guard's signal
            # to stop the rank
            proc = subprocess.Popen(rank_argv(seat.host, env, command),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            procs.append(proc)
            assert proc.stdin is not None
            try:
                proc.stdin.write(token + "\n")
                proc.stdin.flush()
            except OSError:  # it ended already: its status says why
                pass

        def pump(rank: int, proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(f"[{rank}] {line}")
                sys.stdout.flush()

        pumps = [threading.Thread(target=pump, args=(r, p), daemon=True) for r, p in enumerate(procs)]
        for t in pumps:
            t.start()
        deadline = time.monotonic() + args.timeout
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed and status == 0 and not args.elastic:
                status = failed[0]
                deadline = min(deadline, time.monotonic() + 90)  # the rest notice and end
            if time.monotonic() > deadline:
                print(f"launch: stopping the job after {args.timeout:g} s (--timeout extends it)",
                      file=sys.stderr)
                status = status or 124
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        stopping.append(signal.SIGINT)  # a SIGTERM now must not cut this clean-up short
        print("launch: interrupted; stopping every rank", file=sys.stderr)
        status = 130
    except Stop as why:
        print(f"launch: {why}; stopping every rank", file=sys.stderr)
        status = 143
    finally:
        stopping.append(0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish the clean-up undisturbed
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        _stop_all(procs)
        for t in pumps:
            t.join(timeout=5)
    if (status == 0 and args.elastic and any(p.returncode == 0 for p in procs)
            and all(p.returncode in LOSSES for p in procs)):
        return 0  # the survivors finished: those that died or stopped were the job's to lose
    if status == 0:
        status = next((p.returncode for p in procs if p.returncode), 0)
    return status


def _stop_all(procs: list[subprocess.Popen[str]]) -> None:
    """Close every guard's pipe (each guard then stops its rank, on whatever host), wait for
    them, and only then take the SSH clients down."""
    for p in procs:
        if p.stdin is not None:
            try:
                p.stdin.close()
            except OSError:
                pass
    end = time.monotonic() + GRACE + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


if __name__ == "__main__":
    sys.exit(main())

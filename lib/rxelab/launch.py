"""Our own launcher, for clusters without mpirun or srun: starts a job's ranks over SSH with
the environment init() reads (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), prefixes their
output with the rank, and ends with the first failure's status.

    python3 -m rxelab.launch --hosts node1,node2,node3 [--per-host 2] -- python3 app.py ...

Ranks are placed host by host; rank 0 runs on the first host, which is also the rendezvous.
A host that is this machine runs its ranks directly, without SSH.
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

LOCAL_NAMES = {"localhost", "127.0.0.1"}


def local_addresses() -> set[str]:
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(out.split())


def is_local(host: str) -> bool:
    return host in LOCAL_NAMES or host == socket.gethostname() or host in local_addresses()


def rank_argv(host: str, env: dict[str, str], command: list[str]) -> list[str]:
    assignments = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    remote = f"cd {shlex.quote(os.getcwd())} 2>/dev/null; exec env {' '.join(assignments)} " + \
        shlex.join(command)
    if is_local(host):
        return ["sh", "-c", remote]
    return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
            host, remote]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", required=True, help="comma-separated host names")
    ap.add_argument("--per-host", type=int, default=1, help="ranks per host (default 1)")
    ap.add_argument("--port", type=int, default=29500, help="rendezvous port on the first host")
    ap.add_argument("--timeout", type=float, default=600, help="seconds before the job is stopped")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- program and its arguments")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    hosts = [h for h in args.hosts.split(",") if h]
    if not command or not hosts or args.per_host < 1:
        ap.error("give --hosts, --per-host >= 1 and a command after --")
    world = len(hosts) * args.per_host
    pythonpath = os.environ.get("PYTHONPATH", "")
    procs: list[subprocess.Popen[str]] = []
    for rank in range(world):
        env = {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": hosts[0],
               "MASTER_PORT": str(args.port), "LOCAL_RANK": str(rank % args.per_host)}
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        procs.append(subprocess.Popen(rank_argv(hosts[rank // args.per_host], env, command),
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True))

    def pump(rank: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(f"[{rank}] {line}")
            sys.stdout.flush()

    pumps = [threading.Thread(target=pump, args=(r, p), daemon=True) for r, p in enumerate(procs)]
    for t in pumps:
        t.start()
    deadline = time.monotonic() + args.timeout
    status = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed and status == 0:
                status = failed[0]
                deadline = min(deadline, time.monotonic() + 90)  # the rest notice and end
            if time.monotonic() > deadline:
                print(f"launch: stopping the job after {args.timeout:g} s", file=sys.stderr)
                status = status or 124
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        status = 130
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for t in pumps:
            t.join(timeout=5)
    if status == 0:
        status = next((p.returncode for p in procs if p.returncode), 0)
    return status


if __name__ == "__main__":
    sys.exit(main())

"""Waiting for nodes to become usable, with progress per node and a deadline that names
what it waited for. Ready means: SSH answers, cloud-init finished without errors, and the
RDMA port is ACTIVE.

Polling reads files (boot-finished, result.json, sysfs) instead of running `cloud-init
status`, which costs seconds of guest CPU per call under emulation.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from infra.errors import LabError
from infra.inventory import Host
from infra.ssh import shell_vars, ssh_run

POLL_S = 3.0
# Once SSH answers, every probe is an SSH handshake that steals guest CPU from cloud-init
# (seconds of it under TCG), so probe again only when the serial console says cloud-init
# finished, or after this long.
SLOW_POLL_S = 20.0
FINISHED_MARK = "finished at"
HEARTBEAT_S = 15.0
PROBE = (
    "test -f /var/lib/cloud/instance/boot-finished && echo boot-finished; "
    "cat /run/cloud-init/result.json 2>/dev/null; echo; "
    'cat "/sys/class/infiniband/$dev/ports/$port/state" 2>/dev/null || echo no-rdma-device'
)


@dataclass
class Progress:
    stage: str = "booting"
    since: float = field(default_factory=time.monotonic)
    error: str | None = None
    done: bool = False


def parse_probe(output: str, device: str) -> tuple[str, str | None, bool]:
    """(stage, error, done) from the probe's output."""
    if "boot-finished" not in output:
        return "ssh up, cloud-init running", None, False
    start, end = output.find("{"), output.rfind("}")
    if start >= 0 and end > start:
        try:
            errors = json.loads(output[start:end + 1]).get("v1", {}).get("errors", [])
        except ValueError:
            errors = []
        if errors:
            return "cloud-init failed", "cloud-init reported errors: " + "; ".join(map(str, errors)), False
    if "ACTIVE" in output:
        return f"ready ({device} ACTIVE)", None, True
    if "no-rdma-device" in output:
        return f"cloud-init done, waiting for {device}", None, False
    return f"cloud-init done, {device} not ACTIVE yet", None, False


def _wait_for_console(log: Path | None, mark: str, limit: float, stop: threading.Event) -> None:
    deadline = time.monotonic() + limit
    while not stop.is_set() and time.monotonic() < deadline:
        if log is not None and log.exists() and mark in log.read_text(errors="replace"):
            stop.wait(1.0)  # cloud-init is done or nearly; a short pause, then probe
            return
        stop.wait(1.0)


def wait_ready(
    hosts: list[Host],
    *,
    timeout: float,
    alive: Callable[[Host], bool],
    serial_log: Callable[[Host], Path | None],
    say: Callable[[str], None] = lambda s: print(s, flush=True),
) -> dict[str, float]:
    """Block until every host is ready; return seconds to ready per host."""
    start = time.monotonic()
    progress = {h.name: Progress() for h in hosts}
    ready_at: dict[str, float] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def watch(host: Host) -> None:
        p = progress[host.name]
        probe = shell_vars(dev=host.rdma.device, port=host.rdma.port) + PROBE
        while not stop.is_set():
            if not alive(host):
                p.error = "its VM exited"
                return
            r = ssh_run(host, probe, timeout=30, check=False)
            if r.returncode == 0:
                stage, error, done = parse_probe(r.stdout, host.rdma.device)
            else:
                stage, error, done = "booting", None, False
            with lock:
                if stage != p.stage:
                    p.stage, p.since = stage, time.monotonic()
                    say(f"{host.name}: {stage} ({time.monotonic() - start:.0f} s)")
            if error:
                p.error = error
                return
            if done:
                p.done = True
                ready_at[host.name] = time.monotonic() - start
                return
            if r.returncode != 0:
                stop.wait(POLL_S)
            else:
                _wait_for_console(serial_log(host), FINISHED_MARK, SLOW_POLL_S, stop)

    threads = [threading.Thread(target=watch, args=(h,), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    say(f"waiting for {len(hosts)} nodes (up to {timeout:.0f} s): SSH, cloud-init, RDMA port")
    last_beat = time.monotonic()
    try:
        while any(t.is_alive() for t in threads):
            elapsed = time.monotonic() - start
            if elapsed > timeout:
                break
            if time.monotonic() - last_beat >= HEARTBEAT_S:
                last_beat = time.monotonic()
                pending = ", ".join(f"{n} {p.stage}" for n, p in progress.items() if not p.done)
                say(f"  {elapsed:.0f} s: {pending}")
            time.sleep(0.5)
    finally:
        stop.set()
    failed = {n: p for n, p in progress.items() if not p.done}
    if failed:
        name, p = next(iter(failed.items()))
        what = p.error or f"not ready after {timeout:.0f} s (last stage: {p.stage})"
        host = next(h for h in hosts if h.name == name)
        log = serial_log(host)
        tail = ""
        if log and log.exists():
            lines = log.read_text(errors="replace").splitlines()[-15:]
            tail = f"\nlast lines of {log}:\n    " + "\n    ".join(lines)
        others = ", ".join(n for n in failed if n != name)
        raise LabError(f"{name}: {what}" + (f" (also not ready: {others})" if others else "") + tail)
    return ready_at

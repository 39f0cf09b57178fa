"""Waiting for nodes to become usable, with progress per node and a deadline that names
what it waited for. Ready means: SSH answers, cloud-init finished without errors, and the
RDMA port is ACTIVE.

The wait is driven by the serial console, which costs the guest nothing to watch: cloud-init
prints each stage there and its final message last. Only then is the node probed over SSH
(an SSH handshake costs seconds of guest CPU under emulation, stolen from the boot). A node
whose console says nothing new is probed every SLOW_POLL_S all the same. The probe reads files
(boot-finished, result.json, sysfs) instead of running `cloud-init status`, which costs
seconds of guest CPU per call.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from infra import rdmaport
from infra.errors import LabError
from infra.inventory import Host
from infra.ssh import ssh_run

POLL_S = 3.0
SLOW_POLL_S = 20.0
FINISHED_MARK = "finished at"
# What the console shows, latest first: (text printed, the stage it starts).
CONSOLE_STAGES = (
    (FINISHED_MARK, "cloud-init finished"),
    ("running 'modules:final'", "cloud-init final stage"),
    ("running 'modules:config'", "cloud-init config stage"),
    ("running 'init' ", "cloud-init network stage"),
    ("running 'init-local'", "cloud-init local stage"),
    ("Run /init as init process", "initrd"),
    ("Linux version", "kernel"),
)
HEARTBEAT_S = 15.0
NO_DEVICE = "no-rdma-device"


def probe_command(host: Host) -> str:
    """Whether cloud-init finished, its result, and the RDMA port's state."""
    return ("test -f /var/lib/cloud/instance/boot-finished && echo boot-finished; "
            "cat /run/cloud-init/result.json 2>/dev/null; echo; "
            + rdmaport.state_command(host.rdma, NO_DEVICE))


def console_stage(text: str) -> str | None:
    """The latest boot stage the serial console shows, or None."""
    for mark, stage in CONSOLE_STAGES:
        if mark in text:
            return stage
    return None


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
    if rdmaport.ACTIVE in output:
        return f"ready ({device} ACTIVE)", None, True
    if NO_DEVICE in output:
        return f"cloud-init done, waiting for {device}", None, False
    return f"cloud-init done, {device} not ACTIVE yet", None, False


class Console:
    """A node's serial log, read from where the last look stopped."""

    def __init__(self, log: Path | None) -> None:
        self.log, self.offset = log, 0
        self.stage: str | None = None
        self.finished = False
        self._tail = ""

    def look(self) -> str | None:
        """The stage the console has reached, if it moved since the last look."""
        if self.log is None or not self.log.exists():
            return None
        with self.log.open("rb") as f:
            f.seek(self.offset)
            new = f.read().decode(errors="replace")
            self.offset = f.tell()
        text, self._tail = self._tail + new, (self._tail + new)[-200:]  # marks split by a read
        stage = console_stage(text)
        if stage is None or stage == self.stage:
            return None
        self.stage, self.finished = stage, self.finished or stage == "cloud-init finished"
        return stage


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

    def show(p: Progress, host: Host, stage: str) -> None:
        with lock:
            if stage != p.stage:
                p.stage, p.since = stage, time.monotonic()
                say(f"{host.name}: {stage} ({time.monotonic() - start:.0f} s)")

    def watch(host: Host) -> None:
        p = progress[host.name]
        console = Console(serial_log(host))
        probe = probe_command(host)
        last_probe = time.monotonic()
        while not stop.is_set():
            if not alive(host):
                p.error = "its VM exited"
                return
            if (stage := console.look()) is not None:
                show(p, host, stage)
            # Probe once the console says cloud-init finished, or when it has been quiet long.
            patience = SLOW_POLL_S if console.log is not None else POLL_S
            if not console.finished and time.monotonic() - last_probe < patience:
                stop.wait(0.5)
                continue
            r = ssh_run(host, probe, timeout=30, check=False)
            last_probe = time.monotonic()
            if r.returncode == 0:
                stage, error, done = parse_probe(r.stdout, host.rdma.device)
                show(p, host, stage)
                if error:
                    p.error = error
                    return
                if done:
                    p.done = True
                    ready_at[host.name] = time.monotonic() - start
                    return
            # cloud-init finishes a moment before sshd starts (sshd follows it): a refused
            # connection costs the guest nothing, so ask again soon
            stop.wait(1.0 if console.finished else 0.5)

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

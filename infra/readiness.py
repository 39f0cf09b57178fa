"""Waiting for nodes to become usable, with progress per node and deadlines that follow
progress. Ready means: SSH answers, cloud-init finished without errors, and the RDMA port is
ACTIVE.

A clock tuned on a quiet host fails a slow boot on a busy one, so a node is failed only when it
stops moving: no new console output, no new stage, and its VM idle (its qemu's CPU time), for
a stall window. A boot that keeps moving may take long; a cap on the whole wait still names
its setting, so nothing waits for ever.

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
from infra.run import BUSY_SHARE, CPU_WINDOW_S
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
PROBE_TIMEOUT_S = 60.0  # one SSH probe; a busy guest's handshake takes seconds of its CPU


@dataclass(frozen=True)
class Deadlines:
    """How long a node may go without progress, and the whole wait at most; each named by the
    setting that extends it."""

    stall: float
    total: float
    stall_setting: str = "RXELAB_STALL"
    total_setting: str = "RXELAB_BOOT_TIMEOUT"


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
    moved: float = field(default_factory=time.monotonic)  # the last sign of progress
    error: str | None = None
    done: bool = False
    cpu: tuple[float, float] | None = None  # (when, the VM's CPU seconds then)

    def sample_cpu(self, seconds: float | None, now: float) -> None:
        """A VM that used more than BUSY_SHARE of a core since the last sample is working."""
        if seconds is None:
            return
        if self.cpu is None:
            self.cpu = (now, seconds)
        elif now - self.cpu[0] >= CPU_WINDOW_S:
            if seconds - self.cpu[1] >= BUSY_SHARE * (now - self.cpu[0]):
                self.moved = now
            self.cpu = (now, seconds)


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
        self.grew = False
        self._tail = ""

    def look(self) -> str | None:
        """The stage the console has reached, if it moved since the last look (`grew` says
        whether anything at all was printed)."""
        self.grew = False
        if self.log is None or not self.log.exists():
            return None
        with self.log.open("rb") as f:
            f.seek(self.offset)
            new = f.read().decode(errors="replace")
            self.offset = f.tell()
        self.grew = bool(new)
        text, self._tail = self._tail + new, (self._tail + new)[-200:]  # marks split by a read
        stage = console_stage(text)
        if stage is None or stage == self.stage:
            return None
        self.stage, self.finished = stage, self.finished or stage == "cloud-init finished"
        return stage


def wait_ready(
    hosts: list[Host],
    *,
    deadlines: Deadlines,
    alive: Callable[[Host], bool],
    serial_log: Callable[[Host], Path | None],
    cpu_seconds: Callable[[Host], float | None] = lambda h: None,
    say: Callable[[str], None] = lambda s: print(s + "\n", end="", flush=True),
) -> dict[str, float]:
    """Block until every host is ready; return seconds to ready per host. A node that makes no
    progress for deadlines.stall, or the whole wait past deadlines.total, raises a LabError."""
    start = time.monotonic()
    progress = {h.name: Progress() for h in hosts}
    ready_at: dict[str, float] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def show(p: Progress, host: Host, stage: str) -> None:
        with lock:
            p.moved = time.monotonic()
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
            elif console.grew:
                p.moved = time.monotonic()
            # Probe once the console says cloud-init finished, or when it has been quiet long.
            patience = SLOW_POLL_S if console.log is not None else POLL_S
            if not console.finished and time.monotonic() - last_probe < patience:
                stop.wait(0.5)
                continue
            try:
                r = ssh_run(host, probe, timeout=PROBE_TIMEOUT_S, check=False)
            except LabError:  # the probe ran out of time: the node did not answer, this once
                r = None
            last_probe = time.monotonic()
            if r is not None and r.returncode == 0:
                stage, error, done = parse_probe(r.stdout, host.rdma.device)
                if stage != p.stage:
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
    say(f"waiting for {len(hosts)} nodes: SSH, cloud-init, RDMA port (a node is failed after "
        f"{deadlines.stall:.0f} s without progress, {deadlines.stall_setting}; the whole wait "
        f"after {deadlines.total:.0f} s, {deadlines.total_setting})")
    last_beat = time.monotonic()
    failure: tuple[str, str] | None = None  # (node, what)
    try:
        while any(t.is_alive() for t in threads):
            now = time.monotonic()
            for h in hosts:
                progress[h.name].sample_cpu(cpu_seconds(h), now)
            failure = _overdue(progress, deadlines, now, start)
            if failure:
                break
            if now - last_beat >= HEARTBEAT_S:
                last_beat = now
                with lock:  # one line at a time: the nodes' threads say their stages too
                    say(f"  {now - start:.0f} s: " + ", ".join(
                        f"{n} {p.stage}" + (f" (still for {now - p.moved:.0f} s)"
                                            if now - p.moved >= 60 else "")
                        for n, p in progress.items() if not p.done))
            time.sleep(0.5)
    finally:
        stop.set()
    failed = {n: p for n, p in progress.items() if not p.done}
    if not failed:
        return ready_at
    name, what = failure or next(((n, p.error) for n, p in failed.items() if p.error),
                                 (next(iter(failed)), "not ready"))
    host = next(h for h in hosts if h.name == name)
    others = ", ".join(f"{n} ({p.stage})" for n, p in failed.items() if n != name)
    raise LabError(f"{name}: {what}" + (f" (also not ready: {others})" if others else "")
                   + _console_tail(serial_log(host)), hint=_hint(what, deadlines))


def _overdue(progress: dict[str, Progress], deadlines: Deadlines, now: float,
             start: float) -> tuple[str, str] | None:
    """The first node past a deadline, and what it waited for."""
    for name, p in progress.items():
        if p.done or p.error:
            continue
        if now - p.moved > deadlines.stall:
            return name, (f"no progress for {deadlines.stall:.0f} s (last stage: {p.stage}; no new "
                          f"console output, no new stage, its VM idle)")
        if now - start > deadlines.total:
            return name, f"not ready after {deadlines.total:.0f} s (last stage: {p.stage})"
    return None


def _hint(what: str, deadlines: Deadlines) -> str | None:
    if what.startswith("no progress"):
        return (f"a node that is only slow keeps its VM busy and is waited for; this one was idle. "
                f"If it needs longer, set {deadlines.stall_setting}=<seconds>")
    if what.startswith("not ready after"):
        return f"its boot was still moving: set {deadlines.total_setting}=<seconds> to wait longer"
    return None


def _console_tail(log: Path | None) -> str:
    if not log or not log.exists():
        return ""
    lines = log.read_text(errors="replace").splitlines()[-15:]
    return f"\nlast lines of {log}:\n    " + "\n    ".join(lines)

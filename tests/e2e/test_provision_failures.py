"""A provision that fails or is interrupted leaves nothing running and nothing half-made.

Each test runs `make provision` for a small lab of its own (own name, ports, state) and
breaks it on purpose; VMs live only seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from infra import network
from infra import run as runner
from infra.config import REPO
from infra.state import MARKER

pytestmark = pytest.mark.vm


def lab_env(tmp_path: Path, lab: str, port_base: int, **extra: str) -> dict[str, str]:
    return {**os.environ, "RXELAB_STATE": str(tmp_path / "state"), "LAB": lab,
            "SSH_PORT_BASE": str(port_base), "NODES": "2", **extra}


def qemu_of_lab(lab: str) -> list[int]:
    """Pids of qemu processes named after this lab (vm.py names them `<lab>-nodeN`)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and runner.process_is(int(proc.name), "qemu-system-x86_64"):
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(arg.startswith(f"{lab}-node".encode()) for arg in cmdline):
                pids.append(int(proc.name))
    return pids


def assert_nothing_left(lab: str, state: Path) -> None:
    assert qemu_of_lab(lab) == [], f"qemu of lab {lab} still running"
    if os.geteuid() == 0:
        assert f"{lab}-data" not in network.namespaces()
        leftover_taps = [p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith(f"{lab}t")]
        assert leftover_taps == []
    if state.exists():
        assert {p.name for p in state.iterdir()} <= {"logs", MARKER}, "only serial logs are kept"


# These labs boot beside the shared one, whose VMs yield to the unit tests (conftest.yield_cpu):
# theirs yield more, so the shared lab's timing-sensitive tests (a newcomer joining in time)
# keep theirs.
NICE = ["nice", "-n", "19"]


def make(target: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NICE, "make", target], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_a_node_that_is_not_ready_in_time_is_named_with_its_serial_log(tmp_path):
    env = lab_env(tmp_path, "rxefail", 2420, RXELAB_BOOT_TIMEOUT="12")
    try:
        r = make("provision", env, timeout=900)
        out = r.stdout + r.stderr
        assert r.returncode != 0
        assert "provisioning failed" in out and "not ready after 12 s" in out, out[-3000:]
        assert "last lines of" in out and "serial.log" in out
        assert "Traceback" not in out
        assert_nothing_left("rxefail", tmp_path / "state")
    finally:
        d = make("destroy", env, timeout=300)
    assert d.returncode == 0 and not (tmp_path / "state").exists()


def default_sigint() -> None:
    """In the child: Ctrl-C does what it does at a terminal, even when this test process was
    started with SIGINT ignored (a background job of a non-interactive shell, many CI
    runners), which the child would otherwise inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_provision_stops_and_removes_everything(tmp_path):
    env = lab_env(tmp_path, "rxeint", 2440)
    run_dir = tmp_path / "state" / "run"
    try:
        proc = subprocess.Popen([*NICE, "make", "provision"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                preexec_fn=default_sigint)
        try:
            deadline = time.monotonic() + 600
            while not (run_dir.exists() and list(run_dir.glob("node*.pid"))):
                assert proc.poll() is None, f"provision ended early: {proc.stdout.read()}"
                assert time.monotonic() < deadline, "no VM was started within 10 minutes"
                time.sleep(0.5)
            time.sleep(3)
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
            out, _ = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert proc.returncode != 0
        assert "interrupted" in out and "nothing is left running" in out, out[-3000:]
        assert "Traceback" not in out
        assert_nothing_left("rxeint", tmp_path / "state")
        d = make("destroy", env, timeout=300)
        assert d.returncode == 0
        again = make("provision", {**env, "RXELAB_BOOT_TIMEOUT": "10"}, timeout=600)
        assert "node1: started" in again.stdout + again.stderr, "the next provision is not tripped"
        assert "already exists" not in again.stdout + again.stderr
    finally:  # whatever failed above, this test's lab is gone afterwards
        make("destroy", env, timeout=300)
        for pid in qemu_of_lab("rxeint"):
            os.kill(pid, signal.SIGKILL)
    assert_nothing_left("rxeint", tmp_path / "state")

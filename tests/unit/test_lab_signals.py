"""A signal during provision or destroy leaves nothing running: Terraform is told and waited
for, a destroy (the clean-up itself) finishes, and one SIGTERM is one interrupt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from infra import run as runner
from infra.config import REPO
from infra.state import LabState
from tests.unit.lab_helpers import unique_lab

FAKE_TERRAFORM = """#!/bin/sh
# stands in for Terraform: init passes, apply runs until interrupted and says it was
case " $* " in *" init "*) exit 0;; esac
case " $* " in *" version "*) echo '{"terraform_version": "1.11.4"}'; exit 0;; esac
trap 'echo interrupted-by-INT >> "$TF_FAKE_LOG"; exit 130' INT
echo $$ > "$TF_FAKE_PID"
while :; do sleep 0.2; done
"""


@pytest.mark.parametrize("sig, terminal", [(signal.SIGTERM, "pipe"), (signal.SIGHUP, "pipe"),
                                           (signal.SIGHUP, "closed terminal")])
def test_a_signal_during_provision_interrupts_terraform_and_cleans_up(tmp_path, sig, terminal):
    """...also when the terminal really closed: writing to it then fails (EIO), and the
    clean-up must go on regardless (what it says goes to the lab's logs/provision.log)."""
    import pty

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "terraform").write_text(FAKE_TERRAFORM)
    (bin_dir / "terraform").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RXELAB_CACHE": str(tmp_path / "c"),
           "TF_FAKE_LOG": str(tmp_path / "tf.log"), "TF_FAKE_PID": str(tmp_path / "tf.pid")}
    state_dir = tmp_path / "lab"
    master = slave = None
    if terminal == "pipe":
        out = subprocess.PIPE
    else:
        master, slave = pty.openpty()
        out = slave
    proc = subprocess.Popen([sys.executable, "-m", "infra", "--state-dir", str(state_dir), "provision",
                             "--lab", unique_lab(), "--ssh-port-base", "40400", "--image", "debian-12"],
                            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "tf.pid").exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "terraform apply never started"
            time.sleep(0.1)
        tf_pid = int((tmp_path / "tf.pid").read_text())
        if master is not None:
            os.close(slave)
            os.close(master)  # the terminal is gone
        proc.send_signal(sig)
        said = proc.communicate(timeout=60)[0] if terminal == "pipe" else ""
        proc.wait(timeout=60)
        if sig == signal.SIGHUP:  # the terminal is gone: the rest went to the log
            said += (state_dir / "logs" / "provision.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1, said
    assert "interrupted: removing everything this provision started" in said, said
    assert "Traceback" not in said
    assert (tmp_path / "tf.log").read_text().strip() == "interrupted-by-INT", "Terraform was told"
    assert not runner.process_is(tf_pid, "sh"), "Terraform was left running"


SLOW_TERRAFORM = """#!/bin/sh
# stands in for Terraform: init passes; destroy, or apply until interrupted, takes a while,
# and says when it has finished
case " $* " in *" init "*) exit 0;; esac
case " $* " in *" version "*) echo '{"terraform_version": "1.11.4"}'; exit 0;; esac
echo $$ > "$TF_FAKE_PID"
case " $* " in *" destroy "*) sleep 2; echo destroyed >> "$TF_FAKE_LOG"; exit 0;; esac
trap 'echo interrupted >> "$TF_FAKE_LOG"; sleep 2; echo finished >> "$TF_FAKE_LOG"; exit 130' INT
while :; do sleep 0.2; done
"""


def slow_terraform(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "terraform").write_text(SLOW_TERRAFORM)
    (bin_dir / "terraform").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RXELAB_CACHE": str(tmp_path / "c"),
            "TF_FAKE_LOG": str(tmp_path / "tf.log"), "TF_FAKE_PID": str(tmp_path / "tf.pid")}


def started_terraform(tmp_path, proc):
    deadline = time.monotonic() + 60
    while not (tmp_path / "tf.pid").exists():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "terraform never started"
        time.sleep(0.05)
    return int((tmp_path / "tf.pid").read_text())


def stop_all(proc, tmp_path):
    """What a test started, stopped by its own pids also when it fails: the command's group,
    and a fake Terraform left running in a session of its own."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if (tmp_path / "tf.pid").exists():
        try:
            os.killpg(int((tmp_path / "tf.pid").read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_destroy_signalled_midway_finishes(tmp_path, sig):
    """A destroy is the clean-up itself: SIGTERM (a cancelled CI job, a test session's
    teardown) or a closed terminal lets it finish. Before, it ended at once and left
    Terraform destroying alone, and the lab's directory after it."""
    state = LabState(tmp_path / "lab")
    state.claim()
    state.terraform.mkdir()
    (state.terraform / "lab.tfvars.json").write_text("{}")
    (state.terraform / "terraform.tfstate").write_text("{}")
    proc = subprocess.Popen([sys.executable, "-m", "infra", "--state-dir", str(state.root), "destroy"],
                            cwd=REPO, env=slow_terraform(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        started_terraform(tmp_path, proc)
        proc.send_signal(sig)
        said = proc.communicate(timeout=60)[0]
    finally:
        stop_all(proc, tmp_path)
    assert proc.returncode == 0, said
    assert (tmp_path / "tf.log").read_text() == "destroyed\n"
    assert not state.root.exists(), "the lab's directory was removed"
    if sig == signal.SIGTERM:  # after SIGHUP nothing more is said (the terminal is gone)
        assert "lab destroyed" in said, said


@pytest.mark.slow
def test_a_second_sigterm_during_provision_does_not_cut_terraforms_interrupt_short(tmp_path):
    """One SIGTERM is one interrupt: a second one right after it (make passes one on to its
    child as the group gets its own) let Terraform finish its interrupt, not killed midway."""
    state_dir = tmp_path / "lab"
    proc = subprocess.Popen([sys.executable, "-m", "infra", "--state-dir", str(state_dir), "provision",
                             "--lab", unique_lab(), "--ssh-port-base", "40400", "--image", "debian-12"],
                            cwd=REPO, env=slow_terraform(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        tf_pid = started_terraform(tmp_path, proc)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while not (tmp_path / "tf.log").exists():
            assert time.monotonic() < deadline, "Terraform was never told"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        said = proc.communicate(timeout=60)[0]
    finally:
        stop_all(proc, tmp_path)
    assert proc.returncode == 1, said
    assert (tmp_path / "tf.log").read_text() == "interrupted\nfinished\n", said
    assert not runner.process_is(tf_pid, "sh"), "Terraform was left running"

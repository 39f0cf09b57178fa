import os
import shlex
import signal
import sys
import time

import pytest

from infra import run as runner
from infra.errors import LabError


def test_missing_programs_are_named_with_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(LabError) as e:
        runner.require("mmdebstrap", "qemu-system-x86_64", "vde_switch")
    assert "mmdebstrap, qemu-system-x86_64, vde_switch" in str(e.value)
    assert "apt-get install mmdebstrap" in e.value.hint
    assert "apt-get install qemu-system-x86" in e.value.hint
    assert "apt-get install vde2" in e.value.hint
    with pytest.raises(LabError, match="qemu-img is not installed"):
        runner.run(["qemu-img", "info"])


def test_failed_command_error_quotes_its_tail():
    with pytest.raises(runner.CommandError) as e:
        runner.run(["sh", "-c", "echo first; echo 'the reason' >&2; exit 3"])
    assert "exited with status 3" in str(e.value) and "the reason" in str(e.value)
    assert e.value.returncode == 3


@pytest.mark.slow
def test_timeout_stops_the_whole_process_group(tmp_path):
    marker = tmp_path / "child-survived"
    started = time.monotonic()
    with pytest.raises(LabError, match="did not finish within 1 s"):
        runner.run(["sh", "-c", f"(sleep 3; touch {marker}) & sleep 30"], timeout=1)
    assert time.monotonic() - started < 5
    time.sleep(3.5)
    assert not marker.exists(), "the grandchild was killed with its group"


def stop_left_running(pid_file):
    """A program a test left running is the test's to stop (its own group, by its pid)."""
    if pid_file.exists():
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_signal_while_the_reader_is_made_is_passed_on_to_the_program(tmp_path, monkeypatch):
    """A signal (here its KeyboardInterrupt) that comes right after the program started, while
    its output's reader is being made, still interrupts the program with SIGINT and waits for
    it: it says so and is gone (CI once left a Terraform apply running, never told)."""
    import threading

    told, pid = tmp_path / "told", tmp_path / "pid"
    program = (f"trap 'echo interrupted > {told}; exit 130' INT; echo $$ > {pid}.new; "
               f"mv {pid}.new {pid}; while :; do sleep 0.1; done")

    def signal_now(*args, **kwargs):
        deadline = time.monotonic() + 30
        while not pid.exists():  # the program's trap is set
            assert time.monotonic() < deadline, "the program never started"
            time.sleep(0.05)
        raise KeyboardInterrupt
    monkeypatch.setattr(threading, "Thread", signal_now)
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.run_streaming(["sh", "-c", program], prefix="", timeout=60,
                                 log_file=tmp_path / "out.log", interrupt_grace=10)
        monkeypatch.undo()
        started = int(pid.read_text())
        assert told.read_text() == "interrupted\n"
        assert not os.path.exists(f"/proc/{started}"), "the program was waited for"
    finally:
        stop_left_running(pid)


@pytest.fixture
def python_ctrl_c():
    """Ctrl-C as Python gives it to a program started in a terminal (KeyboardInterrupt),
    whatever this process inherited: started as a background job of a non-interactive shell
    (`make test &`, some CI runners) it begins with SIGINT ignored, and these tests' own
    SIGINT would be lost."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.usefixtures("python_ctrl_c")
@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "run"])
def test_a_signal_inside_popen_after_the_program_started_is_passed_on_to_it(tmp_path, monkeypatch,
                                                                            streaming):
    """A Ctrl-C that comes after the fork, while `subprocess.Popen` has not yet returned the
    pid, is held until the program is the run's to stop: then it interrupts the program (SIGINT
    when streaming, SIGKILL for `run`) and waits for it. Unheld, it raised inside Popen and
    left the program running in its own session."""
    import subprocess

    told, pid = tmp_path / "told", tmp_path / "pid"
    program = (f"trap 'echo interrupted > {told}; exit 130' INT; echo $$ > {pid}.new; "
               f"mv {pid}.new {pid}; while :; do sleep 0.1; done")
    real_popen = subprocess.Popen
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM,)}

    def popen_then_signal(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        deadline = time.monotonic() + 30
        while not pid.exists():  # the program's trap is set
            assert time.monotonic() < deadline, "the program never started"
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # Python runs its handler here, inside "Popen"
        for _ in range(5):
            time.sleep(0.01)
        return proc
    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)
    try:
        with pytest.raises(KeyboardInterrupt):
            if streaming:
                runner.run_streaming(["sh", "-c", program], prefix="", timeout=60,
                                     log_file=tmp_path / "out.log", interrupt_grace=10)
            else:
                runner.run(["sh", "-c", program], timeout=60)
        monkeypatch.undo()
        started = int(pid.read_text())
        if streaming:
            assert told.read_text() == "interrupted\n"
        assert not os.path.exists(f"/proc/{started}"), "the program was stopped and waited for"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is handlers[signal.SIGTERM]
    finally:
        stop_left_running(pid)


@pytest.mark.usefixtures("python_ctrl_c")
def test_a_run_outside_the_main_thread_holds_no_signal(tmp_path):
    import threading

    seen = []
    worker = threading.Thread(target=lambda: seen.append(runner.run(["sh", "-c", "echo ok"]).stdout))
    worker.start()
    worker.join(timeout=30)
    assert seen == ["ok\n"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_held_signals_are_raised_once_each_and_their_handlers_put_back(monkeypatch):
    """Python handlers are held and given back; a signal left to its default or ignored is
    not touched; a failure while the handlers are swapped leaves none of them swapped."""
    seen = []

    def mine(signum, frame):
        seen.append(signum)
    before = {sig: signal.getsignal(sig) for sig in runner._HeldSignals.SIGNALS}
    try:
        signal.signal(signal.SIGTERM, mine)
        signal.signal(signal.SIGHUP, mine)
        held = runner._HeldSignals()
        for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGHUP):
            os.kill(os.getpid(), sig)
        time.sleep(0.05)
        assert seen == [], "a held signal reached its handler before release"
        held.release()
        assert seen == [signal.SIGTERM, signal.SIGHUP]
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGHUP) is mine

        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        held = runner._HeldSignals()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        held.release()

        signal.signal(signal.SIGTERM, mine)
        signal.signal(signal.SIGHUP, mine)
        real = signal.signal

        def fails_on_sighup(sig, handler):
            if sig == signal.SIGHUP:
                raise KeyboardInterrupt  # as a signal arriving just then would
            return real(sig, handler)
        monkeypatch.setattr(signal, "signal", fails_on_sighup)
        with pytest.raises(KeyboardInterrupt):
            runner._HeldSignals()
        monkeypatch.undo()
        assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_streaming_shows_lines_and_keeps_a_log(tmp_path, capsys):
    log = tmp_path / "out.log"
    runner.run_streaming(["sh", "-c", "echo one; echo two"], prefix="> ", timeout=10, log_file=log,
                         transform=lambda line: None if line == "two" else line)
    assert capsys.readouterr().out == "> one\n"
    assert log.read_text() == "one\ntwo\n"


@pytest.mark.slow
def test_a_silent_busy_command_is_waited_for_past_the_stall_window_and_an_idle_one_stopped(
        tmp_path, monkeypatch):
    """A build on a busy host may print nothing for minutes while it works (mkfs, dpkg): its
    session's CPU says so. One that only sleeps stands still and is stopped, with the setting
    that would extend the window; a cap still bounds one that keeps moving."""
    monkeypatch.setattr(runner, "CPU_WINDOW_S", 0.3)
    busy = "import time; t = time.monotonic()\nwhile time.monotonic() - t < 3: pass\nprint('done')"
    started = time.monotonic()
    runner.run_streaming([sys.executable, "-c", busy], prefix="", timeout=60, stall=1,
                          log_file=tmp_path / "busy.log")
    assert time.monotonic() - started >= 3 and "done" in (tmp_path / "busy.log").read_text()
    # the work is in a child of a child: the session's CPU counts it
    nested = ["sh", "-c", f'{shlex.quote(sys.executable)} -c {shlex.quote(busy)} >/dev/null']
    runner.run_streaming(nested, prefix="", timeout=60, stall=1, log_file=tmp_path / "nested.log")
    with pytest.raises(LabError) as e:
        runner.run_streaming(["sh", "-c", "echo start; sleep 30"], prefix="", timeout=60, stall=1.5,
                              log_file=tmp_path / "idle.log")
    assert "made no progress for 2 s (no output, no CPU used) and was stopped" in e.value.message
    assert "RXELAB_STALL=" in (e.value.hint or "")
    with pytest.raises(LabError, match="was still running after 2 s"):
        runner.run_streaming([sys.executable, "-c", busy], prefix="", timeout=1.5, stall=1,
                              log_file=tmp_path / "capped.log")

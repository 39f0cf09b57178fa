import threading
import time

import pytest

from infra.errors import LabError
from infra.inventory import Host, RdmaEndpoint, SSHEndpoint
from infra.readiness import Deadlines, parse_probe, wait_ready

WIDE = Deadlines(stall=30, total=30)


def test_probe_stages():
    assert parse_probe("", "rxe0") == ("ssh up, cloud-init running", None, False)
    ok = 'boot-finished\n{"v1": {"errors": []}}\n4: ACTIVE\n'
    assert parse_probe(ok, "rxe0") == ("ready (rxe0 ACTIVE)", None, True)
    no_dev = 'boot-finished\n{"v1": {"errors": []}}\nno-rdma-device\n'
    assert parse_probe(no_dev, "rxe0")[0] == "cloud-init done, waiting for rxe0"
    stage, error, done = parse_probe('boot-finished\n{"v1": {"errors": ["users: boom"]}}\n', "rxe0")
    assert not done and "users: boom" in error


def test_a_vm_that_exits_fails_fast_and_shows_its_serial_log(tmp_path):
    log = tmp_path / "serial.log"
    log.write_text("".join(f"line {i}\n" for i in range(40)) + "Kernel panic - not syncing\n")
    host = Host("node1", SSHEndpoint("127.0.0.1", 1), "10.0.0.1", RdmaEndpoint())
    with pytest.raises(LabError) as e:
        wait_ready([host], deadlines=WIDE, alive=lambda h: False, serial_log=lambda h: log,
                   say=lambda s: None)
    text = str(e.value)
    assert text.startswith("node1: its VM exited")
    assert "Kernel panic" in text and "line 39" in text and "line 5\n" not in text


def test_console_stages_follow_the_serial_log_as_it_grows(tmp_path):
    from infra.readiness import Console

    log = tmp_path / "serial.log"
    console = Console(log)
    assert console.look() is None, "no log yet"
    log.write_text("[    0.000000] Linux version 6.1.0\n")
    assert console.look() == "kernel"
    assert console.look() is None, "nothing new"
    with log.open("a") as f:
        f.write("Cloud-init v. 22.4.2 running 'init-local' at Tue. Up 33.5 seconds.\n"
                "Cloud-init v. 22.4.2 running 'init' at Tue. Up 43.6 seconds.\n")
    assert console.look() == "cloud-init network stage", "the latest stage of a chunk"
    assert not console.finished
    with log.open("a") as f:
        f.write("Cloud-init v. 22.4.2 fini")
    assert console.look() is None
    with log.open("a") as f:
        f.write("shed at Tue, 24 Nov 2026. Datasource DataSourceNoCloud.  Up 55.2 seconds\n")
    assert console.look() == "cloud-init finished", "a mark split between two reads"
    assert console.finished


def host(port=1):
    return Host("node1", SSHEndpoint("127.0.0.1", port), "10.0.0.1", RdmaEndpoint())


def test_ssh_is_probed_only_once_the_console_says_cloud_init_finished(tmp_path, monkeypatch):
    """An SSH handshake costs the booting guest seconds of CPU under TCG: none before the end."""
    from infra import readiness
    from infra.run import Result

    log = tmp_path / "serial.log"
    log.write_text("Cloud-init v. 22.4.2 running 'init-local' at Tue. Up 3 seconds.\n")
    probes = []

    def fake_ssh(h, command, timeout, check):
        probes.append(log.read_text())
        return Result(["ssh"], 0, 'boot-finished\n{"v1": {"errors": []}}\n4: ACTIVE\n', "")

    monkeypatch.setattr(readiness, "ssh_run", fake_ssh)

    def finish_later():
        time.sleep(1.5)
        with log.open("a") as f:
            f.write("Cloud-init v. 22.4.2 finished at Tue. Up 9 seconds\n")

    said = []
    t = threading.Thread(target=finish_later)
    t.start()
    ready = wait_ready([host()], deadlines=WIDE, alive=lambda h: True, serial_log=lambda h: log,
                       say=said.append)
    t.join()
    assert len(probes) == 1 and "finished at" in probes[0], probes
    assert 1.4 < ready["node1"] < 10
    assert any("node1: cloud-init local stage" in s for s in said), said
    assert any("node1: ready (rxe0 ACTIVE)" in s for s in said), said


def test_a_silent_console_still_gets_probed(tmp_path, monkeypatch):
    from infra import readiness
    from infra.run import Result

    monkeypatch.setattr(readiness, "SLOW_POLL_S", 0.5)
    calls = []

    def fake_ssh(h, command, timeout, check):
        calls.append(1)
        out = 'boot-finished\n{"v1": {"errors": []}}\n4: ACTIVE\n' if len(calls) > 1 else ""
        return Result(["ssh"], 0 if len(calls) > 1 else 255, out, "")

    monkeypatch.setattr(readiness, "ssh_run", fake_ssh)
    ready = wait_ready([host()], deadlines=WIDE, alive=lambda h: True,
                       serial_log=lambda h: tmp_path / "never-written.log", say=lambda s: None)
    assert "node1" in ready and len(calls) == 2


def _no_ssh(monkeypatch, answers=None):
    """SSH probes that fail (a guest not up yet), or give the answers in order."""
    from infra import readiness
    from infra.run import Result

    answers = list(answers or [])

    def fake_ssh(h, command, timeout, check):
        if answers:
            return Result(["ssh"], 0, answers.pop(0), "")
        return Result(["ssh"], 255, "", "")

    monkeypatch.setattr(readiness, "ssh_run", fake_ssh)
    monkeypatch.setattr(readiness, "SLOW_POLL_S", 0.2)


@pytest.mark.slow
def test_a_node_that_stands_still_is_failed_after_the_stall_window_naming_its_stage_and_setting(
        tmp_path, monkeypatch):
    """Idle VM, silent console, probe saying the same thing: the stall window ends the wait,
    long before the cap."""
    from infra import readiness

    monkeypatch.setattr(readiness, "CPU_WINDOW_S", 0.2)
    waiting = 'boot-finished\n{"v1": {"errors": []}}\nno-rdma-device\n'
    _no_ssh(monkeypatch, [waiting] * 1000)
    log = tmp_path / "serial.log"
    log.write_text("Cloud-init v. 22.4.2 finished at Tue. Up 9 seconds\n")
    started = time.monotonic()
    with pytest.raises(LabError) as e:
        wait_ready([host()], deadlines=Deadlines(stall=2, total=60), alive=lambda h: True,
                   serial_log=lambda h: log, cpu_seconds=lambda h: 12.0, say=lambda s: None)
    assert time.monotonic() - started < 10
    text = str(e.value)
    assert text.startswith("node1: no progress for 2 s (last stage: cloud-init done, waiting for rxe0")
    assert "RXELAB_STALL=" in text and "finished at" in text, text


@pytest.mark.slow
def test_a_slow_node_whose_console_keeps_printing_is_waited_for_past_the_stall_window(
        tmp_path, monkeypatch):
    _no_ssh(monkeypatch, ['boot-finished\n{"v1": {"errors": []}}\n4: ACTIVE\n'])
    from infra import readiness

    monkeypatch.setattr(readiness, "SLOW_POLL_S", 100)  # no probe until the console says so
    log = tmp_path / "serial.log"
    log.write_text("")

    def print_slowly():
        for i in range(12):
            time.sleep(0.25)
            with log.open("a") as f:
                f.write(f"[ {i}.0] A start job is running for something\n")
        with log.open("a") as f:
            f.write("Cloud-init v. 22.4.2 finished at Tue. Up 9 seconds\n")

    t = threading.Thread(target=print_slowly)
    t.start()
    ready = wait_ready([host()], deadlines=Deadlines(stall=1, total=60), alive=lambda h: True,
                       serial_log=lambda h: log, cpu_seconds=lambda h: 5.0, say=lambda s: None)
    t.join()
    assert ready["node1"] > 2.5, "three times the stall window, and not failed"


@pytest.mark.slow
def test_a_slow_node_whose_vm_stays_busy_is_waited_for_though_its_console_is_silent(
        tmp_path, monkeypatch):
    """Before cloud-init's first line, a busy host's guest may print nothing for minutes: its
    qemu's CPU time says it is working."""
    from infra import readiness

    monkeypatch.setattr(readiness, "CPU_WINDOW_S", 0.2)
    begun = time.monotonic()
    answers = iter([255] * 1000)

    def fake_ssh(h, command, timeout, check):
        from infra.run import Result
        if time.monotonic() - begun > 3:
            return Result(["ssh"], 0, 'boot-finished\n{"v1": {"errors": []}}\n4: ACTIVE\n', "")
        return Result(["ssh"], next(answers), "", "")

    monkeypatch.setattr(readiness, "ssh_run", fake_ssh)
    monkeypatch.setattr(readiness, "SLOW_POLL_S", 0.2)
    busy = lambda h: (time.monotonic() - begun) * 0.3  # noqa: E731 - 30 % of a core
    ready = wait_ready([host()], deadlines=Deadlines(stall=1, total=60), alive=lambda h: True,
                       serial_log=lambda h: tmp_path / "silent.log", cpu_seconds=busy,
                       say=lambda s: None)
    assert ready["node1"] > 3


def test_the_whole_wait_has_a_cap_that_names_its_setting(tmp_path, monkeypatch):
    from infra import readiness

    monkeypatch.setattr(readiness, "CPU_WINDOW_S", 0.2)
    _no_ssh(monkeypatch)
    begun = time.monotonic()
    with pytest.raises(LabError) as e:
        wait_ready([host()], deadlines=Deadlines(stall=30, total=1.5), alive=lambda h: True,
                   serial_log=lambda h: None, cpu_seconds=lambda h: time.monotonic() - begun,
                   say=lambda s: None)
    assert str(e.value).startswith("node1: not ready after 2 s (last stage: booting)")
    assert "RXELAB_BOOT_TIMEOUT=" in str(e.value)

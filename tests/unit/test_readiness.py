import threading
import time

import pytest

from infra.errors import LabError
from infra.inventory import Host, RdmaEndpoint, SSHEndpoint
from infra.readiness import parse_probe, wait_ready


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
        wait_ready([host], timeout=30, alive=lambda h: False, serial_log=lambda h: log,
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
    ready = wait_ready([host()], timeout=30, alive=lambda h: True, serial_log=lambda h: log,
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
    ready = wait_ready([host()], timeout=30, alive=lambda h: True,
                       serial_log=lambda h: tmp_path / "never-written.log", say=lambda s: None)
    assert "node1" in ready and len(calls) == 2

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

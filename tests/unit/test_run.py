import time

import pytest

from infra import run as runner
from infra.errors import LabError


def test_missing_programs_are_named_with_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(LabError) as e:
        runner.require("mmdebstrap", "qemu-system-x86_64", "terraform")
    assert "mmdebstrap, qemu-system-x86_64, terraform" in str(e.value)
    assert "apt-get install mmdebstrap" in e.value.hint
    assert "apt-get install qemu-system-x86" in e.value.hint
    assert "HashiCorp" in e.value.hint
    with pytest.raises(LabError, match="qemu-img is not installed"):
        runner.run(["qemu-img", "info"])


def test_failed_command_error_quotes_its_tail():
    with pytest.raises(runner.CommandError) as e:
        runner.run(["sh", "-c", "echo first; echo 'the reason' >&2; exit 3"])
    assert "exited with status 3" in str(e.value) and "the reason" in str(e.value)
    assert e.value.returncode == 3


def test_timeout_stops_the_whole_process_group(tmp_path):
    marker = tmp_path / "child-survived"
    started = time.monotonic()
    with pytest.raises(LabError, match="did not finish within 1 s"):
        runner.run(["sh", "-c", f"(sleep 3; touch {marker}) & sleep 30"], timeout=1)
    assert time.monotonic() - started < 5
    time.sleep(3.5)
    assert not marker.exists(), "the grandchild was killed with its group"


def test_streaming_shows_lines_and_keeps_a_log(tmp_path, capsys):
    log = tmp_path / "out.log"
    runner.run_streaming(["sh", "-c", "echo one; echo two"], prefix="> ", timeout=10, log_file=log,
                         transform=lambda line: None if line == "two" else line)
    assert capsys.readouterr().out == "> one\n"
    assert log.read_text() == "one\ntwo\n"

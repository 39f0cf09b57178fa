"""A newcomer's first hour (issue 59): a host without pyverbs, or with pyverbs and no RDMA
device, is told what to do in one line - by init(), and by every console script, on stderr,
without a traceback - while a bug in a script keeps its traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import rxelab
from pyverbs import enums
from pyverbs.device import Context, PortAttr
from pyverbs.pyverbs_error import PyverbsRDMAError
from rxelab import verbs
from rxelab.errors import ConfigError

from tests.unit.fakejob import free_port

LIB = Path(__file__).resolve().parents[2] / "lib"
PY = sys.executable


def without_pyverbs(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """argv run where pyverbs cannot be imported (this host has only the tests' fake), from
    this checkout's library."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("RXELAB_", "PYTEST")) and k not in ("RANK", "WORLD_SIZE")}
    clean.update(PYTHONPATH=str(LIB), **env)
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/", env=clean)


def said_once(r: subprocess.CompletedProcess[str]) -> str:
    """The one line a script said on stderr, having failed without a traceback."""
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def names_the_way_out(line: str) -> None:
    assert "python3-pyverbs" in line and "--system-site-packages" in line, line
    assert 'transport="tcp"' in line and "RXELAB_TRANSPORT=tcp" in line, line


def test_init_without_pyverbs_names_the_package_the_venv_flag_and_tcp():
    code = ("import rxelab\n"
            "try:\n    rxelab.init(0, 1, '127.0.0.1', 9)\n"
            "except rxelab.ConfigError as err:\n    print(err)\n")
    r = without_pyverbs([PY, "-c", code])
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.strip().splitlines()
    assert line.startswith("transport verbs needs pyverbs"), line
    names_the_way_out(line)


@pytest.mark.slow
@pytest.mark.parametrize("script, prefix", [("selftest", "selftest: "), ("bench", "bench: ")])
def test_each_script_without_pyverbs_says_one_line_on_stderr(script, prefix):
    r = without_pyverbs([PY, "-m", f"rxelab.{script}", "--sizes", "8"], RANK="0",
                        WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    line = said_once(r)
    assert line.startswith(prefix + "transport verbs needs pyverbs"), line
    names_the_way_out(line)
    assert r.stdout == "", "stdout is the script's product: checks or the table, not errors"


@pytest.mark.slow
def test_the_launcher_passes_its_rank_s_one_line_on_and_fails():
    r = without_pyverbs([PY, "-m", "rxelab.launch", "--hosts", "localhost", "--port",
                         str(free_port()), "--timeout", "60", "--", PY, "-m", "rxelab.selftest"])
    assert r.returncode != 0 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    (line,) = r.stdout.strip().splitlines()
    assert line.startswith("[0] selftest: transport verbs needs pyverbs"), line
    names_the_way_out(line)


@pytest.mark.slow
def test_the_launcher_without_ssh_says_so_in_one_line(tmp_path):
    (tmp_path / "sh").symlink_to("/bin/sh")  # a PATH with a shell and no ssh
    r = without_pyverbs([PY, "-m", "rxelab.launch", "--hosts", "node9.invalid", "--timeout", "5",
                         "--", "true"], PATH=str(tmp_path))
    assert said_once(r) == "launch: No such file or directory: ssh"


@pytest.mark.slow
def test_a_rank_whose_rank_0_never_comes_says_one_line():
    r = without_pyverbs([PY, "-m", "rxelab.selftest", "--transport", "tcp", "--timeout", "1"],
                        RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(free_port()))
    line = said_once(r)
    assert line.startswith("selftest: cannot reach rank 0 at 127.0.0.1:") and "within 1 s" in line


@pytest.mark.slow
@pytest.mark.parametrize("raised, status, line", [
    ("ConfigError('no such thing', hint='try another')", 2,
     "demo: no such thing (hint: try another)"),
    ("ConnectionRefusedError(111, 'Connection refused')", 2, "demo: Connection refused"),
    ("TimeoutError('timed out')", 2, "demo: TimeoutError: timed out"),
    ("KeyboardInterrupt()", 130, "demo: interrupted"),
])
def test_an_expected_failure_at_a_script_s_edge_is_one_line(raised, status, line):
    code = ("import sys\nfrom rxelab.console import one_line_errors\n"
            "from rxelab.errors import ConfigError\n"
            f"def main(argv):\n    raise {raised}\n"
            "sys.exit(one_line_errors('demo')(main)(None))\n")
    r = without_pyverbs([PY, "-c", code])
    assert r.returncode == status and said_once(r) == line


@pytest.mark.slow
@pytest.mark.parametrize("raised", ["ZeroDivisionError('a bug')", "KeyError('a bug')",
                                    "FileNotFoundError(2, 'No such file or directory', 'x')"])
def test_a_bug_at_a_script_s_edge_keeps_its_traceback(raised):
    code = ("import sys\nfrom rxelab.console import one_line_errors\n"
            f"def main(argv):\n    raise {raised}\n"
            "sys.exit(one_line_errors('demo')(main)(None))\n")
    r = without_pyverbs([PY, "-c", code])
    assert r.returncode == 1, r.stderr
    assert "Traceback (most recent call last)" in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(raised.split("(")[0] + ":"), r.stderr


# ---- pyverbs, and no RDMA device (the fake's list made to say so) ----------------------------

@pytest.mark.parametrize("listing", ["raises", "empty"])
def test_no_rdma_device_says_how_to_make_one_however_rdma_core_says_it(monkeypatch, listing):
    def device_list() -> list:
        if listing == "raises":  # rdma-core 44 without /sys/class/infiniband
            raise PyverbsRDMAError("Failed to get devices list", 2)
        return []
    monkeypatch.setattr(verbs, "get_device_list", device_list)
    with pytest.raises(ConfigError) as caught:
        verbs.Device()
    said = str(caught.value)
    assert said.startswith("no RDMA device on this host"), said
    assert "rdma link add rxe0 type rxe netdev <if>" in said and "modprobe rdma_rxe" in said
    assert 'transport="tcp"' in said and "\n" not in said
    assert ("Failed to get devices list" in said) == (listing == "raises")


def test_init_without_an_rdma_device_says_it_in_one_line(monkeypatch):
    monkeypatch.setattr(verbs, "get_device_list", lambda: [])
    with pytest.raises(ConfigError, match=r"no RDMA device on this host \(hint: SoftRoCE"):
        rxelab.init(0, 1, "127.0.0.1", free_port(), transport="verbs", device="fake0")


def test_devices_without_an_active_port_are_named_with_how_to_bring_one_up(monkeypatch):
    class Down(Context):
        def query_port(self, port: int) -> PortAttr:
            return PortAttr(enums.IBV_PORT_DOWN, enums.IBV_MTU_4096, 0, 4)
    monkeypatch.setattr(verbs, "Context", Down)
    with pytest.raises(ConfigError) as caught:
        verbs.Device()
    said = str(caught.value)
    assert said.startswith("no RDMA device has an ACTIVE port"), said
    assert "fake0" in said, "the device and its ports' states named"
    assert "rdma link" in said and "ip link set <if> up" in said

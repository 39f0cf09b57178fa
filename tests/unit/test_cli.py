"""What a user sees from bad input: one message with a hint, exit status 1, no traceback."""

import subprocess
import sys

import pytest

from infra.config import REPO


def infra(*args, tmp_path):
    return subprocess.run([sys.executable, "-m", "infra", "--state-dir", str(tmp_path / "lab"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args, message",
    [
        (["provision", "--nodes", "12"], "error: NODES=12 is out of range"),
        (["provision", "--image", "centos"], "error: unknown IMAGE 'centos'"),
        (["provision", "--accel", "xen"], "error: unknown ACCEL 'xen'"),
        (["provision", "--mem-mb", "lots"], "error: MEM_MB='lots' is not a whole number"),
        (["status"], "error: no inventory at"),
        (["ssh", "node1"], "error: no inventory at"),
        (["node", "up", "1"], "error: no lab is configured"),
        (["configure"], "error: no lab configuration was written to"),
    ],
)
def test_bad_input_is_one_clear_message(tmp_path, args, message):
    r = infra(*args, tmp_path=tmp_path)
    assert r.returncode == 1
    assert r.stderr.startswith(message), r.stderr
    assert "Traceback" not in r.stderr and "hint:" in r.stderr


@pytest.mark.slow
def test_destroy_with_nothing_there_is_fine_and_repeatable(tmp_path):
    for _ in range(2):
        r = infra("destroy", tmp_path=tmp_path)
        assert r.returncode == 0 and "nothing to destroy" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_status_reads_any_inventory(tmp_path):
    inv = tmp_path / "hosts.json"
    inv.write_text('{"version": 1, "nodes": [{"name": "far", "ssh": {"host": "127.0.0.1", '
                   '"port": 1}, "data_ip": "192.0.2.7"}]}')
    r = infra("status", "--inventory", str(inv), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "far" in r.stdout and "unreachable" in r.stdout and "192.0.2.7" in r.stdout


def test_the_configure_step_takes_no_settings_but_the_config_provision_wrote(tmp_path):
    """Terraform runs `configure` without any setting: it reads the lab's config file."""
    r = infra("configure", "--mtu", "1500", tmp_path=tmp_path)
    assert r.returncode == 2 and "unrecognized arguments: --mtu 1500" in r.stderr, r.stderr


INTERRUPTED_WHILE_IMPORTING = """
import runpy, sys

class CtrlC:  # the group's SIGINT, landing while `python -m infra` still imports its modules
    def find_spec(self, name, path=None, target=None):
        if name == "infra.cli":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["infra", "wait"]
runpy.run_module("infra", run_name="__main__")
"""


def test_ctrl_c_while_infra_starts_is_one_line_not_a_traceback():
    """A provision's `wait` child is started late; Ctrl-C may reach it before main() runs
    (the e2e test_ctrl_c_during_provision_stops_and_removes_everything saw its traceback)."""
    r = subprocess.run([sys.executable, "-c", INTERRUPTED_WHILE_IMPORTING], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 130 and r.stderr == "interrupted\n", r.stderr

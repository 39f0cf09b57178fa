"""Two labs on one host (issue 15, item 2): a second lab with another name boots beside the
shared one, both are reachable, destroying it leaves the shared lab running; a second lab
under the shared lab's name is refused before anything is touched. Before, `network.up()`
tore down `<lab>-data` by name, and a second default `make provision` deleted the first
lab's data network."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from infra import network
from infra import run as runner
from infra.config import REPO

from .test_provision_failures import assert_nothing_left, qemu_of_lab

pytestmark = pytest.mark.vm


def make(target: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["make", target], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`make {target}` ({env.get('LAB')}) did not finish within {timeout} s")


def shared_lab_is_whole(lab) -> None:
    assert all(runner.process_is(pid, "qemu-system-x86_64") for pid in lab.qemu_pids.values())
    if os.geteuid() == 0 and lab.config.data_net.value == "bridge":
        assert lab.config.netns in network.namespaces()
    for h in lab.hosts:
        out = lab.try_ssh(h, "cat /sys/class/infiniband/rxe0/ports/1/state", timeout=60) or ""
        assert "ACTIVE" in out, f"the shared lab's {h.name} is not reachable with rxe0 ACTIVE"


def test_a_second_lab_of_the_same_name_is_refused_before_anything_is_touched(lab, tmp_path):
    env = {**os.environ, "RXELAB_STATE": str(tmp_path / "twin"), "LAB": lab.config.lab,
           "SSH_PORT_BASE": "2380", "NODES": "2"}
    r = make("provision", env, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"another lab named '{lab.config.lab}' runs on this host" in out, out[-2000:]
    assert "nothing was changed" in out and "Traceback" not in out
    assert not (tmp_path / "twin").exists() or not any((tmp_path / "twin").iterdir())
    shared_lab_is_whole(lab)


def test_two_labs_run_side_by_side_and_one_goes_without_the_other(lab, tmp_path):
    name = "rxeduo"
    env = {**os.environ, "RXELAB_STATE": str(tmp_path / "duo"), "LAB": name,
           "SSH_PORT_BASE": "2360", "NODES": "2", "MEM_MB": "512"}
    try:
        r = make("provision", env, timeout=1500)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        status = make("status", env, timeout=120)
        rows = [x for x in status.stdout.splitlines() if x.startswith("│ node")]
        assert len(rows) == 2 and all("running" in x and "ACTIVE" in x for x in rows), status.stdout
        shared_lab_is_whole(lab)
        d = make("destroy", env, timeout=600)
        assert d.returncode == 0 and "lab destroyed" in d.stdout, d.stdout + d.stderr
        assert_nothing_left(name, Path(env["RXELAB_STATE"]))
        shared_lab_is_whole(lab)
    finally:
        make("destroy", env, timeout=600)
        for pid in qemu_of_lab(name):  # last resort, by the pids of this lab's own VMs
            os.kill(pid, 9)

"""A lab owns what it removes, and keeps its secrets private. Each test here failed before the
lab's marker, ownership labels and private modes existed (issue 15, items 1-3)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import lab, network, nocloud, vm
from infra import run as runner
from infra.config import Image, LabConfig
from infra.errors import LabError
from infra.state import MARKER, LabState
from tests.unit.lab_helpers import free_base, infra, unique_lab

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and taps need root")


# ---- item 1: destroy removes only a lab, and only what the lab made -------------------------
def test_destroy_refuses_a_directory_that_is_not_a_lab(tmp_path):
    home = tmp_path / "home"
    (home / "thesis").mkdir(parents=True)
    (home / "thesis" / "chapter1.tex").write_text("years of work")
    (home / ".bashrc").write_text("alias ll='ls -l'")
    r = infra(home, "destroy")
    assert r.returncode == 1, r.stdout
    assert "is not an rxelab lab" in r.stderr and "nothing removed" in r.stderr
    assert "Traceback" not in r.stderr and "lab destroyed" not in r.stdout
    assert (home / "thesis" / "chapter1.tex").read_text() == "years of work"
    assert (home / ".bashrc").exists()


@pytest.mark.slow
def test_destroy_removes_what_the_lab_made_and_leaves_the_rest(tmp_path):
    state = LabState(tmp_path / "lab")
    state.claim()
    for d in ("keys", "seeds", "disks", "logs", "run"):
        (state.root / d).mkdir()
        (state.root / d / "x").write_text("lab file")
    (state.root / "lab.json").write_text("{}")
    (state.root / "notes.txt").write_text("mine, not the lab's")
    r = infra(state.root, "destroy")
    assert r.returncode == 0, r.stderr
    assert "lab destroyed" in r.stdout and "notes.txt" in r.stdout
    assert sorted(p.name for p in state.root.iterdir()) == ["notes.txt", MARKER]
    (state.root / "notes.txt").unlink()
    assert infra(state.root, "destroy").returncode == 0
    assert not state.root.exists(), "an empty lab directory goes, marker and all"


def test_provision_refuses_a_directory_that_holds_something_else(tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "data.csv").write_text("1,2,3")
    r = infra(taken, "provision", "--lab", unique_lab(), "--ssh-port-base", "40100")
    assert r.returncode == 1
    assert "is not empty and is not an rxelab lab" in r.stderr, r.stderr
    assert sorted(p.name for p in taken.iterdir()) == ["data.csv"], "nothing was written"


def test_a_lab_made_before_the_marker_existed_is_still_recognised(tmp_path):
    config = LabConfig(state_dir=tmp_path / "old")
    state = LabState(config.state_dir)
    state.root.mkdir()
    state.save_config(config)
    assert state.is_lab()
    elsewhere = LabState(tmp_path / "copy")
    elsewhere.root.mkdir()
    (elsewhere.root / "lab.json").write_text(config.to_json())  # names another directory
    assert not elsewhere.is_lab()


# ---- item 3: secrets stay private --------------------------------------------------------------
@pytest.fixture
def configured(tmp_path, monkeypatch):
    monkeypatch.setenv("RXELAB_CACHE", str(tmp_path / "cache"))
    old = os.umask(0o022)  # a user's usual mask: the lab must not depend on a stricter one
    try:
        config = LabConfig(image=Image.DEBIAN12, lab=unique_lab(), state_dir=tmp_path / "lab")
        lab.configure(config, LabState(config.state_dir))
    finally:
        os.umask(old)
    return LabState(config.state_dir)


def test_every_file_with_a_private_key_is_0600_in_a_0700_directory(configured):
    assert stat.S_IMODE(configured.root.stat().st_mode) == 0o700
    secret_files = []
    for path in configured.root.rglob("*"):
        if path.is_file() and b"PRIVATE KEY" in path.read_bytes():
            secret_files.append(path.relative_to(configured.root))
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            for parent in path.relative_to(configured.root).parents:
                assert stat.S_IMODE((configured.root / parent).stat().st_mode) == 0o700, parent
    names = {p.name for p in secret_files}
    assert {"id_ed25519", "cluster_ed25519", "node1-seed.iso", "user-data"} <= names


def test_a_seed_iso_cut_short_by_a_crash_is_private_too(tmp_path, monkeypatch):
    import pycdlib

    def crash(self, fp, *args, **kwargs):
        fp.write(b"-----BEGIN OPENSSH PRIVATE KEY----- half an ISO")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pycdlib.PyCdlib, "write_fp", crash)
    old = os.umask(0o022)
    try:
        with pytest.raises(OSError):
            nocloud.write_iso({"user-data": "secret"}, tmp_path / "seeds" / "n-seed.iso")
    finally:
        os.umask(old)
    (left,) = list((tmp_path / "seeds").iterdir())
    assert stat.S_IMODE(left.stat().st_mode) == 0o600


def test_claiming_an_old_lab_directory_makes_it_private(tmp_path):
    root = tmp_path / "lab"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    LabState(root).claim()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


# ---- item 2: two labs on one host --------------------------------------------------------------
@as_root
def test_a_namespace_of_another_lab_with_this_name_is_refused_and_left_alone(tmp_path):
    name = unique_lab()
    config = LabConfig(lab=name, ssh_port_base=free_base(), state_dir=tmp_path / "mine")
    other = f"{name}-data"
    runner.run(["ip", "netns", "add", other])
    try:
        runner.run(["ip", "-n", other, "link", "add", "br0", "type", "bridge"])
        runner.run(["ip", "-n", other, "link", "set", "br0", "alias", "rxelab:someoneelse"])
        state = LabState(config.state_dir)
        clash = f"another lab named .{name}. runs on this host .network namespace {other}, " \
                "labelled rxelab:someoneelse"
        with pytest.raises(LabError, match=clash):
            lab.preflight(config, state)
        state.claim()
        state.save_config(config)
        with pytest.raises(LabError, match="another lab named"):
            network.up(config, state)
        assert network.down(config, state) == []
        lab.teardown(state)
        assert other in network.namespaces(), "another lab's namespace is never removed"
    finally:
        runner.run(["ip", "netns", "del", other], check=False)


@as_root
def test_a_lab_removes_its_own_namespace_and_taps_and_no_one_elses(tmp_path):
    name = unique_lab()
    config = LabConfig(lab=name, state_dir=tmp_path / "mine")
    state = LabState(config.state_dir)
    state.claim()
    state.save_config(config)
    foreign_tap = f"{name}t2"
    try:
        network.up(config, state)
        network.before_vm(config, state, config.node(1))  # our tap, in the host namespace
        runner.run(["ip", "tuntap", "add", "dev", foreign_tap, "mode", "tap"])  # not ours
        assert network.link_alias(config.bridge, config.netns) == network.owner_label(state.lab_id())
        removed = network.down(config, state)
        assert sorted(removed) == [f"network namespace {name}-data", f"tap {name}t1"]
        assert config.netns not in network.namespaces()
        assert network.host_taps(config) == [foreign_tap]
    finally:
        runner.run(["ip", "link", "del", foreign_tap], check=False)
        runner.run(["ip", "link", "del", f"{name}t1"], check=False)
        runner.run(["ip", "netns", "del", config.netns], check=False)


def test_a_taken_ssh_port_is_refused_before_anything_is_touched(tmp_path):
    """The taken port is node1's, the first checked: what holds its neighbours (another
    program's ephemeral ports, on a busy CI host) does not change the verdict."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        config = LabConfig(lab=unique_lab(), ssh_port_base=port - 1, state_dir=tmp_path / "lab")
        with pytest.raises(LabError, match=f"port {port} \\(node1's SSH forward\\) is in use"):
            lab.preflight(config, LabState(config.state_dir))
    assert not config.state_dir.exists()


@pytest.fixture
def fake_qemu(tmp_path):
    """A process that looks like another lab's qemu: argv[0] qemu-system-x86_64, `-name`."""
    def start(lab_name: str, pidfile: Path) -> subprocess.Popen[bytes]:
        script = "import time; time.sleep(120)"
        proc = subprocess.Popen(["bash", "-c", f'exec -a {vm.QEMU} "$0" -c "$1" -name "$2" '
                                 f'-pidfile "$3"', sys.executable, script, f"{lab_name}-node1",
                                 str(pidfile)])
        deadline = time.monotonic() + 10
        while not runner.process_is(proc.pid, vm.QEMU):
            assert time.monotonic() < deadline, "the stand-in never started"
            time.sleep(0.05)
        started.append(proc)
        return proc

    started: list[subprocess.Popen[bytes]] = []
    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_running_vm_of_a_lab_with_this_name_is_refused(tmp_path, fake_qemu):
    name = unique_lab()
    other = fake_qemu(name, tmp_path / "other" / "run" / "node1.pid")
    config = LabConfig(lab=name, ssh_port_base=free_base(), state_dir=tmp_path / "mine")
    with pytest.raises(LabError) as e:
        lab.preflight(config, LabState(config.state_dir))
    assert f"qemu pid {other.pid}" in str(e.value) and "nothing was changed" in str(e.value)


def test_a_pid_file_stops_only_the_process_that_wrote_it(tmp_path, fake_qemu):
    """A pid file that names another lab's qemu (a stale file, a recycled pid) stops nothing."""
    other = fake_qemu(unique_lab(), tmp_path / "other.pid")
    ours = tmp_path / "run" / "node1.pid"
    ours.parent.mkdir()
    ours.write_text(f"{other.pid}\n")
    assert runner.stop_pidfile(ours, vm.QEMU) is False
    assert other.poll() is None, "another lab's VM was signalled"
    mine = fake_qemu(unique_lab(), ours)
    ours.write_text(f"{mine.pid}\n")
    assert runner.stop_pidfile(ours, vm.QEMU) is True
    assert mine.wait(timeout=10) == -signal.SIGTERM


def test_a_provision_after_the_host_rebooted_replaces_the_stale_lab_and_claims_anew(tmp_path,
                                                                                  monkeypatch):
    """The VMs are gone (a reboot): the stale lab is destroyed - marker and all - and the
    directory must be claimed again, or configure refuses its own lab's directory."""
    from infra import cli, terraform

    config = LabConfig(lab=unique_lab(), ssh_port_base=free_base(), state_dir=tmp_path / "lab")
    state = LabState(config.state_dir)
    state.claim()
    state.save_config(config)
    state.terraform.mkdir()
    (state.terraform / "lab.tfvars.json").write_text("{}")
    (state.terraform / "terraform.tfstate").write_text("{}")
    monkeypatch.setattr(terraform, "destroy", lambda st: None)
    cli.prepare_state(config, state)
    assert state.lab_id() is not None and not state.config_file.exists()
    state.terraform.mkdir()  # terraform init, next
    state.claim()  # what the configure step does: it must not refuse


@as_root
def test_a_namespace_caught_before_its_label_is_still_removed_and_no_obstacle(tmp_path, monkeypatch):
    """A crash or signal between `ip netns add` and the bridge's label: before, the lab
    could neither remove its namespace nor provision again."""
    name = unique_lab()
    config = LabConfig(lab=name, ssh_port_base=free_base(), state_dir=tmp_path / "mine")
    state = LabState(config.state_dir)
    state.claim()
    state.save_config(config)
    real_run = runner.run

    def cut_short(argv, **kw):
        if "bridge" in argv:
            raise LabError("interrupted")
        return real_run(argv, **kw)

    monkeypatch.setattr(runner, "run", cut_short)
    try:
        with pytest.raises(LabError, match="interrupted"):
            network.up(config, state)
        monkeypatch.setattr(runner, "run", real_run)
        assert config.netns in network.namespaces()
        lab.preflight(config, state)  # ours: no obstacle
        assert network.down(config, state) == [f"network namespace {name}-data"]
        assert config.netns not in network.namespaces()
    finally:
        real_run(["ip", "netns", "del", config.netns], check=False)


@as_root
def test_a_lab_made_before_labels_existed_takes_its_network_down(tmp_path):
    name = unique_lab()
    config = LabConfig(lab=name, ssh_port_base=free_base(), state_dir=tmp_path / "old")
    state = LabState(config.state_dir)
    state.root.mkdir()
    state.save_config(config)  # what an earlier rxelab left: no marker, no labels
    try:
        runner.run(["ip", "netns", "add", config.netns])
        runner.run(["ip", "tuntap", "add", "dev", f"{name}t1", "mode", "tap"])
        lab.preflight(config, state)  # its own namespace is no obstacle
        network.intents(state).unlink()  # as if `make destroy` came first
        lab.teardown(state)
        assert config.netns not in network.namespaces() and network.host_taps(config) == []
        assert not state.root.exists()
    finally:
        runner.run(["ip", "netns", "del", config.netns], check=False)
        runner.run(["ip", "link", "del", f"{name}t1"], check=False)

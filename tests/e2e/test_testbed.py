"""The testbed, end to end on real VMs: the CI smoke test on rxe."""

from __future__ import annotations

import itertools
import json
import os
import secrets
import shlex
import shutil
import subprocess
import time

import pytest

from experiments.running import commands
from infra import lab as lab_mod
from infra import network, vm
from infra import run as runner
from infra.config import REPO
from infra.inventory import Host
from infra.readiness import Console
from infra.ssh import ssh_argv

pytestmark = pytest.mark.vm


def test_the_lab_came_up_and_deployed_beside_cpu_hogs_driven_by_opentofu(lab):
    """Issue 53: `make provision` and `fab deploy`, with their defaults, beside CPU-bound
    processes twice as many as the cores (tests/conftest.py) - on a busy host fixed timeouts
    tuned on a quiet one had failed both - and with OpenTofu, not Terraform, on the PATH."""
    if lab.borrowed:
        pytest.skip("RXELAB_TEST_STATE names a developer's lab: it was not booted here")
    busy = lab.busy
    print(f"provision {busy['provision_s']:.0f} s, deploy {busy['deploy_s']:.0f} s beside "
          f"{busy['hogs']:.0f} CPU hogs (each used {busy['hog_cpu_s']:.0f} s of CPU or more)")
    assert busy["hogs"] >= 2 * (os.cpu_count() or 1) or os.environ.get("RXELAB_TEST_HOGS")
    # each hog really competed: at least 5 % of a core through the boot and the deploy
    assert busy["hog_cpu_s"] >= 0.05 * (busy["provision_s"] + busy["deploy_s"]), busy
    assert shutil.which("terraform", path=lab.env["PATH"]) is None
    assert shutil.which("tofu", path=lab.env["PATH"]) is not None
    standin_log = lab.state.root.parent / "tofu.log"
    if standin_log.exists():
        calls = standin_log.read_text()
        assert "init" in calls and "apply" in calls, calls


def test_make_status_shows_every_node_running_with_rxe_active(lab):
    r = subprocess.run(["make", "status"], cwd=REPO, env=lab.env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("│ node")]
    assert len(rows) == 3, r.stdout
    for row in rows:
        assert "running" in row and "ACTIVE" in row, row
        assert "data0 9000 / rdma 4096" in row, "jumbo frames by default: rxe path MTU 4096"


@pytest.mark.parametrize("index", [0, 1, 2])
def test_rxe0_is_active_on_data0(lab, index):
    host = lab.hosts[index]
    r = lab.ssh(host, "rdma link show rxe0/1; ip -4 -br addr show data0")
    assert r.returncode == 0, r.stderr
    assert "state ACTIVE" in r.stdout and "netdev data0" in r.stdout, r.stdout
    assert f"{host.data_ip}/24" in r.stdout
    r = lab.ssh(host, "ibv_devinfo -d rxe0 | grep active_mtu; cat /sys/class/net/data0/mtu")
    assert "4096" in r.stdout.split("\n")[0] and r.stdout.split()[-1] == "9000", r.stdout


@pytest.mark.parametrize("index", [0, 1, 2])
def test_cloud_init_done_without_errors_and_its_schema_check_passes(lab, index):
    host = lab.hosts[index]
    r = lab.ssh(host, "cloud-init status --long", timeout=180)
    assert "status: done" in r.stdout, r.stdout + r.stderr
    # (its own status says "recoverable_errors: {}" since cloud-init 23: the result apart)
    r = lab.ssh(host, "cat /run/cloud-init/result.json", timeout=60)
    assert json.loads(r.stdout)["v1"]["errors"] == [], r.stdout + r.stderr
    r = lab.ssh(host, "sudo cloud-init schema --system", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Valid" in r.stdout, r.stdout


def test_boot_profile_accounts_for_every_node_s_boot(lab):
    r = subprocess.run(["make", "boot-profile"], cwd=REPO, env=lab.env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    header = next(line for line in r.stdout.splitlines() if line.startswith("┃ phase"))
    assert all(n.name in header for n in lab.hosts), header
    for phase in ("kernel", "initrd", "cloud-init init-local", "init-local: Python start-up",
                  "rxe0.service active", "host saw it ready"):
        row = next((x for x in r.stdout.splitlines() if phase in x), None)
        assert row is not None and row.count("-") < 3, f"{phase}: {row}"
    assert "slowest node ready" in r.stdout and "cloud-init modules" in r.stdout, r.stdout


def wait_listening(lab, server: Host, port: int, proc: subprocess.Popen[str]) -> None:
    """A perftest client fails at once if its server is not listening yet."""
    assert proc.stdout is not None  # stdout=PIPE
    deadline = time.monotonic() + 60
    while True:
        r = lab.ssh(server, f"ss -Hltn 'sport = :{port}'", timeout=30)
        if str(port) in r.stdout:
            return
        assert proc.poll() is None, f"server on {server.name} exited: {proc.stdout.read()}"
        assert time.monotonic() < deadline, f"server on {server.name} never listened on {port}"
        time.sleep(1)


def pingpong(lab, client: Host, server: Host, port: int, iters: int = 200) -> str:
    """ibv_rc_pingpong over rxe (GID index 1) from client to server's data IP."""
    base = f"timeout 90 ibv_rc_pingpong -d rxe0 -g 1 -n {iters} -p {port}"
    srv = subprocess.Popen(ssh_argv(server, base), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    assert srv.stdout is not None  # stdout=PIPE
    try:
        wait_listening(lab, server, port, srv)
        cli = lab.ssh(client, f"{base} {server.data_ip}", timeout=120)
        out, _ = srv.communicate(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    assert cli.returncode == 0, f"{client.name} -> {server.name}: {cli.stdout}{cli.stderr}"
    assert srv.returncode == 0, f"server {server.name}: {out}"
    assert f"{iters} iters in" in cli.stdout and f"{iters} iters in" in out
    return cli.stdout


@pytest.mark.parametrize("a, b", list(itertools.combinations(range(3), 2)))
def test_ibv_rc_pingpong_between_every_pair(lab, a, b):
    pingpong(lab, lab.hosts[a], lab.hosts[b], port=18515 + a * 3 + b)


TX_STALL = "transmit queue"  # the kernel's NETDEV WATCHDOG line: a ring the device stopped taking
BULK_PORT = 18540  # + the server's index


def test_bulk_writes_both_ways_leave_every_transmit_ring_moving(lab):
    """A health check of the data NICs after the heaviest load the lab sees: each node writes
    1 MiB messages to the next and back at once for 30 s; then no node's kernel has logged a
    stalled transmit ring (since it booted: the tests before this one count too) and every
    data path still carries a ping. It does not reproduce the stall that virtio's event index
    caused (that took minutes of one node writing to three): `test_vm_argv` guards the
    setting itself (infra/network.py)."""
    hosts = lab.hosts
    tag = f"test-bulk-{secrets.token_hex(6)}"  # what this test starts carries it, and only that
    # -u 18: a 1 s transport timeout; at 65 ms (the default) the crowded VMs exhaust rxe's retries
    base = (f"{commands.started_by(tag)}timeout 90 "
            "ib_write_bw -d rxe0 -x 1 -s 1048576 -b -D 30 -F -u 18 -p {port}")
    procs: list[subprocess.Popen[str]] = []

    def start(host: Host, command: str) -> subprocess.Popen[str]:
        procs.append(subprocess.Popen(ssh_argv(host, command), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      text=True))
        return procs[-1]

    try:
        for i, h in enumerate(hosts):
            wait_listening(lab, h, BULK_PORT + i, start(h, base.format(port=BULK_PORT + i)))
        clients = []
        for i, h in enumerate(hosts):
            j = (i + 1) % len(hosts)
            clients.append(start(h, f"{base.format(port=BULK_PORT + j)} "
                                    f"{shlex.quote(hosts[j].data_ip)}"))
        try:
            outs = [c.communicate(timeout=150)[0] for c in clients]
        except subprocess.TimeoutExpired:
            pytest.fail("the bulk writes did not end within 150 s (their own limit is 90 s)")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for h in hosts:  # what the test started there, by its tag: nothing else
            lab.try_ssh(h, commands.stop_command(tag), timeout=30)
    for h, out, c in zip(hosts, outs, clients, strict=True):
        assert c.returncode == 0 and "1048576" in out, f"{h.name}: {out}"
    for i, h in enumerate(hosts):
        peer = hosts[(i + 1) % len(hosts)]
        r = lab.ssh(h, f"k=$(sudo -n dmesg) && echo kernel-log-read && "
                       f"printf '%s\\n' \"$k\" | grep -F {shlex.quote(TX_STALL)} | head -3; "
                       f"ping -c 3 -W 3 {shlex.quote(peer.data_ip)} >/dev/null && echo path-up")
        assert "kernel-log-read" in r.stdout, f"{h.name}: dmesg unreadable: {r.stdout}{r.stderr}"
        assert TX_STALL not in r.stdout, f"{h.name}: {r.stdout}"
        assert "path-up" in r.stdout, f"{h.name} -> {peer.name}: no ping over the data network"


def qmp_data_nic(lab, node_name: str, command: str) -> None:
    """Unplug (device_del) or plug (device_add) a node's data NIC, as a hot-plug would."""
    node = next(n for n in lab.config.all_nodes() if n.name == node_name)
    if command == "device_del":
        vm.qmp_command(lab.state, node, "device_del", arguments={"id": network.DATA_NIC_ID})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the guest acknowledges the unplug (ACPI) first
            present = vm.qmp_command(lab.state, node, "qom-list",
                                     arguments={"path": "/machine/peripheral"})
            assert isinstance(present, list), present
            if not any(p["name"] == network.DATA_NIC_ID for p in present):
                return
            time.sleep(1)
        pytest.fail(f"{node_name}: the guest did not let its data NIC go within 120 s")
    driver, *options = network.NIC.split(",")
    props = {k: {"on": True, "off": False}.get(v, v) for k, v in (o.split("=") for o in options)}
    vm.qmp_command(lab.state, node, "device_add", arguments={
        "driver": driver, **props, "netdev": "data", "mac": node.data_mac, "id": network.DATA_NIC_ID})


def wait_for_rxe(lab, node: Host, what: str, limit: float = 240) -> None:
    """Until rxe0 is ACTIVE on data0 with the node's address, or fail naming what it waited for."""
    deadline = time.monotonic() + limit
    out = None
    while time.monotonic() < deadline:
        out = lab.try_ssh(node, "rdma link show rxe0/1; ip -4 -br addr show dev data0")
        if out and "state ACTIVE" in out and f"{node.data_ip}/" in out:
            return
        time.sleep(2)
    pytest.fail(f"{node.name}: rxe0 not ACTIVE on data0 {limit:.0f} s after {what}: {out!r}")


def test_rxe_follows_its_nic_across_a_reboot_a_late_plug_and_a_replug(lab):
    """Issue 53: on a busy host the data NIC was renamed minutes into the boot, past systemd's
    90 s device timeout; rxe0.service, wanted by multi-user.target and bound to that device,
    failed by dependency and nothing started it again. Here the NIC is not there at all when
    the node reboots and is plugged in only after that timeout (hot-plug over QMP), then
    unplugged and plugged again: rxe0 comes up every time with no manual step."""
    if lab.borrowed:
        pytest.skip("RXELAB_TEST_STATE names a developer's lab, which the tests do not reboot")
    node = lab.hosts[2]
    before = lab.ssh(node, "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    assert before
    qmp_data_nic(lab, node.name, "device_del")
    gone = lab.ssh(node, "rdma link show rxe0/1 2>&1; systemctl is-active rxe0.service")
    assert "inactive" in gone.stdout and "state ACTIVE" not in gone.stdout, gone.stdout
    # The serial log goes on across the reboot: its new part says when cloud-init has finished
    # again, so SSH (which costs a booting guest CPU) is asked only then.
    console = Console(lab.state.serial_log(node.name))
    console.offset = lab.state.serial_log(node.name).stat().st_size
    lab.try_ssh(node, "sudo systemctl reboot", timeout=30)  # the connection may just drop
    deadline = time.monotonic() + 420
    state = "waiting for cloud-init to finish again on the console"
    uptime = 0.0
    while time.monotonic() < deadline:
        console.look()
        if console.finished:
            state = "cloud-init finished again, waiting for SSH"
            out = lab.try_ssh(node, "cat /proc/sys/kernel/random/boot_id /proc/uptime")
            if out and out.split("\n")[0].strip() not in ("", before):
                uptime = float(out.split("\n")[1].split()[0])
                break
        time.sleep(1)
    else:
        pytest.fail(f"{node.name}: {state} (7 min)")
    time.sleep(max(0.0, 100 - uptime))  # past systemd's 90 s wait for a device
    waiting = lab.ssh(node, "systemctl is-active rxe0.service; systemctl is-failed rxe0.service; "
                            "systemctl --failed --no-legend --plain")
    assert waiting.stdout.split()[:2] == ["inactive", "inactive"], (
        f"with no NIC, rxe0 waits for it, not failed: {waiting.stdout}")
    assert "rxe0" not in waiting.stdout.split("\n", 2)[-1], f"a failed unit: {waiting.stdout}"
    qmp_data_nic(lab, node.name, "device_add")
    wait_for_rxe(lab, node, "its NIC was plugged in 100 s after boot")
    pingpong(lab, lab.hosts[0], node, port=18600)
    qmp_data_nic(lab, node.name, "device_del")  # and once more while it runs
    qmp_data_nic(lab, node.name, "device_add")
    wait_for_rxe(lab, node, "its NIC was unplugged and plugged again")
    pingpong(lab, lab.hosts[0], node, port=18602)


@pytest.mark.destroys_lab
def test_destroy_leaves_nothing_behind(lab, tmp_path):
    if lab.borrowed:
        pytest.skip("RXELAB_TEST_STATE names a developer's lab, which the tests do not destroy")
    assert all(runner.process_is(pid, "qemu-system-x86_64") for pid in lab.qemu_pids.values())
    r = lab.make("destroy", 600, tmp_path / "destroy.log")
    assert r.returncode == 0, r.stdout
    assert "lab destroyed" in r.stdout
    for name, pid in lab.qemu_pids.items():
        assert not runner.process_is(pid, "qemu-system-x86_64"), f"{name} (pid {pid}) still runs"
    assert lab_mod.leftovers(lab.state, lab.config) == []
    if os.geteuid() == 0:
        assert lab.config.netns not in network.namespaces()
        assert network.host_taps(lab.config) == []
    assert not lab.state.root.exists()
    again = lab.make("destroy", 120, tmp_path / "destroy-again.log")
    assert again.returncode == 0 and "nothing to destroy" in again.stdout, "destroy is idempotent"

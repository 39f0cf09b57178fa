"""Nodes as qemu processes: a qcow2 overlay on the cached base image, a NoCloud seed, a serial
log, a QMP socket for a clean stop, and a pid file that lets any later command find it.

qemu daemonizes, so a node outlives the command that started it (Terraform's provisioner);
everything that stops it goes through the pid file and checks the pid still is qemu.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from pathlib import Path

from infra import network
from infra import run as runner
from infra.accel import cpu_args
from infra.config import Accel, LabConfig, Node
from infra.errors import LabError
from infra.images import BaseImage
from infra.state import LabState, mkdir_private

QEMU = "qemu-system-x86_64"
UBUNTU_DISK_SIZE = "10G"  # the cloud image is 3.5G virtual; first boot installs packages


def qemu_argv(config: LabConfig, state: LabState, image: BaseImage, accel: Accel,
              node: Node) -> list[str]:
    if image.direct_boot:
        boot = [
            "-kernel", str(image.kernel),
            "-initrd", str(image.initrd),
            # quiet: the kernel's chatter on an emulated serial port is boot time; cloud-init's
            # stages and errors still reach the console (the serial log). cloud-init=enabled:
            # the image enables it statically, without its generator (the Debian recipe)
            "-append", "console=ttyS0 quiet root=/dev/vda rw rootfstype=ext4 ds=nocloud "
                       "cloud-init=enabled",
        ]  # fmt: skip
    else:
        boot = []  # the Ubuntu cloud image boots through its own bootloader
    # The management NIC reaches nothing but the host's forward on 127.0.0.1. Ubuntu's first
    # boot installs packages, so its NIC is allowed out; Debian's image has them baked in.
    restrict = "off" if not image.direct_boot else "on"
    return [
        QEMU,
        "-name", f"{config.lab}-{node.name}",
        *cpu_args(accel),
        "-m", str(config.mem_mb),
        "-smp", "1",
        "-nodefaults", "-no-user-config", "-display", "none",
        *boot,
        "-drive", f"file={state.overlay(node.name)},if=virtio,format=qcow2,cache=unsafe",
        "-drive", f"file={state.seed_iso(node.name)},if=virtio,format=raw,readonly=on",
        "-netdev", f"user,id=mgmt,restrict={restrict},net={node.mgmt_net},"
                   f"hostfwd=tcp:127.0.0.1:{node.ssh_port}-:22",
        "-device", f"{network.NIC},netdev=mgmt,mac={node.mgmt_mac}",
        *network.qemu_args(config, state, node),
        "-device", "virtio-rng-pci",
        "-serial", f"file:{state.serial_log(node.name)}",
        "-qmp", f"unix:{state.qmp_socket(node.name)},server=on,wait=off",
        "-pidfile", str(state.pidfile(node.name)),
        "-daemonize",
    ]  # fmt: skip


def start(config: LabConfig, state: LabState, image: BaseImage, accel: Accel, node: Node) -> None:
    stop(config, state, node)  # an interrupted earlier run may have left this node behind
    runner.require(QEMU, "qemu-img")
    for d in (state.disks, state.logs, state.run):
        mkdir_private(d)
    overlay = ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(image.disk),
               "-F", image.disk_format, str(state.overlay(node.name))]
    if not image.direct_boot:
        overlay.append(UBUNTU_DISK_SIZE)
    runner.run(overlay, timeout=60)
    state.overlay(node.name).chmod(0o600)  # the guest's disk: it will hold the cluster key
    state.serial_log(node.name).unlink(missing_ok=True)
    network.before_vm(config, state, node)
    try:
        runner.run(qemu_argv(config, state, image, accel, node), timeout=60)
        network.after_vm(config, node)
    except BaseException:
        stop(config, state, node)
        raise
    print(f"{node.name}: started ({accel.value}), ssh on 127.0.0.1:{node.ssh_port}", flush=True)


def pid(state: LabState, node: Node) -> int | None:
    try:
        value = int(state.pidfile(node.name).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return value if runner.process_is(value, QEMU, str(state.pidfile(node.name))) else None


def processes_named(lab: str) -> list[tuple[int, list[str]]]:
    """Running qemu processes of any lab with this name (`-name <lab>-nodeN`), with their
    arguments: how a second lab of the same name is found, whoever started it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not runner.process_is(int(entry.name), QEMU):
            continue
        args = runner.cmdline(int(entry.name)) or []
        names = [b for a, b in zip(args, args[1:], strict=False) if a == "-name"]
        if any(re.fullmatch(rf"{re.escape(lab)}-node\d+", n) for n in names):
            found.append((int(entry.name), args))
    return found


def cpu_seconds(state: LabState, node: Node) -> float | None:
    """The CPU time the node's qemu has used (all its threads), or None if it is not running:
    what tells a slow guest from an idle one."""
    found = pid(state, node)
    fields = runner.stat_fields(found) if found is not None else None
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def is_running(state: LabState, node: Node) -> bool:
    return pid(state, node) is not None


def stop(config: LabConfig, state: LabState, node: Node, timeout: float = 10.0) -> None:
    """Ask qemu to quit over QMP; if it will not, kill it. Then remove the node's files."""
    if is_running(state, node):
        try:
            qmp_command(state, node, "quit", timeout=timeout)
        except Exception:  # any QMP failure falls back to signals below
            pass
        deadline = time.monotonic() + timeout
        while is_running(state, node) and time.monotonic() < deadline:
            time.sleep(0.1)
    runner.stop_pidfile(state.pidfile(node.name), QEMU)
    network.remove_tap(config, state, node)
    for path in (state.overlay(node.name), state.qmp_socket(node.name)):
        path.unlink(missing_ok=True)


def qmp_command(state: LabState, node: Node, command: str, timeout: float = 10.0,
                arguments: dict[str, object] | None = None) -> object:
    from qemu.qmp import QMPClient

    logging.getLogger("qemu.qmp").setLevel(logging.CRITICAL)

    async def call() -> object:
        client = QMPClient(f"rxelab-{node.name}")
        await asyncio.wait_for(client.connect(str(state.qmp_socket(node.name))), timeout)
        try:
            return await asyncio.wait_for(client.execute(command, arguments), timeout)
        finally:
            await client.disconnect()

    try:
        return asyncio.run(call())
    except (TimeoutError, OSError) as e:
        raise LabError(f"{node.name}: QMP {command!r} failed: {e}") from None

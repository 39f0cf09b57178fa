"""The lab's lifecycle steps. Terraform calls each one as a command (see terraform/main.tf);
each is idempotent and safe to re-run after an interruption, and `teardown` removes whatever
any of them left, from the files in the state directory alone.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time

from infra import accel as accel_mod
from infra import images, inventory, lab_settings, network, nocloud, readiness, vm
from infra import run as runner
from infra.config import Accel, LabConfig
from infra.errors import LabError
from infra.images import BaseImage
from infra.state import MARKER, OWNED, LabState, own_temporary, write_atomic


def configure(config: LabConfig, state: LabState) -> LabConfig:
    """Validate, resolve IMAGE=auto, record the config and make keys and seeds."""
    kind, why = images.resolve(config.image)
    print(why, flush=True)
    data_net = network.resolve(config.data_net)
    mtu, why_mtu = network.resolve_mtu(data_net, config.mtu)
    print(why_mtu, flush=True)
    resolved = LabConfig(**{**vars(config), "image": kind, "data_net": data_net, "mtu": mtu})
    state.claim()
    state.save_config(resolved)
    nocloud.make_isos(resolved, state, instance_tag=f"{int(time.time())}")
    return resolved


def prepare_image(state: LabState) -> None:
    """Build or find the base image, then decide the accelerator with its kernel."""
    config = state.load_config()
    image = images.ensure(config.image, config.extras)
    accel, why = accel_mod.resolve(config.accel, image)
    print(why, flush=True)
    write_atomic(state.root / "boot.json",
                 json.dumps({"image": json.loads(image.to_json()), "accel": accel.value}) + "\n")


def boot_plan(state: LabState) -> tuple[BaseImage, Accel]:
    try:
        data = json.loads((state.root / "boot.json").read_text())
    except FileNotFoundError:
        raise LabError("the base image is not prepared yet", hint="run `make provision`") from None
    return BaseImage.from_json(json.dumps(data["image"])), Accel(data["accel"])


def node_up(state: LabState, index: int) -> None:
    config = state.load_config()
    image, accel = boot_plan(state)
    vm.start(config, state, image, accel, config.node(index))


def node_down(state: LabState, index: int) -> None:
    if not state.config_file.exists():
        return
    config = state.load_config()
    if index <= config.nodes:
        vm.stop(config, state, config.node(index))


def boot_deadlines() -> readiness.Deadlines:
    """How long a node may stand still, and the whole wait at most (infra/lab_settings.py)."""
    return readiness.Deadlines(stall=lab_settings.stall_window(),
                               total=float(lab_settings.value("RXELAB_BOOT_TIMEOUT")))  # type: ignore[arg-type]


def wait(state: LabState) -> None:
    config = state.load_config()
    inv = inventory.for_lab(config, state)
    nodes = {n.name: n for n in config.all_nodes()}
    began = time.time()
    ready = readiness.wait_ready(
        list(inv.hosts),
        deadlines=boot_deadlines(),
        alive=lambda h: vm.is_running(state, nodes[h.name]),
        serial_log=lambda h: state.serial_log(h.name),
        cpu_seconds=lambda h: vm.cpu_seconds(state, nodes[h.name]),
    )
    inventory.save(inv, state.inventory_file)
    # When each qemu started (its pid file's time) and when the host saw the node ready: what
    # `make boot-profile` sets against the guest's own account of its boot.
    times = {name: {"qemu_started": state.pidfile(name).stat().st_mtime, "ready": began + t}
             for name, t in ready.items()}
    write_atomic(state.run / "ready.json", json.dumps(times, indent=1) + "\n")
    after_start = max(t["ready"] - t["qemu_started"] for t in times.values())
    print(f"all {len(ready)} nodes ready, {after_start:.0f} s after their VMs started; "
          f"inventory: {state.inventory_file}", flush=True)


def preflight(config: LabConfig, state: LabState) -> None:
    """Before anything is touched: the state directory can be this lab's, no other lab of the
    same name runs on this host, and the SSH ports of nodes not yet running are free."""
    state.check_claimable()
    if state.made_before_markers():
        network.adopt_unlabelled(config, state)
    clash = network.conflicts(config, state)
    ours = {str(state.pidfile(n.name)) for n in config.all_nodes()}
    for pid, args in vm.processes_named(config.lab):
        if not ours & set(args):
            clash.append(f"qemu pid {pid}")
    if clash:
        raise LabError(f"another lab named {config.lab!r} runs on this host ({', '.join(clash)}); "
                       "nothing was changed", hint=network.CLASH_HINT)
    for n in config.all_nodes():
        if not vm.is_running(state, n) and not port_is_free(n.ssh_port):
            raise LabError(f"port {n.ssh_port} ({n.name}'s SSH forward) is in use on 127.0.0.1; "
                           "nothing was changed",
                           hint="another lab or program holds it: choose SSH_PORT_BASE=...")


def port_is_free(port: int) -> bool:
    """Free to listen on, as qemu's forward does (with SO_REUSEADDR: a connection of a lab
    just destroyed, lingering in TIME_WAIT, does not hold the port)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def teardown(state: LabState, keep_logs: bool = False) -> list[str]:
    """Stop this lab's VMs and switch, remove its network and the entries of its state
    directory; report what was removed. Only what carries this lab's marks goes: a directory
    that is not a lab is refused whole, and files the lab did not make stay where they are."""
    if not state.root.exists():
        return []
    state.check_own()
    if not state.is_lab():
        raise LabError(f"{state.root} is not an rxelab lab (it has no {MARKER}): nothing removed",
                       hint="RXELAB_STATE (or --state-dir) must name a lab's own state directory")
    removed: list[str] = []
    config = None
    if state.config_file.exists():
        try:
            config = state.load_config()
        except (LabError, ValueError, KeyError, TypeError):
            config = None
    for pidfile in sorted(state.run.glob("*.pid")) if state.run.exists() else []:
        name = pidfile.stem
        program = "vde_switch" if name == "vde_switch" else vm.QEMU
        if runner.stop_pidfile(pidfile, program):
            removed.append(f"{program} {name}")
    if config is not None:
        if state.made_before_markers():
            network.adopt_unlabelled(config, state)
        removed += [x for x in network.down(config, state) if x != "vde_switch"]
    for name in OWNED:
        path = state.root / name
        if (keep_logs and name == "logs") or not (path.exists() or path.is_symlink()):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    for left in state.root.iterdir():  # write_atomic's temporaries of our own files, only
        if own_temporary(left.name, (*OWNED, MARKER)) and left.is_file() and not left.is_symlink():
            left.unlink()
    others = sorted(p.name for p in state.root.iterdir() if p.name != MARKER)
    if not others:
        state.marker.unlink(missing_ok=True)
        state.root.rmdir()
    elif not (keep_logs and others == ["logs"]):
        print(f"left in {state.root} (not made by rxelab): {', '.join(others)}", flush=True)
    return removed


def leftovers(state: LabState, config: LabConfig) -> list[str]:
    """What of this lab still exists on the host (for tests and `destroy`'s last check)."""
    found = []
    for n in config.all_nodes():
        pid = vm.pid(state, n)
        if pid:
            found.append(f"qemu {n.name} (pid {pid})")
        if state.overlay(n.name).exists():
            found.append(f"overlay {state.overlay(n.name)}")
    if os.geteuid() == 0:
        if config.netns in network.namespaces():
            found.append(f"network namespace {config.netns}")
        found += [f"tap {t}" for t in network.host_taps(config)]
    return found

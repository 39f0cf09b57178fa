"""The data network: an isolated L2 segment that the lab makes and owns, nothing else on it.

As root it is a bridge inside a network namespace of our own. Each node's tap is created in
the host namespace, opened by qemu there (so qemu's SSH forward stays on the host's
127.0.0.1), and then moved into the lab's namespace and onto the bridge: a tap keeps working
after `ip link set TAP netns NS`. Without root it is a vde_switch on a unix socket.
Either way no route leads from the segment anywhere else.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from infra import run as runner
from infra.config import VDE_MAX_MTU, DataNet, LabConfig, Node
from infra.errors import LabError
from infra.state import LabState, mkdir_private, write_atomic


def resolve(requested: DataNet) -> DataNet:
    if requested is DataNet.AUTO:
        return DataNet.BRIDGE if os.geteuid() == 0 else DataNet.VDE
    if requested is DataNet.BRIDGE and os.geteuid() != 0:
        raise LabError("DATA_NET=bridge needs root (taps and a network namespace)",
                       hint="run as root, or use DATA_NET=vde (no root needed)")
    return requested


def resolve_mtu(kind: DataNet, mtu: int) -> tuple[int, str]:
    """The MTU the segment can carry, and a line that says what rxe gets from it."""
    if kind is DataNet.VDE and mtu > VDE_MAX_MTU:
        return VDE_MAX_MTU, (f"MTU: {VDE_MAX_MTU}, not {mtu}: vde_switch forwards frames of at most "
                             f"{VDE_MAX_MTU} bytes of payload (use DATA_NET=bridge, as root, for "
                             f"jumbo frames); rxe path MTU {rxe_path_mtu(VDE_MAX_MTU)}")
    return mtu, f"MTU: {mtu} on the data network; rxe path MTU {rxe_path_mtu(mtu)}"


def rxe_path_mtu(mtu: int) -> int:
    """The largest InfiniBand MTU whose RoCEv2 packet (payload + IPv4/UDP/BTH/ICRC headers,
    at most 96 bytes with the extended headers) fits the netdev's MTU, as rxe picks it."""
    return max((m for m in (256, 512, 1024, 2048, 4096) if m + 96 <= mtu), default=256)


def vde_socket(state: LabState) -> Path:
    return state.run / "vde.ctl"


def owner_label(lab_id: str) -> str:
    """What a lab writes into the alias of the links it creates (its bridge, its taps): the
    proof, checked before any removal, that a link with the lab's name is really this lab's."""
    return f"rxelab:{lab_id}"


def link_alias(name: str, netns: str | None = None) -> str | None:
    """The alias of a link (None: no such link, or no alias)."""
    r = runner.run(["ip", *(["-n", netns] if netns else []), "-j", "link", "show", "dev", name],
                   check=False)
    try:
        return str(json.loads(r.stdout)[0].get("ifalias") or "") or None
    except (ValueError, IndexError, KeyError, AttributeError):
        return None


def intents(state: LabState) -> Path:
    """The names of the links this lab is about to make, written before it makes them: a link
    caught between its creation and its label (a crash, a signal) is still provably ours."""
    return state.run / "links.json"


def _intended(state: LabState) -> set[str]:
    try:
        return set(json.loads(intents(state).read_text()))
    except (OSError, ValueError, TypeError):
        return set()


def _intend(state: LabState, *names: str) -> None:
    write_atomic(intents(state), json.dumps(sorted(_intended(state) | set(names))) + "\n")


def _ours(state: LabState, name: str, alias: str | None) -> bool:
    lab_id = state.lab_id()
    if lab_id is not None and alias == owner_label(lab_id):
        return True
    return alias is None and name in _intended(state)


def namespace_is_ours(config: LabConfig, state: LabState) -> bool:
    return _ours(state, config.netns, link_alias(config.bridge, config.netns))


def adopt_unlabelled(config: LabConfig, state: LabState) -> None:
    """A lab made before links were labelled: the namespace and taps of its name are its own."""
    if resolve(config.data_net) is DataNet.BRIDGE and os.geteuid() == 0:
        found = [t for t in host_taps(config) if link_alias(t) is None]
        if config.netns in namespaces() and link_alias(config.bridge, config.netns) is None:
            found.append(config.netns)
        if found:
            _intend(state, *found)


def conflicts(config: LabConfig, state: LabState) -> list[str]:
    """What of another lab with this lab's name exists on the host (as root: its namespace,
    its taps); empty when nothing would clash."""
    if resolve(config.data_net) is not DataNet.BRIDGE:
        return []
    found = []
    if config.netns in namespaces() and not namespace_is_ours(config, state):
        found.append(f"network namespace {config.netns}{labelled(link_alias(config.bridge, config.netns))}")
    found += [f"tap {t}{labelled(link_alias(t))}" for t in host_taps(config)
              if not _ours(state, t, link_alias(t))]
    return found


def labelled(alias: str | None) -> str:
    """The owner's label, for a clash message: the lab whose rxelab-lab.json holds that id
    is the one whose `make destroy` removes it."""
    return f", labelled {alias}" if alias else ""


CLASH_HINT = ("give this lab another name: LAB=...; if that lab was interrupted, destroy it "
              "from its own state directory (RXELAB_STATE=<dir> make destroy: the directory "
              "whose rxelab-lab.json holds the label's id)")


def up(config: LabConfig, state: LabState) -> None:
    kind = resolve(config.data_net)
    lab_id = state.require_id()
    if clash := conflicts(config, state):
        raise LabError(f"another lab named {config.lab!r} runs on this host ({', '.join(clash)})",
                       hint=CLASH_HINT)
    down(config, state)  # a leftover of this lab's interrupted run must not trip this one
    if kind is DataNet.BRIDGE:
        runner.require("ip")
        ns, br = config.netns, config.bridge
        _intend(state, ns)
        runner.run(["ip", "netns", "add", ns])
        runner.run(["ip", "-n", ns, "link", "set", "lo", "up"])
        runner.run(["ip", "-n", ns, "link", "add", br, "mtu", str(config.mtu), "type", "bridge",
                    "stp_state", "0", "forward_delay", "0", "mcast_snooping", "0"])
        runner.run(["ip", "-n", ns, "link", "set", br, "alias", owner_label(lab_id)])
        runner.run(["ip", "-n", ns, "link", "set", br, "up"])
        print(f"network: bridge {br} in namespace {ns}", flush=True)
    else:
        runner.require("vde_switch")
        mkdir_private(state.run)
        runner.run(["vde_switch", "-s", vde_socket(state), "-p", state.pidfile("vde_switch"),
                    "-d"])
        print(f"network: vde_switch on {vde_socket(state)}", flush=True)


def down(config: LabConfig, state: LabState) -> list[str]:
    """Remove this lab's segment and taps - only those that carry its id - and say what was
    removed; safe to call when nothing exists."""
    removed = []
    if os.geteuid() == 0:
        for tap in host_taps(config):
            if _ours(state, tap, link_alias(tap)):
                runner.run(["ip", "link", "del", tap], check=False)
                removed.append(f"tap {tap}")
        if config.netns in namespaces() and namespace_is_ours(config, state):
            runner.run(["ip", "netns", "del", config.netns])
            removed.append(f"network namespace {config.netns}")
    if runner.stop_pidfile(state.pidfile("vde_switch"), "vde_switch"):
        removed.append("vde_switch")
    shutil.rmtree(vde_socket(state), ignore_errors=True)  # vde_switch -s makes a directory
    return removed


def namespaces() -> set[str]:
    out = runner.run(["ip", "netns", "list"], check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def host_taps(config: LabConfig) -> list[str]:
    """Taps named for this lab still in the host namespace (a node that never got its tap
    moved), whoever made them: callers check the owner."""
    prefix = f"{config.lab}t"
    return sorted(p.name for p in Path("/sys/class/net").iterdir()
                  if p.name.startswith(prefix) and p.name[len(prefix):].isdigit())


# Both of a node's NICs (data and management) are virtio-net without the event index, the
# ring-index form of virtio's notification suppression; the used ring's flag stands in for it.
# Measured on this machine (Debian's qemu 7.2 under TCG, the guest's kernel 6.1): with the index,
# bulk RDMA writes among four VMs stalled a node's transmit ring within 2-3 minutes for good: the
# guest had posted 238 buffers past the index at which the device asked to be kicked, the device
# had taken none and was not waiting, and no kick came again (NETDEV WATCHDOG every 5 s, the data
# path gone until the VM restarts). The same load without the index ran clean (field notes,
# 2026-11-28).
NIC = "virtio-net-pci,event_idx=off"
DATA_NIC_ID = "datanic"  # the data NIC's qdev id: QMP unplugs and plugs it by this name


def qemu_args(config: LabConfig, state: LabState, node: Node) -> list[str]:
    if resolve(config.data_net) is DataNet.BRIDGE:
        netdev = f"tap,id=data,ifname={node.tap},script=no,downscript=no"
    else:
        netdev = f"vde,id=data,sock={vde_socket(state)}"
    return [
        "-netdev", netdev,
        "-device", f"{NIC},netdev=data,mac={node.data_mac},id={DATA_NIC_ID}",
    ]  # fmt: skip


def before_vm(config: LabConfig, state: LabState, node: Node) -> None:
    if resolve(config.data_net) is DataNet.BRIDGE:
        remove_tap(config, state, node)
        if node.tap in host_taps(config):
            raise LabError(f"tap {node.tap} exists and is not this lab's",
                           hint="another lab has this lab's name: give this one another (LAB=...)")
        _intend(state, node.tap)
        runner.run(["ip", "tuntap", "add", "dev", node.tap, "mode", "tap"])
        runner.run(["ip", "link", "set", node.tap, "mtu", str(config.mtu),
                    "alias", owner_label(state.require_id())])


def after_vm(config: LabConfig, node: Node) -> None:
    """qemu holds the tap open now: move it into the lab's namespace, onto the bridge."""
    if resolve(config.data_net) is DataNet.BRIDGE:
        runner.run(["ip", "link", "set", node.tap, "netns", config.netns])
        runner.run(["ip", "-n", config.netns, "link", "set", node.tap, "mtu", str(config.mtu),
                    "master", config.bridge, "up"])


def remove_tap(config: LabConfig, state: LabState, node: Node) -> None:
    """This node's tap, wherever it is, if it is this lab's."""
    if resolve(config.data_net) is not DataNet.BRIDGE or os.geteuid() != 0:
        return
    if _ours(state, node.tap, link_alias(node.tap)):
        runner.run(["ip", "link", "del", node.tap], check=False)
    if config.netns in namespaces() and _ours(state, node.tap, link_alias(node.tap, config.netns)):
        runner.run(["ip", "-n", config.netns, "link", "del", node.tap], check=False)

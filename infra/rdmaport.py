"""An RDMA port as a node's shell sees it: where sysfs keeps the port's state, the netdev
under its GID and its counters, and how to read its active (RoCE path) MTU. The one place
that knows this; the readiness wait, `make status`, the deploy check and the experiments
(the netdev they change, the port they wait for, the MTUs they record) all read the port
through it.

Every command here is shell text for the node; the inventory's values (device, port, GID
index) reach it only through shlex.quote.
"""

from __future__ import annotations

import shlex

from infra.inventory import RdmaEndpoint

SYSFS = "/sys/class/infiniband"
ACTIVE = "ACTIVE"
# What ibv_devinfo prints as `active_mtu: 4096 (5)`, reduced to the number of bytes.
_ACTIVE_MTU = "sed -n 's/.*active_mtu:[^0-9]*\\([0-9]*\\).*/\\1/p'"


def device_path(r: RdmaEndpoint) -> str:
    return f"{SYSFS}/{r.device}"


def port_path(r: RdmaEndpoint, *parts: str) -> str:
    """The port's sysfs directory, or a file under it (`state`, `hw_counters`, ...)."""
    return "/".join((f"{device_path(r)}/ports/{r.port}", *parts))


def state_path(r: RdmaEndpoint) -> str:
    return port_path(r, "state")


def netdev_path(r: RdmaEndpoint) -> str:
    """The file naming the netdev under the port's GID (data0 in the lab)."""
    return port_path(r, "gid_attrs", "ndevs", str(r.gid_index))


def counters_path(r: RdmaEndpoint) -> str:
    return port_path(r, "hw_counters")


def state_command(r: RdmaEndpoint, missing: str) -> str:
    """Prints the port's state as the kernel says it (`4: ACTIVE`), or `missing` without one."""
    return f"cat {shlex.quote(state_path(r))} 2>/dev/null || echo {shlex.quote(missing)}"


def device_exists(r: RdmaEndpoint) -> str:
    """A test: the node has the RDMA device."""
    return f"test -e {shlex.quote(device_path(r))}"


def is_active(r: RdmaEndpoint) -> str:
    """A test: the port is ACTIVE."""
    return (f"test \"$(cut -d' ' -f2 {shlex.quote(state_path(r))} 2>/dev/null)\" = {ACTIVE}")


def wait_active(r: RdmaEndpoint, seconds: float) -> str:
    """Wait (up to `seconds`) until the port is ACTIVE; prints nothing, fails never."""
    return (f"for i in $(seq {int(seconds * 2)}); do grep -q {ACTIVE} "
            f"{shlex.quote(state_path(r))} && break; sleep 0.5; done")


def netdev_assign(r: RdmaEndpoint, var: str = "nd", quiet: bool = False) -> str:
    """Sets $var to the netdev under the port's GID (empty where there is none)."""
    return f"{var}=$(cat {shlex.quote(netdev_path(r))}{' 2>/dev/null' if quiet else ''})"


def netdev_mtu(var: str = "nd") -> str:
    """Prints the MTU of the netdev named by $var (after netdev_assign)."""
    return f'cat "/sys/class/net/${var}/mtu"'


def active_mtu(r: RdmaEndpoint) -> str:
    """Prints the port's active MTU (the RoCE path MTU) in bytes, or nothing."""
    return (f"ibv_devinfo -d {shlex.quote(r.device)} -i {shlex.quote(str(r.port))} "
            f"2>/dev/null | {_ACTIVE_MTU}")


def parse_state(line: str) -> str:
    """`4: ACTIVE` (the state file's text) -> `ACTIVE`."""
    return line.strip().split(":")[-1].strip()

"""Which RDMA device, port and GID the verbs transport opens, decided in pure Python:
rxelab.verbs asks the devices (pyverbs), this module chooses and, when nothing fits, says
why in words a newcomer can act on (the devices there are, the port's state, the size of
the GID table). Kept apart from pyverbs so the choice is tested without RDMA.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rxelab.errors import ConfigError

# enum ibv_port_state, as libibverbs numbers it (verbs.h)
PORT_STATES = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")
ACTIVE = PORT_STATES.index("ACTIVE")
EMPTY_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
LOOK = "ibv_devinfo -v lists them"  # rdma-core's, on every host with RDMA
BRING_UP = ("`rdma link` shows each port's state; an rxe port is ACTIVE once its netdev is up "
            "(`sudo ip link set <if> up`)")


def state_name(state: int) -> str:
    return PORT_STATES[state] if 0 <= state < len(PORT_STATES) else f"in state {state}"


def first_active(states: Sequence[int], port: int | None) -> int | None:
    """The port to use of one device whose ports 1.. are in `states`: `port` if it is
    ACTIVE, else (no port asked for) the first ACTIVE one; None if there is none."""
    if port is not None:
        return port if 1 <= port <= len(states) and states[port - 1] == ACTIVE else None
    return next((n for n, state in enumerate(states, 1) if state == ACTIVE), None)


def _ports_said(device: str, states: Sequence[int], port: int | None) -> str:
    if port is not None:
        if port > len(states):
            return f"{device} has no port {port}"
        return f"{device} port {port} is {state_name(states[port - 1])}"
    if not states:
        return f"{device} has no port"
    return f"{device}: " + ", ".join(f"port {n} {state_name(s)}" for n, s in enumerate(states, 1))


def no_port(seen: Mapping[str, Sequence[int]], name: str | None, port: int | None) -> ConfigError:
    """Why no port of the devices `seen` (each device's ports' states, port 1 first) can be
    used: asked for `name` (a device) and `port`, None where the choice was left open."""
    if name is not None and port is not None:
        states = seen[name]
        if port > len(states):
            count = len(states)
            return ConfigError(f"RDMA device {name} has no port {port}",
                               hint=f"its ports: {'1..' + str(count) if count > 1 else count}")
        return ConfigError(f"port {port} of RDMA device {name} is "
                           f"{state_name(states[port - 1])}, not ACTIVE",
                           hint="is its link up? `rdma link show` says (rxe: is its netdev up?)")
    said = "; ".join(_ports_said(d, s, port) for d, s in seen.items()) + f"; {BRING_UP}"
    if name is not None:
        return ConfigError(f"RDMA device {name} has no ACTIVE port", hint=said)
    what = f"an ACTIVE port {port}" if port is not None else "an ACTIVE port"
    return ConfigError(f"no RDMA device has {what}", hint=said)


def check_gid_index(device: str, port: int, index: int, table_len: int) -> int:
    """A GID index asked for, within the port's table."""
    if not 0 <= index < table_len:
        entries = f"{table_len} entries (0..{table_len - 1})" if table_len else "no entries"
        raise ConfigError(f"GID index {index} is out of range: {device} port {port} has a GID "
                          f"table of {entries}", hint=LOOK)
    return index


def check_gid(device: str, port: int, index: int, gid: str) -> str:
    """The GID at an index asked for: an empty entry routes nothing."""
    if gid == EMPTY_GID:
        raise ConfigError(f"GID index {index} of {device} port {port} is empty (no address)",
                          hint=LOOK)
    return gid

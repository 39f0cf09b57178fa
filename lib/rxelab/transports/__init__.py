"""The transports a communicator can run its collectives over, and the one door to them.

Each transport is imported only when a communicator opens it, so a host without pyverbs can
import the library (and, with a transport that needs no verbs, run it).
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rxelab.errors import ConfigError
from rxelab.settings import (
    CONGESTION_ENV,
    CONGESTIONS,
    DEVICE_ENV,
    GID_INDEX_ENV,
    IB_PORT_ENV,
    TRANSPORT_ENV,
    TRANSPORTS,
)
from rxelab.transports.base import Fabric

# where pyverbs comes from (not PyPI), and what runs without it
NO_PYVERBS = ("install rdma-core's Python bindings, the Debian/Ubuntu package python3-pyverbs "
              "(a venv needs --system-site-packages to see it); on a machine without RDMA, "
              f'use transport="tcp" ({TRANSPORT_ENV}=tcp)')


def choose(given: str | None) -> str:
    """The transport to open: init()'s transport=, else RXELAB_TRANSPORT, else verbs."""
    env = os.environ.get(TRANSPORT_ENV)
    said = f"transport={given!r}" if given is not None else f"{TRANSPORT_ENV}={env!r}"
    name = given if given is not None else env or "verbs"
    if name not in TRANSPORTS:
        raise ConfigError(f"{said}: no such transport", hint=f"one of {', '.join(TRANSPORTS)}")
    return name


@dataclass(frozen=True)
class Where:
    """Where a communicator opens its transport (None: the transport chooses). device: the
    RDMA device (tcp, quic: the address to listen on); port and gid_index: the device's port
    and the port's GID index, verbs only."""

    device: str | None
    port: int | None
    gid_index: int | None


LARGEST = 255  # a port number and a GID index are 8 bits in libibverbs' address handle


def where(transport: str, device: Any = None, port: Any = None, gid_index: Any = None,
          env: Mapping[str, str] | None = None) -> Where:
    """init()'s device=, port=, gid_index=, else RXELAB_DEVICE, RXELAB_IB_PORT,
    RXELAB_GID_INDEX (an argument wins over the environment): each checked, and named as it
    was given when it is wrong."""
    env = os.environ if env is None else env
    if device is None:
        device = env.get(DEVICE_ENV, "").strip() or None
    elif not isinstance(device, str) or not device.strip():
        raise ConfigError(f"device={device!r} must name an RDMA device (verbs) or an address "
                          "(tcp, quic)")
    return Where(device, _number("port", port, IB_PORT_ENV, 1, transport, env),
                 _number("gid_index", gid_index, GID_INDEX_ENV, 0, transport, env))


def _number(name: str, given: Any, variable: str, low: int, transport: str,
            env: Mapping[str, str]) -> int | None:
    meaning = "the RDMA device's port" if name == "port" else "the port's GID table index"
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, numbers.Integral) \
                or not low <= int(given) <= LARGEST:
            raise ConfigError(f"{name}={given!r}: {meaning}, a whole number from {low} to "
                              f"{LARGEST}")
        return int(given)
    raw = env.get(variable, "").strip()
    if not raw:
        return None
    if transport != "verbs":
        raise ConfigError(f"{variable}={raw!r} chooses an RDMA port; transport {transport} has "
                          "none", hint=f"unset {variable}, or use transport verbs")
    value = int(raw) if raw.isascii() and raw.isdigit() else -1
    if not low <= value <= LARGEST:
        raise ConfigError(f"{variable}={raw!r}: {meaning}, a whole number from {low} to "
                          f"{LARGEST}")
    return value


def load(name: str) -> None:
    """Import what the transport needs, so that a host without it is told before it meets
    the job (a newcomer before it knocks), in one line."""
    if name == "verbs":
        try:
            from rxelab import verbs  # noqa: F401
        except ModuleNotFoundError as err:
            if err.name != "pyverbs" and not (err.name or "").startswith("pyverbs."):
                raise
            raise ConfigError("transport verbs needs pyverbs, which this Python cannot import",
                              hint=NO_PYVERBS) from None
        except ImportError as err:  # a pyverbs rxelab.verbs refuses
            raise ConfigError(str(err)) from None
    if name == "quic":
        try:
            import aioquic.quic.connection  # noqa: F401
        except ImportError:
            raise ConfigError("transport quic needs aioquic, which this Python cannot import",
                              hint="pip install 'rxelab[quic]', or Debian 13's python3-aioquic") \
                from None
        congestion()


def congestion() -> str:
    """quic's congestion control: RXELAB_CONGESTION, else reno."""
    name = os.environ.get(CONGESTION_ENV) or CONGESTIONS[0]
    if name not in CONGESTIONS:
        raise ConfigError(f"{CONGESTION_ENV}={name!r}: quic has no such congestion control",
                          hint=f"one of {', '.join(CONGESTIONS)}")
    return name


def id_of(name: str) -> int:
    """What the hello carries for a transport (settings.TRANSPORT)."""
    return TRANSPORTS.index(name)


def open_fabric(name: str, *, device: str | None, port: int | None, gid_index: int | None,
                cq_depth: int, toward: str) -> Fabric:
    """The named transport's fabric for one communicator (its device and completion queue).
    device: verbs' RDMA device, or the address tcp listens on (default: the one that reaches
    `toward`, the job's rendezvous host)."""
    if name == "verbs":
        from rxelab import verbs  # pyverbs: only now

        return verbs.VerbsFabric(device, port, gid_index, cq_depth)
    if port is not None or gid_index is not None:
        raise ConfigError(f"port= and gid_index= choose an RDMA port; transport {name} has none",
                          hint=f"device= names the address {name} listens on")
    if name == "tcp":
        from rxelab.transports import tcp

        return tcp.TcpFabric(device, toward)
    if name == "quic":
        from rxelab.transports import quic

        return quic.QuicFabric(device, toward, congestion())
    raise ConfigError(f"transport {name!r} cannot be opened", hint=f"one of {', '.join(TRANSPORTS)}")

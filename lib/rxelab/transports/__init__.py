"""The transports a communicator can run its collectives over, and the one door to them.

Each transport is imported only when a communicator opens it, so a host without pyverbs can
import the library (and, with a transport that needs no verbs, run it).
"""

from __future__ import annotations

import os

from rxelab.errors import ConfigError
from rxelab.settings import CONGESTION_ENV, CONGESTIONS, TRANSPORT_ENV, TRANSPORTS
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

"""rxelab: RDMA collectives on pyverbs (rxe in the lab's VMs; real RoCE/InfiniBand elsewhere).

    import rxelab
    with rxelab.init() as comm:              # rank/size/rendezvous from the launcher's env
        comm.alltoall(send, recv, algorithm="sequential")

Importing this package does not import pyverbs; init() does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rxelab.errors import ClosedError, ConfigError, PeerError, ProtocolError, RdmaError

__version__ = "0.3.0"  # the one place of the version (lib/pyproject.toml, CHANGELOG.md)

if TYPE_CHECKING:
    from rxelab.comm import Communicator


_SUFFIX = "_ALGORITHMS"


def __getattr__(name: str) -> tuple[str, ...]:
    """<NAME>_ALGORITHMS: the algorithms of the described collective <name> (rxelab.ops), which
    imports numpy: read when asked for, so that `python3 -m rxelab.launch` (which needs
    neither) starts in a fraction of the time (under TCG, ~0.9 s less per job)."""
    if name.endswith(_SUFFIX) and name.isupper():
        from rxelab.ops import COLLECTIVES

        described = COLLECTIVES.get(name[:-len(_SUFFIX)].lower())
        if described is not None:
            return tuple(described.algorithms)
    raise AttributeError(f"module 'rxelab' has no attribute {name!r}")


def init(*args: Any, **kwargs: Any) -> Communicator:
    from rxelab.comm import init as _init

    return _init(*args, **kwargs)


def join(*args: Any, **kwargs: Any) -> Communicator:
    """A newcomer to a running elastic job (rxelab.comm.join)."""
    from rxelab.comm import join as _join

    return _join(*args, **kwargs)


__all__ = ["__version__", "init", "join", "RdmaError", "ConfigError", "PeerError",
           "ProtocolError", "ClosedError", "ALLTOALL_ALGORITHMS", "ALLGATHER_ALGORITHMS"]

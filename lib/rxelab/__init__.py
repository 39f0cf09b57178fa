"""rxelab: RDMA collectives on pyverbs (rxe in the lab's VMs; real RoCE/InfiniBand elsewhere).

    import rxelab
    with rxelab.init() as comm:              # rank/size/rendezvous from the launcher's env
        comm.alltoall(send, recv, algorithm="sequential")

Importing this package does not import pyverbs; init() does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rxelab.errors import ClosedError, ConfigError, PeerError, ProtocolError, RdmaError
from rxelab.ops import COLLECTIVES

ALLTOALL_ALGORITHMS = tuple(COLLECTIVES["alltoall"].algorithms)
ALLGATHER_ALGORITHMS = tuple(COLLECTIVES["allgather"].algorithms)

if TYPE_CHECKING:
    from rxelab.comm import Communicator


def init(*args: Any, **kwargs: Any) -> Communicator:
    from rxelab.comm import init as _init

    return _init(*args, **kwargs)


__all__ = ["init", "RdmaError", "ConfigError", "PeerError", "ProtocolError", "ClosedError",
           "ALLTOALL_ALGORITHMS", "ALLGATHER_ALGORITHMS"]

"""What every part of the communicator relies on, declared once: its state and its inner
calls. The parts (p2p.py, named.py) are typed against this, so none of them imports the
communicator; communicator.py fills it in. What failing one touches is guard.py's Guarded."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rxelab.comm.guard import Guarded

if TYPE_CHECKING:
    from rxelab.buffers import Buffer
    from rxelab.comm.plans import Plan, Planner
    from rxelab.comm.results import Stats
    from rxelab.requests import Request


class Core(Guarded):
    """Guarded's state (what failing a communicator touches), and the rest."""

    size: int
    timeout: float
    planner: Planner
    p2p_sent: dict[int, int]
    p2p_recv: dict[int, int]
    exposed: dict[int, int]
    remotes: dict[int, int]

    def _check_open(self) -> None:
        raise NotImplementedError

    def _peer(self, peer: int) -> int:
        raise NotImplementedError

    def _mr(self, buf: Buffer, remote: bool, hold: bool = False) -> Any:
        raise NotImplementedError

    def collective(self, name: str, sendbuf: Any, recvbuf: Any = None,
                   algorithm: str | None = None, **arguments: Any) -> Stats:
        raise NotImplementedError

    def start(self, name: str, sendbuf: Any, recvbuf: Any = None, algorithm: str | None = None,
              **arguments: Any) -> Request:
        raise NotImplementedError

    def _submit(self, what: str, prepare: Callable[[], Plan]) -> Request:
        raise NotImplementedError

    def _run(self, plan: Plan, in_worker: bool = False) -> Stats:
        raise NotImplementedError

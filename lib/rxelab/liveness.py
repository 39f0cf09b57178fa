"""Is a rank of an elastic job alive? Its listener's porter answers a probe at once, proven
(rxelab.auth): a refused or unanswered connection, a listener that cannot prove it holds the
job's secret (a stranger on a dead rank's port) or no answer within PROBE_S all mean gone.
A TCP connect alone means nothing: anyone can listen on a port a dead process left.

Watch runs probes in the background, so a loop that waits for members (a coordinator, rank 0
gathering a new generation) never blocks on one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from rxelab.auth import Credential
from rxelab.errors import PeerError, ProtocolError
from rxelab.link import dial

CONNECT_S = 3.0  # a listener that has not taken the connection by then is taken for dead
PROBE_S = 5.0  # a porter answers within this, however busy its rank is
EVERY_S = 1.0  # a rank not yet come is probed again after this


def probe(address: tuple[str, int], credential: Credential, *, scope: str, rank: int,
          generation: int) -> bool:
    """Whether a live rank of this job listens at `address` (rank, generation: the asker's)."""
    deadline = time.monotonic() + PROBE_S
    try:
        link = dial(address, credential, kind="probe", rank=rank, generation=generation,
                    scope=scope, deadline=deadline, connect_s=CONNECT_S)
    except (OSError, ProtocolError, PeerError):
        return False
    try:
        link.send({"type": "probe", "rank": rank, "generation": generation})
        reply = link.recv(deadline=deadline, peer=f"the listener at {address[0]}:{address[1]}")
        return reply["type"] == "alive"
    except (OSError, ProtocolError, PeerError):
        return False
    finally:
        link.close()


class Watch:
    """Background probes of ranks: gone(ranks) starts a probe for each asked rank that has
    none running (again EVERY_S after its last), and returns those found gone so far."""

    def __init__(self, alive: Callable[[int], bool]) -> None:
        self.alive = alive
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._last: dict[int, float] = {}
        self._gone: set[int] = set()

    def gone(self, ranks: Iterable[int]) -> set[int]:
        now = time.monotonic()
        with self._lock:
            for r in ranks:
                if r not in self._running and now - self._last.get(r, -EVERY_S) >= EVERY_S:
                    self._running.add(r)
                    threading.Thread(target=self._probe, args=(r,), daemon=True,
                                     name=f"rxelab-probe-{r}").start()
            return set(self._gone)

    def forget(self, rank: int) -> None:
        """It came after all: whatever a probe thought."""
        with self._lock:
            self._gone.discard(rank)

    def _probe(self, rank: int) -> None:
        try:
            alive = self.alive(rank)
        except Exception:  # a probe that fails says nothing either way
            alive = True
        with self._lock:
            self._running.discard(rank)
            self._last[rank] = time.monotonic()
            if not alive:
                self._gone.add(rank)

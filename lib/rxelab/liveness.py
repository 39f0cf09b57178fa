"""Is a rank of an elastic job alive? Its listener's porter answers a probe at once, proven
(rxelab.auth) and bound to the rank and generation asked about. A TCP connect alone means
nothing: anyone can listen on a port a dead process left.

- gone: nothing listens there (refused, or no connection within CONNECT_S: a dead or cut-off
  node), or what listens cannot prove it holds the job's secret (a stranger on the port), or
  it took the connection and said nothing within PROBE_S twice in a row (a live porter
  answers in milliseconds; a silent stranger is found in two tries);
- unsure: the connection was closed before the handshake ended (a crowded listener, or one
  that does not hold that role yet): asked again, never counted.

Watch runs probes in the background, a few at a time, so a loop that waits for members (a
coordinator, rank 0 gathering a new generation) never blocks on one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from rxelab.auth import Credential
from rxelab.errors import AuthError, PeerError, ProtocolError, Reason
from rxelab.link import dial

CONNECT_S = 3.0  # a listener that has not taken the connection by then is taken for dead
PROBE_S = 4.0  # a porter answers within this, however busy its rank is
EVERY_S = 1.0  # a rank not yet come is probed again this long after its last probe ended
STRIKES = 2  # silent answers in a row that mean gone
MAX_PROBES = 16  # probes in flight at once
ALIVE, GONE, UNSURE, SILENT = "alive", "gone", "unsure", "silent"


def probe(address: tuple[str, int], credential: Credential, *, scope: str, rank: int, to: int,
          generation: int) -> str:
    """What listens at `address` for rank `to` of `generation` (rank: the asker's): ALIVE,
    GONE, SILENT or UNSURE (see the module's docstring)."""
    deadline = time.monotonic() + PROBE_S
    try:
        link = dial(address, credential, kind="probe", rank=rank, to=to, generation=generation,
                    scope=scope, deadline=deadline, connect_s=CONNECT_S)
    except (OSError, AuthError):
        return GONE
    except PeerError as err:
        return SILENT if err.reason == Reason.SILENT else UNSURE
    except ProtocolError:
        return UNSURE
    try:
        link.send({"type": "probe", "rank": rank, "generation": generation})
        reply = link.recv(deadline=deadline, peer=f"the listener at {address[0]}:{address[1]}")
        return ALIVE if reply["type"] == "alive" else UNSURE
    except (OSError, ProtocolError, PeerError):
        return UNSURE
    finally:
        link.close()


class Watch:
    """Background probes of ranks: gone(ranks) starts a probe for each asked rank that has
    none running (again EVERY_S after its last), at most MAX_PROBES at once, and returns
    those found gone so far."""

    def __init__(self, look: Callable[[int], str]) -> None:
        self.look = look
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._last: dict[int, float] = {}
        self._strikes: dict[int, int] = {}
        self._gone: set[int] = set()

    def gone(self, ranks: Iterable[int]) -> set[int]:
        now = time.monotonic()
        with self._lock:
            for r in ranks:
                if len(self._running) >= MAX_PROBES:
                    break
                if r not in self._running and now - self._last.get(r, -EVERY_S) >= EVERY_S:
                    self._running.add(r)
                    threading.Thread(target=self._probe, args=(r,), daemon=True,
                                     name=f"rxelab-probe-{r}").start()
            return set(self._gone)

    def forget(self, rank: int) -> None:
        """It came after all: whatever a probe thought."""
        with self._lock:
            self._gone.discard(rank)
            self._strikes.pop(rank, None)

    def _probe(self, rank: int) -> None:
        try:
            verdict = self.look(rank)
        except Exception:  # a probe that fails says nothing either way
            verdict = UNSURE
        with self._lock:
            self._running.discard(rank)
            self._last[rank] = time.monotonic()
            if verdict == SILENT:
                self._strikes[rank] = self._strikes.get(rank, 0) + 1
            elif verdict != UNSURE:
                self._strikes.pop(rank, None)
            if verdict == GONE or self._strikes.get(rank, 0) >= STRIKES:
                self._gone.add(rank)

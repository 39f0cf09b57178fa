"""Is a rank of an elastic job alive? Its listener's server answers a probe at once, proven
(rxelab.control.handshake) and bound to the rank and generation asked about. A TCP connect alone means
nothing: anyone can listen on a port a dead process left, and anyone can keep a live
listener's accept queue full.

What one probe says, its Verdict (verdict_of), an outcome of one try and not why a rank is
down (that is a rxelab.errors.Reason: GONE_REASON, once the verdicts make a rank gone):
- ALIVE: a proven answer;
- GONE: nothing listens there (refused), or what listens cannot prove it holds the job's
  secret (a stranger on the port);
- UNANSWERED: no connection within CONNECT_S: a dead or cut-off node, or a live listener
  whose accept queue a flood of connects keeps full;
- UNSURE, MUTE: the connection was taken, then closed before the handshake ended (UNSURE),
  or said nothing within PROBE_S (MUTE): a crowded listener, or a stranger on the port.

Only GONE is death at once. Doubts weighs the rest over time, so "unsure" has an end and a
flood cannot make a death: a rank that gave no proof for NO_PROOF_S (STRIKES tries at least)
is gone, unless its heartbeats vouch for it still and its listener only failed to take a
connection or to answer in time (what a flood of connects does to a live one), never closed
one unproven. Heartbeats vouch for a rank until SILENT_S after it was last heard (Lively,
from rxelab.control.plane as this rank left the communicator; ranks given without times were heard
just now): the control plane's own rule, a link silent that long is a rank gone. So a node
that powers off (or stops, or is cut off) just as a shrink starts is dropped once its
heartbeats lapse, never waited for to the deadline.

Watch runs probes in the background, a few at a time, so a loop that waits for members (a
coordinator, rank 0 gathering a new generation) never blocks on one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from rxelab.control.connection import dial
from rxelab.control.handshake import Credential
from rxelab.errors import AuthError, PeerError, ProtocolError, Reason

CONNECT_S = 3.0  # a listener that has not taken the connection by then: no answer this time
PROBE_S = 4.0  # a server answers within this, however busy its rank is
EVERY_S = 1.0  # a rank not yet come is probed again this long after its last probe ended
STRIKES = 2  # probes without proof, at least, before a rank is gone
NO_PROOF_S = 5.0  # ... over this long (a live server proves itself in milliseconds)
MAX_PROBES = 16  # probes in flight at once
SILENT_S = 10.0  # heartbeats vouch for a rank this long after it was last heard (rxelab.control.plane:
# a link silent this long means the rank behind it is gone)


class Verdict(StrEnum):
    """What one probe says of the rank behind an address (the module's docstring)."""

    ALIVE = "alive"  # a proven answer
    GONE = "gone"  # refused, or a stranger on the port: a death at once
    UNANSWERED = "unanswered"  # nothing took the connection within CONNECT_S
    UNSURE = "unsure"  # taken, then closed before any proof (or the probe failed otherwise)
    MUTE = "mute"  # taken, then nothing said within PROBE_S


# why a rank is down once its verdicts make it gone (GONE at once, or Doubts.gone over time),
# where that stops a call (rxelab.control.rendezvous): taken for dead, as a closed connection
GONE_REASON: Final = Reason.DIED


def verdict_of(err: BaseException) -> Verdict:
    """What a dial that failed with `err` says of the rank behind the address."""
    if isinstance(err, ConnectionRefusedError | AuthError):
        return Verdict.GONE
    if isinstance(err, PeerError):  # the handshake's own read: it said nothing, or closed
        return Verdict.MUTE if err.reason == Reason.SILENT else Verdict.UNSURE
    if isinstance(err, ConnectionResetError | BrokenPipeError | ConnectionAbortedError
                  | ProtocolError):
        return Verdict.UNSURE  # taken, then dropped before any proof
    if isinstance(err, OSError):
        return Verdict.UNANSWERED  # a timeout, an unreachable host: nothing took the connection
    return Verdict.UNSURE


def probe(address: tuple[str, int], credential: Credential, *, scope: str, rank: int, to: int,
          generation: int) -> Verdict:
    """What listens at `address` for rank `to` of `generation` (rank: the asker's): its
    Verdict (see the module's docstring)."""
    deadline = time.monotonic() + PROBE_S
    try:
        link = dial(address, credential, kind="probe", rank=rank, to=to, generation=generation,
                    scope=scope, deadline=deadline, connect_s=CONNECT_S)
    except (OSError, ProtocolError, PeerError) as err:
        return verdict_of(err)
    try:
        link.send({"type": "probe", "rank": rank, "generation": generation})
        reply = link.recv(deadline=deadline, peer=f"the listener at {address[0]}:{address[1]}")
        return Verdict.ALIVE if reply["type"] == "alive" else Verdict.UNSURE
    except (OSError, ProtocolError, PeerError):
        return Verdict.UNSURE
    finally:
        link.close()


class Lively(frozenset[int]):
    """The ranks whose heartbeats said they lived, each with until when they vouch for it
    (time.monotonic(): SILENT_S after the rank was last heard)."""

    until: Mapping[int, float]

    def __new__(cls, until: Mapping[int, float]) -> Lively:
        made = super().__new__(cls, until)
        made.until = MappingProxyType(dict(until))
        return made

    def __reduce__(self) -> tuple[type[Lively], tuple[dict[int, float]]]:  # copies keep times
        return Lively, (dict(self.until),)


@dataclass
class Doubt:
    """A rank's tries without proof since its last proof."""

    since: float  # when the first of them began
    tries: int = 0
    taken: bool = False  # one was taken and closed unproven (no flood of connects does that)


class Doubts:
    """The verdicts on each rank so far, weighed over time (see the module's docstring).
    lively: the ranks whose heartbeats said they lived (a Lively, or ranks heard just now);
    clock: time.monotonic, or a test's."""

    def __init__(self, lively: Iterable[int] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        if isinstance(lively, Lively):
            self._vouched = dict(lively.until)
        else:
            now = clock()
            self._vouched = {r: now + SILENT_S for r in lively}
        self._doubts: dict[int, Doubt] = {}
        self._gone: set[int] = set()
        self._proven: set[int] = set()

    def note(self, rank: int, verdict: Verdict, began: float) -> None:
        """A try that began at `began` (on the clock) said `verdict`."""
        if verdict == Verdict.ALIVE:
            self._proven.add(rank)
            self._doubts.pop(rank, None)
        elif verdict == Verdict.GONE:
            self._gone.add(rank)
        else:
            doubt = self._doubts.setdefault(rank, Doubt(began))
            doubt.tries += 1
            doubt.taken |= verdict == Verdict.UNSURE

    def vouched(self, rank: int) -> bool:
        """Whether its heartbeats still vouch for it (not SILENT_S past its last one)."""
        return self.clock() <= self._vouched.get(rank, float("-inf"))

    def gone(self, rank: int) -> bool:
        if rank in self._gone:
            return True
        doubt = self._doubts.get(rank)
        if doubt is None or doubt.tries < STRIKES or self.clock() - doubt.since < NO_PROOF_S:
            return False
        return doubt.taken or not self.vouched(rank)

    def alive(self, rank: int) -> bool:
        """Proven, or vouched for by its heartbeats, and not found gone since."""
        return (rank in self._proven or self.vouched(rank)) and not self.gone(rank)

    def forget(self, rank: int) -> None:
        """It came after all: whatever a probe thought."""
        self._gone.discard(rank)
        self._doubts.pop(rank, None)
        self._proven.add(rank)


class Watch:
    """Background probes of ranks: gone(ranks) starts a probe for each asked rank that has
    none running (again EVERY_S after its last), at most MAX_PROBES at once, and returns
    those of them found gone so far (Doubts, with `lively` and `clock`)."""

    def __init__(self, look: Callable[[int], Verdict], lively: Iterable[int] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.look = look
        self._clock = clock
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._last: dict[int, float] = {}
        self._doubts = Doubts(lively, clock)

    def gone(self, ranks: Iterable[int]) -> set[int]:
        now = self._clock()
        asked = list(ranks)
        with self._lock:
            for r in asked:
                if len(self._running) >= MAX_PROBES:
                    break
                if r not in self._running and now - self._last.get(r, -EVERY_S) >= EVERY_S:
                    self._running.add(r)
                    threading.Thread(target=self._probe, args=(r,), daemon=True,
                                     name=f"rxelab-probe-{r}").start()
            return {r for r in asked if self._doubts.gone(r)}

    def alive(self, rank: int) -> bool:
        with self._lock:
            return self._doubts.alive(rank)

    def forget(self, rank: int) -> None:
        with self._lock:
            self._doubts.forget(rank)

    def _probe(self, rank: int) -> None:
        began = self._clock()
        try:
            verdict = self.look(rank)
        except Exception:  # a probe that fails says nothing either way
            verdict = Verdict.UNSURE
        with self._lock:
            self._running.discard(rank)
            self._last[rank] = self._clock()
            self._doubts.note(rank, verdict, began)

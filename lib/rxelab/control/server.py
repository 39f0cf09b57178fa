"""A listener served by a thread of its own: every connection is taken through the handshake
(rxelab.control.accepting) whatever the rank is doing, liveness probes are answered at once, and each other
request goes to whoever serves its kind now (rank 0 gathering hellos, a coordinator hearing
shrinks, an admit hearing newcomers) or is told "later" (the asker tries again). Newcomers
wait here until the job admits (their joins are parked, and dropped if they give up).

A knock names the rank and generation it is for: a server takes only those of the roles its
rank holds (rank 3 of generation 1, rank 0 of the generation it gathers), so a relay cannot
pass a probe or a shrink meant for a dead rank to a live one.

An elastic rank keeps one for the job's life (rxelab.membership), so "is rank r alive?" is
answered by rank r itself, proven, not by whoever holds its port; rank 0 of a fixed job has
one only while it gathers the job.
"""

from __future__ import annotations

import contextlib
import queue
import select
import socket
import threading
from collections.abc import Iterator
from typing import Any

from rxelab.control.accepting import Acceptor, Heard
from rxelab.control.connection import Link
from rxelab.control.handshake import Credential

PATIENCE_S = 5.0  # a connection must finish its handshake and say what it wants within this
MAX_PENDING = 64  # connections in the handshake at once: beyond this the oldest goes
SEND_S = 2.0  # an answer that the other end does not take within this is dropped
PARKED = ("join",)  # kinds that wait for their consumer instead of hearing "later"
MAX_PARKED = 64
HEAR_S = 0.2  # the serving loop looks at its parked requests this often; close() wakes it


class Server:
    def __init__(self, listener: socket.socket, credential: Credential, scopes: set[str], *,
                 rank: int, generation: int) -> None:
        """scopes: the job scopes it serves (rxelab.control.handshake: knocks for others are dropped);
        rank and generation: what a probe is answered, and the first role it holds
        (update() as they change)."""
        self.listener = listener
        self.port: int = listener.getsockname()[1]
        self._lock = threading.Lock()
        self._scopes = set(scopes)
        self._me = (rank, generation)
        self._roles = {(generation, rank)}
        self._inboxes: dict[str, queue.Queue[Heard]] = {}
        self._parked: list[Heard] = []
        self._stop = threading.Event()
        self.acceptor = Acceptor(listener, credential, self._wanted, patience=PATIENCE_S,
                         limit=MAX_PENDING)
        self._thread = threading.Thread(target=self._run, name="rxelab-control-server", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> list[str]:
        return list(self.acceptor.dropped)

    def update(self, *, rank: int, generation: int, scopes: set[str] | None = None) -> None:
        """This rank is `rank` of `generation` now (a role it keeps: a late probe of an
        earlier one is still its to answer)."""
        with self._lock:
            self._me = (rank, generation)
            self._roles.add((generation, rank))
            if scopes is not None:
                self._scopes |= scopes

    def hold(self, generation: int, rank: int) -> None:
        """Take a role before it is this rank's (a coordinator, rank 0 of the generation it
        is about to gather: its members dial at once)."""
        with self._lock:
            self._roles.add((generation, rank))

    def _wanted(self, knock: dict[str, Any]) -> str | None:
        with self._lock:
            if knock["scope"] not in self._scopes:
                return f"a knock for another job or rendezvous ({knock['scope'][:60]!r})"
            kind, role = knock["kind"], (knock["generation"], knock["to"])
            if kind == "data":
                return "a data connection, which belongs at a rank's transport, not here"
            if kind == "join" or role in self._roles:
                return None
            if kind == "shrink" and all(g != role[0] for g, _ in self._roles):
                return None  # a member of a generation this rank never had: told so, not taken
        return (f"a {kind} for rank {role[1]} of generation {role[0]}, which this listener "
                "is not")

    @contextlib.contextmanager
    def serving(self, *kinds: str) -> Iterator[queue.Queue[Heard]]:
        """The requests of these kinds, as they come (those parked first), while the block
        runs; any left when it ends are told to try again."""
        inbox: queue.Queue[Heard] = queue.Queue()
        with self._lock:
            for kind in kinds:
                self._inboxes[kind] = inbox
            for heard in [h for h in self._parked if h[1]["type"] in kinds]:
                self._parked.remove(heard)
                inbox.put(heard)
        try:
            yield inbox
        finally:
            with self._lock:
                for kind in kinds:
                    if self._inboxes.get(kind) is inbox:
                        del self._inboxes[kind]
                left = []
                while True:
                    try:
                        left.append(inbox.get_nowait())
                    except queue.Empty:
                        break
            for link, _ in left:
                answer(link, {"type": "later", "reason": "not serving that now"})

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for link, request in self.acceptor.hear(HEAR_S):
                    self._route(link, request)
                self._prune()
            except (OSError, ValueError):  # the listener was closed under us: nothing to serve
                if self.listener.fileno() < 0:
                    return
            except Exception as err:  # a connection's fault must not end the serving
                self.acceptor.dropped.append(f"server: {type(err).__name__}: {err}")

    def _route(self, link: Link, request: dict[str, Any]) -> None:
        kind = request["type"]
        reply: dict[str, Any] | None = None
        with self._lock:
            inbox = self._inboxes.get(kind)
            rank, generation = self._me
            if kind == "probe":
                reply = {"type": "alive", "rank": rank, "generation": generation}
            elif inbox is not None:
                inbox.put((link, request))  # under the lock: never into an inbox gone since
                return
            elif kind in PARKED and len(self._parked) < MAX_PARKED:
                self._parked.append((link, request))
                return
            elif kind == "hello" and "shrink" in self._inboxes:
                # it agrees on the members again: the generation that hello is for will not form
                reply = {"type": "failed",
                         "reason": "rank 0 of that generation is agreeing on the members again"}
            else:
                reply = {"type": "later", "reason": f"not taking {kind} requests now"}
        answer(link, reply)

    def _prune(self) -> None:
        """Parked requests whose asker gave up (its connection closed) go."""
        with self._lock:
            parked = list(self._parked)
        if not parked:
            return
        try:
            readable, _, _ = select.select([link.sock for link, _ in parked], [], [], 0)
        except (OSError, ValueError):
            readable = [link.sock for link, _ in parked]
        for link, request in parked:
            if link.sock in readable:  # a waiting newcomer says nothing more: it left
                with self._lock:
                    if (link, request) in self._parked:
                        self._parked.remove((link, request))
                link.close()

    def close(self, *, listener: bool) -> None:
        """Stop serving (and close the listener too, if it is not handed on)."""
        self._stop.set()
        self.acceptor.wake()  # not a select's wait later: a job's end waits on this join
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self.acceptor.close()
        with self._lock:
            parked, self._parked = self._parked, []
        for link, _ in parked:
            link.close()
        if listener:
            self.listener.close()


def answer(link: Link, message: dict[str, Any] | None) -> None:
    """Best effort (the other end may be gone), then close."""
    with contextlib.suppress(OSError):
        if message is not None:
            link.sock.settimeout(SEND_S)
            link.send(message)
    link.close()

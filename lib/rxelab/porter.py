"""A listener served by a thread of its own: every connection is taken through the handshake
(rxelab.hall) whatever the rank is doing, liveness probes are answered at once, and each other
request goes to whoever serves its kind now (rank 0 gathering hellos, a coordinator hearing
shrinks, an admit hearing newcomers) or is told "later" (the asker tries again).

An elastic rank keeps one for the job's life (rxelab.membership), so "is rank r alive?" is
answered by rank r itself, proven, not by whoever holds its port; rank 0 of a fixed job has
one only while it gathers the job.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
from collections.abc import Iterator
from typing import Any

from rxelab.auth import Credential
from rxelab.hall import Hall, Heard
from rxelab.link import Link

PATIENCE_S = 5.0  # a connection must finish its handshake and say what it wants within this
MAX_PENDING = 64  # connections in the handshake at once: beyond this the oldest goes
SEND_S = 2.0  # an answer that the other end does not take within this is dropped


class Porter:
    def __init__(self, listener: socket.socket, credential: Credential, scopes: set[str], *,
                 rank: int, generation: int) -> None:
        """scopes: the job scopes it serves (rxelab.auth: knocks for others are dropped);
        rank and generation: what a probe is answered (update() as they change)."""
        self.listener = listener
        self.port: int = listener.getsockname()[1]
        self._lock = threading.Lock()
        self._scopes = set(scopes)
        self._me = (rank, generation)
        self._inboxes: dict[str, queue.Queue[Heard]] = {}
        self._stop = threading.Event()
        self.hall = Hall(listener, credential, self._wanted, patience=PATIENCE_S,
                         limit=MAX_PENDING)
        self._thread = threading.Thread(target=self._run, name="rxelab-porter", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> list[str]:
        return list(self.hall.dropped)

    def update(self, *, rank: int | None = None, generation: int | None = None,
               scopes: set[str] | None = None) -> None:
        with self._lock:
            r, g = self._me
            self._me = (r if rank is None else rank, g if generation is None else generation)
            if scopes is not None:
                self._scopes |= scopes

    def _wanted(self, knock: dict[str, Any]) -> str | None:
        with self._lock:
            if knock["scope"] in self._scopes:
                return None
        return f"a knock for another job or rendezvous ({knock['scope'][:60]!r})"

    @contextlib.contextmanager
    def serving(self, *kinds: str) -> Iterator[queue.Queue[Heard]]:
        """The requests of these kinds, as they come, while the block runs; any left when it
        ends are told to try again."""
        inbox: queue.Queue[Heard] = queue.Queue()
        with self._lock:
            for kind in kinds:
                self._inboxes[kind] = inbox
        try:
            yield inbox
        finally:
            with self._lock:
                for kind in kinds:
                    if self._inboxes.get(kind) is inbox:
                        del self._inboxes[kind]
            while True:
                try:
                    link, _ = inbox.get_nowait()
                except queue.Empty:
                    break
                answer(link, {"type": "later", "reason": "not serving that now"})

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for link, request in self.hall.hear(0.2):
                    self._route(link, request)
            except (OSError, ValueError):  # the listener was closed under us: nothing to serve
                if self.listener.fileno() < 0:
                    return
            except Exception as err:  # a connection's fault must not end the serving
                self.hall.dropped.append(f"porter: {type(err).__name__}: {err}")

    def _route(self, link: Link, request: dict[str, Any]) -> None:
        kind = request["type"]
        with self._lock:
            inbox = self._inboxes.get(kind)
            agreeing = "shrink" in self._inboxes
            rank, generation = self._me
        if kind == "probe":
            answer(link, {"type": "alive", "rank": rank, "generation": generation})
        elif inbox is not None:
            inbox.put((link, request))
        elif kind == "hello" and agreeing:
            # it agrees on the members again: the generation that hello is for will not form
            answer(link, {"type": "failed", "reason": "rank 0 of that generation is agreeing on "
                                                      "the members again"})
        else:
            answer(link, {"type": "later", "reason": f"not taking {kind} requests now"})

    def close(self, *, listener: bool) -> None:
        """Stop serving (and close the listener too, if it is not handed on)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self.hall.close()
        if listener:
            self.listener.close()


def answer(link: Link, message: dict[str, Any] | None) -> None:
    """Best effort (the other end may be gone), then close."""
    with contextlib.suppress(OSError):
        if message is not None:
            link.sock.settimeout(SEND_S)
            link.send(message)
    link.close()

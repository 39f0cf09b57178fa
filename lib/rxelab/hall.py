"""A listener's waiting room: the connections that reach it, each taken through the handshake
(rxelab.link.Greeting) up to its first sealed message, all at once, so one slow or silent
connection holds up nobody. rxelab.porter serves a listener with it.

Whatever does not prove itself in time - another program, a port scanner, a stray stream, a
process without the job's secret, a connection that says nothing - is dropped, and why is
kept (`dropped`) for an error that must list it. A crowd of silent connections cannot take
every descriptor: past `limit` the oldest that has not knocked goes. Where proving costs (MUNGE),
rxelab.gate bounds the work done for connections that have proved nothing yet: the handshake's
steps run on its checker threads, never this one, at a rate per source.
"""

from __future__ import annotations

import contextlib
import queue
import selectors
import socket
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from rxelab.auth import Credential
from rxelab.errors import ProtocolError
from rxelab.gate import Gate
from rxelab.link import Greeting, Link

Heard = tuple[Link, dict[str, Any]]
MAX_DROPPED = 32  # reasons kept for an error message


class Hall:
    def __init__(self, listener: socket.socket, credential: Credential,
                 wanted: Callable[[dict[str, Any]], str | None], *, patience: float,
                 limit: int) -> None:
        """patience: seconds a connection may take from its first byte (or, where a checker
        works on its handshake, from the checker's last answer) to its first sealed
        message; limit: connections waiting at most; wanted(knock): see Greeting."""
        self.listener, self.credential, self.wanted = listener, credential, wanted
        self.patience, self.limit = patience, limit
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ)
        # in the order they came: what came so far, since when, and the handshake's state
        self.pending: dict[socket.socket, tuple[bytearray, float, Greeting]] = {}
        self.dropped: list[str] = []
        self.gate = Gate(credential)
        # a costly credential's steps: on a checker thread (busy), bytes that came meanwhile
        # (later), finished steps (done), and a socket pair that wakes select() for them
        self.busy: set[socket.socket] = set()
        self.later: dict[socket.socket, bytearray] = {}
        self.done: queue.SimpleQueue[tuple[socket.socket, Future[Any]]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ)

    def hear(self, wait: float) -> list[Heard]:
        """The connections that finished their handshake within `wait` seconds, each with its
        first sealed message (the link now blocking, no longer watched here)."""
        out: list[Heard] = []
        for key, _ in self.sel.select(timeout=wait):
            if key.fileobj is self.listener:
                self._enter()
                continue
            if key.fileobj is self._wake_r:
                self._finish(out)
                continue
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            if sock not in self.pending:  # dropped earlier in this round (crowded out)
                continue
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError as err:
                self.reject(sock, str(err))
                continue
            if not data:
                self.reject(sock, "closed before it finished the handshake")
                continue
            if sock in self.busy:
                self.later.setdefault(sock, bytearray()).extend(data)
                continue
            buf, _, greeting = self.pending[sock]
            buf += data
            if self.gate.costly:
                self._check_aside(sock, buf, greeting)
                continue
            try:
                reply, request = greeting.step(buf)
            except (ProtocolError, OSError) as err:
                self.reject(sock, str(err))
                continue
            self._answer(sock, reply, request, greeting, out)
        now = time.monotonic()  # what came has been read: only the slow ones go (not while a
        # checker works on theirs: that time is ours, and each check ends within munge.CALL_S)
        for sock in [s for s, (_, t, _) in self.pending.items()
                     if now - t > self.patience and s not in self.busy]:
            self.reject(sock, f"did not finish the handshake within {self.patience:g} s")
        return out

    def _answer(self, sock: socket.socket, reply: bytes, request: dict[str, Any] | None,
                greeting: Greeting, out: list[Heard]) -> None:
        try:
            if reply:
                sock.send(reply)  # a fresh connection's buffer takes a challenge whole
        except OSError as err:
            self.reject(sock, str(err))
            return
        if request is not None:
            self.sel.unregister(sock)
            del self.pending[sock]
            sock.setblocking(True)
            out.append((greeting.link(sock), request))

    def _check_aside(self, sock: socket.socket, buf: bytearray, greeting: Greeting) -> None:
        """The next step of a costly handshake, on a checker thread (rxelab.gate)."""
        if self.gate.full():
            self.reject(sock, "too many handshakes in progress")
            return
        self.busy.add(sock)

        def finished(future: Future[Any]) -> None:
            self.done.put((sock, future))
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
        self.gate.submit(lambda: greeting.step(buf), finished)

    def _finish(self, out: list[Heard]) -> None:
        """The steps the checkers finished: answered, and the next one started if more came."""
        with contextlib.suppress(OSError):
            self._wake_r.recv(1 << 16)
        while True:
            try:
                sock, future = self.done.get_nowait()
            except queue.Empty:
                return
            self.gate.waiting -= 1
            self.busy.discard(sock)
            more = self.later.pop(sock, None)
            if sock not in self.pending:  # dropped meanwhile (too slow, crowded out)
                continue
            try:
                reply, request = future.result()
            except (ProtocolError, OSError) as err:
                self.reject(sock, str(err))
                continue
            except Exception as err:  # a check's fault is that connection's only
                self.reject(sock, f"{type(err).__name__}: {err}")
                continue
            buf, _, greeting = self.pending[sock]
            self.pending[sock] = (buf, time.monotonic(), greeting)  # its patience runs anew
            self._answer(sock, reply, request, greeting, out)
            if more and request is None and sock in self.pending:
                buf += more
                self._check_aside(sock, buf, greeting)

    def _enter(self) -> None:
        if len(self.pending) >= self.limit:  # make room
            self.reject(self._victim(), "crowded out by newer connections")
        try:
            sock, _ = self.listener.accept()
        except OSError:  # out of descriptors, say: free one, do not spin
            if self.pending:
                self.reject(self._victim(), "crowded out by newer connections")
            else:
                time.sleep(0.05)
            return
        if (why := self.gate.admit(sock)) is not None:
            self.reject(sock, why)
            return
        sock.setblocking(False)
        self.pending[sock] = (bytearray(), time.monotonic(), Greeting(self.credential, self.wanted))
        self.sel.register(sock, selectors.EVENT_READ)

    def _victim(self) -> socket.socket:
        """Who goes when the room is full: the oldest that has not even knocked (a rank
        knocks as it connects: a crowd of silent connections crowds out only itself), else
        the oldest."""
        for sock, (_, _, greeting) in self.pending.items():
            if greeting.knock is None:
                return sock
        return next(iter(self.pending))

    def reject(self, sock: socket.socket, why: str) -> None:
        """Close a connection, and say why in `dropped`."""
        with contextlib.suppress(OSError):
            self.dropped.append(f"{sock.getpeername()[0]}: {why}")
            del self.dropped[:-MAX_DROPPED]
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(sock)
        self.pending.pop(sock, None)
        self.later.pop(sock, None)
        sock.close()

    def close(self) -> None:
        """Every connection still waiting is closed; the listener stays (it is not ours)."""
        for sock in list(self.pending):
            self.reject(sock, "the hall closed")
        self.gate.close()
        self.sel.close()
        self._wake_r.close()
        self._wake_w.close()

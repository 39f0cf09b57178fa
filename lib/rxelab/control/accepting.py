"""A listener's waiting room: the connections that reach it, each taken through the handshake
(rxelab.control.connection.Greeting) up to its first sealed message, all at once, so one slow or silent
connection holds up nobody. rxelab.control.server serves a listener with it.

Whatever does not prove itself in time - another program, a port scanner, a stray stream, a
process without the job's secret, a connection that says nothing - is dropped, and why is
kept (`dropped`) for an error that must list it. A connection is read one frame at a time, its
header checked before its body is read, and not at all while its frame waits for a check: what
it sends ahead stays in the kernel's buffers (and then its sender's), never in ours.

A crowd of silent connections cannot take every descriptor: past `limit` the oldest that has
not knocked goes. A connection that knocked, or whose frame a checker holds, is never made to
go for a newcomer: while none may go, the acceptor takes no new connection, and newcomers wait in
the listener's backlog. A dialler that gives up meanwhile has timed out (to rxelab.control.liveness: a
busy listener), never been closed unanswered (a stranger's doing). Where proving costs (MUNGE),
rxelab.control.accept_limits bounds the work done for connections that have proved nothing yet: the
handshake's steps run on its checker threads, never this one, at a rate per source.
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

from rxelab.control import framing
from rxelab.control.accept_limits import Gate
from rxelab.control.connection import Greeting, Link
from rxelab.control.handshake import Credential
from rxelab.errors import ProtocolError

Heard = tuple[Link, dict[str, Any]]
MAX_DROPPED = 32  # reasons kept for an error message
Stage = tuple[bool, bool]  # knocked, proven: a check that changes it took the handshake on


class Acceptor:
    def __init__(self, listener: socket.socket, credential: Credential,
                 wanted: Callable[[dict[str, Any]], str | None], *, patience: float,
                 limit: int) -> None:
        """patience: seconds a connection may take from being taken (or, where a checker
        took its handshake a step on, from that step) to its first sealed message, the time
        its frames wait for a checker not counted; limit: connections waiting at most;
        wanted(knock): see Greeting."""
        self.listener, self.credential, self.wanted = listener, credential, wanted
        self.patience, self.limit = patience, limit
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ)
        self.accepting = True
        # in the order they came: what came so far, since when, and the handshake's state
        self.pending: dict[socket.socket, tuple[bytearray, float, Greeting]] = {}
        self.dropped: list[str] = []
        self.gate = Gate(credential)
        # a costly credential's steps: a whole frame on a checker thread or waiting for one
        # (held: not read meanwhile), those waiting in order (queued), finished ones (done:
        # with the stage the handshake was at, and when the check began), and a socket pair
        # that wakes select() for them
        self.held: set[socket.socket] = set()
        self.queued: dict[socket.socket, None] = {}
        self.done: queue.SimpleQueue[tuple[socket.socket, Future[Any], Stage, float]] = \
            queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ)

    def hear(self, wait: float) -> list[Heard]:
        """The connections that finished their handshake within `wait` seconds, each with its
        first sealed message (the link now blocking, no longer watched here)."""
        out: list[Heard] = []
        ready = self.sel.select(timeout=wait)  # the listener last: a knock that came is read
        # before a newcomer may crowd out its sender as one that never knocked
        for key, _ in sorted(ready, key=lambda event: event[0].fileobj is self.listener):
            if key.fileobj is self.listener:
                self._enter()
            elif key.fileobj is self._wake_r:
                self._finish(out)
            elif key.fileobj in self.pending and key.fileobj not in self.held:
                self._read(key.fileobj, out)  # type: ignore[arg-type]
        now = time.monotonic()  # what came has been read: only the slow ones go (not while a
        # checker has their frame, or it waits for one: that time is ours, and bounded, each
        # check ending within munge.CALL_S)
        for sock in [s for s, (_, t, _) in self.pending.items()
                     if now - t > self.patience and s not in self.held]:
            self.reject(sock, f"did not finish the handshake within {self.patience:g} s")
        self._listen(len(self.pending) < self.limit or self._victim() is not None)
        return out

    def _read(self, sock: socket.socket, out: list[Heard]) -> None:
        buf, _, greeting = self.pending[sock]
        try:
            while (need := _need(buf, greeting)) > 0:
                data = sock.recv(need)
                if not data:
                    self.reject(sock, "closed before it finished the handshake")
                    return
                buf += data
        except BlockingIOError:
            return
        except (ProtocolError, OSError) as err:
            self.reject(sock, str(err))
            return
        if self.gate.costly:
            self._check_aside(sock)
            return
        try:
            reply, request = greeting.step(buf)
        except (ProtocolError, OSError) as err:
            self.reject(sock, str(err))
            return
        self._answer(sock, reply, request, greeting, out)

    def _answer(self, sock: socket.socket, reply: bytes, request: dict[str, Any] | None,
                greeting: Greeting, out: list[Heard]) -> None:
        try:
            if reply:
                sock.send(reply)  # a fresh connection's buffer takes a challenge whole
        except OSError as err:
            self.reject(sock, str(err))
            return
        if request is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(sock)
            del self.pending[sock]
            sock.setblocking(True)
            out.append((greeting.link(sock), request))

    def _check_aside(self, sock: socket.socket) -> None:
        """A whole frame of a costly handshake, to a checker thread (rxelab.control.accept_limits), or to
        wait its turn while the gate is full: a full gate is the listener's load, not a fault
        of the connection, which is neither dropped nor hurried for it."""
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(sock)
        self.held.add(sock)
        if self.gate.full():
            self.queued[sock] = None
        else:
            self._submit(sock)

    def _submit(self, sock: socket.socket) -> None:
        buf, _, greeting = self.pending[sock]
        stage, began = _stage(greeting), time.monotonic()

        def finished(future: Future[Any]) -> None:
            self.done.put((sock, future, stage, began))
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
        self.gate.submit(lambda: greeting.step(buf), finished)

    def _finish(self, out: list[Heard]) -> None:
        """The steps the checkers finished: answered, the connection read again, and the
        frames waiting for a checker given one."""
        with contextlib.suppress(OSError):
            self._wake_r.recv(1 << 16)
        while True:
            try:
                sock, future, stage, began = self.done.get_nowait()
            except queue.Empty:
                break
            self.gate.waiting -= 1
            self.held.discard(sock)
            if sock not in self.pending:  # dropped meanwhile (the acceptor closed)
                continue
            try:
                reply, request = future.result()
            except (ProtocolError, OSError) as err:
                self.reject(sock, str(err))
                continue
            except Exception as err:  # a check's fault is that connection's only
                self.reject(sock, f"{type(err).__name__}: {err}")
                continue
            buf, since, greeting = self.pending[sock]
            now = time.monotonic()
            # a step taken: its patience runs anew; none: only the check's own time is ours
            since = now if _stage(greeting) != stage else since + (now - began)
            self.pending[sock] = (buf, since, greeting)
            self._answer(sock, reply, request, greeting, out)
            if sock in self.pending:
                self.sel.register(sock, selectors.EVENT_READ)
        while self.queued and not self.gate.full():
            sock = next(iter(self.queued))
            del self.queued[sock]
            self._submit(sock)

    def _enter(self) -> None:
        """A newcomer is taken only if there is room, or a connection that may go for it; and
        one goes only once the newcomer passed the gate."""
        if len(self.pending) >= self.limit and self._victim() is None:
            self._listen(False)
            return
        try:
            sock, _ = self.listener.accept()
        except OSError:  # out of descriptors, say: free one, do not spin
            if (victim := self._victim()) is not None:
                self.reject(victim, "crowded out by newer connections")
            else:
                time.sleep(0.05)
            return
        if (why := self.gate.admit(sock)) is not None:
            self.reject(sock, why)
            return
        if len(self.pending) >= self.limit and (victim := self._victim()) is not None:
            self.reject(victim, "crowded out by newer connections")
        sock.setblocking(False)
        self.pending[sock] = (bytearray(), time.monotonic(), Greeting(self.credential, self.wanted))
        self.sel.register(sock, selectors.EVENT_READ)

    def _victim(self) -> socket.socket | None:
        """Who goes when the room is full: the oldest that has not even knocked (a rank
        knocks as it connects: a crowd of silent connections crowds out only itself), never
        one that knocked or whose frame a checker holds; else nobody."""
        for sock, (_, _, greeting) in self.pending.items():
            if greeting.knock is None and sock not in self.held:
                return sock
        return None

    def _listen(self, on: bool) -> None:
        """Take new connections, or leave them in the backlog until there is room."""
        if on != self.accepting:
            if on:
                self.sel.register(self.listener, selectors.EVENT_READ)
            else:
                self.sel.unregister(self.listener)
            self.accepting = on

    def reject(self, sock: socket.socket, why: str) -> None:
        """Close a connection, and say why in `dropped`."""
        with contextlib.suppress(OSError):
            self.dropped.append(f"{sock.getpeername()[0]}: {why}")
            del self.dropped[:-MAX_DROPPED]
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(sock)
        self.pending.pop(sock, None)
        self.queued.pop(sock, None)
        sock.close()

    def wake(self) -> None:
        """hear() returns now rather than at the end of its wait (its server is stopping)."""
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def close(self) -> None:
        """Every connection still waiting is closed; the listener stays (it is not ours)."""
        for sock in list(self.pending):
            self.reject(sock, "the acceptor closed")
        self.gate.close()
        self.sel.close()
        self._wake_r.close()
        self._wake_w.close()


def _stage(greeting: Greeting) -> Stage:
    return greeting.knock is not None, greeting.session is not None


def _need(buf: bytearray, greeting: Greeting) -> int:
    """Bytes still to come of the frame at hand (0: it is whole). A bad start or header is a
    ProtocolError as soon as it came, before its body is read."""
    limit = framing.HANDSHAKE_BODY if greeting.session is None else framing.MAX_BODY
    if len(buf) <= framing.HEADER.size:
        framing.split_frame(bytes(buf), None, limit)
        if len(buf) < framing.HEADER.size:
            return framing.HEADER.size - len(buf)
    return int(framing.HEADER.size + framing.HEADER.unpack_from(buf)[2] - len(buf))

"""A listener's waiting room: the connections that reach it, each taken through the handshake
(rxelab.link.Greeting) up to its first sealed message, all at once, so one slow or silent
connection holds up nobody. rxelab.porter serves a listener with it.

Whatever does not prove itself in time - another program, a port scanner, a stray stream, a
process without the job's secret, a connection that says nothing - is dropped, and why is
kept (`dropped`) for an error that must list it. A crowd of silent connections cannot take
every descriptor: past `limit` the oldest that has not knocked goes.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
from collections.abc import Callable
from typing import Any

from rxelab.auth import Credential
from rxelab.errors import ProtocolError
from rxelab.link import Greeting, Link

Heard = tuple[Link, dict[str, Any]]
MAX_DROPPED = 32  # reasons kept for an error message


class Hall:
    def __init__(self, listener: socket.socket, credential: Credential,
                 wanted: Callable[[dict[str, Any]], str | None], *, patience: float,
                 limit: int) -> None:
        """patience: seconds a connection may take from its first byte to its first sealed
        message; limit: connections waiting at most; wanted(knock): see Greeting."""
        self.listener, self.credential, self.wanted = listener, credential, wanted
        self.patience, self.limit = patience, limit
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ)
        # in the order they came: what came so far, since when, and the handshake's state
        self.pending: dict[socket.socket, tuple[bytearray, float, Greeting]] = {}
        self.dropped: list[str] = []

    def hear(self, wait: float) -> list[Heard]:
        """The connections that finished their handshake within `wait` seconds, each with its
        first sealed message (the link now blocking, no longer watched here)."""
        out: list[Heard] = []
        for key, _ in self.sel.select(timeout=wait):
            if key.fileobj is self.listener:
                self._enter()
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
            buf, _, greeting = self.pending[sock]
            buf += data
            try:
                reply, request = greeting.step(buf)
                if reply:
                    sock.send(reply)  # a fresh connection's buffer takes a challenge whole
            except (ProtocolError, OSError) as err:
                self.reject(sock, str(err))
                continue
            if request is not None:
                self.sel.unregister(sock)
                del self.pending[sock]
                sock.setblocking(True)
                out.append((greeting.link(sock), request))
        now = time.monotonic()  # what came has been read: only the slow ones go
        for sock in [s for s, (_, t, _) in self.pending.items() if now - t > self.patience]:
            self.reject(sock, f"did not finish the handshake within {self.patience:g} s")
        return out

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
        sock.close()

    def close(self) -> None:
        """Every connection still waiting is closed; the listener stays (it is not ours)."""
        for sock in list(self.pending):
            self.reject(sock, "the hall closed")
        self.sel.close()

"""A listener's waiting room: the connections that reach it and the first message of each,
heard all at once, so one slow or silent connection holds up nobody. Rank 0 gathers the
ranks' hellos here (rxelab.control), and a change of membership its requests
(rxelab.membership).

Whatever is not a whole, well-formed rxelab message in time - another program, a port
scanner, a stray stream, a connection that says nothing - is dropped, and why is kept
(`dropped`) for an error that must list it. A crowd of silent connections cannot take every
descriptor: past `limit` the oldest goes.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
from typing import Any

from rxelab import wire
from rxelab.errors import ProtocolError

Heard = tuple[socket.socket, dict[str, Any] | None]


class Hall:
    def __init__(self, listener: socket.socket, *, patience: float, limit: int) -> None:
        """patience: seconds a connection may take to say its message; limit: connections
        waiting at most."""
        self.listener, self.patience, self.limit = listener, patience, limit
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ)
        self.pending: dict[socket.socket, tuple[bytearray, float]] = {}  # in the order they came
        self.kept: set[socket.socket] = set()
        self.dropped: list[str] = []

    def keep(self, sock: socket.socket) -> None:
        """Watch a connection after its message: hear() reports it (with None) when it closes,
        as a member's does when its process dies."""
        self.kept.add(sock)
        self.sel.register(sock, selectors.EVENT_READ)

    def hear(self, wait: float) -> list[Heard]:
        """The messages that came within `wait` seconds, each with its connection (now
        blocking, no longer watched), and the kept connections that closed (None)."""
        out: list[Heard] = []
        for key, _ in self.sel.select(timeout=wait):
            if key.fileobj is self.listener:
                self._enter()
                continue
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError as err:
                data, why = b"", str(err)
            else:
                why = "closed before saying anything"
            if sock in self.kept:  # after its message a member says nothing: data or not,
                self.sel.unregister(sock)  # it has closed or broken the protocol
                self.kept.discard(sock)
                out.append((sock, None))
                continue
            if not data:
                self.reject(sock, why)
                continue
            buf = self.pending[sock][0]
            buf += data
            try:
                got = wire.split_frame(buf)
            except ProtocolError as err:
                self.reject(sock, str(err))
                continue
            if got is not None:
                self.sel.unregister(sock)
                del self.pending[sock]
                sock.setblocking(True)
                out.append((sock, got[0]))
        now = time.monotonic()  # what came has been read: only the silent ones go
        for sock in [s for s, (_, t) in self.pending.items() if now - t > self.patience]:
            self.reject(sock, f"said nothing within {self.patience:g} s")
        return out

    def _enter(self) -> None:
        if len(self.pending) >= self.limit:  # make room: the oldest silent one goes
            self.reject(next(iter(self.pending)), "crowded out by newer connections")
        try:
            sock, _ = self.listener.accept()
        except OSError:  # out of descriptors, say: free one, do not spin
            if self.pending:
                self.reject(next(iter(self.pending)), "crowded out by newer connections")
            else:
                time.sleep(0.05)
            return
        sock.setblocking(False)
        self.pending[sock] = (bytearray(), time.monotonic())
        self.sel.register(sock, selectors.EVENT_READ)

    def reject(self, sock: socket.socket, why: str) -> None:
        """Close a connection, and say why in `dropped`."""
        with contextlib.suppress(OSError):
            self.dropped.append(f"{sock.getpeername()[0]}: {why}")
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(sock)
        self.pending.pop(sock, None)
        sock.close()

    def close(self) -> None:
        """Every connection still waiting is closed; the listener stays (it is not ours)."""
        for sock in list(self.pending):
            self.reject(sock, "the hall closed")
        for sock in self.kept:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(sock)
        self.sel.close()

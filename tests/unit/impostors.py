"""Local attackers for the control plane's tests: a process of another user on a job's node,
without the job's secret, listening where the job's ranks will connect (a dead rank's port,
rank 0's port before rank 0 binds it, [::1] beside an IPv4 rendezvous). It records every
frame it is sent and answers as well as it can without the secret: a challenge with a forged
proof, or silence."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from rxelab.control import framing, handshake
from rxelab.errors import ProtocolError


class Impostor:
    def __init__(self, address: tuple[str, int], *, family: int = socket.AF_INET,
                 silent: bool = False, v6only: bool = False) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if v6only:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        self.sock.bind(address)
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.silent = silent
        self.heard: list[str] = []  # the type of every frame a connection sent it
        self.raw: list[bytes] = []  # everything each connection sent, for a replay
        self.connections = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._main = threading.Thread(target=self._accept, daemon=True, name="impostor")
        self._main.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        got = bytearray()
        buf = bytearray()
        conn.settimeout(0.3)
        end = time.monotonic() + 10
        with conn:
            while not self._stop.is_set() and time.monotonic() < end:
                try:
                    data = conn.recv(1 << 16)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not data:
                    break
                got += data
                buf += data
                while True:
                    try:
                        frame = framing.split_frame(buf)
                    except ProtocolError:  # sealed or foreign: it cannot read it
                        self.heard.append("unreadable")
                        buf.clear()
                        break
                    if frame is None:
                        break
                    message, used = frame
                    del buf[:used]
                    self.heard.append(message["type"])
                    if message["type"] == "knock" and not self.silent:
                        with contextlib.suppress(OSError):  # a proof it cannot make
                            conn.sendall(framing.encode({"type": "challenge", "nonce": handshake.nonce(),
                                                      "proof": handshake.nonce()}))
        self.raw.append(bytes(got))

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._main.join(2)
        for t in self._threads:
            t.join(2)


def bind_when_free(address: tuple[str, int], deadline_s: float = 10, **kw: object) -> Impostor:
    """Take the port as soon as its owner lets go of it (as a local user would)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return Impostor(address, **kw)  # type: ignore[arg-type]
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.01)

"""The tcp transport: the collectives over kernel TCP sockets, one connection per pair of
ranks, for hosts without RDMA and links where RoCE's lossless assumption breaks.

The engine keeps driving work requests and completions (rxelab.transports.base); each
connection's rxelab.transports.wire turns them into frames. One I/O thread per communicator
plays the NIC: it places arriving writes while the ranks' own threads are elsewhere (a
one-sided write lands while its target computes, as with verbs), acknowledges, and files
completions. A data connection is opened only after both ends proved the job's secret, with
the control plane's own handshake (rxelab.control.connection); nothing else is read from it
before that.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import struct
import threading
import time
from typing import Any

from rxelab.control.accepting import Acceptor
from rxelab.control.connection import dial
from rxelab.errors import AuthError, ConfigError, PeerError, ProtocolError, Reason
from rxelab.transports import base
from rxelab.transports.local import KeyTable, NicThread, Region, Slab, SocketDevice
from rxelab.transports.outbox import Outbox
from rxelab.transports.wire import Wire

READ_BYTES = 1 << 20  # at most this much read from one socket per turn: the others get theirs
OUTBOX_BYTES = 4 << 20  # no more frames taken from a wire while its socket has this much to send
log = logging.getLogger(__name__)
WAIT_S = 1.0  # the I/O thread's longest sleep (a stop also wakes it)
DIAL_PAUSE_S = 0.05


def own_address(toward: str) -> str:
    """The address this host reaches `toward` from (no packet is sent)."""
    with socket.socket(socket.AF_INET6 if ":" in toward else socket.AF_INET,
                       socket.SOCK_DGRAM) as s:
        s.connect((toward, 9))
        return str(s.getsockname()[0])


class TcpEndpoint:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port}


class TcpConnection(base.SlotState):
    """One peer's connection: its Wire, its slot slabs and (once connected) its socket."""

    def __init__(self, fabric: TcpFabric, registry: Any, peer: int, slots: int,
                 slot_size: int) -> None:
        super().__init__(slots)
        self.fabric, self.peer, self.slot_size = fabric, peer, slot_size
        self.recv_mr = Slab(fabric.keys, slots * slot_size)
        self.send_mr = Slab(fabric.keys, slots * slot_size)
        self.recv_base, self.send_base = self.recv_mr.buf, self.send_mr.buf
        registry.add_fixed(2 * slots * slot_size)  # as verbs' slabs (messages.ring_bytes)
        self.wire = Wire(peer, slots, slot_size, self.recv_base, fabric.keys.covers)
        self.sock: socket.socket | None = None
        self.outbox = Outbox()
        self.cut = False  # the outbox was cut when the wire went to error
        self.watching_write = False

    def endpoint(self) -> TcpEndpoint:
        return self.fabric.endpoint

    def post(self, wr_id: int, opcode: int, addr: int, length: int, lkey: int,
             remote_addr: int = 0, rkey: int = 0, imm: int = 0, signaled: bool = True) -> None:
        with self.fabric.lock:
            self.wire.post(wr_id, opcode, addr, length, lkey, remote_addr, rkey, imm, signaled)
        self.fabric.poke()

    def repost(self, slot: int) -> None:
        with self.fabric.lock:
            self.wire.repost(slot)
        self.fabric.poke()

    def slot_bytes(self, slot: int, length: int) -> bytes:
        return self.recv_mr.read(length, slot * self.slot_size)

    def kill(self) -> None:
        """Vanish as a killed process does (tests): no goodbye, a reset instead of a close."""
        self.fabric.stop()
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()

    def close(self) -> None:
        """Stop the fabric's I/O (nothing lands after this), say goodbye, hang up."""
        self.fabric.stop()
        sock, self.sock = self.sock, None
        if sock is not None:
            if not self.outbox:  # a goodbye only between frames (else the peer sees a break)
                with contextlib.suppress(OSError):
                    sock.settimeout(1.0)
                    sock.sendall(self.wire.bye())
            with contextlib.suppress(OSError):
                sock.close()
        self.recv_mr.close()
        self.send_mr.close()


class TcpFabric(NicThread):
    """rxelab.transports.base.Fabric over TCP."""

    name = "tcp"

    def __init__(self, host: str | None, toward: str) -> None:
        try:
            self.host = host or own_address(toward)
            self.listener = socket.create_server((self.host, 0), backlog=64,
                                                 family=socket.AF_INET6 if ":" in self.host
                                                 else socket.AF_INET)
        except OSError as err:
            raise ConfigError(f"transport tcp cannot listen on {host or toward!r}: {err}",
                              hint="device= names this host's address for tcp (an IP or a "
                                   "name); by default the one that reaches MASTER_ADDR") from None
        self.endpoint = TcpEndpoint(self.host, self.listener.getsockname()[1])
        log.debug("transport tcp listens on %s:%d", self.host, self.endpoint.port)
        self.device = SocketDevice()
        self.keys = KeyTable()
        self.lock = threading.Lock()  # the wires: the callers' posts and the I/O thread
        self.conns: dict[int, TcpConnection] = {}
        self._init_thread()

    # ---- what the communicator asks ----------------------------------------------------------
    def register(self, address: int, nbytes: int, access: int) -> Region:
        return Region(self.keys, address, nbytes, access)

    def connection(self, registry: Any, peer: int, slots: int, send_depth: int,
                   slot_size: int) -> TcpConnection:
        conn = self.conns[peer] = TcpConnection(self, registry, peer, slots, slot_size)
        return conn

    def connect(self, remote: dict[int, dict[str, Any]], meeting: base.Meeting) -> None:
        """Every pair's connection, each proven: this rank dials the ranks above it and takes
        those below it, then starts its I/O thread."""
        lower = sorted(p for p in self.conns if p < meeting.rank)
        came: dict[int, socket.socket] = {}
        failed: list[BaseException] = []
        taking = threading.Thread(target=self._take, args=(lower, came, failed, meeting),
                                  name="rxelab-tcp-accept", daemon=True)
        taking.start()
        try:
            for peer in sorted(p for p in self.conns if p > meeting.rank):
                self._attach(peer, self._dial(peer, remote[peer], meeting))
        except BaseException:
            self.stopping = True  # the acceptor's thread too
            raise
        finally:
            taking.join(max(0.0, meeting.deadline - time.monotonic()) + 1.0)
            missing = [p for p in lower if p not in came]
            if failed or missing or self.stopping:
                for sock in came.values():
                    sock.close()
        if failed:
            raise failed[0]
        if missing:
            raise PeerError(f"transport tcp: rank{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(map(str, missing))} never connected", peer=missing[0],
                            reason=Reason.SILENT)
        for peer, sock in came.items():
            self._attach(peer, sock)
        self.listener.close()
        self._start_thread()

    def close(self) -> None:
        self.stop()
        for conn in self.conns.values():
            conn.close()
        with contextlib.suppress(OSError):
            self.listener.close()
        self._close_thread()
        self.device.close()

    # ---- connecting -------------------------------------------------------------------------
    def _dial(self, peer: int, ep: dict[str, Any], meeting: base.Meeting) -> socket.socket:
        if set(ep) != {"host", "port"}:
            raise ProtocolError(f"rank {peer}'s endpoint is not tcp's: {sorted(ep)}")
        address = (str(ep["host"]), int(ep["port"]))
        while True:
            try:
                link = dial(address, meeting.credential, kind="data", rank=meeting.rank, to=peer,
                            generation=meeting.generation, scope=meeting.scope,
                            deadline=meeting.deadline, connect_s=5.0)
                link.send({"type": "data", "rank": meeting.rank, "generation": meeting.generation})
                return link.sock
            except AuthError:
                raise
            except (OSError, ProtocolError) as err:
                if time.monotonic() + DIAL_PAUSE_S >= meeting.deadline:
                    raise PeerError(f"transport tcp: cannot connect to rank {peer} at "
                                    f"{address[0]}:{address[1]}: {err}", peer=peer,
                                    reason=Reason.DIED) from None
                time.sleep(DIAL_PAUSE_S)

    def _take(self, lower: list[int], came: dict[int, socket.socket],
              failed: list[BaseException], meeting: base.Meeting) -> None:
        """The acceptor's thread: the lower ranks' proven connections, until each came."""
        def wanted(knock: dict[str, Any]) -> str | None:
            if knock["kind"] != "data" or knock["to"] != meeting.rank:
                return "not a data connection to this rank"
            if knock["scope"] != meeting.scope or knock["generation"] != meeting.generation:
                return "a data connection of another job or generation"
            if knock["rank"] not in lower or knock["rank"] in came:
                return f"rank {knock['rank']} does not connect here, or did already"
            return None
        acceptor = Acceptor(self.listener, meeting.credential, wanted,
                            patience=max(1.0, meeting.deadline - time.monotonic()),
                            limit=len(lower) + 16)
        try:
            while len(came) < len(lower) and time.monotonic() < meeting.deadline \
                    and not self.stopping:
                for link, _ in acceptor.hear(0.05):
                    rank = int(link.knock["rank"])
                    if rank in came:  # two proven knocks for one rank: the first stays
                        link.close()
                    else:
                        came[rank] = link.sock
        except BaseException as err:  # reported by connect()
            failed.append(err)
        finally:
            acceptor.close()

    def _attach(self, peer: int, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        conn = self.conns[peer]
        conn.sock = sock
        log.debug("transport tcp: connected to rank %d", peer)
        self.sel.register(sock, selectors.EVENT_READ, conn)

    # ---- the I/O thread ---------------------------------------------------------------------
    def _turns(self) -> None:
        conns = list(self.conns.values())
        while not self.stopping:
            for key, _ in self.sel.select(timeout=WAIT_S):
                if key.data is None:
                    self._woken()
                else:
                    self._read(key.data)
            if self.stopping:
                break
            done = []
            for conn in conns:
                self._write(conn)
                with self.lock:
                    done.extend(conn.wire.take())
            if done:
                self.device.cq.push(done)

    def _read(self, conn: TcpConnection) -> None:
        sock, got = conn.sock, 0
        if sock is None:
            return
        # the key table's lock too: a registration closed (revoked) waits for this read, and
        # the wire checks each piece's key, so nothing lands once close() returned
        with self.lock, self.keys.lock:
            wire = conn.wire
            try:
                while got < READ_BYTES:
                    into = wire.target()
                    n = sock.recv_into(into)
                    if not n:
                        self._lost(conn)
                        return
                    got += n
                    wire.received(n)
                    if n < len(into):  # drained: asking again costs a system call and an
                        break  # exception, and the selector says when there is more
            except BlockingIOError:
                pass
            except (OSError, ProtocolError):
                self._lost(conn)

    def _write(self, conn: TcpConnection) -> None:
        sock = conn.sock
        if sock is None:
            return
        box = conn.outbox
        with self.lock:
            if conn.wire.error is not None and not conn.cut:
                box.cut()
                conn.cut = True
            if box.bytes < OUTBOX_BYTES:
                box.add(conn.wire.out())
        try:
            while box:
                before = box.bytes
                box.send(sock)
                if box.bytes and box.bytes == before:
                    break
        except BlockingIOError:
            pass
        except OSError:
            with self.lock:
                self._lost(conn)
            return
        if bool(box) != conn.watching_write:  # a full socket: wake when it has room again
            conn.watching_write = bool(box)
            self.sel.modify(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if box else 0), conn)

    def _lost(self, conn: TcpConnection) -> None:
        """The peer's stream ended (lock held): the wire fails what it must; we stop reading."""
        conn.wire.lost()
        conn.outbox = Outbox()
        sock, conn.sock = conn.sock, None
        if sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(sock)
            with contextlib.suppress(OSError):
                sock.close()

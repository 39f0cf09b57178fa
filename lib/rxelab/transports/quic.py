"""The quic transport: the collectives over QUIC (aioquic), for long links with loss and delay,
where RoCE's go-back-N and one TCP stream's head-of-line blocking hurt.

The same rules as tcp (rxelab.transports.wire) over one QUIC stream per pair of ranks, all
of a rank's connections on one UDP socket. The lower rank is the client. aioquic is driven
without asyncio, from the one I/O thread that plays the NIC, as tcp's does: it places
arriving writes while the ranks' own threads are elsewhere.

Who may talk: the server presents the job's certificate, which only holders of the job's
secret derive (rxelab.transports.quic_config), and the client pins it; the client then proves
the secret in-band before the server reads anything else (rxelab.transports.quic_admission).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import selectors
import socket
import struct
import threading
import time
from typing import Any

from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, QuicEvent, StreamDataReceived, StreamReset

from rxelab.control.connection import Knocking
from rxelab.errors import AuthError, ConfigError, PeerError, ProtocolError, Reason
from rxelab.transports import base, quic_config
from rxelab.transports.local import KeyTable, NicThread, Region, Slab, SocketDevice
from rxelab.transports.quic_admission import Admission, Proven, answer
from rxelab.transports.tcp import TcpEndpoint, own_address
from rxelab.transports.wire import Wire

log = logging.getLogger(__name__)
WAIT_S = 1.0  # the I/O thread's longest sleep (a post, a stop or a datagram also wakes it)
IDLE_S = 10.0  # a peer silent this long is gone (QUIC has no reset: a killed peer just stops)
PING_S = IDLE_S / 4  # a quiet connection says it is alive this often
READ_DATAGRAMS = 512  # at most this many read per turn: the timers and senders get theirs
QUEUED_BYTES = 4 << 20  # no more frames taken from a wire while its stream holds this much
SOCKET_BUFFER = 4 << 20


class QuicPeerConnection(base.SlotState):
    """One peer's connection: its Wire, its slot slabs and (once made) its QUIC connection."""

    def __init__(self, fabric: QuicFabric, registry: Any, peer: int, slots: int,
                 slot_size: int) -> None:
        super().__init__(slots)
        self.fabric, self.peer, self.slot_size = fabric, peer, slot_size
        self.recv_mr = Slab(fabric.keys, slots * slot_size)
        self.send_mr = Slab(fabric.keys, slots * slot_size)
        self.recv_base, self.send_base = self.recv_mr.buf, self.send_mr.buf
        registry.add_fixed(2 * slots * slot_size)  # as verbs' slabs (messages.ring_bytes)
        self.wire = Wire(peer, slots, slot_size, self.recv_base, fabric.keys.covers)
        self.quic: QuicConnection | None = None
        self.stream = 0
        self.knocking: Knocking | None = None  # the client's side, until the server answered
        self.inbox = bytearray()
        self.proven = False
        self.pinged = 0.0

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
        """Vanish as a killed process does (tests): nothing more is sent or read."""
        self.fabric.stop()
        self.quic = None
        with contextlib.suppress(OSError):
            self.fabric.sock.close()

    def close(self) -> None:
        """Stop the fabric's I/O (nothing lands after this), say goodbye, hang up."""
        self.fabric.stop()
        quic, self.quic = self.quic, None
        if quic is not None:
            if self.proven and self.wire.error is None:
                quic.send_stream_data(self.stream, self.wire.bye())
            quic.close(reason_phrase="goodbye")
            self.fabric.transmit(quic, time.monotonic())
        self.recv_mr.close()
        self.send_mr.close()


class QuicFabric(NicThread):
    """rxelab.transports.base.Fabric over QUIC."""

    name = "quic"

    def __init__(self, host: str | None, toward: str, congestion: str) -> None:
        try:
            self.host = host or own_address(toward)
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            self.sock = socket.socket(family, socket.SOCK_DGRAM)
            self.sock.bind((self.host, 0))
        except OSError as err:
            raise ConfigError(f"transport quic cannot listen on {host or toward!r}: {err}",
                              hint="device= names this host's address for quic (an IP or a "
                                   "name); by default the one that reaches MASTER_ADDR") from None
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        self.sock.setblocking(False)
        self.family = family
        self.gso = quic_config.GSO
        self.endpoint = TcpEndpoint(self.host, self.sock.getsockname()[1])
        log.debug("transport quic listens on %s:%d (UDP), congestion control %s", self.host,
                  self.endpoint.port, congestion)
        self.congestion = congestion
        self.device = SocketDevice()
        self.keys = KeyTable()
        self.lock = threading.Lock()  # the wires and connections: the callers and the I/O thread
        self.changed = threading.Condition(self.lock)  # a peer proven, or connecting failed
        self.conns: dict[int, QuicPeerConnection] = {}
        self.by_address: dict[tuple[str, int], QuicPeerConnection] = {}
        self.admission: Admission | None = None  # the server's side, once connecting
        self.failure: BaseException | None = None
        self.meeting: base.Meeting | None = None
        self._init_thread()
        self.sel.register(self.sock, selectors.EVENT_READ, "datagrams")

    # ---- what the communicator asks ----------------------------------------------------------
    def register(self, address: int, nbytes: int, access: int) -> Region:
        return Region(self.keys, address, nbytes, access)

    def connection(self, registry: Any, peer: int, slots: int, send_depth: int,
                   slot_size: int) -> QuicPeerConnection:
        conn = self.conns[peer] = QuicPeerConnection(self, registry, peer, slots, slot_size)
        return conn

    def connect(self, remote: dict[int, dict[str, Any]], meeting: base.Meeting) -> None:
        """Every pair's connection, each proven: this rank is the client of the ranks above
        it and the server of those below; the I/O thread does the handshakes."""
        client, server = quic_config.configurations(
            meeting.credential, meeting.scope, congestion=self.congestion, idle_s=IDLE_S,
            datagram=quic_config.DATAGRAM)
        self.meeting = meeting
        self.admission = Admission(
            meeting, server, self.family, send=lambda q: self.transmit(q, time.monotonic()),
            expected=lambda: [p for p, c in self.conns.items() if p < meeting.rank and not c.proven],
            patience_s=IDLE_S)
        now = time.monotonic()
        for peer in sorted(p for p in self.conns if p > meeting.rank):
            address = self._address(peer, remote[peer])
            conn = self.conns[peer]
            conn.quic = QuicConnection(configuration=dataclasses.replace(
                client, max_datagram_size=quic_config.datagram_size(address, self.family)))
            conn.quic.connect(address, now)
            conn.stream = conn.quic.get_next_available_stream_id()
            conn.knocking = Knocking(meeting.credential, kind="data", rank=meeting.rank, to=peer,
                                     generation=meeting.generation, scope=meeting.scope,
                                     where=f"rank {peer} at {address[0]}:{address[1]}")
            conn.quic.send_stream_data(conn.stream, conn.knocking.first())
            self.by_address[address] = conn
        self._start_thread()
        with self.changed:
            self.changed.wait_for(lambda: self.failure is not None or self.stopping
                                  or all(c.proven for c in self.conns.values()),
                                  max(0.0, meeting.deadline - time.monotonic()))
            missing = [p for p, c in sorted(self.conns.items()) if not c.proven]
            failure = self.failure
        if failure is not None or missing:
            self.stop()
        if failure is not None:
            raise failure
        if missing:
            raise PeerError(f"transport quic: rank{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(map(str, missing))} never connected", peer=missing[0],
                            reason=Reason.SILENT)
        log.debug("transport quic: connected to ranks %s", sorted(self.conns))

    def close(self) -> None:
        self.stop()
        for conn in self.conns.values():
            conn.close()
        if self.admission is not None:
            self.admission.close()
        with contextlib.suppress(OSError):
            self.sock.close()
        self._close_thread()
        self.device.close()

    def _address(self, peer: int, ep: dict[str, Any]) -> tuple[str, int]:
        if set(ep) != {"host", "port"}:
            raise ProtocolError(f"rank {peer}'s endpoint is not quic's: {sorted(ep)}")
        try:
            found = socket.getaddrinfo(str(ep["host"]), int(ep["port"]), self.family,
                                       socket.SOCK_DGRAM)
        except OSError as err:
            raise PeerError(f"transport quic: rank {peer}'s address {ep['host']!r}: {err}",
                            peer=peer, reason=Reason.DIED) from None
        host, port = found[0][4][:2]
        return str(host), int(port)

    # ---- the I/O thread ---------------------------------------------------------------------
    def _faulted(self, err: BaseException) -> None:
        self.failure = self.failure or err
        self.changed.notify_all()

    def _quics(self) -> list[QuicConnection]:
        theirs = self.admission.quics() if self.admission is not None else []
        return [c.quic for c in self.conns.values() if c.quic is not None] + theirs

    def _turns(self) -> None:
        while not self.stopping:
            now = time.monotonic()
            timers = [t for q in self._quics() if (t := q.get_timer()) is not None]
            wait = min([WAIT_S, *(t - now for t in timers)])
            for key, _ in self.sel.select(timeout=max(0.0, wait)):
                if key.data is None:
                    self._woken()
                else:
                    self._receive()
            if self.stopping:
                break
            now = time.monotonic()
            done = []
            with self.changed:
                for quic in self._quics():
                    timer = quic.get_timer()
                    if timer is not None and timer <= now:
                        quic.handle_timer(now)
                self._events(now)
                for conn in self.conns.values():
                    if conn.proven and conn.quic is not None:
                        self._send_frames(conn, now)
                    done.extend(conn.wire.take())
            for quic in self._quics():
                self.transmit(quic, now)
            if done:
                self.device.cq.push(done)

    def _receive(self) -> None:
        now = time.monotonic()
        for _ in range(READ_DATAGRAMS):
            try:
                data, sender = self.sock.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # an ICMP error of an earlier send: the datagram is simply lost
                continue
            address = (str(sender[0]), int(sender[1]))
            conn = self.by_address.get(address)
            if conn is not None and conn.quic is not None:
                conn.quic.receive_datagram(data, sender, now)  # the wire: only in _events
                continue
            stranger = self.admission.take(address, data, now) if self.admission else None
            if stranger is not None:
                stranger.quic.receive_datagram(data, sender, now)

    def _events(self, now: float) -> None:
        """What every QUIC connection has to say (lock held)."""
        for conn in list(self.conns.values()):
            while conn.quic is not None and (event := conn.quic.next_event()) is not None:
                self._conn_event(conn, event)
            if conn.proven and conn.quic is not None and now - conn.pinged > PING_S:
                conn.pinged = now
                conn.quic.send_ping(0)
        for address, proven in self.admission.events(now) if self.admission else ():
            self._admitted(address, proven)

    def _admitted(self, address: tuple[str, int], proven: Proven) -> None:
        """A lower rank's client proved the job's secret: its connection is that rank's."""
        conn = self.conns[proven.rank]
        conn.quic, conn.stream, conn.proven, conn.pinged = proven.quic, proven.stream, True, 0.0
        self.by_address[address] = conn
        self.changed.notify_all()
        if proven.rest:
            self._feed(conn, proven.rest)

    def _conn_event(self, conn: QuicPeerConnection, event: QuicEvent) -> None:
        if isinstance(event, StreamDataReceived) and event.stream_id == conn.stream:
            if conn.proven:
                self._feed(conn, event.data)
            else:
                conn.inbox += event.data
                self._answer(conn)
        elif isinstance(event, (ConnectionTerminated, StreamReset)):
            why = getattr(event, "reason_phrase", "") or "the stream was reset"
            if not conn.proven:
                where = conn.knocking.where if conn.knocking else f"rank {conn.peer}"
                err: BaseException = (AuthError(f"{where} does not hold this job's secret: {why}")
                                      if "certificate" in why or "signature" in why else
                                      PeerError(f"transport quic: {where} closed the connection: "
                                                f"{why}", peer=conn.peer, reason=Reason.DIED))
                self.failure = self.failure or err
                self.changed.notify_all()
            conn.wire.lost()
            conn.quic = None
            self.by_address = {a: c for a, c in self.by_address.items() if c is not conn}

    def _answer(self, conn: QuicPeerConnection) -> None:
        """The client's side: the server's challenge came, so prove ourselves and begin."""
        if conn.knocking is None or conn.quic is None or self.meeting is None:
            return
        try:
            said = answer(conn.knocking, conn.inbox, self.meeting)
        except AuthError as err:
            self.failure = self.failure or err
            self.changed.notify_all()
            return
        if said is None:
            return
        conn.quic.send_stream_data(conn.stream, said)
        conn.proven, conn.knocking = True, None
        self.changed.notify_all()
        rest, conn.inbox = bytes(conn.inbox), bytearray()
        if rest:
            self._feed(conn, rest)

    def _feed(self, conn: QuicPeerConnection, data: bytes) -> None:
        # the key table's lock too: a registration closed (revoked) waits for this, and the
        # wire checks each piece's key, so nothing lands once close() returned
        with self.keys.lock:
            try:
                conn.wire.feed(data)
            except ProtocolError:
                conn.wire.lost()
                if conn.quic is not None:
                    conn.quic.close(reason_phrase="protocol error")

    def _send_frames(self, conn: QuicPeerConnection, now: float) -> None:
        quic = conn.quic
        assert quic is not None
        if quic_config.queued(quic, conn.stream) >= QUEUED_BYTES:
            return
        for frame in conn.wire.out():
            for piece in frame:
                if len(piece):
                    quic.send_stream_data(conn.stream, piece)  # type: ignore[arg-type]  # copied

    def transmit(self, quic: QuicConnection, now: float) -> None:
        """What the connection has for the network now. A datagram the socket cannot take is
        dropped: QUIC resends what was lost."""
        for batch, size, address in quic_config.batches(quic.datagrams_to_send(now), self.gso):
            try:
                if len(batch) == 1:
                    self.sock.sendto(batch[0], address)
                else:  # one call, the kernel cuts it into datagrams of `size` (UDP GSO)
                    self.sock.sendmsg(batch, [(socket.SOL_UDP, quic_config.UDP_SEGMENT,
                                               struct.pack("=H", size))], 0, address)
            except OSError:
                if len(batch) > 1:  # no GSO here after all (an old kernel, a device without)
                    self.gso = False


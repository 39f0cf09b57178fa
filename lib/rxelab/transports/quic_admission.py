"""Who may talk to a quic rank: both sides of a client's in-band proof.

TLS proves only the server (it presents the job's certificate, rxelab.transports.quic_config).
So a client's first bytes on its stream are the control plane's handshake (knock, challenge,
proof, rxelab.control.connection.Greeting), and until they pass, the server reads nothing
else from that connection and sends it nothing but the challenge. Unproven connections are
few (the ranks still expected, and STRANGERS more) and short-lived (IDLE_S), and datagrams
that do not open a QUIC connection are dropped unanswered.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aioquic.buffer import Buffer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, QuicEvent, StreamDataReceived, StreamReset
from aioquic.quic.packet import QuicPacketType, pull_quic_header

from rxelab.control import framing
from rxelab.control.connection import Greeting, Knocking
from rxelab.errors import AuthError, ProtocolError
from rxelab.transports import base
from rxelab.transports.quic_config import datagram_size

log = logging.getLogger(__name__)
STRANGERS = 16  # unproven connections at once beyond the ranks still expected
INITIAL_BYTES = 1200  # a client's first datagram is padded to this at least (RFC 9000 14.1)

Address = tuple[str, int]


@dataclass
class Stranger:
    """A client not proven yet: its QUIC connection and handshake."""

    quic: QuicConnection
    greeting: Greeting
    until: float  # dropped if not proven by then
    inbox: bytearray = field(default_factory=bytearray)


@dataclass(frozen=True)
class Proven:
    """A client that proved the job's secret: which rank, its connection and stream, and what
    it sent after its proof (the first of its data)."""

    rank: int
    quic: QuicConnection
    stream: int
    rest: bytes


def answer(knocking: Knocking, inbox: bytearray, meeting: base.Meeting) -> bytes | None:
    """The client's side: once the server's challenge is whole in inbox (taken from it), our
    proof and the first sealed message, to send; None: not whole yet. AuthError: the server
    does not hold the job's secret."""
    got = framing.split_frame(inbox, None, framing.HANDSHAKE_BODY)
    if got is None:
        return None
    message, used = got
    del inbox[:used]
    proof = knocking.answer(message)
    assert knocking.session is not None
    return proof + framing.encode({"type": "data", "rank": meeting.rank,
                                   "generation": meeting.generation}, knocking.session)


class Admission:
    """The strangers of one rank's UDP socket, from their first datagram to their proof.
    expected() names the lower ranks not connected yet; send(quic) puts a connection's
    datagrams on the wire (a refusal's close)."""

    def __init__(self, meeting: base.Meeting, config: QuicConfiguration, family: int,
                 expected: Callable[[], list[int]], send: Callable[[QuicConnection], None],
                 patience_s: float) -> None:
        self.meeting, self.config, self.family = meeting, config, family
        self.expected, self.send, self.patience_s = expected, send, patience_s
        self.strangers: dict[Address, Stranger] = {}

    def quics(self) -> list[QuicConnection]:
        return [s.quic for s in self.strangers.values()]

    def take(self, address: Address, data: bytes, now: float) -> Stranger | None:
        """The stranger a datagram is for: a known one, or a new one if it opens a QUIC
        connection while ranks are still expected and strangers are few; else None (drop it)."""
        if (known := self.strangers.get(address)) is not None:
            return known
        expected = self.expected()
        if not expected or len(self.strangers) >= len(expected) + STRANGERS:
            return None
        if len(data) < INITIAL_BYTES:
            return None
        try:
            header = pull_quic_header(Buffer(data=data),
                                      host_cid_length=self.config.connection_id_length)
        except ValueError:
            return None
        if header.packet_type != QuicPacketType.INITIAL:
            return None
        config = dataclasses.replace(self.config,
                                     max_datagram_size=datagram_size(address, self.family))
        quic = QuicConnection(configuration=config,
                              original_destination_connection_id=header.destination_cid)
        stranger = self.strangers[address] = Stranger(
            quic, Greeting(self.meeting.credential, self._wanted), now + self.patience_s)
        return stranger

    def events(self, now: float) -> list[tuple[Address, Proven]]:
        """What the strangers said: those that proved themselves (no longer strangers); the
        rest that failed, closed or ran out of time are refused."""
        out = []
        for address, stranger in list(self.strangers.items()):
            while (event := stranger.quic.next_event()) is not None:
                done = self._event(address, stranger, event)
                if isinstance(done, Proven):
                    out.append((address, done))
                if done is not None:
                    break
            if address in self.strangers and now > stranger.until:
                self.refuse(address, "not proven in time")
        return out

    def refuse(self, address: Address, why: str | None) -> None:
        """Forget a stranger; with a reason, tell it (a close) and log why."""
        stranger = self.strangers.pop(address, None)
        if stranger is not None and why is not None:
            log.info("rxelab: quic: refused %s:%s: %s", address[0], address[1], why)
            stranger.quic.close(reason_phrase="refused")
            self.send(stranger.quic)

    def close(self) -> None:
        for address in list(self.strangers):
            self.refuse(address, "closing")

    def _wanted(self, knock: dict[str, Any]) -> str | None:
        meeting = self.meeting
        if knock["kind"] != "data" or knock["to"] != meeting.rank:
            return "not a data connection to this rank"
        if knock["scope"] != meeting.scope or knock["generation"] != meeting.generation:
            return "a data connection of another job or generation"
        if knock["rank"] not in self.expected():
            return f"rank {knock['rank']} does not connect here, or did already"
        return None

    def _event(self, address: Address, stranger: Stranger, event: QuicEvent) -> Proven | bool | None:
        """Proven: it proved itself; True: refused; None: not yet."""
        if isinstance(event, ConnectionTerminated | StreamReset):
            self.refuse(address, None)
            return True
        if not isinstance(event, StreamDataReceived):
            return None
        stranger.inbox += event.data
        try:
            reply, hello = stranger.greeting.step(stranger.inbox)
        except (ProtocolError, AuthError, KeyError, TypeError) as err:
            self.refuse(address, str(err))
            return True
        if reply:
            stranger.quic.send_stream_data(event.stream_id, reply)
        if hello is None:
            return None
        del self.strangers[address]
        return Proven(int(hello["rank"]), stranger.quic, event.stream_id, bytes(stranger.inbox))

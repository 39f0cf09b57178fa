"""A control connection that has passed the handshake of rxelab.control.handshake, from either end: the
connector's side (dial) and the listener's (Greeting, fed frame by frame by rxelab.control.accepting, so
one listener handshakes with many connectors at once without a thread each). After it, a Link
sends and takes only sealed frames.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any

from rxelab.control import framing, handshake
from rxelab.control.handshake import CONNECTOR, LISTENER, Credential, Session
from rxelab.errors import AuthError, ProtocolError


class Link:
    """A sealed control connection: `knock` says what it was opened for (kind, the connector's
    rank and generation, the job's scope)."""

    __slots__ = ("sock", "session", "knock", "_buf")

    def __init__(self, sock: socket.socket, session: Session, knock: dict[str, Any]) -> None:
        self.sock, self.session, self.knock = sock, session, knock
        self._buf = bytearray()

    def send(self, message: dict[str, Any]) -> None:
        """Not thread-safe: a link's sends are serialized by its owner (sequence numbers)."""
        self.sock.sendall(framing.encode(message, self.session))

    def recv(self, *, deadline: float, peer: str, expect: str | None = None) -> dict[str, Any]:
        return framing.recv(self.sock, deadline=deadline, peer=peer, expect=expect,
                         session=self.session)

    def take(self, data: bytes) -> list[dict[str, Any]]:
        """The whole messages that data completes (the reader thread's way: it reads what is
        there and never blocks)."""
        self._buf += data
        out = []
        while (got := framing.split_frame(self._buf, self.session)) is not None:
            message, used = got
            del self._buf[:used]
            out.append(message)
        return out

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Knocking:
    """The connector's side of the handshake without I/O (quic's streams carry it): first()
    is what to send, answer(challenge) checks the listener's proof and gives ours, after which
    `session` seals the connection."""

    def __init__(self, credential: Credential, *, kind: str, rank: int, to: int,
                 generation: int, scope: str, where: str) -> None:
        self.knock = {"type": "knock", "kind": kind, "rank": rank, "to": to,
                      "generation": generation, "scope": scope, "nonce": handshake.nonce()}
        self.hs, self.where = credential.handshake(), where
        self.session: Session | None = None

    def first(self) -> bytes:
        return framing.encode(self.knock)

    def answer(self, challenge: dict[str, Any]) -> bytes:
        """AuthError: the listener does not hold the job's secret (or is not a listener)."""
        if challenge.get("type") != "challenge":
            raise AuthError(f"{self.where} is not this job's: a {challenge.get('type')} "
                            "message where its challenge belongs")
        transcript = handshake.transcript(self.knock, challenge["nonce"])
        if not self.hs.check(LISTENER, transcript, challenge["proof"]):
            raise AuthError(f"{self.where} does not hold this job's secret")
        proof = framing.encode({"type": "proof", "proof": self.hs.prove(CONNECTOR, transcript)})
        self.session = Session(self.hs.seal_key(transcript), CONNECTOR)  # MUNGE's: both proofs
        return proof


def dial(address: tuple[str, int], credential: Credential, *, kind: str, rank: int, to: int,
         generation: int, scope: str, deadline: float, connect_s: float) -> Link:
    """Connect to a listener of the job and prove ourselves to each other. OSError: nothing
    listens there (refused, unreachable, no answer within connect_s); AuthError: what listens
    there does not hold the job's credential (a stranger on the port); PeerError: it did not
    finish the handshake in time."""
    remaining = max(0.05, min(connect_s, deadline - time.monotonic()))
    sock = socket.create_connection(address, timeout=remaining)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        where = f"the listener at {address[0]}:{address[1]}"
        knocking = Knocking(credential, kind=kind, rank=rank, to=to, generation=generation,
                            scope=scope, where=where)
        sock.sendall(knocking.first())
        try:
            challenge = framing.recv(sock, deadline=deadline, peer=where, expect="challenge",
                                  limit=framing.HANDSHAKE_BODY)
        except ProtocolError as err:
            raise AuthError(f"{where} is not this job's: {err}") from None
        sock.sendall(knocking.answer(challenge))
        assert knocking.session is not None
        return Link(sock, knocking.session, knocking.knock)
    except BaseException:
        sock.close()
        raise


class Greeting:
    """The listener's side of one connection's handshake. feed() takes the frames as they
    come and returns what to send back (the challenge), then, once the connector proved
    itself, the link and its first sealed message (what the connection is for). Anything out
    of turn, unproven or unwanted is a ProtocolError: the acceptor drops the connection."""

    __slots__ = ("hs", "wanted", "knock", "transcript", "session")

    def __init__(self, credential: Credential, wanted: Any) -> None:
        """wanted(knock) -> None, or why this listener will not serve it (another job's
        scope, say): said before anything is proven, so it reveals nothing."""
        self.hs, self.wanted = credential.handshake(), wanted
        self.knock: dict[str, Any] | None = None
        self.transcript = b""
        self.session: Session | None = None

    def step(self, buf: bytearray) -> tuple[bytes, dict[str, Any] | None]:
        """Consume what whole frames buf holds: (bytes to send back, the first sealed message
        once it came, else None)."""
        reply = b""
        while (got := framing.split_frame(buf, self.session, framing.MAX_BODY if self.session
                                       else framing.HANDSHAKE_BODY)) is not None:
            message, used = got
            del buf[:used]
            if self.knock is None:
                reply += self._challenge(message)
            elif self.session is None:
                self._check_proof(message)
            else:
                self._check_request(message)
                return reply, message
        return reply, None

    def _challenge(self, knock: dict[str, Any]) -> bytes:
        if knock["type"] != "knock":
            raise ProtocolError(f"a {knock['type']} message before the handshake")
        if (why := self.wanted(knock)) is not None:
            raise ProtocolError(why)
        self.knock = knock
        mine = handshake.nonce()
        self.transcript = handshake.transcript(knock, mine)
        return framing.encode({"type": "challenge", "nonce": mine,
                            "proof": self.hs.prove(LISTENER, self.transcript)})

    def _check_proof(self, message: dict[str, Any]) -> None:
        if message["type"] != "proof" or not self.hs.check(CONNECTOR, self.transcript,
                                                             message["proof"]):
            raise AuthError("did not prove it holds this job's secret")
        self.session = Session(self.hs.seal_key(self.transcript), LISTENER)

    def _check_request(self, message: dict[str, Any]) -> None:
        """The first sealed message is what the knock announced, by the rank it announced."""
        knock = self.knock
        assert knock is not None
        if message["type"] != knock["kind"]:
            raise ProtocolError(f"a {message['type']} message on a connection opened for "
                                f"{knock['kind']}")
        for field in ("rank", "generation"):
            if field in message and message[field] != knock[field]:
                raise ProtocolError(f"a {knock['kind']} whose {field} is not the one its "
                                    "handshake was bound to")

    def link(self, sock: socket.socket) -> Link:
        assert self.session is not None and self.knock is not None
        return Link(sock, self.session, self.knock)

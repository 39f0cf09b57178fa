"""Who may speak on the control plane. Every TCP connection of a job (a rank's hello, a
shrink's question, a liveness probe, a newcomer's knock) opens with a mutual challenge-
response: each end draws a fresh nonce, and each proves it holds the job's credential by an
HMAC over both nonces and what the connection is for (kind, the connector's rank, the rank it
is for, the membership generation, the job's scope) under its own role. Nothing else is sent, and nothing
received is trusted, before the other end has proved itself. Every message after that is
sealed: an HMAC under a key drawn from the same transcript, over its sequence number and its
bytes, so a relay can neither change, drop, replay nor reorder one unnoticed.

What that buys: nobody without the secret can join, answer for a rank, take over a shrink or
read a digest; a captured exchange is worthless (the other end's nonce is new every time),
in this job and in any other that shares the secret (the scope differs, and so does every
nonce). The secret itself never travels, nor anything that could stand for it.

The credential is a small interface (a handshake that proves, checks and gives the seal's
key), so a cluster's own stands in for the shared secret: MUNGE under Slurm (rxelab.control.munge_credential).
Only the standard library's hmac, hashlib and secrets are used: no cryptography of our own
beyond this protocol.

A listener proves itself first, so one knock gives a stranger an HMAC to test guesses against
offline: the secret itself must make that hopeless. A job's secret has at least 128 bits
(strength(): its length times log2 of the character classes it uses, and some variety), so no
key stretching is needed; new_token() makes one (`rxelab-launch --new-token`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
from dataclasses import dataclass
from typing import Protocol

from rxelab.errors import ConfigError, ProtocolError

NONCE_BYTES = 32
TAG_BYTES = 32  # a sealed frame's HMAC-SHA256
CONNECTOR, LISTENER = b"connector", b"listener"
_KEY_LABEL = b"rxelab job key v1"
MIN_BITS = 128  # offline guessing of a secret this strong is hopeless, however fast the HMAC
MIN_DISTINCT = 8  # 'aaaa...' or 'abab...' is no secret, however long
TOKEN_BYTES = 32  # new_token(): 256 random bits, 43 base64url characters
HOW_TO_MAKE = "make one with `rxelab-launch --new-token` (or python3 -c 'import secrets; " \
              "print(secrets.token_urlsafe(32))')"
HEX_DIGITS = frozenset("0123456789abcdef")
# (characters, how many the class has): a secret's characters are taken as drawn from the
# classes it uses
_CLASSES = ((frozenset("0123456789"), 10), (frozenset("abcdefghijklmnopqrstuvwxyz"), 26),
            (frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ"), 26), (frozenset("-_"), 2))
_OTHER = 33  # any other character: the rest of printable ASCII


def strength(secret: str) -> float:
    """An estimate of a secret's entropy in bits: its length times log2 of the size of the
    character classes it uses (hex digits 16; else digits 10, lower case 26, upper case 26,
    '-' and '_' 2 (base64url's 64 in all), anything else 33). Generous to a patterned secret
    (it is checked for variety apart), never to a short one."""
    if not secret:
        return 0.0
    chars = set(secret)
    if chars <= HEX_DIGITS or chars <= {c.upper() for c in HEX_DIGITS}:
        pool = 16
    else:
        pool = sum(size for members, size in _CLASSES if chars & members)
        pool += _OTHER if chars - set().union(*(m for m, _ in _CLASSES)) else 0
    return len(secret) * math.log2(pool)


def weakness(secret: str) -> str | None:
    """Why a secret is too weak for a job (None: it is strong enough)."""
    bits, distinct = strength(secret), len(set(secret))
    if bits < MIN_BITS:
        return f"has about {bits:.0f} bits of entropy, less than {MIN_BITS}"
    if distinct < MIN_DISTINCT:
        return f"has {distinct} distinct characters, fewer than {MIN_DISTINCT}"
    return None


def require_strong(secret: str, where: str) -> None:
    """ConfigError, in one line that says how to make a good one, for a weak secret."""
    if (why := weakness(secret)) is not None:
        raise ConfigError(f"{where}: the job's secret {why}: a listener's proof lets anyone "
                          "guess it offline", hint=HOW_TO_MAKE)


def new_token() -> str:
    """A job's secret of 256 random bits (43 base64url characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


class Handshake(Protocol):
    """One connection's proofs: this end's (prove), the other end's (check), and the key the
    connection is sealed with once both are done."""

    def prove(self, role: bytes, transcript: bytes) -> str: ...

    def check(self, role: bytes, transcript: bytes, proof: str) -> bool: ...

    def seal_key(self, transcript: bytes) -> bytes: ...


class Credential(Protocol):
    """What a rank proves itself with. `secured` is False for a job without a secret, where
    the protocol still runs (one code path) but anyone passes it."""

    @property
    def secured(self) -> bool: ...

    @property
    def source(self) -> str: ...

    def handshake(self) -> Handshake: ...

    def derive(self, label: bytes) -> bytes | None:
        """A key every holder of the credential derives alike (quic's certificate), or None
        where the credential has no shared key (MUNGE proves, it shares nothing)."""


@dataclass(frozen=True)
class SharedSecret:
    """The job's secret, as a key (the secret itself is not kept): an HMAC-SHA256 key drawn
    from it, never sent."""

    key: bytes
    source: str = ""
    secured: bool = True

    @classmethod
    def of(cls, secret: str, source: str) -> SharedSecret:
        key = hmac.new(_KEY_LABEL, secret.encode(), hashlib.sha256).digest()
        return cls(key, source, bool(secret))

    def handshake(self) -> SharedSecret:
        return self  # nothing to keep from one proof to the next: the key is the secret's

    def prove(self, role: bytes, transcript: bytes) -> str:
        return hmac.new(self.key, b"proof\0" + role + b"\0" + transcript, hashlib.sha256).hexdigest()

    def check(self, role: bytes, transcript: bytes, proof: str) -> bool:
        return hmac.compare_digest(self.prove(role, transcript), proof)

    def seal_key(self, transcript: bytes) -> bytes:
        return hmac.new(self.key, b"seal\0" + transcript, hashlib.sha256).digest()

    def derive(self, label: bytes) -> bytes:
        return hmac.new(self.key, b"derive\0" + label, hashlib.sha256).digest()

    def __repr__(self) -> str:  # never in a log or an error
        return f"SharedSecret(source={self.source!r}, secured={self.secured})"


OPEN = SharedSecret.of("", "")  # a job without a secret: anyone passes the handshake


def nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def transcript(knock: dict[str, object], listener_nonce: str) -> bytes:
    """What both proofs and the seal key cover: what the connection is for, and both nonces."""
    fields = [knock["kind"], knock["rank"], knock["to"], knock["generation"], knock["scope"],
              knock["nonce"], listener_nonce]
    return b"rxelab-auth-v1\0" + json.dumps(fields, separators=(",", ":")).encode()


class Session:
    """The seal of one connection after its handshake: each direction has its own key and
    sequence number, so a frame is valid once, in one place of one stream."""

    __slots__ = ("_send_key", "_recv_key", "sent", "received")

    def __init__(self, base: bytes, role: bytes) -> None:
        """base: the handshake's seal key; role: this end's."""
        keys = {r: hmac.new(base, b"direction\0" + r, hashlib.sha256).digest()
                for r in (CONNECTOR, LISTENER)}
        other = LISTENER if role == CONNECTOR else CONNECTOR
        self._send_key, self._recv_key = keys[role], keys[other]
        self.sent = self.received = 0

    def seal(self, frame: bytes) -> bytes:
        tag = hmac.new(self._send_key, self.sent.to_bytes(8, "big") + frame, hashlib.sha256).digest()
        self.sent += 1
        return tag

    def open(self, frame: bytes, tag: bytes) -> None:
        want = hmac.new(self._recv_key, self.received.to_bytes(8, "big") + frame,
                        hashlib.sha256).digest()
        if not hmac.compare_digest(want, tag):
            raise ProtocolError("a control message failed its seal (changed, replayed, reordered, "
                                "or not from this job's peer)")
        self.received += 1

"""The out-of-band message format: what ranks tell each other over TCP before and beside RDMA
(QP numbers, PSNs, GIDs, barrier and close notices).

A frame is a fixed header, `RXLB` + version (u16) + length (u32), then a UTF-8 JSON object;
after a connection's handshake (rxelab.control.handshake) the length also covers the frame's seal, which
follows the body. Never pickle: a peer's bytes are data, not code. Every message is checked
against a schema before use; anything malformed, truncated, oversized, unsealed where a seal
belongs, or of another version is a ProtocolError that says which.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

from rxelab.control.handshake import TAG_BYTES, Session
from rxelab.errors import PeerError, ProtocolError, Reason

MAGIC = b"RXLB"
VERSION = 8  # 2: hellos carry the job token; 3: a digest of the job's secret; 4: settings;
# 5: membership (listeners, generations, shrink and join); 6: a mutual handshake and sealed
# frames instead of a digest of the secret; 7: an abort carries why (errors.Reason);
# 8: transports (a data connection's knock, tcp's endpoints)
HEADER = struct.Struct("!4sHI")
MAX_BODY = 1 << 20  # a table for thousands of ranks fits; a stray stream does not
HANDSHAKE_BODY = 2048  # before a connection is proven, no frame is larger than this

_REASONS = frozenset(r.value for r in Reason)
# type -> {field: (python type, check)}
_U24 = (int, lambda v: 0 <= v < 1 << 24)
_RANK = (int, lambda v: 0 <= v < 1 << 20)
_HEX = set("0123456789abcdefABCDEF")
_LOWER_HEX = set("0123456789abcdef")
_GID = (str, lambda v: len(v) == 39 and all(len(g) == 4 and set(g) <= _HEX for g in v.split(":"))
        and v.count(":") == 7)
_PORT_NUMBER = (int, lambda v: 0 < v < 1 << 16)
_HOST_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:_%")
_HOST = (str, lambda v: 0 < len(v) < 256 and set(v) <= _HOST_CHARS)
# a connection's endpoint, one schema per transport: verbs' QP, or where tcp listens
_ENDPOINTS = ({"qpn": _U24, "psn": _U24, "gid": _GID, "lid": (int, lambda v: 0 <= v < 1 << 16)},
              {"host": _HOST, "port": _PORT_NUMBER})
_NONCE = (str, lambda v: len(v) == 64 and set(v) <= _LOWER_HEX)  # also a proof (HMAC-SHA256)
_JOB = (str, lambda v: len(v) == 32 and set(v) <= _LOWER_HEX)  # the job's id, drawn by rank 0
# an HMAC (rxelab.control.handshake), or a MUNGE credential (rxelab.control.munge_credential)
_PROOF = (str, lambda v: 0 < len(v) <= 1500 and v.isprintable())
_SCOPE = (str, lambda v: 0 < len(v) <= 200 and v.isprintable())
_PORT = (int, lambda v: 0 <= v < 1 << 16)  # 0: this rank keeps no listener (not elastic)
_GENERATION = (int, lambda v: 0 <= v < 1 << 31)
_REASON = (str, lambda v: len(v) <= 2000)
_SETTINGS = (dict, lambda v: len(v) <= 32 and all(
    isinstance(k, str) and len(k) <= 32 and isinstance(x, int | float) and not isinstance(x, bool)
    for k, x in v.items()))
# what a connection is for: its first sealed message (data: a transport's own, rxelab.transports)
KINDS = ("hello", "shrink", "probe", "join", "data")


def _directory(v: Any) -> bool:
    """{rank: [host, port]}: where each rank of an elastic job listens ("": at MASTER_ADDR,
    beside rank 0)."""
    return len(v) <= 1 << 20 and all(
        k.isdigit() and len(k) <= 7 and isinstance(a, list) and len(a) == 2
        and isinstance(a[0], str) and (a[0] == "" or _HOST[1](a[0])) and isinstance(a[1], int)
        and not isinstance(a[1], bool) and 0 < a[1] < 1 << 16 for k, a in v.items())


SCHEMAS: dict[str, dict[str, tuple[type, Any]]] = {
    # the handshake (rxelab.control.handshake), in the clear: what the connection is for and a nonce; the
    # listener's nonce and proof; the connector's proof. Everything after it is sealed.
    "knock": {"kind": (str, lambda v: v in KINDS), "rank": (int, lambda v: -1 <= v < 1 << 20),
              "to": _RANK, "generation": _GENERATION, "scope": _SCOPE, "nonce": _NONCE},
    "challenge": {"nonce": _NONCE, "proof": _PROOF},
    "proof": {"proof": _PROOF},
    "hello": {"rank": _RANK, "world_size": _RANK, "host": (str, lambda v: 0 < len(v) < 256),
              "settings": _SETTINGS, "listen": _PORT, "generation": _GENERATION,
              "endpoints": (dict, None)},
    "table": {"endpoints": (dict, None), "directory": (dict, _directory), "job": _JOB},
    "barrier": {"rank": _RANK, "seq": (int, lambda v: v >= 0)},
    "release": {"seq": (int, lambda v: v >= 0)},
    "bye": {"rank": _RANK},
    "beat": {"rank": _RANK},  # elastic jobs: I am alive (control.BEAT_S)
    # rank: whom it blames; why: what befell that rank (errors.Reason), carried as it was found
    "abort": {"rank": _RANK, "reason": (str, None), "why": (str, lambda v: v in _REASONS)},
    # membership (rxelab.membership): a survivor to the coordinator it found, and the answers
    "shrink": {"rank": _RANK, "generation": _GENERATION},
    "data": {"rank": _RANK, "generation": _GENERATION},
    "members": {"generation": _GENERATION, "members": (list, lambda v: 0 < len(v) <= 1 << 20 and all(
        isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 20 for x in v))},
    "failed": {"reason": _REASON},
    # is a rank there? Answered by its listener at any time (rxelab.control.server)
    "probe": {"rank": _RANK, "generation": _GENERATION},
    "alive": {"rank": _RANK, "generation": _GENERATION},
    # a newcomer to the job's rank 0, and the answers: an offer (taken in if it accepts), its
    # rank in the job, not now (try again), or refused (failed: its settings differ, say)
    "join": {"host": (str, lambda v: 0 < len(v) < 256), "settings": _SETTINGS},
    "offer": {},
    "accept": {},
    "welcome": {"rank": _RANK, "world_size": _RANK, "generation": _GENERATION, "job": _JOB},
    "later": {"reason": _REASON},
}


def encode(message: dict[str, Any], session: Session | None = None) -> bytes:
    """A frame; with a session, sealed (its length covers the seal after the body)."""
    validate(message)
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_BODY:
        raise ProtocolError(f"{message['type']} message of {len(body)} bytes exceeds {MAX_BODY}")
    if session is None:
        return HEADER.pack(MAGIC, VERSION, len(body)) + body
    frame = HEADER.pack(MAGIC, VERSION, len(body) + TAG_BYTES) + body
    return frame + session.seal(frame)


def decode(frame: bytes) -> dict[str, Any]:
    """A whole frame (header + body) to a validated message."""
    if len(frame) < HEADER.size:
        raise ProtocolError(f"truncated message: {len(frame)} bytes, the header alone is {HEADER.size}")
    length = _check_header(frame[:HEADER.size])
    body = frame[HEADER.size:]
    if len(body) != length:
        raise ProtocolError(f"truncated message: header says {length} bytes, got {len(body)}")
    return _parse_body(body)


def _check_header(header: bytes, limit: int = MAX_BODY) -> int:
    magic, version, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError(f"not an rxelab message (starts with {magic!r})")
    if version != VERSION:
        raise ProtocolError(f"message version {version}, this rxelab speaks {VERSION}",
                            hint="run the same rxelab version on every node")
    if length > limit + TAG_BYTES:
        raise ProtocolError(f"message of {length} bytes exceeds the limit of {limit}")
    return int(length)


def _unseal(header: bytes, rest: bytes, session: Session | None) -> bytes:
    """The body of a frame whose header and the rest (body, then seal) are given, its seal
    checked where the connection has one."""
    if session is None:
        return rest
    if len(rest) < TAG_BYTES:
        raise ProtocolError("a control message without its seal")
    body, tag = rest[:-TAG_BYTES], rest[-TAG_BYTES:]
    session.open(header + body, tag)
    return body


def _parse_body(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"message body is not JSON: {e}") from None
    except RecursionError:
        raise ProtocolError("message body is nested too deeply") from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise ProtocolError(f"message body has an impossible value: {str(e)[:80]}") from None
    validate(message)
    return message  # type: ignore[no-any-return]


def validate(message: Any) -> None:
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("message is not an object with a string 'type'")
    kind = message["type"]
    schema = SCHEMAS.get(kind)
    if schema is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    extra = message.keys() - schema.keys() - {"type"}
    if extra:
        raise ProtocolError(f"{kind} message has unknown fields {sorted(extra)}")
    for field, (ftype, check) in schema.items():
        if field not in message:
            raise ProtocolError(f"{kind} message lacks {field!r}")
        value = message[field]
        if not isinstance(value, ftype) or isinstance(value, bool) or (check and not check(value)):
            raise ProtocolError(f"{kind} message has a bad {field!r}: {value!r}")
    if "endpoints" in schema:
        validate_endpoints(message["endpoints"], kind)


def validate_endpoints(endpoints: Any, kind: str) -> None:
    """{peer rank (as str): {qpn, psn, gid, lid} or {host, port}}: JSON keys are strings."""
    for key, ep in endpoints.items():
        if not key.isdigit() or len(key) > 7:
            raise ProtocolError(f"{kind} message: endpoint key {key!r} is not a rank")
        schema = next((e for e in _ENDPOINTS if isinstance(ep, dict) and set(ep) == set(e)), None)
        if schema is None:
            raise ProtocolError(f"{kind} message: endpoint {key} must have "
                                + " or ".join(str(sorted(e)) for e in _ENDPOINTS))
        for field, (ftype, check) in schema.items():
            value = ep[field]
            if not isinstance(value, ftype) or isinstance(value, bool) or not check(value):
                raise ProtocolError(f"{kind} message: endpoint {key} has a bad {field!r}: {value!r}")


def send(sock: socket.socket, message: dict[str, Any], session: Session | None = None) -> None:
    sock.sendall(encode(message, session))


def split_frame(data: bytes | bytearray, session: Session | None = None,
                limit: int = MAX_BODY) -> tuple[dict[str, Any], int] | None:
    """The first whole frame in data, as (message, bytes used), or None while it is still
    incomplete; anything malformed is a ProtocolError at once (even before the whole body
    came, so nobody can make rank 0 buffer a stray stream)."""
    if len(data) < HEADER.size:
        if not MAGIC.startswith(bytes(data[:len(MAGIC)])):
            raise ProtocolError(f"not an rxelab message (starts with {bytes(data[:4])!r})")
        return None
    header = bytes(data[:HEADER.size])
    length = _check_header(header, limit)
    if len(data) < HEADER.size + length:
        return None
    body = _unseal(header, bytes(data[HEADER.size:HEADER.size + length]), session)
    return _parse_body(body), HEADER.size + length


def recv(sock: socket.socket, *, deadline: float, peer: str, expect: str | None = None,
         session: Session | None = None, limit: int = MAX_BODY) -> dict[str, Any]:
    """One message from sock before the deadline (time.monotonic()), or a clear error."""
    header = _recv_exact(sock, HEADER.size, deadline, peer)
    rest = _recv_exact(sock, _check_header(header, limit), deadline, peer)
    message = _parse_body(_unseal(header, rest, session))
    if message["type"] == "abort":
        raise PeerError(f"{peer} aborted: {message['reason']}", peer=message["rank"],
                        reason=Reason(message["why"]))
    if expect is not None and message["type"] != expect:
        raise ProtocolError(f"expected a {expect} message from {peer}, got {message['type']}")
    return message


def _recv_exact(sock: socket.socket, n: int, deadline: float, peer: str) -> bytes:
    chunks, got = [], 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PeerError(f"{peer} did not answer in time (waited for {n - got} more bytes)",
                            reason=Reason.SILENT)
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(min(n - got, 1 << 16))
        except TimeoutError:
            continue
        except OSError as e:
            raise PeerError(f"connection to {peer} failed: {e}", reason=Reason.DIED) from None
        if not chunk:
            raise PeerError(f"{peer} closed the connection" + (" mid-message" if got else ""),
                            reason=Reason.DIED)
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)

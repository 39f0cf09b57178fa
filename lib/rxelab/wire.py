"""The out-of-band message format: what ranks tell each other over TCP before and beside RDMA
(QP numbers, PSNs, GIDs, barrier and close notices).

A frame is a fixed header, `RXLB` + version (u16) + body length (u32), then a UTF-8 JSON
object. Never pickle: a peer's bytes are data, not code. Every message is checked against a
schema before use; anything malformed, truncated, oversized or of another version is a
ProtocolError that says which.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

from rxelab.errors import PeerError, ProtocolError

MAGIC = b"RXLB"
VERSION = 5  # 2: hellos carry the job token; 3: a digest of the job's secret; 4: settings;
# 5: membership (listeners, generations, shrink and join)
HEADER = struct.Struct("!4sHI")
MAX_BODY = 1 << 20  # a table for thousands of ranks fits; a stray stream does not

# type -> {field: (python type, check)}
_U24 = (int, lambda v: 0 <= v < 1 << 24)
_RANK = (int, lambda v: 0 <= v < 1 << 20)
_HEX = set("0123456789abcdefABCDEF")
_LOWER_HEX = set("0123456789abcdef")
_GID = (str, lambda v: len(v) == 39 and all(len(g) == 4 and set(g) <= _HEX for g in v.split(":"))
        and v.count(":") == 7)
_ENDPOINT = {"qpn": _U24, "psn": _U24, "gid": _GID, "lid": (int, lambda v: 0 <= v < 1 << 16)}
_TOKEN = (str, lambda v: v == "" or (len(v) == 64 and set(v) <= _LOWER_HEX))
_PORT = (int, lambda v: 0 <= v < 1 << 16)  # 0: this rank keeps no listener (not elastic)
_GENERATION = (int, lambda v: 0 <= v < 1 << 31)
_HOST_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:_%")
_HOST = (str, lambda v: 0 < len(v) < 256 and set(v) <= _HOST_CHARS)
_REASON = (str, lambda v: len(v) <= 2000)


def _directory(v: Any) -> bool:
    """{rank: [host, port]}: where each rank of an elastic job listens."""
    return len(v) <= 1 << 20 and all(
        k.isdigit() and len(k) <= 7 and isinstance(a, list) and len(a) == 2
        and isinstance(a[0], str) and _HOST[1](a[0]) and isinstance(a[1], int)
        and not isinstance(a[1], bool) and 0 < a[1] < 1 << 16 for k, a in v.items())


SCHEMAS: dict[str, dict[str, tuple[type, Any]]] = {
    "hello": {"rank": _RANK, "world_size": _RANK, "host": (str, lambda v: 0 < len(v) < 256),
              "token": _TOKEN,
              "settings": (dict, lambda v: len(v) <= 32 and all(
                  isinstance(k, str) and len(k) <= 32 and isinstance(x, int | float)
                  and not isinstance(x, bool) for k, x in v.items())),
              "listen": _PORT, "generation": _GENERATION,
              "endpoints": (dict, None)},
    "table": {"endpoints": (dict, None), "directory": (dict, _directory)},
    "barrier": {"rank": _RANK, "seq": (int, lambda v: v >= 0)},
    "release": {"seq": (int, lambda v: v >= 0)},
    "bye": {"rank": _RANK},
    "beat": {"rank": _RANK},  # elastic jobs: I am alive (control.BEAT_S)
    "abort": {"rank": _RANK, "reason": (str, None)},
    # membership (rxelab.membership): a survivor to the coordinator it found, and the answers
    "shrink": {"rank": _RANK, "generation": _GENERATION, "token": _TOKEN},
    "members": {"generation": _GENERATION, "members": (list, lambda v: 0 < len(v) <= 1 << 20 and all(
        isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 20 for x in v))},
    "failed": {"reason": _REASON},
    # a newcomer to the job's rank 0, and the answers: come in as this rank, or try again
    "join": {"token": _TOKEN, "host": (str, lambda v: 0 < len(v) < 256)},
    "welcome": {"rank": _RANK, "world_size": _RANK, "generation": _GENERATION},
    "later": {"reason": _REASON},
}


def encode(message: dict[str, Any]) -> bytes:
    validate(message)
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_BODY:
        raise ProtocolError(f"{message['type']} message of {len(body)} bytes exceeds {MAX_BODY}")
    return HEADER.pack(MAGIC, VERSION, len(body)) + body


def decode(frame: bytes) -> dict[str, Any]:
    """A whole frame (header + body) to a validated message."""
    if len(frame) < HEADER.size:
        raise ProtocolError(f"truncated message: {len(frame)} bytes, the header alone is {HEADER.size}")
    length = _check_header(frame[:HEADER.size])
    body = frame[HEADER.size:]
    if len(body) != length:
        raise ProtocolError(f"truncated message: header says {length} bytes, got {len(body)}")
    return _parse_body(body)


def _check_header(header: bytes) -> int:
    magic, version, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError(f"not an rxelab message (starts with {magic!r})")
    if version != VERSION:
        raise ProtocolError(f"message version {version}, this rxelab speaks {VERSION}",
                            hint="run the same rxelab version on every node")
    if length > MAX_BODY:
        raise ProtocolError(f"message of {length} bytes exceeds the limit of {MAX_BODY}")
    return int(length)


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
    """{peer rank (as str): {qpn, psn, gid, lid}} — JSON keys are strings."""
    for key, ep in endpoints.items():
        if not key.isdigit() or len(key) > 7:
            raise ProtocolError(f"{kind} message: endpoint key {key!r} is not a rank")
        if not isinstance(ep, dict) or set(ep) != set(_ENDPOINT):
            raise ProtocolError(f"{kind} message: endpoint {key} must have {sorted(_ENDPOINT)}")
        for field, (ftype, check) in _ENDPOINT.items():
            value = ep[field]
            if not isinstance(value, ftype) or isinstance(value, bool) or not check(value):
                raise ProtocolError(f"{kind} message: endpoint {key} has a bad {field!r}: {value!r}")


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(encode(message))


def split_frame(data: bytes | bytearray) -> tuple[dict[str, Any], int] | None:
    """The first whole frame in data, as (message, bytes used), or None while it is still
    incomplete; anything malformed is a ProtocolError at once (even before the whole body
    came, so nobody can make rank 0 buffer a stray stream)."""
    if len(data) < HEADER.size:
        if not MAGIC.startswith(bytes(data[:len(MAGIC)])):
            raise ProtocolError(f"not an rxelab message (starts with {bytes(data[:4])!r})")
        return None
    length = _check_header(bytes(data[:HEADER.size]))
    if len(data) < HEADER.size + length:
        return None
    return _parse_body(bytes(data[HEADER.size:HEADER.size + length])), HEADER.size + length


def recv(sock: socket.socket, *, deadline: float, peer: str, expect: str | None = None) -> dict[str, Any]:
    """One message from sock before the deadline (time.monotonic()), or a clear error."""
    header = _recv_exact(sock, HEADER.size, deadline, peer)
    body = _recv_exact(sock, _check_header(header), deadline, peer)
    message = _parse_body(body)
    if message["type"] == "abort":
        raise PeerError(f"{peer} aborted: {message['reason']}", peer=message["rank"])
    if expect is not None and message["type"] != expect:
        raise ProtocolError(f"expected a {expect} message from {peer}, got {message['type']}")
    return message


def _recv_exact(sock: socket.socket, n: int, deadline: float, peer: str) -> bytes:
    chunks, got = [], 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PeerError(f"{peer} did not answer in time (waited for {n - got} more bytes)")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(min(n - got, 1 << 16))
        except TimeoutError:
            continue
        except OSError as e:
            raise PeerError(f"connection to {peer} failed: {e}") from None
        if not chunk:
            raise PeerError(f"{peer} closed the connection" + (" mid-message" if got else ""))
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)

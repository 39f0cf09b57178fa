"""Work before proof, bounded: what a listener spends on connections that have proved nothing
yet, where proving costs (a MUNGE proof is a munge or unmunge process; rxelab.munge). A knock's
scope is public, and the listener proves itself first, so anyone who can connect can make it
work. rxelab.hall asks the gate at each connection:

- a connection from this host is the kernel's to name: the uid of the process at its other end
  (sock_diag, asked for that one connection). Where the credential is only ever this user's
  (MUNGE: a proof names the uid that made it), another user's knock is refused at once;
- a rate per source (its address, and its uid where the kernel names one): a flood from one
  source gets a few checks a second, not the listener's time;
- the checks themselves run on a few threads of their own (CHECKERS), never the listener's,
  at most MAX_WAITING at once: past that a new connection is dropped, and its dialler (a rank
  forming the job, a probe) tries again, as it does when a listener is crowded.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

CHECKERS = 4  # credential checks at once (each a process, with MUNGE)
MAX_WAITING = 32  # checks queued or running at once
RATE = 50.0  # new connections a second, per source
BURST = 100  # ... and at once, from a source that was quiet
MAX_SOURCES = 4096  # sources remembered; past that, the quietest are forgotten

Source = tuple[str, int | None]  # the peer's address, and its uid where this host knows it


class Gate:
    def __init__(self, credential: Any) -> None:
        self.costly = bool(getattr(credential, "costly", False))
        self.same_user_only = bool(getattr(credential, "same_user_only", False))
        self.uid = os.geteuid()
        self._buckets: dict[Source, tuple[float, float]] = {}  # tokens, when last filled
        self._pool: ThreadPoolExecutor | None = None
        self.waiting = 0  # checks submitted and not yet done (the hall's thread only)

    def admit(self, sock: socket.socket) -> str | None:
        """None, or why this new connection is refused before any work is done for it."""
        if not self.costly:
            return None
        try:
            address = str(sock.getpeername()[0])
        except OSError as err:
            return str(err)
        uid = peer_uid(sock)
        if self.same_user_only and uid is not None and uid != self.uid:
            return (f"a process of another user (uid {uid}) on this host: this job's "
                    "credential is only ever its own user's")
        return None if self._take((address, uid)) else \
            f"more than {RATE:g} connections a second from {address} (uid {uid})"

    def _take(self, source: Source) -> bool:
        now = time.monotonic()
        tokens, then = self._buckets.get(source, (float(BURST), now))
        tokens = min(float(BURST), tokens + (now - then) * RATE)
        if len(self._buckets) >= MAX_SOURCES and source not in self._buckets:
            for old in sorted(self._buckets, key=lambda s: self._buckets[s][1])[:MAX_SOURCES // 4]:
                del self._buckets[old]
        if tokens < 1:
            self._buckets[source] = (tokens, now)
            return False
        self._buckets[source] = (tokens - 1, now)
        return True

    def full(self) -> bool:
        return self.waiting >= MAX_WAITING

    def submit(self, work: Callable[[], Any], done: Callable[[Future[Any]], None]) -> None:
        """Run work() on a checker thread; done(future) is called there when it ends."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(CHECKERS, thread_name_prefix="rxelab-check")
        self.waiting += 1
        self._pool.submit(work).add_done_callback(done)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


# the kernel's socket table, asked for one TCP connection (linux/inet_diag.h, sock_diag.h)
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST = 4, 20, 1
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_REQUEST = struct.Struct("=BBBBI")  # inet_diag_req_v2: family, protocol, ext, pad, states
_SOCKID = struct.Struct("!HH16s16s")  # inet_diag_sockid: sport, dport, src, dst
_TAIL = struct.Struct("=III")  # ... its interface, and a cookie (none: ~0, ~0)
_UID_AT = _HEADER.size + 4 + _SOCKID.size + _TAIL.size + 12  # inet_diag_msg's idiag_uid


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a TCP connection, if that end is on this
    host (the kernel has its socket), else None."""
    try:
        peer, me = sock.getpeername(), sock.getsockname()
    except OSError:
        return None
    for family, src, dst in _forms(str(peer[0]), str(me[0])):
        uid = _lookup(family, src, int(peer[1]), dst, int(me[1]))
        if uid is not None:
            return uid
    return None


def _forms(peer: str, me: str) -> list[tuple[int, bytes, bytes]]:
    """The other end's socket as the kernel may hold it: IPv4, or IPv6 (an IPv4 peer of a
    dual-stack listener may be either)."""
    out = []
    v4 = [a[7:] if a.startswith("::ffff:") and "." in a else a for a in (peer, me)]
    if all("." in a and ":" not in a for a in v4):
        out.append((socket.AF_INET, *(socket.inet_aton(a) + bytes(12) for a in v4)))
    try:
        six = [a if ":" in a else "::ffff:" + a for a in (peer, me)]
        out.append((socket.AF_INET6, *(socket.inet_pton(socket.AF_INET6, a) for a in six)))
    except OSError:
        pass
    return out  # type: ignore[return-value]


def _lookup(family: int, src: bytes, sport: int, dst: bytes, dport: int) -> int | None:
    body = (_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
            + _SOCKID.pack(sport, dport, src, dst) + _TAIL.pack(0, 0xFFFFFFFF, 0xFFFFFFFF))
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(0.5)
            nl.send(_HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST,
                                 1, 0) + body)
            data = nl.recv(1 << 16)
    except (OSError, AttributeError):  # no netlink here (not Linux): unknown
        return None
    if len(data) < _UID_AT + 4 or _HEADER.unpack_from(data)[1] != SOCK_DIAG_BY_FAMILY:
        return None  # NLMSG_ERROR: no such socket on this host
    return int(struct.unpack_from("=I", data, _UID_AT)[0])

"""Work before proof, bounded: what a listener spends on connections that have proved nothing
yet, where proving costs (a MUNGE proof is a munge or unmunge process;
rxelab.control.munge_credential). A knock's scope is public, and the listener proves itself
first, so anyone who can connect can make it work. rxelab.control.accepting asks the gate at
each connection:

- a rate per source (its address, and its uid where the kernel names one): a flood from one
  source gets a few checks a second, not the listener's time. A peer that cannot be on this
  host is its address alone, so a flood from elsewhere is refused before the kernel is asked
  anything about it;
- a connection from this host is the kernel's to name: the uid of the process at its other end
  (sock_diag, asked for that one connection). Where the credential is only ever this user's
  (MUNGE: a proof names the uid that made it), another user's knock is refused at once;
- the checks themselves run on a few threads of their own (CHECKERS), never the listener's,
  at most MAX_WAITING at once: past that a connection's next step waits in the acceptor, which
  takes no new connection while its room is full (a dialler waits in the backlog: a rank
  forming the job, or a probe, that then times out is told "busy", not "gone").

The checkers are daemon threads, and close() cancels what is queued and kills the munge or
unmunge a checker still waits for, so a closed gate leaves no process behind and no exit waits
for one (a check may take munge.CALL_S). Closing races with the acceptor's thread (a server closes
its acceptor after a bounded wait for it) and with the checkers: a submit() under way finishes
before close() takes over (a lock), one after it starts nothing, a check dequeued as the gate
closes does not start, and close() looks for a checker's processes until that checker ended,
not once, so a munge started just after a look is killed at the next.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import queue
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

CHECKERS = 4  # credential checks at once (each a process, with MUNGE)
MAX_WAITING = 32  # checks queued or running at once
RATE = 50.0  # new connections a second, per source
BURST = 100  # ... and at once, from a source that was quiet
MAX_SOURCES = 4096  # sources remembered; past that, the quietest are forgotten
CLOSE_S = 1.0  # close() waits this long at most for the checkers to end
LOOK_S = 0.01  # ... looking again this often for the processes they started

Source = tuple[str, int | None]  # the peer's address, and its uid where this host knows it
Work = tuple[Future[Any], Callable[[], Any]]


class Gate:
    def __init__(self, credential: Any) -> None:
        self.costly = bool(getattr(credential, "costly", False))
        self.same_user_only = bool(getattr(credential, "same_user_only", False))
        self.uid = os.geteuid()
        self._buckets: dict[Source, tuple[float, float]] = {}  # tokens, when last filled
        self._work: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self._checkers: list[threading.Thread] = []
        self._lock = threading.Lock()  # submit() against close(): no checker started after it
        self._closed = False
        self.waiting = 0  # checks submitted and not yet done (the acceptor's thread only)

    def admit(self, sock: socket.socket) -> str | None:
        """None, or why this new connection is refused before any work is done for it."""
        if not self.costly:
            return None
        try:
            address = str(sock.getpeername()[0])
        except OSError as err:
            return str(err)
        uid = None
        if on_this_host(address):  # only here may a uid tell one source from another
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
        """Run work() on a checker thread; done(future) is called there when it ends (or
        here, cancelled, once the gate is closed: no thread started, nothing queued)."""
        future: Future[Any] = Future()
        future.add_done_callback(done)
        self.waiting += 1
        with self._lock:
            if not self._closed:
                if len(self._checkers) < CHECKERS:
                    checker = threading.Thread(target=self._check, daemon=True,
                                               name=f"rxelab-check-{len(self._checkers)}")
                    checker.start()
                    self._checkers.append(checker)
                self._work.put((future, work))
                return
        future.cancel()  # done() outside the lock: it may be the acceptor's, which submits

    def _check(self) -> None:
        while (item := self._work.get()) is not None:
            future, work = item
            if self._closed:  # taken from the queue as close() emptied it
                future.cancel()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = work()
            except BaseException as err:  # the connection's to hear, not this thread's to end
                future.set_exception(err)
            else:
                future.set_result(result)

    def close(self) -> None:
        """Queued checks are cancelled and running ones cut short, within CLOSE_S."""
        with self._lock:
            self._closed = True
            checkers = list(self._checkers)
        while True:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in checkers:
            self._work.put(None)
        deadline = time.monotonic() + CLOSE_S
        while (alive := [c for c in checkers if c.is_alive()]) and time.monotonic() < deadline:
            for checker in alive:
                _kill_children(checker)
            alive[0].join(min(LOOK_S, max(0.0, deadline - time.monotonic())))


def _kill_children(thread: threading.Thread) -> None:
    """Kill the processes this thread started and still waits for (a munge call). The pidfd
    is taken before the second look, so a pid reaped and reused meanwhile is never signalled."""
    where = f"/proc/self/task/{thread.native_id}/children"
    try:
        with open(where) as f:
            pids = [int(p) for p in f.read().split()]
    except (OSError, ValueError):  # ended already, or no /proc: nothing to kill
        return
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            continue
        try:
            with open(where) as f:
                if str(pid) in f.read().split():
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)


def on_this_host(address: str) -> bool:
    """Whether a peer's address may be one of this host's (then the kernel can name the uid
    behind it): a loopback, or one a socket here can bind to. Unsure: yes."""
    if address.startswith("::ffff:") and "." in address:
        address = address[7:]
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return True
    if ip.is_loopback:
        return True
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((address, 0))
    except OSError as err:
        return err.errno != errno.EADDRNOTAVAIL
    return True


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

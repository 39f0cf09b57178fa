"""What a transport without a NIC keeps itself: the table of registrations a write is checked
against, the slot slabs, and a completion queue with a descriptor to sleep on. A NIC does all
of this in hardware; tcp and quic do it here, with the semantics of the verbs they stand in for.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import os
import selectors
import socket
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

from rxelab.transports import base
from rxelab.transports.wire import Completion

log = logging.getLogger(__name__)

# what a completion's status means here (ibv_wc_status_str's words where they fit)
STATUS_WORDS = {
    base.WC_SUCCESS: "success",
    base.WC_LOC_LEN_ERR: "local length error (a message longer than the receive slot)",
    base.WC_LOC_PROT_ERR: "local protection error (no registration covers the memory)",
    base.WC_WR_FLUSH_ERR: "flushed: the connection is in error",
    base.WC_REM_INV_REQ_ERR: "remote invalid request error",
    base.WC_REM_ACCESS_ERR: "remote access error (no live registration covers that key and range)",
    base.WC_RETRY_EXC_ERR: "the connection to the peer closed or broke",
}


class KeyTable:
    """Registrations by key. Keys count up from 1 and are never reused, so a write with the
    key of a closed registration fails instead of landing in whatever took its place."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[int, tuple[int, int, int]] = {}
        self.keys = itertools.count(1)

    def add(self, address: int, nbytes: int, access: int) -> int:
        with self.lock:
            key = next(self.keys)
            self.entries[key] = (address, nbytes, access)
            return key

    def drop(self, key: int) -> None:
        with self.lock:
            self.entries.pop(key, None)

    def covers(self, key: int, address: int, nbytes: int, access: int) -> bool:
        """Whether a live registration of `key` holds [address, +nbytes) with `access`."""
        found = self.entries.get(key)
        if found is None:
            return False
        at, length, allowed = found
        return at <= address and address + nbytes <= at + length and allowed & access == access


class Region:
    """One registration (a Registry's mr): lkey and rkey are one key."""

    def __init__(self, table: KeyTable, address: int, nbytes: int, access: int) -> None:
        self.table, self.buf, self.length = table, address, nbytes
        self.lkey = self.rkey = table.add(address, nbytes, access)

    def close(self) -> None:
        self.table.drop(self.lkey)


class Slab(Region):
    """Slots this transport owns (a connection's receive or send slots), registered."""

    def __init__(self, table: KeyTable, nbytes: int) -> None:
        self.memory = (ctypes.c_char * nbytes)()
        super().__init__(table, ctypes.addressof(self.memory), nbytes, base.ACCESS_LOCAL_WRITE)

    def write(self, data: bytes, length: int, offset: int = 0) -> None:
        ctypes.memmove(self.buf + offset, data, length)

    def read(self, length: int, offset: int = 0) -> bytes:
        return ctypes.string_at(self.buf + offset, length)


class CompletionQueue:
    """Completions in order. Once armed, the next completion makes `fd` readable: the engine
    sleeps on it as on a verbs completion channel."""

    def __init__(self) -> None:
        self.entries: deque[Completion] = deque()
        self.lock = threading.Lock()
        self.armed = False
        self.fd, self._signal = os.pipe()
        os.set_blocking(self.fd, False)

    def poll(self, n: int) -> tuple[int, list[Completion]]:
        entries = self.entries
        if not entries:
            return 0, []
        with self.lock:
            out = [entries.popleft() for _ in range(min(n, len(entries)))]
        return len(out), out

    def push(self, done: Iterable[Completion]) -> None:
        with self.lock:
            before = len(self.entries)
            self.entries.extend(done)
            if self.armed and len(self.entries) > before:
                self.armed = False
                os.write(self._signal, b"c")

    def arm(self) -> None:
        with self.lock:
            if self.entries:  # already there: wake at once
                os.write(self._signal, b"c")
            else:
                self.armed = True

    def take_event(self) -> None:
        try:
            os.read(self.fd, 64)
        except BlockingIOError:
            pass

    def close(self) -> None:
        for fd in (self.fd, self._signal):
            try:
                os.close(fd)
            except OSError:
                pass


class SocketDevice:
    """rxelab.transports.base.Device for a transport whose NIC is this process."""

    def __init__(self) -> None:
        self.cq = CompletionQueue()
        self.channel_fd: int | None = self.cq.fd

    def arm(self) -> None:
        self.cq.arm()

    def take_event(self) -> None:
        self.cq.take_event()

    def status_str(self, status: int) -> str:
        return STATUS_WORDS.get(status, f"status {status}")

    def close(self) -> None:
        self.cq.close()


class NicThread:
    """The I/O thread a socket transport's fabric runs to play the NIC: a selector with a wake
    pipe, woken by posts (a flag, so no syscall per post while it runs), stopped once; a fault
    of its own fails every connection in words instead of hanging them. The fabric gives
    `conns` (each with a `wire`), `device`, `lock` and `_turns()`, the loop itself."""

    name = "socket"
    conns: dict[int, Any]
    device: SocketDevice
    lock: threading.Lock

    def _init_thread(self) -> None:
        self.sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ)
        self.poked = False
        self.stopping = False
        self.thread: threading.Thread | None = None

    def _start_thread(self) -> None:
        self.thread = threading.Thread(target=self._serve, name=f"rxelab-{self.name}", daemon=True)
        self.thread.start()

    def _close_thread(self) -> None:
        self.sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def poke(self) -> None:
        """Wake the I/O thread: a post or a repost has something for it to send."""
        if not self.poked:
            self.poked = True
            with contextlib.suppress(OSError):
                self._wake_w.send(b"p")

    def _woken(self) -> None:
        """The pokes are read. The flag drops after the bytes are read, never before: a poke
        while they are read then finds it up, and its post is in the write pass that follows,
        and a poke after sends a byte of its own. (Dropped first, a poke's byte could be read
        here with the flag left up, and no poke would wake the thread again.)"""
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(4096)
        self.poked = False

    def stop(self) -> None:
        if self.thread is None or self.stopping:
            self.stopping = True
            return
        self.stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"s")
        if self.thread is not threading.current_thread():
            self.thread.join(10.0)

    def _turns(self) -> None:
        raise NotImplementedError

    def _faulted(self, err: BaseException) -> None:
        """What else a fault of the thread's own means to the fabric (lock held)."""

    def _serve(self) -> None:
        try:
            self._turns()
        except BaseException as err:  # a fault of ours: every connection fails, in words
            log.error("rxelab: the %s transport's I/O thread failed: %r", self.name, err)
            with self.lock:
                done = []
                for conn in self.conns.values():
                    conn.wire.fail()
                    done.extend(conn.wire.take())
                self._faulted(err)
            self.device.cq.push(done)

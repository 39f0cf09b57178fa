"""What a transport without a NIC keeps itself: the table of registrations a write is checked
against, the slot slabs, and a completion queue with a descriptor to sleep on. A NIC does all
of this in hardware; tcp and quic do it here, with the semantics of the verbs they stand in for.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from collections import deque
from collections.abc import Iterable

from rxelab.transports import base
from rxelab.transports.wire import Completion

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

"""The memory registration cache: caller buffers are registered in place once and reused,
because registering (pinning pages, a system call, a device table entry) costs far more
than a small collective.

What it promises, and why:
- bounded by entries and by pinned bytes, counted in whole pages (what the kernel pins);
- an entry holds an export of its buffer (a memoryview): the memory stays alive and a
  bytearray cannot be resized under a registration that would go stale;
- a numpy array can be, export or not (`a.resize(n, refcheck=False)` frees its memory), and
  a tensor's storage too: an entry whose memory is no longer where, or as long as, it was
  when registered (buffers.Placement) is stale, and made anew for whatever is there now;
- entries whose buffer the application dropped (only our export still refers to it) are let
  go, so a loop that allocates a fresh buffer per call does not pin memory without end;
- what the current call uses, and what was exposed to peers, is never evicted: a call whose
  buffers alone exceed the limit is refused before anything is posted.
"""

from __future__ import annotations

import mmap
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rxelab.buffers import Buffer, Placement, holding
from rxelab.errors import ConfigError

PAGE = mmap.PAGESIZE
Key = tuple[int, int, int]  # address, bytes, access


def pinned_size(address: int, nbytes: int) -> int:
    """Bytes of the whole pages [address, address + nbytes) touches."""
    if nbytes == 0:
        return 0
    first, last = address // PAGE, (address + nbytes - 1) // PAGE
    return (last - first + 1) * PAGE


@dataclass
class Entry:
    mr: Any
    view: memoryview
    pinned: int
    placed: Placement  # where view.obj's memory was when registered


class Registry:
    def __init__(self, make_mr: Callable[[int, int, int], Any], limit: int,
                 max_entries: int = 64) -> None:
        self.make_mr = make_mr  # (address, nbytes, access) -> MR
        self.limit = limit
        self.max_entries = max_entries
        self.entries: OrderedDict[Key, Entry] = OrderedDict()
        self.busy: set[Key] = set()  # the current call's buffers
        self.held: set[Key] = set()  # exposed to peers: until close
        self.fixed = 0
        self.held_version = 0  # changes whenever what is held for peers changes
        self.pinned = 0
        self.peak = 0
        self.registrations = 0

    def check_fits(self, *buffers: Buffer, staging: int = 0, why: str = "") -> None:
        """staging: bytes the call may pin besides its buffers (coded blocks' areas)."""
        need = sum(pinned_size(b.address, b.nbytes) for b in buffers) + staging
        held = sum(self.entries[k].pinned for k in self.held if k in self.entries)
        if need + held + self.fixed > self.limit:
            of = f" ({staging} of them staging for {why})" if staging else ""
            raise ConfigError(f"these buffers need {need} bytes pinned{of}; with "
                              f"{held + self.fixed} already held that exceeds pin_limit={self.limit}",
                              hint="pass a larger pin_limit to init(), or smaller buffers")

    def register(self, buf: Buffer, access: int, hold: bool = False) -> Any:
        key = (buf.address, buf.nbytes, access)
        # An entry at this address serves any object there: our export keeps the memory of
        # the object it was made for alive, so another object at the same address is another
        # view of that memory (t and t[:]) - while that object's memory is where it was.
        entry = self.entries.get(key)
        if entry is not None and entry.placed.moved(entry.view.obj):
            self._drop(key)  # resized or freed under the registration: stale
            entry = None
        if entry is None:
            self._make_room(pinned_size(buf.address, buf.nbytes))
            mr = self.make_mr(buf.address, buf.nbytes, access)
            view = memoryview(buf.owner)  # placed by what it exports (a memoryview's array)
            entry = Entry(mr, view, pinned_size(buf.address, buf.nbytes), Placement(view.obj))
            self.entries[key] = entry
            self.registrations += 1
            self.pinned += entry.pinned
            self.peak = max(self.peak, self.pinned)
        else:
            self.entries.move_to_end(key)
        if hold and key not in self.held:
            self.held.add(key)
            self.held_version += 1
        elif not hold:
            self.busy.add(key)
        return entry.mr

    def end_call(self) -> None:
        self.busy.clear()

    def add_fixed(self, nbytes: int) -> None:
        """Memory the library pins for itself (slot slabs) counts too."""
        self.fixed += nbytes
        self.pinned += nbytes
        self.peak = max(self.peak, self.pinned)

    def _make_room(self, incoming: int) -> None:
        for key in [k for k, e in self.entries.items() if self._dropped_by_app(k, e)]:
            self._drop(key)
        for key in list(self.entries):
            if self.pinned + incoming <= self.limit and len(self.entries) < self.max_entries:
                return
            if key not in self.busy and key not in self.held:
                self._drop(key)
        if self.pinned + incoming > self.limit:
            raise ConfigError(f"registering {incoming} more bytes would exceed pin_limit="
                              f"{self.limit} ({self.pinned} pinned by buffers in use)",
                              hint="pass a larger pin_limit to init()")

    def _dropped_by_app(self, key: Key, entry: Entry) -> bool:
        if key in self.busy or key in self.held:
            return False
        obj = entry.view.obj
        if (held := holding(obj)) is not None and held.caller is not None:
            return held.caller() is None  # a tensor's registration lasts while the tensor lives
        views = sum(1 for e in self.entries.values() if e.view.obj is obj)
        # references: our exports, the local `obj`, getrefcount's argument
        return sys.getrefcount(obj) <= views + 2

    def _drop(self, key: Key) -> None:
        entry = self.entries.pop(key)
        entry.mr.close()
        entry.view.release()
        self.pinned -= entry.pinned
        self.busy.discard(key)
        if key in self.held:
            self.held.discard(key)
            self.held_version += 1

    def revoke(self, remote_bit: int) -> None:
        """No peer may write into this rank's memory any more (it failed or gave up, and the
        application may reuse its buffers): every registration that lets peers write goes,
        at once, so a late write fails at its sender instead of landing."""
        for key in [k for k in self.entries if k[2] & remote_bit]:
            self._drop(key)

    def close(self) -> None:
        for key in list(self.entries):
            self._drop(key)


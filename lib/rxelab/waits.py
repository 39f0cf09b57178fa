"""The waits of the progress engine, and the mailbox they wait on: what arrived (buffers
advertised, tokens, data notices, eager blocks, aborts) is filed there by completions, and an
operation waits until what it needs is there, with a deadline of no progress that names what
it waited for. A mixin of rxelab.engine.Engine, which posts and completes."""

from __future__ import annotations

import ctypes
import select
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rxelab.codecs import BY_ID
from rxelab.errors import Mismatch, MismatchError, PeerError, RdmaError, Reason
from rxelab.messages import AbortReason, SendOp, WriteOp

if TYPE_CHECKING:
    from rxelab.transports.base import Connection, Device

WATCH_EVERY = 0.25  # seconds between looks at the control connections while waiting
EXPLAIN_S = 0.5  # how long a rank stopped by a peer waits for word of why (the first cause)
BACKOFF = 0.0002  # the sleep instead, where there is no completion channel


@dataclass
class Counters:
    bytes_sent: int = 0
    bytes_received: int = 0
    coded_raw: int = 0  # bytes of blocks this rank coded and sent (rxelab.codecs)
    coded_wire: int = 0  # what they took on the wire
    codec_seconds: float = 0.0  # CPU time coding and decoding
    empty_polls: int = 0  # polls of the completion queue that found nothing (see Waits.wait)
    sleeps: int = 0  # waits on the completion channel (select): a wake-up, or an event found there
    inflight: int = 0
    peak_inflight: int = 0


@dataclass
class Arrival:
    count: int = 0  # messages whose last chunk's notice came and nobody took yet


@dataclass(frozen=True)
class Notice:
    """An abort notice as it was filed: why in words, and as its sender said it (a Reason,
    or MISMATCH: rxelab.messages), the rank its sender blames, and the mismatch that started
    it all, where one did."""

    words: str
    why: AbortReason
    blamed: int | None
    mismatch: Mismatch | None = None

    def passes_on(self, sender: int) -> bool:
        """Whether the notice only passes on another rank's failure (its sender was stopped
        by that rank's notice): that rank's own notice says what went wrong."""
        return self.why == Reason.FAILED and self.blamed is not None and self.blamed != sender


@dataclass
class Mailbox:
    rtr: dict[tuple[int, int], tuple[int, int, int, int]] = field(default_factory=dict)
    rts: dict[tuple[int, int], int] = field(default_factory=dict)  # -> the sender's byte count
    tokens: set[tuple[int, int]] = field(default_factory=set)
    arrivals: dict[tuple[int, int], Arrival] = field(default_factory=dict)
    eager: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # -> slot, bytes
    aborts: dict[int, Notice] = field(default_factory=dict)  # the first of each rank


class Waits:
    """Declared here, set by the engine."""

    box: Mailbox
    rank: int
    counters: Counters
    conns: dict[int, Connection]
    dev: Device
    timeout: float
    spin_s: float
    armed: bool
    watch: Callable[[], None] | None

    def progress(self) -> bool:
        raise NotImplementedError

    def poll_quietly(self) -> int:
        raise NotImplementedError

    def wait(self, cond: Callable[[], bool], what: str, peer: int | None = None,
             patience: float = 1.0) -> None:
        """Until cond() holds. The deadline is one of no progress: `timeout` seconds in which
        not one completion arrived (a slow transfer that moves is not cut off; a stalled one
        is, naming what it waited for), times `patience`: a rank waiting its turn behind k
        pairs of the sequential schedule allows each of them the deadline. A peer whose
        process died is noticed sooner, by its control connection (watch).

        Polls come back empty for `spin_s` seconds (the spin_us option; 0 by default) before
        the rank sleeps until the next completion: ranks share cores (several per VM, VMs per
        core), and a rank that polls takes the CPU from the peers and from rxe, whose packet
        work runs in the kernel; on the 3-VM lab one spinning rank per VM made a 1 KiB
        all-to-all 2x slower, and 20 polls before sleeping 7 % slower, than sleeping at once
        (measured; docs/library.md). This loop runs once or twice per block on the hot path, so it does
        little: the clock is read only when a poll came back empty."""
        progress = self.progress
        box = self.box
        idle_since = None  # when polls started coming back empty
        next_watch = None  # the peers are looked at every WATCH_EVERY s of the wait, even
        # while other completions keep coming (a dead peer's block never does)
        counters = self.counters
        spin_s = self.spin_s
        while True:
            if box.aborts:  # before cond: an abort filed with what we wait for comes first
                raise self.stopped(f" while this rank waited for {what}", cond)
            if cond():
                return
            if progress():
                idle_since = None
                continue
            counters.empty_polls += 1
            now = time.monotonic()
            if next_watch is None:
                next_watch = now + WATCH_EVERY
            if idle_since is None:
                idle_since = now
            elif now - idle_since > self.timeout * patience:
                raise PeerError(f"no progress for {self.timeout * patience:g} s while waiting for {what}",
                                peer=peer, reason=Reason.STALLED,
                                hint="a peer may have died, hung, or called a "
                                                "different operation")
            if now > next_watch and self.watch is not None:
                next_watch = now + WATCH_EVERY
                try:
                    self.watch()
                except PeerError as known:
                    raise self.heard(known, f" while this rank waited for {what}", cond) from None
            if now - idle_since >= spin_s:
                self._block(min(WATCH_EVERY, self.timeout * patience - (now - idle_since)))

    def stopped(self, context: str, cond: Callable[[], bool] | None = None) -> RdmaError:
        """The error of a call that peers' abort notices stopped: the first cause of its
        failure, in this rank's words. This rank's own finding first (cond() raises a
        mismatch it finds in what arrived before the notice); else a notice that carries a
        mismatch (the sender's and the receiver's words for it, or a bystander's); a notice
        that only passes on another rank's failure waits up to EXPLAIN_S for that rank's
        own notice (sent before it, on another connection); else the first notice as it is."""
        if cond is not None:
            cond()
        box, end = self.box, time.monotonic() + EXPLAIN_S
        while True:
            told = next((item for item in box.aborts.items() if item[1].mismatch), None)
            if told is not None:
                return self._notice_error(*told, context)
            who, notice = next(iter(box.aborts.items()))
            if notice.passes_on(who) and notice.blamed in box.aborts:
                who, notice = notice.blamed, box.aborts[notice.blamed]  # type: ignore[index]
            if not notice.passes_on(who) or time.monotonic() > end:
                return self._notice_error(who, notice, context)
            if not self.poll_quietly():
                time.sleep(0.0005)

    def heard(self, known: PeerError, context: str,
              cond: Callable[[], bool] | None = None) -> RdmaError:
        """What the control plane said (`known`), unless it is of a rank that stopped a call:
        that rank posted its abort notices before it told the control plane, and they say
        the first cause in this rank's words (stopped()); they have up to EXPLAIN_S to come. A
        rank gone sends none: said at once."""
        if known.lost:
            return known
        end = time.monotonic() + EXPLAIN_S
        while not self.box.aborts and time.monotonic() < end:
            if not self.poll_quietly():
                time.sleep(0.0005)
        return self.stopped(context, cond) if self.box.aborts else known

    def _notice_error(self, who: int, notice: Notice, context: str) -> RdmaError:
        m = notice.mismatch
        if m is None:
            return PeerError(f"rank {who} stopped the operation ({notice.words}){context}",
                             peer=who, reason=Reason.ABORTED)
        other = m.other(self.rank)
        if other is None:
            return PeerError(f"rank {who} stopped the operation ({m.words(self.rank)})"
                             f"{context}", peer=who, reason=Reason.ABORTED, mismatch=m)
        return MismatchError(f"{m.words(self.rank)} (rank {who} stopped the operation"
                             f"{context})", peer=other, mismatch=m,
                             hint="send and receive counts must match pairwise")

    def _block(self, seconds: float) -> None:
        dev = self.dev
        if dev.channel_fd is None:
            time.sleep(BACKOFF)
        elif not self.armed:  # arm, then poll once more before sleeping (no lost wake-up)
            dev.arm()
            self.armed = True
        else:
            self.counters.sleeps += 1
            if select.select([dev.channel_fd], [], [], max(0.0, seconds))[0]:
                dev.take_event()
                self.armed = False

    def wait_rtr(self, peer: int, tag: int, what: str, codec: int = 0) -> tuple[int, int, int]:
        """The buffer `peer` advertised for `tag`: (address, rkey, bytes). It must be ready for
        blocks coded as this rank codes them (`codec`, rxelab.codecs' id; 0: as they are)."""
        key = (peer, tag)
        self.wait(lambda: key in self.box.rtr, f"rank {peer}'s buffer for {what}", peer)
        addr, rkey, room, theirs = self.box.rtr.pop(key)
        if theirs != codec:
            raise MismatchError(f"{what}: rank {peer} expects {_coding(theirs)}, this rank sends "
                                f"{_coding(codec)}", peer=peer,
                                hint="give every rank the same compression= (init or the call)")
        return addr, rkey, room

    def wait_token(self, peer: int, tag: int, what: str, patience: float = 1.0) -> None:
        key = (peer, tag)
        self.wait(lambda: key in self.box.tokens, f"the turn from rank {peer} ({what})", peer,
                  patience)
        self.box.tokens.discard(key)

    def wait_data(self, peer: int, tag: int, length: int, what: str, patience: float = 1.0) -> None:
        """Wait for one message written with immediate `tag` (its last chunk's notice)."""
        key = (peer, tag)
        box = self.box

        def arrived() -> bool:
            if key in box.eager:  # the peer sent this block eagerly: its size differs from ours
                self._mismatch(peer, box.eager[key][1], length, what)
            if key in box.rts:  # the peer said how much it sends (vector collectives)
                sent = box.rts.pop(key)
                if sent != length:
                    self._mismatch(peer, sent, length, what)
            return key in box.arrivals

        if key not in box.arrivals:
            self.wait(arrived, f"{length} bytes from rank {peer} ({what})", peer, patience)
        # the notice came before the data (RC keeps order) and may have been filed with it
        sent = box.rts.pop(key, None)
        if sent is not None and sent != length:
            self._mismatch(peer, sent, length, what)
        a = box.arrivals[key]
        a.count -= 1
        if a.count == 0:
            del box.arrivals[key]
        self.counters.bytes_received += length

    def recv_eager(self, peer: int, tag: int, dest: int, length: int, what: str,
                   patience: float = 1.0) -> None:
        """Wait for the eager block `tag` from peer, copy it to dest, give the slot back."""
        key = (peer, tag)
        box = self.box.eager
        got = box.pop(key, None)
        if got is None:
            rts = self.box.rts

            def arrived() -> bool:
                if key in rts:  # the peer is sending more than an eager block: ours is smaller
                    self._mismatch(peer, rts[key], length, what)
                return key in box

            self.wait(arrived, f"{length} bytes from rank {peer} ({what})", peer, patience)
            got = box.pop(key)
        slot, nbytes = got
        conn = self.conns[peer]
        if nbytes != length:
            conn.repost(slot)
            self._mismatch(peer, nbytes, length, what)
        if length:
            ctypes.memmove(dest, conn.recv_base + slot * conn.slot_size, length)
        self.counters.bytes_received += length
        conn.repost(slot)

    def _mismatch(self, peer: int, sent: int, expected: int, what: str) -> None:
        m = Mismatch(peer, self.rank, sent, expected)
        raise MismatchError(f"{what}: {m.words(self.rank)}", peer=peer, mismatch=m,
                            hint="send and receive counts must match pairwise")

    def wait_ops(self, ops: Sequence[WriteOp | SendOp], what: str) -> None:
        for op in ops:
            self.wait(lambda op=op: bool(op.complete), f"rank {op.peer} to acknowledge {what}",  # type: ignore[misc]
                      op.peer)


def _coding(codec: int) -> str:
    return f"blocks coded with {BY_ID[codec].name}" if codec in BY_ID else \
        "blocks as they are" if codec == 0 else f"blocks in an unknown coding ({codec})"

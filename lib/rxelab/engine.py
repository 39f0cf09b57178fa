"""The progress engine: posts work, polls the one completion queue, and files what arrives
into a mailbox that the operations wait on, each wait with a deadline that names what it
waited for.

Two protocols, chosen by block size as MPI's eager limit and UCX's rendezvous threshold do:
- eager (blocks up to `eager_limit` bytes): the sender copies the block into one of its
  registered send slots and SENDs it WITH IMMEDIATE (the tag) into a receive slot the
  receiver posted in advance; the receiver copies it out. One message, no handshake, no
  registration of the caller's buffers, and the sender need not wait for the
  acknowledgement (its buffer is free once copied).
- rendezvous (larger blocks): RDMA WRITE WITH IMMEDIATE into the buffer the receiver
  advertised (a ready-to-receive control message with address, rkey and length), in chunks of
  at most `chunk` bytes with at most `window` bytes of one message in flight: zero copies.
Control messages (ready-to-receive, tokens, aborts) are small SENDs into the same slots.
"""

from __future__ import annotations

import ctypes
import itertools
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyverbs.enums as e

from rxelab.codecs import BY_ID
from rxelab.errors import MismatchError, PeerError, ProtocolError
from rxelab.verbs import Connection, Device, status_str

CTRL = struct.Struct("!BBHIIIQQ")  # kind, version, reserved, tag, rkey, codec, addr, length
CTRL_VERSION = 2  # 2: a ready-to-receive names the codec of the block it awaits
RTR, TOKEN, ABORT, RTS, MOVING = 1, 2, 3, 4, 5
FAILED, STALLED, DIED, MISMATCH = 0, 1, 2, 3  # why a rank aborted
ABORT_REASONS = {FAILED: "it failed", STALLED: "no progress from", DIED: "it found dead",
                 MISMATCH: "counts disagree with"}
# The immediate of a progress notice: no tag is all ones (collective tags use 30 bits, p2p
# and user tags leave bits clear), and it reads the same in either byte order.
PROGRESS_IMM = 0xFFFFFFFF
SEND_BIT = 1 << 63
DATA_BIT = 1 << 62
POLL_BATCH = 32
WATCH_EVERY = 0.25  # seconds between looks at the control connections while waiting
SIGNAL_EVERY = 8  # at most this many slot sends per completion
SPINS = 1  # empty polls before sleeping until a completion comes (see Engine.wait)
BACKOFF = 0.0002  # the sleep instead, where there is no completion channel
EXPLAIN_S = 0.5  # how long a failed work request waits for a peer to say why


@dataclass
class WriteOp:
    peer: int
    tag: int
    addr: int
    lkey: int
    length: int
    remote_addr: int
    rkey: int
    imm: bool = True
    notify: bool = True  # progress notices every window (the receiver is in a wait, polling)
    watchers: Iterable[int] = ()  # other ranks that wait on this transfer: told it moves too
    posted: int = 0
    done: int = 0
    chunks_posted: int = 0
    chunks_done: int = 0

    @property
    def complete(self) -> bool:
        return self.chunks_posted > 0 and self.posted == self.length and \
            self.chunks_done == self.chunks_posted


@dataclass
class Counters:
    bytes_sent: int = 0
    bytes_received: int = 0
    coded_raw: int = 0  # bytes of blocks this rank coded and sent (rxelab.codecs)
    coded_wire: int = 0  # what they took on the wire
    codec_seconds: float = 0.0  # CPU time coding and decoding
    inflight: int = 0
    peak_inflight: int = 0


@dataclass
class Arrival:
    count: int = 0  # messages whose last chunk's notice came and nobody took yet


class SendOp:
    """An eager block or control message on its way; done once the peer acknowledged it."""

    __slots__ = ("peer", "done")

    def __init__(self, peer: int, done: bool = False) -> None:
        self.peer, self.done = peer, done

    @property
    def complete(self) -> bool:
        return self.done


UNTRACKED = SendOp(-1, done=True)  # what an unacknowledged eager send returns: nothing to wait on


@dataclass
class Mailbox:
    rtr: dict[tuple[int, int], tuple[int, int, int, int]] = field(default_factory=dict)
    rts: dict[tuple[int, int], int] = field(default_factory=dict)  # -> the sender's byte count
    tokens: set[tuple[int, int]] = field(default_factory=set)
    arrivals: dict[tuple[int, int], Arrival] = field(default_factory=dict)
    eager: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # -> slot, bytes
    aborts: dict[int, str] = field(default_factory=dict)


class Engine:
    def __init__(self, dev: Device, conns: dict[int, Connection], *,
                 timeout: float, window: int, chunk: int, send_depth: int,
                 eager_limit: int = 0, watch: Callable[[], None] | None = None) -> None:
        self.dev = dev
        self.watch = watch
        self.armed = False  # an event is requested on the completion channel
        self.eager_limit = eager_limit
        self.conns = conns
        self.timeout = timeout
        self.window = window
        self.chunk = max(1, min(chunk, window))
        self.send_depth = send_depth
        self.box = Mailbox()
        self.counters = Counters()
        self.outstanding = {peer: 0 for peer in conns}
        self.pending: deque[WriteOp] = deque()
        self.in_flight_chunks: dict[int, tuple[WriteOp, int]] = {}
        self.ids = itertools.count(1)

    # ---- posting ----------------------------------------------------------------------
    def _send_slot(self, peer: int) -> tuple[Connection, int]:
        conn = self.conns[peer]
        if not conn.free_send_slots or self.outstanding[peer] >= self.send_depth:
            self.wait(lambda: bool(conn.free_send_slots) and self.outstanding[peer] < self.send_depth,
                      f"a free send slot towards rank {peer}", peer)
        return conn, conn.free_send_slots.pop()

    def send_ctrl(self, peer: int, kind: int, tag: int, rkey: int = 0, addr: int = 0,
                  length: int = 0, acked: bool = False, codec: int = 0) -> SendOp:
        """codec: a ready-to-receive's, the codec the receiver decodes with (rxelab.codecs;
        0: the block lands as it is)."""
        conn, slot = self._send_slot(peer)
        conn.send_mr.write(CTRL.pack(kind, CTRL_VERSION, 0, tag, rkey, codec, addr, length),
                           CTRL.size, slot * conn.slot_size)
        return self._post_slot(conn, slot, e.IBV_WR_SEND, CTRL.size, 0, acked)

    def send_eager(self, peer: int, addr: int, length: int, tag: int,
                   acked: bool = False) -> SendOp:
        """Copy `length` bytes at addr into a send slot and SEND them with the tag; the
        caller's buffer is free again as soon as this returns. With acked, the SendOp
        completes when the peer acknowledged it; without, it is complete at once (there is
        nothing to wait for)."""
        conn, slot = self._send_slot(peer)
        counters = self.counters
        if length:
            ctypes.memmove(conn.send_base + slot * conn.slot_size, addr, length)
            counters.inflight += length  # in flight until a completion answers for its slot
            if counters.inflight > counters.peak_inflight:
                counters.peak_inflight = counters.inflight
        counters.bytes_sent += length
        return self._post_slot(conn, slot, e.IBV_WR_SEND_WITH_IMM, length, socket.htonl(tag),
                               acked, length)

    def _post_slot(self, conn: Connection, slot: int, opcode: int, length: int, imm: int,
                   acked: bool = False, payload: int = 0) -> SendOp:
        """Post from a send slot. Most go unsignaled (no completion of their own: less work
        for the device and for us); every SIGNAL_EVERY-th, or when slots run short, is
        signaled, and its completion gives back the slots of those before it (RC completes a
        queue's work in order). The last one before the send depth is full is signaled too,
        or a small send_depth could fill up with sends that never report back. Only an acked
        send (or a signaled one) gets an op of its own to wait on."""
        peer = conn.peer
        signaled = acked or len(conn.unsignaled) >= SIGNAL_EVERY - 1 \
            or len(conn.free_send_slots) < SIGNAL_EVERY \
            or self.outstanding[peer] + 1 >= self.send_depth
        if signaled:  # it answers for the unsignaled ones before it, and their eager bytes
            op = SendOp(peer)
            conn.slot_ops[slot] = (op, conn.unsignaled, conn.unsignaled_bytes + payload)
            conn.unsignaled = []
            conn.unsignaled_bytes = 0
        else:
            op = UNTRACKED
            conn.unsignaled.append(slot)
            conn.unsignaled_bytes += payload
        self.outstanding[peer] += 1
        conn.post(SEND_BIT | (peer << 32) | slot, opcode,
                  conn.send_base + slot * conn.slot_size, length, conn.send_mr.lkey, imm=imm,
                  signaled=signaled)
        return op

    def _tell_moving(self, peer: int) -> None:
        """A progress notice to a rank that waits for this transfer to end (its turn comes
        after it), if a send slot is free at once: never waited for (this runs while posting,
        inside progress())."""
        conn = self.conns[peer]
        if conn.free_send_slots and self.outstanding[peer] + 1 < self.send_depth:
            slot = conn.free_send_slots.pop()
            conn.send_mr.write(CTRL.pack(MOVING, CTRL_VERSION, 0, 0, 0, 0, 0, 0), CTRL.size,
                               slot * conn.slot_size)
            self._post_slot(conn, slot, e.IBV_WR_SEND, CTRL.size, 0)

    def flush(self, peer: int) -> SendOp:
        """A signaled zero-length RDMA write (it touches no memory and no receive): when it
        completes, everything posted to `peer` before it has."""
        conn, slot = self._send_slot(peer)
        return self._post_slot(conn, slot, e.IBV_WR_RDMA_WRITE, 0, 0, acked=True)

    def write(self, peer: int, addr: int, lkey: int, length: int, remote_addr: int, rkey: int,
              tag: int, imm: bool = True, notify: bool = True,
              watchers: Iterable[int] = ()) -> WriteOp:
        """Start writing `length` bytes; the engine posts chunks as the window allows. With
        notify, a long message carries progress notices: only where the receiver waits for
        it (collectives, send/recv), since each takes one of its receive slots, and a receiver
        that does not poll (a one-sided target, busy elsewhere) would hold the writer up."""
        if length == 0:  # still one (empty) write, so the receiver is notified
            conn = self.conns[peer]
            addr, lkey = conn.send_mr.buf, conn.send_mr.lkey
        op = WriteOp(peer, tag, addr, lkey, length, remote_addr, rkey, imm, notify, watchers)
        self.pending.append(op)
        self._post_pending()
        return op

    def _post_pending(self) -> None:
        for _ in range(len(self.pending)):
            op = self.pending.popleft()
            conn = self.conns[op.peer]
            while (op.posted < op.length or op.chunks_posted == 0) \
                    and op.posted - op.done < self.window \
                    and self.outstanding[op.peer] < self.send_depth:
                n = min(self.chunk, op.length - op.posted)
                wr_id = SEND_BIT | DATA_BIT | (op.peer << 40) | (next(self.ids) & ((1 << 40) - 1))
                # Only the last chunk carries the message's immediate: one notice per message
                # (two writes with the same tag stay two), and RC's order puts every earlier
                # chunk in place before it. A long message also carries a progress notice
                # every `window` bytes, so a receiver that waits for it sees it move (its
                # no-progress deadline is for transfers that stall, not for slow ones).
                end = op.posted + n
                last = end == op.length
                moving = not last and op.notify and op.imm \
                    and end // self.window != op.posted // self.window
                opcode = e.IBV_WR_RDMA_WRITE_WITH_IMM if op.imm and last or moving \
                    else e.IBV_WR_RDMA_WRITE
                conn.post(wr_id, opcode, op.addr + op.posted, n, op.lkey,
                          op.remote_addr + op.posted, op.rkey,
                          PROGRESS_IMM if moving else socket.htonl(op.tag))
                if moving:
                    for watcher in op.watchers:
                        self._tell_moving(watcher)
                self.in_flight_chunks[wr_id] = (op, n)
                self.outstanding[op.peer] += 1
                op.posted += n
                op.chunks_posted += 1
                self.counters.inflight += n
                self.counters.peak_inflight = max(self.counters.peak_inflight,
                                                  self.counters.inflight)
            if op.posted < op.length or op.chunks_posted == 0:
                self.pending.append(op)

    # ---- completions --------------------------------------------------------------------
    def progress(self) -> bool:
        n, wcs = self.dev.cq.poll(POLL_BATCH)
        failure = None
        for wc in wcs:
            try:
                self._complete(wc)
            except PeerError as err:  # file the rest first: an abort among them says why
                failure = failure or err
        if failure is not None:
            self._explain(failure)
        if n and self.pending:
            self._post_pending()
        return bool(n)

    def _explain(self, failure: PeerError) -> None:
        """A work request failed: raise it with why, when a peer said (its abort notice) or
        the control plane knows (a rank gone). A rank that fails closes its memory to peers at
        once, so a peer's write to it can fail before its notice arrives: wait a moment for
        the notice, then say what is known."""
        end = time.monotonic() + EXPLAIN_S
        while True:
            if self.box.aborts:
                who, why = next(iter(self.box.aborts.items()))
                raise PeerError(f"rank {who} stopped the operation ({why}); then: {failure}",
                                peer=who)
            if self.watch is not None:
                try:
                    self.watch()
                except PeerError as known:
                    raise PeerError(f"{known}; then: {failure}", peer=known.peer) from None
            if time.monotonic() > end:
                raise failure
            n, wcs = self.dev.cq.poll(POLL_BATCH)
            for wc in wcs:
                try:
                    self._complete(wc)
                except PeerError:  # more of the same: the first says what failed
                    pass
            if not n:
                time.sleep(0.005)

    def _complete(self, wc: Any) -> None:
        wr_id = wc.wr_id
        if wr_id & SEND_BIT:
            peer = (wr_id >> 40) & 0xFFFFF if wr_id & DATA_BIT else (wr_id >> 32) & 0xFFFFF
            self.outstanding[peer] -= 1
            if wc.status != e.IBV_WC_SUCCESS:
                what = "RDMA write" if wr_id & DATA_BIT else "control send"
                raise PeerError(f"{what} to rank {peer} failed: {status_str(wc.status)}"
                                f" (vendor error {wc.vendor_err})", peer=peer,
                                hint="the peer may have died or closed its connection")
            if wr_id & DATA_BIT:
                op, n = self.in_flight_chunks.pop(wr_id)
                op.done += n
                op.chunks_done += 1
                self.counters.inflight -= n
                self.counters.bytes_sent += n
            else:
                conn = self.conns[peer]
                slot = wr_id & 0xFFFFFFFF
                op, before, eager_bytes = conn.slot_ops.pop(slot)
                conn.free_send_slots.extend(before)
                self.outstanding[peer] -= len(before)
                op.done = True
                conn.free_send_slots.append(slot)
                self.counters.inflight -= eager_bytes
            return
        peer, slot = (wr_id >> 32) & 0xFFFFF, wr_id & 0xFFFFFFFF
        if wc.status != e.IBV_WC_SUCCESS:
            raise PeerError(f"receive from rank {peer} failed: {status_str(wc.status)}", peer=peer)
        conn = self.conns[peer]
        if wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM:
            if wc.imm_data != PROGRESS_IMM:  # a progress notice only says the data moves
                tag = socket.ntohl(wc.imm_data)
                arrival = self.box.arrivals.setdefault((peer, tag), Arrival())
                arrival.count += 1
        elif wc.wc_flags & e.IBV_WC_WITH_IMM:  # eager data: the slot is held until consumed
            key = (peer, socket.ntohl(wc.imm_data))
            if key in self.box.eager:
                raise ProtocolError(f"rank {peer} sent a second eager block with tag "
                                    f"{key[1]:#x} before the first was taken")
            self.box.eager[key] = (slot, wc.byte_len)
            return
        else:
            self._file_ctrl(peer, conn.slot_bytes(slot, CTRL.size), wc.byte_len)
        conn.repost(slot)

    def _file_ctrl(self, peer: int, data: bytes, length: int) -> None:
        if length != CTRL.size:
            raise ProtocolError(f"control message of {length} bytes from rank {peer}, "
                                f"expected {CTRL.size}")
        kind, version, _, tag, rkey, codec, addr, nbytes = CTRL.unpack(data)
        if version != CTRL_VERSION:
            raise ProtocolError(f"control message version {version} from rank {peer}")
        if kind == RTR:
            self.box.rtr[(peer, tag)] = (addr, rkey, nbytes, codec)
        elif kind == RTS:
            self.box.rts[(peer, tag)] = nbytes
        elif kind == TOKEN:
            self.box.tokens.add((peer, tag))
        elif kind == MOVING:  # only that a transfer this rank waits behind moves: the
            pass  # completion itself was the news (the wait's deadline starts again)
        elif kind == ABORT:
            reason = ABORT_REASONS.get(rkey, "it failed")
            self.box.aborts[peer] = reason if rkey == FAILED or not addr else f"{reason} rank {addr - 1}"
        else:
            raise ProtocolError(f"unknown control message kind {kind} from rank {peer}")

    # ---- waiting ------------------------------------------------------------------------
    def wait(self, cond: Callable[[], bool], what: str, peer: int | None = None,
             patience: float = 1.0) -> None:
        """Until cond() holds. The deadline is one of no progress: `timeout` seconds in which
        not one completion arrived (a slow transfer that moves is not cut off; a stalled one
        is, naming what it waited for), times `patience`: a rank waiting its turn behind k
        pairs of the sequential schedule allows each of them the deadline. A peer whose
        process died is noticed sooner, by its control connection (watch).

        An empty poll sleeps at once until the next completion (after SPINS empty polls):
        ranks share cores (several per VM, VMs per core), and a rank that polls takes the CPU
        from the peers and from rxe, whose packet work runs in the kernel; on the 3-VM lab one
        spinning rank per VM made a 1 KiB all-to-all 2x slower, and 20 polls before sleeping
        7 % slower, than sleeping at once (measured; README). This loop runs once or twice per
        block on the hot path, so it does little: the clock is read only when a poll came
        back empty."""
        progress = self.progress
        box = self.box
        idle_since = None  # when polls started coming back empty
        next_watch = None  # the peers are looked at every WATCH_EVERY s of the wait, even
        spins = 0  # while other completions keep coming (a dead peer's block never does)
        while True:
            if box.aborts:  # before cond: an abort filed with what we wait for comes first
                who, why = next(iter(box.aborts.items()))
                raise PeerError(f"rank {who} stopped the operation ({why}) while this rank "
                                f"waited for {what}", peer=who)
            if cond():
                return
            if progress():
                idle_since = None
                spins = 0
                continue
            now = time.monotonic()
            if next_watch is None:
                next_watch = now + WATCH_EVERY
            if idle_since is None:
                idle_since = now
            elif now - idle_since > self.timeout * patience:
                raise PeerError(f"no progress for {self.timeout * patience:g} s while waiting for {what}",
                                peer=peer, hint="a peer may have died, hung, or called a "
                                                "different operation")
            if now > next_watch and self.watch is not None:
                next_watch = now + WATCH_EVERY
                self.watch()
            spins += 1
            if spins >= SPINS:
                self._block(min(WATCH_EVERY, self.timeout * patience - (now - idle_since)))

    def _block(self, seconds: float) -> None:
        dev = self.dev
        if dev.channel_fd is None:
            time.sleep(BACKOFF)
        elif not self.armed:  # arm, then poll once more before sleeping (no lost wake-up)
            dev.arm()
            self.armed = True
        elif select.select([dev.channel_fd], [], [], max(0.0, seconds))[0]:
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
                              f"{_coding(codec)}",
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
        raise ProtocolError(f"{what}: rank {peer} sends {sent} bytes to this rank, which expects "
                            f"{expected}", hint="send and receive counts must match pairwise")

    def wait_ops(self, ops: Sequence[WriteOp | SendOp], what: str) -> None:
        for op in ops:
            self.wait(lambda op=op: bool(op.complete), f"rank {op.peer} to acknowledge {what}",  # type: ignore[misc]
                      op.peer)

    def drain(self, seconds: float) -> bool:
        """Wait (bounded) until every work request we posted has completed, so the last token
        or write of a collective reaches its peer before our QPs go. True when drained."""
        end = time.monotonic() + seconds
        for peer, conn in self.conns.items():
            if conn.unsignaled:
                self.flush(peer)
        while any(self.outstanding.values()) or self.pending:
            if time.monotonic() > end:
                return False
            if not self.progress():
                time.sleep(0.0001)
        return True

    def post_aborts(self, tag: int, why: int = FAILED, blamed: int | None = None) -> list[SendOp]:
        """Best effort: tell every peer to stop waiting for this rank, and why (one of
        ABORT_REASONS, and the rank this one blames, if any)."""
        notices = []
        for peer in self.conns:
            try:
                notices.append(self.send_ctrl(peer, ABORT, tag, rkey=why,
                                              addr=0 if blamed is None else blamed + 1, acked=True))
            except Exception:  # the peer may be the one that is gone
                pass
        return notices

    def await_notices(self, notices: list[SendOp]) -> None:
        """Wait up to a second for the notices to be acknowledged, whatever else fails."""
        end = time.monotonic() + 1.0
        while time.monotonic() < end and not all(n.done for n in notices):
            try:
                if not self.progress():
                    time.sleep(0.0005)
            except Exception:  # a failed completion of a dead peer's work
                pass


def _coding(codec: int) -> str:
    return f"blocks coded with {BY_ID[codec].name}" if codec in BY_ID else \
        "blocks as they are" if codec == 0 else f"blocks in an unknown coding ({codec})"

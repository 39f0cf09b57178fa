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

This module posts and completes; the waits and the mailbox are rxelab.waits, the formats on
the wire rxelab.messages. It speaks verbs' vocabulary (rxelab.transports.base) to whichever
transport the communicator opened.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from rxelab import abort_notices
from rxelab.errors import Mismatch, PeerError, ProtocolError, Reason
from rxelab.messages import (
    ABORT,
    ABORT_CODE,
    CAUSE,
    CTRL,
    CTRL_VERSION,
    DATA_BIT,
    MOVING,
    PROGRESS_IMM,
    RTR,
    RTS,
    SEND_BIT,
    TOKEN,
    UNTRACKED,
    AbortReason,
    SendOp,
    WriteOp,
)
from rxelab.transports import base
from rxelab.transports.base import Connection, Device
from rxelab.waits import EXPLAIN_S, WATCH_EVERY, Arrival, Counters, Mailbox, Waits

__all__ = ["WATCH_EVERY", "Engine"]  # WATCH_EVERY: how often a wait looks at the peers

POLL_BATCH = 32
SIGNAL_EVERY = 8  # at most this many slot sends per completion
NOTICE_S = 1.0  # how long a failed rank waits for its abort notices to be acknowledged
log = logging.getLogger(__name__)


class Engine(Waits):
    def __init__(self, dev: Device, conns: dict[int, Connection], *,
                 timeout: float, window: int, chunk: int, send_depth: int,
                 eager_limit: int = 0, watch: Callable[[], None] | None = None,
                 spin_s: float = 0.0, rank: int | None = None) -> None:
        self.dev = dev
        # this rank: the one the connections, one to every other rank, leave out
        self.rank = rank if rank is not None else min(set(range(len(conns) + 1)) - set(conns))
        self.watch = watch
        self.armed = False  # an event is requested on the completion channel
        self.eager_limit = eager_limit
        self.conns = conns
        self.timeout = timeout
        self.spin_s = spin_s
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
                  length: int = 0, acked: bool = False, codec: int = 0,
                  extra: bytes = b"") -> SendOp:
        """codec: a ready-to-receive's, the codec the receiver decodes with (rxelab.codecs;
        0: the block lands as it is); extra: what follows the message (an abort's CAUSE)."""
        conn, slot = self._send_slot(peer)
        message = CTRL.pack(kind, CTRL_VERSION, 0, tag, rkey, codec, addr, length) + extra
        conn.send_mr.write(message, len(message), slot * conn.slot_size)
        return self._post_slot(conn, slot, base.WR_SEND, len(message), 0, acked)

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
        return self._post_slot(conn, slot, base.WR_SEND_WITH_IMM, length, socket.htonl(tag),
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
            self._post_slot(conn, slot, base.WR_SEND, CTRL.size, 0)

    def flush(self, peer: int) -> SendOp:
        """A signaled zero-length RDMA write (it touches no memory and no receive): when it
        completes, everything posted to `peer` before it has."""
        conn, slot = self._send_slot(peer)
        return self._post_slot(conn, slot, base.WR_RDMA_WRITE, 0, 0, acked=True)

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
                opcode = base.WR_RDMA_WRITE_WITH_IMM if op.imm and last or moving \
                    else base.WR_RDMA_WRITE
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
                raise self.stopped(f"; then: {failure}")
            if self.watch is not None:
                try:
                    self.watch()
                except PeerError as known:
                    said = self.heard(known, f"; then: {failure}")
                    if said is not known:
                        raise said from None
                    raise PeerError(f"{known}; then: {failure}", peer=known.peer,
                                    reason=known.reason) from None
            if time.monotonic() > end:
                raise failure
            if not self.poll_quietly():
                time.sleep(0.005)

    def poll_quietly(self, unreachable: set[int | None] | None = None) -> int:
        """One poll of the completions, of a call that failed already: a failed completion
        (PeerError) or a malformed message (ProtocolError) among them is more of the same
        (the first failure says what failed); the peers of failed completions go into
        `unreachable`, if given (their connections are down). Anything else _complete raises
        is a fault of this rank's own and goes up: hidden here, it would pass for a peer's."""
        n, wcs = self.dev.cq.poll(POLL_BATCH)
        for wc in wcs:
            try:
                self._complete(wc)
            except PeerError as err:
                if unreachable is not None:
                    unreachable.add(err.peer)
            except ProtocolError:  # more of the same
                pass
        return n

    def _complete(self, wc: Any) -> None:
        wr_id = wc.wr_id
        if wr_id & SEND_BIT:
            peer = (wr_id >> 40) & 0xFFFFF if wr_id & DATA_BIT else (wr_id >> 32) & 0xFFFFF
            self.outstanding[peer] -= 1
            if wc.status != base.WC_SUCCESS:
                what = "RDMA write" if wr_id & DATA_BIT else "control send"
                raise PeerError(f"{what} to rank {peer} failed: {self.dev.status_str(wc.status)}"
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
        if wc.status != base.WC_SUCCESS:
            raise PeerError(f"receive from rank {peer} failed: {self.dev.status_str(wc.status)}", peer=peer)
        conn = self.conns[peer]
        if wc.opcode == base.WC_RECV_RDMA_WITH_IMM:
            if wc.imm_data != PROGRESS_IMM:  # a progress notice only says the data moves
                tag = socket.ntohl(wc.imm_data)
                arrival = self.box.arrivals.setdefault((peer, tag), Arrival())
                arrival.count += 1
        elif wc.wc_flags & base.WC_WITH_IMM:  # eager data: the slot is held until consumed
            key = (peer, socket.ntohl(wc.imm_data))
            if key in self.box.eager:
                raise ProtocolError(f"rank {peer} sent a second eager block with tag "
                                    f"{key[1]:#x} before the first was taken")
            self.box.eager[key] = (slot, wc.byte_len)
            return
        else:
            caused = wc.byte_len == CTRL.size + CAUSE.size
            self._file_ctrl(peer, conn.slot_bytes(slot, wc.byte_len if caused else CTRL.size),
                            wc.byte_len)
        conn.repost(slot)

    def _file_ctrl(self, peer: int, data: bytes, length: int) -> None:
        if length not in (CTRL.size, CTRL.size + CAUSE.size):
            raise ProtocolError(f"control message of {length} bytes from rank {peer}, "
                                f"expected {CTRL.size}")
        kind, version, _, tag, rkey, codec, addr, nbytes = CTRL.unpack(data[:CTRL.size])
        if version != CTRL_VERSION:
            raise ProtocolError(f"control message version {version} from rank {peer}")
        if length != CTRL.size and kind != ABORT:  # only an abort says more: its cause
            raise ProtocolError(f"control message of {length} bytes from rank {peer}, "
                                f"expected {CTRL.size}")
        if kind == RTR:
            self.box.rtr[(peer, tag)] = (addr, rkey, nbytes, codec)
        elif kind == RTS:
            self.box.rts[(peer, tag)] = nbytes
        elif kind == TOKEN:
            self.box.tokens.add((peer, tag))
        elif kind == MOVING:  # only that a transfer this rank waits behind moves: the
            pass  # completion itself was the news (the wait's deadline starts again)
        elif kind == ABORT:  # every field checked; a malformed one stops the call as such
            if peer not in self.box.aborts:  # a rank's first notice says why
                self.box.aborts[peer] = abort_notices.read(peer, len(self.conns) + 1, rkey, addr,
                                                           codec, nbytes, data[CTRL.size:length])
        else:
            raise ProtocolError(f"unknown control message kind {kind} from rank {peer}")

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

    def post_aborts(self, tag: int, why: AbortReason = Reason.FAILED, blamed: int | None = None,
                    cause: Mismatch | None = None) -> list[SendOp]:
        """Best effort: tell every peer to stop waiting for this rank, and why (an AbortReason,
        sent as its ABORT_CODE; and the rank this one blames, if any); a mismatch that started
        the failure, found here or told by a peer, goes along (CAUSE) where the wire can carry
        it: the notices go all the same where it cannot (a count out of range, a bug's)."""
        notices = []
        try:
            extra = b"" if cause is None else CAUSE.pack(cause.sender, cause.receiver,
                                                         cause.sent, cause.expected)
        except struct.error as err:
            log.debug("rank %d's abort notices go without their cause %s: %s", self.rank, cause, err)
            extra = b""
        for peer in self.conns:
            try:
                notices.append(self.send_ctrl(peer, ABORT, tag, rkey=ABORT_CODE[why],
                                              addr=0 if blamed is None else blamed + 1, acked=True,
                                              extra=extra))
            except Exception:  # the peer may be the one that is gone
                pass
        return notices

    def await_notices(self, notices: list[SendOp]) -> None:
        """Wait up to NOTICE_S for the notices to be acknowledged, whatever else fails; a
        peer whose connection failed is not waited for (its notice will not arrive)."""
        end = time.monotonic() + NOTICE_S
        unreachable: set[int | None] = set()
        while waiting := sorted(n.peer for n in notices if not n.done and n.peer not in unreachable):
            if time.monotonic() > end:
                log.debug("rank %d gave up after %g s waiting for rank%s %s to acknowledge its "
                          "abort notices", self.rank, NOTICE_S, "s"[:len(waiting) - 1],
                          ", ".join(map(str, waiting)))
                return
            n = self.poll_quietly(unreachable)
            if n and self.pending:
                self._post_pending()
            if not n:
                time.sleep(0.0005)



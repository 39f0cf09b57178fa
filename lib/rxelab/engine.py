"""The progress engine: posts work, polls the one completion queue, and files what arrives
into a mailbox that the operations wait on, each wait with a deadline that names what it
waited for.

Data moves by RDMA WRITE WITH IMMEDIATE into buffers the receiver advertised (a
ready-to-receive control message carrying address, rkey and length), in chunks of at most
`chunk` bytes, with at most `window` bytes of one message in flight. The immediate value is
the operation's tag, so the receiver learns of each arrival without any copy. Control
messages (ready-to-receive, tokens, aborts) are small SENDs into generic receive slots.
"""

from __future__ import annotations

import itertools
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyverbs.enums as e

from rxelab.errors import PeerError, ProtocolError
from rxelab.verbs import SLOT_BYTES, Connection, Device, status_str

CTRL = struct.Struct("!BBHIIIQQ")  # kind, version, reserved, tag, rkey, pad, addr, length
CTRL_VERSION = 1
RTR, TOKEN, ABORT = 1, 2, 3
KIND_NAMES = {RTR: "ready-to-receive", TOKEN: "token", ABORT: "abort"}
SEND_BIT = 1 << 63
DATA_BIT = 1 << 62
POLL_BATCH = 32


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
    inflight: int = 0
    peak_inflight: int = 0
    messages: int = 0


@dataclass
class Arrival:
    count: int = 0
    nbytes: int = 0


@dataclass
class Mailbox:
    rtr: dict[tuple[int, int], tuple[int, int, int]] = field(default_factory=dict)
    tokens: set[tuple[int, int]] = field(default_factory=set)
    arrivals: dict[tuple[int, int], Arrival] = field(default_factory=dict)
    aborts: dict[int, str] = field(default_factory=dict)


class Engine:
    def __init__(self, dev: Device, conns: dict[int, Connection], *,
                 timeout: float, window: int, chunk: int, send_depth: int) -> None:
        self.dev = dev
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
    def send_ctrl(self, peer: int, kind: int, tag: int, rkey: int = 0, addr: int = 0,
                  length: int = 0) -> None:
        conn = self.conns[peer]
        deadline = time.monotonic() + self.timeout
        while not conn.free_send_slots or self.outstanding[peer] >= self.send_depth:
            self._wait_step(deadline, f"a free send slot towards rank {peer}", peer)
        slot = conn.free_send_slots.pop()
        conn.send_mr.write(CTRL.pack(kind, CTRL_VERSION, 0, tag, rkey, 0, addr, length),
                           CTRL.size, slot * SLOT_BYTES)
        self.outstanding[peer] += 1
        conn.post(SEND_BIT | (peer << 32) | slot, e.IBV_WR_SEND,
                  conn.send_mr.buf + slot * SLOT_BYTES, CTRL.size, conn.send_mr.lkey)

    def write(self, peer: int, addr: int, lkey: int, length: int, remote_addr: int, rkey: int,
              tag: int, imm: bool = True) -> WriteOp:
        """Start writing `length` bytes; the engine posts chunks as the window allows."""
        if length == 0:  # still one (empty) write, so the receiver is notified
            conn = self.conns[peer]
            addr, lkey = conn.send_mr.buf, conn.send_mr.lkey
        op = WriteOp(peer, tag, addr, lkey, length, remote_addr, rkey, imm)
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
                opcode = e.IBV_WR_RDMA_WRITE_WITH_IMM if op.imm else e.IBV_WR_RDMA_WRITE
                conn.post(wr_id, opcode, op.addr + op.posted, n, op.lkey,
                          op.remote_addr + op.posted, op.rkey, socket.htonl(op.tag))
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
        for wc in wcs:
            self._complete(wc)
        if n:
            self._post_pending()
        return bool(n)

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
                self.conns[peer].free_send_slots.append(wr_id & 0xFFFFFFFF)
            return
        peer, slot = (wr_id >> 32) & 0xFFFFF, wr_id & 0xFFFFFFFF
        if wc.status != e.IBV_WC_SUCCESS:
            raise PeerError(f"receive from rank {peer} failed: {status_str(wc.status)}", peer=peer)
        conn = self.conns[peer]
        if wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM:
            tag = socket.ntohl(wc.imm_data)
            arrival = self.box.arrivals.setdefault((peer, tag), Arrival())
            arrival.count += 1
            arrival.nbytes += wc.byte_len
            self.counters.bytes_received += wc.byte_len
        else:
            self._file_ctrl(peer, conn.slot_bytes(slot, CTRL.size), wc.byte_len)
        conn.repost(slot)

    def _file_ctrl(self, peer: int, data: bytes, length: int) -> None:
        if length != CTRL.size:
            raise ProtocolError(f"control message of {length} bytes from rank {peer}, "
                                f"expected {CTRL.size}")
        kind, version, _, tag, rkey, _, addr, nbytes = CTRL.unpack(data)
        if version != CTRL_VERSION:
            raise ProtocolError(f"control message version {version} from rank {peer}")
        if kind == RTR:
            self.box.rtr[(peer, tag)] = (addr, rkey, nbytes)
        elif kind == TOKEN:
            self.box.tokens.add((peer, tag))
        elif kind == ABORT:
            self.box.aborts[peer] = f"tag {tag:#x}"
        else:
            raise ProtocolError(f"unknown control message kind {kind} from rank {peer}")

    # ---- waiting ------------------------------------------------------------------------
    def _wait_step(self, deadline: float, what: str, peer: int | None,
                   spins: list[int] | None = None) -> None:
        if self.box.aborts:
            who, why = next(iter(self.box.aborts.items()))
            raise PeerError(f"rank {who} aborted the operation ({why}) while this rank waited "
                            f"for {what}", peer=who)
        if self.progress():
            return
        if time.monotonic() > deadline:
            raise PeerError(f"timed out after {self.timeout:g} s waiting for {what}", peer=peer,
                            hint="a peer may have died, hung, or called a different operation")
        # Back off instead of spinning: ranks share cores (several per VM, VMs per core).
        time.sleep(0 if spins is None or spins[0] < 50 else 0.0002)
        if spins is not None:
            spins[0] += 1

    def wait(self, cond: Callable[[], bool], what: str, peer: int | None = None) -> None:
        deadline = time.monotonic() + self.timeout
        spins = [0]
        while not cond():
            self._wait_step(deadline, what, peer, spins)

    def wait_rtr(self, peer: int, tag: int, what: str) -> tuple[int, int, int]:
        key = (peer, tag)
        self.wait(lambda: key in self.box.rtr, f"rank {peer}'s buffer for {what}", peer)
        return self.box.rtr.pop(key)

    def wait_token(self, peer: int, tag: int, what: str) -> None:
        key = (peer, tag)
        self.wait(lambda: key in self.box.tokens, f"the turn from rank {peer} ({what})", peer)
        self.box.tokens.discard(key)

    def wait_data(self, peer: int, tag: int, length: int, what: str) -> None:
        key = (peer, tag)

        def arrived() -> bool:
            a = self.box.arrivals.get(key)
            return a is not None and a.count > 0 and a.nbytes >= length

        self.wait(arrived, f"{length} bytes from rank {peer} ({what})", peer)
        a = self.box.arrivals.pop(key)
        if a.nbytes != length:
            raise ProtocolError(f"rank {peer} wrote {a.nbytes} bytes for {what}, expected {length}")

    def wait_ops(self, ops: list[WriteOp], what: str) -> None:
        for op in ops:
            self.wait(lambda op=op: op.complete, f"rank {op.peer} to acknowledge {what}", op.peer)

    def abort_all(self, tag: int) -> None:
        """Best effort: tell every peer to stop waiting for this rank."""
        for peer in self.conns:
            try:
                self.send_ctrl(peer, ABORT, tag)
            except Exception:  # noqa: BLE001 - the peer may be the one that is gone
                pass
        end = time.monotonic() + 1.0
        while time.monotonic() < end and any(self.outstanding.values()):
            try:
                self.progress()
            except Exception:  # noqa: BLE001
                break

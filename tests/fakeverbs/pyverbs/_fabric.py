"""An in-memory RDMA fabric with reliable-connection semantics, for tests without RDMA.

What it keeps of RC, because rxelab's correctness depends on it:
- per-QP order: a QP's work requests are carried out one after another, each after a random
  delay (seeded), while different QPs interleave freely;
- receiver not ready: a SEND or WRITE WITH IMMEDIATE that finds no posted receive waits and
  is retried (rnr_retry=7: forever), holding back everything behind it on that QP;
- keys and bounds: every local SGE must lie in a live MR of its lkey, every remote write in a
  live MR of its rkey with remote-write access; a violation completes in error (local
  protection, remote access) and moves the QP to the error state, flushing what follows;
- data is read from the sender's memory when the request is carried out, not when it is
  posted (unless inline), so a buffer reused before its completion shows up as wrong data;
- send-queue slots come back only with a polled completion (of that request or a later
  signaled one): posting more than the queue holds fails, as on hardware;
- a peer QP that is gone (closed, or never connected) fails the request with retry exceeded.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pyverbs import enums as e
from pyverbs.pyverbs_error import PyverbsRDMAError

DEVICE = "fake0"
# the devices the fake has, each its ports' states (port 1 first): a test may set others, e.g.
# a management HCA whose port is DOWN beside a data HCA (enums.IBV_PORT_*)
DEVICES: dict[str, tuple[int, ...]] = {DEVICE: (e.IBV_PORT_ACTIVE,)}
GID_TABLE_LEN = 4  # every port's: index 0 link-local, 1 RoCE v2 IPv4, the rest empty
MAX_INLINE = 256
RNR_DELAY = 0.001


@dataclass
class Op:
    wr_id: int
    opcode: int
    signaled: bool
    imm: int
    sges: list[tuple[int, int, int]]
    remote_addr: int
    rkey: int
    data: bytes | None  # inline: taken at post time


@dataclass(frozen=True)
class Delivery:
    """One work request as the wire carried it out (Fabric.trace)."""

    qpn: int  # the sending QP
    nbytes: int
    opcode: int
    imm: int
    head: bytes  # a SEND's first bytes (a control message's header)


@dataclass
class Stats:
    posted: int = 0
    signaled: int = 0
    inline: int = 0
    rnr: int = 0
    errors: int = 0
    bytes_moved: int = 0
    recvs_posted: int = 0
    aliased_sges: int = 0
    by_opcode: dict[int, int] = field(default_factory=dict)


class Fabric:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.wake = threading.Condition(self.lock)
        self.reset()
        self.thread = threading.Thread(target=self._wire, name="fake-fabric", daemon=True)
        self.thread.start()

    def reset(self, seed: int = 0, max_delay: float = 0.0002) -> None:
        """Forget everything (between tests); delays are uniform in [0, max_delay] seconds."""
        with self.lock:
            self.qps: dict[int, Any] = {}
            self.mrs: dict[int, Any] = {}
            self.outq: dict[int, deque[Op]] = {}
            self.keys = itertools.count(0x100)
            self.qpns = itertools.count(0x11)
            self.ips = itertools.count(1)
            self.rng = random.Random(seed)
            self.max_delay = max_delay
            self.heap: list[tuple[float, int, int]] = []
            self.seq = itertools.count()
            self.stats = Stats()
            self.trace: list[Delivery] | None = None  # as delivered, when a test asks

    def next_ip(self) -> tuple[int, int, int, int]:
        n = next(self.ips)
        return (10, 99, n // 256, n % 256)

    # ---- memory ---------------------------------------------------------------------
    def register(self, mr: Any) -> int:
        with self.lock:
            key = next(self.keys)
            self.mrs[key] = mr
            return key

    def deregister(self, mr: Any) -> None:
        with self.lock:
            self.mrs.pop(mr.lkey, None)

    def _mr_covers(self, key: int, addr: int, length: int, access: int = 0) -> bool:
        mr = self.mrs.get(key)
        return (mr is not None and mr.buf <= addr and addr + length <= mr.buf + mr.length
                and (mr.access & access) == access)

    # ---- queue pairs ----------------------------------------------------------------
    def add_qp(self, qp: Any) -> int:
        with self.lock:
            qpn = next(self.qpns)
            self.qps[qpn] = qp
            self.outq[qpn] = deque()
            return qpn

    def remove_qp(self, qp: Any) -> None:
        with self.lock:
            self.qps.pop(qp.qp_num, None)
            self.outq.pop(qp.qp_num, None)
            qp.state = e.IBV_QPS_RESET

    def post_recv(self, qp: Any, wr: Any) -> None:
        with self.lock:
            while wr is not None:
                if qp.state == e.IBV_QPS_ERR:
                    self._push(qp.init.rcq, wr.wr_id, e.IBV_WC_WR_FLUSH_ERR, e.IBV_WC_RECV, qp)
                elif len(qp.recvs) >= qp.init.cap.max_recv_wr:
                    raise PyverbsRDMAError("Failed to post recv (queue full)", 12)
                else:
                    qp.recvs.append(wr)
                    self.stats.recvs_posted += 1
                wr = wr.next_wr

    def post_send(self, qp: Any, wr: Any) -> None:
        with self.lock:
            while wr is not None:
                if qp.state != e.IBV_QPS_RTS and qp.state != e.IBV_QPS_ERR:
                    raise PyverbsRDMAError("Failed to post send (QP not ready to send)", 22)
                if qp.sq_used >= qp.init.cap.max_send_wr:
                    raise PyverbsRDMAError("Failed to post send (send queue full)", 12)
                sges = [(s.addr, s.length, s.lkey) for s in wr.sg[:wr.num_sge]]
                data = None
                if wr.send_flags & e.IBV_SEND_INLINE:
                    total = sum(n for _, n, _ in sges)
                    if total > qp.init.cap.max_inline_data:
                        raise PyverbsRDMAError(f"Failed to post send (inline {total} bytes)", 22)
                    data = b"".join(ctypes.string_at(a, n) for a, n, _ in sges)
                    self.stats.inline += 1
                signaled = bool(qp.init.sq_sig_all or wr.send_flags & e.IBV_SEND_SIGNALED)
                op = Op(wr.wr_id, wr.opcode, signaled, wr.imm_data, sges, wr.remote_addr,
                        wr.rkey, data)
                qp.sq_used += 1
                self.stats.posted += 1
                self.stats.signaled += signaled
                self.stats.by_opcode[wr.opcode] = self.stats.by_opcode.get(wr.opcode, 0) + 1
                queue = self.outq[qp.qp_num]
                queue.append(op)
                if len(queue) == 1:
                    self._schedule(qp.qp_num)
                wr = wr.next_wr

    def release(self, qpn: int, slots: int) -> None:
        """A send completion was polled: its slots (and earlier unsignaled ones) are free."""
        with self.lock:
            qp = self.qps.get(qpn)
            if qp is not None:
                qp.sq_used = max(0, qp.sq_used - slots)

    # ---- the wire -------------------------------------------------------------------
    def _schedule(self, qpn: int, delay: float | None = None) -> None:
        due = time.monotonic() + (self.rng.uniform(0, self.max_delay) if delay is None else delay)
        heapq.heappush(self.heap, (due, next(self.seq), qpn))
        self.wake.notify()

    def _wire(self) -> None:
        with self.lock:
            while True:
                if not self.heap:
                    self.wake.wait()
                    continue
                due, _, qpn = self.heap[0]
                now = time.monotonic()
                if due > now:
                    self.wake.wait(due - now)
                    continue
                heapq.heappop(self.heap)
                qp = self.qps.get(qpn)
                queue = self.outq.get(qpn)
                if qp is None or not queue:
                    continue
                if self._carry_out(qp, queue[0]):
                    queue.popleft()
                    if queue:
                        self._schedule(qpn)

    def _carry_out(self, qp: Any, op: Op) -> bool:
        """One work request, start to end. False: not yet (receiver not ready)."""
        send_op = e.IBV_WC_RDMA_WRITE if op.opcode in (e.IBV_WR_RDMA_WRITE,
                                                      e.IBV_WR_RDMA_WRITE_WITH_IMM) else e.IBV_WC_SEND
        if qp.state == e.IBV_QPS_ERR:
            self._complete_send(qp, op, e.IBV_WC_WR_FLUSH_ERR, send_op)
            return True
        if op.data is None:
            if not all(n == 0 or self._mr_covers(k, a, n) for a, n, k in op.sges):
                return self._fail(qp, op, e.IBV_WC_LOC_PROT_ERR, send_op)
            data = b"".join(ctypes.string_at(a, n) for a, n, _ in op.sges)
        else:
            data = op.data
        dest = self.qps.get(qp.remote_qpn)
        if dest is None or dest.state not in (e.IBV_QPS_RTR, e.IBV_QPS_RTS):
            return self._fail(qp, op, e.IBV_WC_RETRY_EXC_ERR, send_op)
        writes = op.opcode in (e.IBV_WR_RDMA_WRITE, e.IBV_WR_RDMA_WRITE_WITH_IMM)
        consumes = op.opcode != e.IBV_WR_RDMA_WRITE
        if writes and data and not self._mr_covers(op.rkey, op.remote_addr, len(data),
                                                   e.IBV_ACCESS_REMOTE_WRITE):
            # (a zero-length write checks no key, as the IB spec says)
            self._error_qp(dest)
            return self._fail(qp, op, e.IBV_WC_REM_ACCESS_ERR, send_op)
        if consumes and not dest.recvs:
            self.stats.rnr += 1
            self._schedule(qp.qp_num, RNR_DELAY)
            return False
        if writes and data:
            ctypes.memmove(op.remote_addr, data, len(data))
        if consumes:
            rwr = dest.recvs.pop(0)
            with_imm = op.opcode in (e.IBV_WR_SEND_WITH_IMM, e.IBV_WR_RDMA_WRITE_WITH_IMM)
            if not writes:
                room = [(s.addr, s.length, s.lkey) for s in rwr.sg]
                if len(data) > sum(n for _, n, _ in room) or not all(
                        self._mr_covers(k, a, n, e.IBV_ACCESS_LOCAL_WRITE) for a, n, k in room):
                    self._push(dest.init.rcq, rwr.wr_id, e.IBV_WC_LOC_LEN_ERR, e.IBV_WC_RECV, dest)
                    self._error_qp(dest)
                    return self._fail(qp, op, e.IBV_WC_REM_INV_REQ_ERR, send_op)
                pos = 0
                for a, n, _ in room:
                    piece = data[pos:pos + n]
                    ctypes.memmove(a, piece, len(piece))
                    pos += len(piece)
            self._push(dest.init.rcq, rwr.wr_id, e.IBV_WC_SUCCESS,
                       e.IBV_WC_RECV_RDMA_WITH_IMM if writes else e.IBV_WC_RECV, dest,
                       byte_len=len(data), imm=op.imm if with_imm else 0,
                       flags=e.IBV_WC_WITH_IMM if with_imm else 0)
        self.stats.bytes_moved += len(data)
        if self.trace is not None:
            self.trace.append(Delivery(qp.qp_num, len(data), op.opcode, op.imm,
                                       b"" if writes else data[:64]))
        self._complete_send(qp, op, e.IBV_WC_SUCCESS, send_op)
        return True

    def _complete_send(self, qp: Any, op: Op, status: int, opcode: int) -> None:
        if op.signaled or status != e.IBV_WC_SUCCESS:
            release = 1 + qp.unsignaled_done
            qp.unsignaled_done = 0
            self._push(qp.init.scq, op.wr_id, status, opcode, qp, release=release)
        else:
            qp.unsignaled_done += 1

    def _fail(self, qp: Any, op: Op, status: int, opcode: int) -> bool:
        self.stats.errors += 1
        self._complete_send(qp, op, status, opcode)
        self._error_qp(qp)
        return True

    def _error_qp(self, qp: Any) -> None:
        """The error state: posted receives are flushed; queued sends flush as they come up."""
        if qp.state == e.IBV_QPS_ERR:
            return
        qp.state = e.IBV_QPS_ERR
        for rwr in qp.recvs:
            self._push(qp.init.rcq, rwr.wr_id, e.IBV_WC_WR_FLUSH_ERR, e.IBV_WC_RECV, qp)
        qp.recvs.clear()
        if self.outq.get(qp.qp_num):
            self._schedule(qp.qp_num)

    def _push(self, cq: Any, wr_id: int, status: int, opcode: int, qp: Any, byte_len: int = 0,
              imm: int = 0, flags: int = 0, release: int = 0) -> None:
        from pyverbs.cq import WC

        wc = WC(wr_id=wr_id, status=status, opcode=opcode, byte_len=byte_len, qp_num=qp.qp_num,
                imm_data=imm, wc_flags=flags)
        wc.release = release
        cq.push(wc)


FABRIC = Fabric()

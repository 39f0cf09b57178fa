"""The small all-to-all and allgather as a hand-written pyverbs loop: the floor a library call
of the same bytes is measured against (`rxelab-bench --hand-loop`). It does only what any
eager implementation on these verbs must: copy each block into a registered slot, one SEND per
peer, poll the completion queue, sleep on the completion channel when it is empty (as the
library does by default: spin_us = 0), copy each arrival out and post its receive again. No
tags, no plans, no deadlines of progress, no checks of what a peer sent.

It opens a device context, a CQ and QPs of its own beside the communicator's, so it takes
nothing the library's engine waits for; the communicator only carries the endpoints."""

from __future__ import annotations

import ctypes
import json
import select
import time
from collections import deque
from typing import Any

import numpy as np

from rxelab import verbs
from rxelab.comm.results import Stats
from rxelab.errors import ConfigError, RdmaError
from rxelab.transports.base import WC_SUCCESS, WR_RDMA_WRITE, WR_SEND

OPS = ("alltoall", "allgather")  # rxelab.bench.HAND_OPS
ALGORITHM = "hand-loop"  # rxelab.bench.HAND_LOOP
ENDPOINT_BYTES = 128  # one endpoint as JSON, padded: what a rank tells each peer
SLOTS = 16
SIGNAL_EVERY = 8  # as the engine: one send in 8 asks for a completion that frees the others
SEND_BIT = 1 << 63
POLL_BATCH = 32


class _Unpinned:
    """Connection's registry: the hand loop keeps no pin budget."""

    def add_fixed(self, nbytes: int) -> None:
        pass


class HandLoop:
    def __init__(self, comm: Any, max_size: int, timeout: float = 60.0) -> None:
        if max_size < 1:
            raise ConfigError("the hand loop needs blocks of 1 byte at least")
        self.rank, self.size, self.timeout = comm.rank, comm.size, timeout
        self.slot_size = max_size
        here = comm.dev
        self.dev = verbs.Device(here.name, here.port, here.gid_index,
                                cq_depth=4 * self.size * SLOTS)
        self.conns: dict[int, verbs.Connection] = {}
        try:
            if self.dev.channel_fd is None:
                raise RdmaError("the hand loop needs a completion channel")
            self.channel_fd: int = self.dev.channel_fd
            for peer in range(self.size):
                if peer != self.rank:
                    self.conns[peer] = verbs.Connection(self.dev, _Unpinned(), peer, SLOTS, SLOTS,
                                                        slot_size=self.slot_size)
            self._connect(comm)
        except BaseException:
            self.close()
            raise
        self.posted = dict.fromkeys(self.conns, 0)  # sends posted to each peer
        self.freed = dict.fromkeys(self.conns, 0)  # of them, whose slots are free again
        self.arrived: dict[int, deque[tuple[int, int]]] = {p: deque() for p in self.conns}
        self.armed = False
        self.sleeps = 0
        self.draining = False  # closing: a peer that closed first already took our blocks

    def _connect(self, comm: Any) -> None:
        """Each peer's endpoint through the communicator's own all-to-all, then a barrier: every
        QP is ready to receive before any rank sends."""
        out = np.zeros(self.size * ENDPOINT_BYTES, np.uint8)
        for peer, conn in self.conns.items():
            text = json.dumps(conn.endpoint().to_dict()).encode()
            out[peer * ENDPOINT_BYTES:peer * ENDPOINT_BYTES + len(text)] = np.frombuffer(text, np.uint8)
        back = np.zeros_like(out)
        comm.alltoall(out, back)
        for peer, conn in self.conns.items():
            text = back[peer * ENDPOINT_BYTES:(peer + 1) * ENDPOINT_BYTES].tobytes().rstrip(b"\0")
            try:
                theirs = verbs.Endpoint.from_dict(json.loads(text))
            except (ValueError, KeyError, TypeError):
                raise RdmaError(f"hand loop: rank {peer} sent no endpoint ({text[:40]!r})") from None
            conn.connect(theirs, int(comm.options["qp_timeout"]), int(comm.options["retry_cnt"]))
        comm.barrier()

    def run(self, op: str, send: np.ndarray, recv: np.ndarray) -> Stats:
        """One call: `op` (alltoall: block j of send to rank j; allgather: send to every rank),
        block i of recv from rank i."""
        if op not in OPS:
            raise ConfigError(f"the hand loop does {' and '.join(OPS)}, not {op}")
        p, r = self.size, self.rank
        block = recv.nbytes // p
        if block > self.slot_size:
            raise ConfigError(f"blocks of {block} bytes: this hand loop's slots hold {self.slot_size}")
        src, dst = send.ctypes.data, recv.ctypes.data
        step = block if op == "alltoall" else 0
        ctypes.memmove(dst + r * block, src + r * step, block)
        self.sleeps = 0
        for i in range(1, p):
            peer = (r + i) % p
            self._send(peer, src + peer * step, block)
        for i in range(1, p):
            peer = (r - i) % p
            slot, nbytes = self._arrival(peer)
            conn = self.conns[peer]
            if nbytes != block:  # never copied past its place in recv
                conn.repost(slot)
                raise ConfigError(f"hand loop: rank {peer} sent {nbytes} bytes, this rank expects "
                                  f"{block}")
            ctypes.memmove(dst + peer * block, conn.recv_base + slot * self.slot_size, nbytes)
            conn.repost(slot)
        return Stats(op, ALGORITHM, (p - 1) * block, (p - 1) * block, 0, 0, 0.0,
                     sleeps=self.sleeps)

    def _send(self, peer: int, addr: int, nbytes: int) -> None:
        conn = self.conns[peer]
        while self.posted[peer] - self.freed[peer] >= SLOTS:
            self._progress(f"a free send slot towards rank {peer}")
        n = self.posted[peer]
        slot = n % SLOTS
        base = conn.send_base + slot * self.slot_size
        ctypes.memmove(base, addr, nbytes)
        signaled = n % SIGNAL_EVERY == SIGNAL_EVERY - 1 or n + 1 - self.freed[peer] >= SLOTS
        conn.post(SEND_BIT | (peer << 32) | (n & 0xFFFFFFFF), WR_SEND, base, nbytes, conn.send_mr.lkey,
                  signaled=signaled)
        self.posted[peer] = n + 1

    def _arrival(self, peer: int) -> tuple[int, int]:
        queue = self.arrived[peer]
        while not queue:
            self._progress(f"a block from rank {peer}")
        return queue.popleft()

    def _progress(self, what: str) -> None:
        """Take what the CQ holds; if nothing, arm the channel, poll once more, then sleep."""
        deadline = time.monotonic() + self.timeout
        while True:
            n, wcs = self.dev.cq.poll(POLL_BATCH)
            for wc in wcs:
                wr_id = wc.wr_id
                failed = wc.status != WC_SUCCESS
                if failed and not self.draining:
                    raise RdmaError(f"hand loop: a work request failed ({verbs.status_str(wc.status)})")
                if wr_id & SEND_BIT:
                    peer = (wr_id >> 32) & 0xFFFFF  # this send and those before it are done
                    ahead = (wr_id + 1 - self.freed[peer]) & 0xFFFFFFFF
                    if ahead < 1 << 31:  # flushed ones may come back in any order
                        self.freed[peer] += ahead
                elif not failed:  # a receive flushed at close carries nothing
                    self.arrived[(wr_id >> 32) & 0xFFFFF].append((wr_id & 0xFFFFFFFF, wc.byte_len))
            if n:
                return
            if not self.armed:
                self.dev.arm()
                self.armed = True
                continue
            self.sleeps += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise RdmaError(f"hand loop: no completion in {self.timeout:g} s waiting for {what}")
            if select.select([self.channel_fd], [], [], left)[0]:
                self.dev.take_event()
                self.armed = False

    def _drain(self) -> None:
        """Before the QPs go: a signaled zero-length write after the sends not yet known
        complete, whose completion says they all are (RC completes in order). Destroyed at
        once, a QP may drop its last unsignaled blocks, which a peer still waits for. A peer
        that finished first had all of them, and its QPs may be gone: a failed write to it
        counts as done."""
        self.draining = True
        for peer, conn in self.conns.items():
            n = self.posted[peer]
            if n > self.freed[peer]:
                conn.post(SEND_BIT | (peer << 32) | (n & 0xFFFFFFFF), WR_RDMA_WRITE,
                          conn.send_base, 0, conn.send_mr.lkey, signaled=True)
                self.posted[peer] = n + 1
        for peer in self.conns:
            while self.freed[peer] < self.posted[peer]:
                self._progress(f"rank {peer} to take this rank's last blocks")

    def close(self) -> None:
        try:
            if hasattr(self, "posted"):  # made whole: its sends may still be on their way
                self._drain()
        finally:
            self._release()

    def _release(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns = {}
        self.dev.close()

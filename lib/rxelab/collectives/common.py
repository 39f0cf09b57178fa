"""What every collective shares: the call's context (engine, layout, tags) and the three
moves they are made of: advertise where a peer may write, write a block where a peer said,
copy one's own block locally.

Tags: a 32-bit tag names (call sequence, sub-tag); the sub-tag separates the data of a call
from its tokens and steps, so waits never confuse two messages from the same peer.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rxelab import schedules
from rxelab.buffers import Buffer
from rxelab.engine import RTR, TOKEN, Engine, WriteOp
from rxelab.errors import ConfigError

DATA = 1
BCAST = 2
STEP0 = 16  # sub-tags from here on number the steps of a schedule
MAX_SUB = 0xFFFF


@dataclass
class Layout:
    """Byte offsets and lengths of each peer's block in the send and receive buffers."""

    send: Buffer
    recv: Buffer
    send_off: list[int]
    send_len: list[int]
    recv_off: list[int]
    recv_len: list[int]


@dataclass
class Call:
    engine: Engine
    rank: int
    size: int
    seq: int  # this call's sequence number (15 bits), equal on every rank
    name: str
    layout: Layout
    send_mr: Any
    recv_mr: Any

    def tag(self, sub: int) -> int:
        if sub > MAX_SUB:
            raise ConfigError(f"{self.name}: schedule too long for one call ({sub} steps)")
        return (self.seq << 16) | sub

    # ---- moves --------------------------------------------------------------------
    def advertise(self, peer: int, sub: int, offset: int, length: int) -> None:
        """Tell `peer` it may write `length` bytes at `offset` of our receive buffer."""
        base = self.layout.recv.address
        rkey = self.recv_mr.rkey if self.recv_mr is not None else 0
        self.engine.send_ctrl(peer, RTR, self.tag(sub), rkey, base + offset, length)

    def write_to(self, peer: int, sub: int, offset: int, length: int, remote_offset: int = 0,
                 from_recv: bool = False) -> WriteOp:
        """Wait for `peer`'s advertisement, then write our bytes there (at remote_offset)."""
        addr, rkey, room = self.engine.wait_rtr(peer, self.tag(sub), self.name)
        if remote_offset + length > room:
            raise ConfigError(f"{self.name}: rank {peer} expects {room} bytes from rank "
                              f"{self.rank}, which has {length} for it",
                              hint="send and receive counts must match pairwise")
        buf, mr = (self.layout.recv, self.recv_mr) if from_recv else (self.layout.send, self.send_mr)
        lkey = mr.lkey if mr is not None else 0
        return self.engine.write(peer, buf.address + offset, lkey, length, addr + remote_offset,
                                 rkey, self.tag(sub))

    def receive(self, peer: int, sub: int, length: int) -> None:
        self.engine.wait_data(peer, self.tag(sub), length, self.name)

    def copy_own_block(self, send_off: int, recv_off: int, length: int) -> None:
        if length:
            ctypes.memmove(self.layout.recv.address + recv_off,
                           self.layout.send.address + send_off, length)

    def pass_turn(self, peer: int, step: int) -> None:
        self.engine.send_ctrl(peer, TOKEN, self.tag(STEP0 + step))

    def await_turn(self, leader: int, step: int) -> None:
        self.engine.wait_token(leader, self.tag(STEP0 + step), f"{self.name} step {step}")

    def finish(self, ops: list[WriteOp]) -> None:
        self.engine.wait_ops(ops, self.name)


def sequential_walk(c: Call, exchange: Callable[[int], WriteOp]) -> None:
    """Take part in the strictly sequential schedule: for each of this rank's pairs, in the
    global order, wait for the turn, exchange with the partner (exchange(partner) starts our
    write; the partner's block is awaited here), and hand the turn on if we lead the pair."""
    steps = schedules.sequential_steps(c.size)
    for k, step in enumerate(steps):
        if c.rank not in step.pair:
            continue
        partner = step.pair[1] if step.pair[0] == c.rank else step.pair[0]
        if schedules.needs_token(steps, k, c.rank):
            c.await_turn(steps[k - 1].leader, k)
        op = exchange(partner)
        c.finish([op])  # acknowledged: the partner has our block (and we theirs, see exchange)
        if c.rank == step.leader:
            for r in schedules.token_receivers(steps, k):
                c.pass_turn(r, k + 1)

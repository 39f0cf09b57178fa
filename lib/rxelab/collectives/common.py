"""What every collective shares: the call's context (engine, layout, tags) and the moves they
are made of: expect a block from a peer, send a block to a peer, receive it, copy one's own
block locally. A block travels eager (copied through slots, no handshake) when it is at most
the engine's eager limit, else by rendezvous (the receiver advertises where the sender may
write; the sender writes there). Both sides know the block's size, so both pick the same.

Tags: a 32-bit tag names (call sequence, sub-tag); the sub-tag separates the data of a call
from its tokens and steps, so waits never confuse two messages from the same peer.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rxelab import codecs, schedules
from rxelab.buffers import Buffer, as_buffer
from rxelab.codecs import Codec
from rxelab.errors import ConfigError, Mismatch, MismatchError
from rxelab.layouts import Blocks, Layout, Reduction, Rooted
from rxelab.messages import RTR, RTS, TOKEN, SendOp, WriteOp
from rxelab.schedules import ANSWERED, STARTED

if TYPE_CHECKING:  # the engine posts to RDMA: a recording engine stands in without pyverbs
    from rxelab.engine import Engine

DATA = 1
BCAST = 2
STEP0 = 16  # sub-tags from here on number the steps of a schedule
MAX_SUB = 0xFFFF


SENDING, RECEIVING = 0, 1


class Staging:
    """Byte areas that coded blocks pass through, kept from call to call of one plan: the same
    areas in the same order each call (a plan's calls repeat their blocks), so their
    registrations are found in the cache rather than made again. An area is used once per
    call: a call's blocks may all be in flight at once."""

    def __init__(self) -> None:
        self.areas: tuple[list[tuple[Buffer, Any]], list[tuple[Buffer, Any]]] = ([], [])
        self.used = [0, 0]

    def start(self) -> None:
        self.used = [0, 0]

    def area(self, kind: int, nbytes: int) -> tuple[Buffer, Any]:
        """The next area of this call for sending or receiving, at least nbytes long."""
        i = self.used[kind]
        self.used[kind] = i + 1
        areas = self.areas[kind]
        if i < len(areas) and areas[i][0].nbytes >= nbytes:
            return areas[i]
        arr = np.empty(max(nbytes, codecs.MIN_AREA), np.uint8)
        made = (as_buffer(arr, "staging area", writable=True), arr)
        if i < len(areas):
            areas[i] = made
        else:
            areas.append(made)
        return made


class Call:
    """One collective call: engine, ranks, this call's tags, and the buffers' layout.
    (A plain class with slots: one is made per call.)"""

    __slots__ = ("engine", "rank", "size", "seq", "name", "layout", "register", "_mrs", "watchers",
                 "codec", "staging", "_landing", "_shared")

    def __init__(self, engine: Engine, rank: int, size: int, seq: int, name: str, layout: Layout,
                 register: Callable[[Buffer, bool], Any], codec: Codec | None = None,
                 staging: Staging | None = None) -> None:
        self.engine, self.rank, self.size, self.seq = engine, rank, size, seq  # seq: 14 bits
        self.name, self.layout = name, layout
        self.register = register  # (buffer, remote access) -> MR or None
        self._mrs: dict[tuple[int, bool], Any] = {}
        self.watchers: Iterable[int] = ()  # ranks to tell that our long transfers move
        # rendezvous blocks coded (rxelab.codecs) through staging areas; where each lands
        self.codec, self.staging = codec, staging
        self._landing: dict[tuple[int, int], tuple[Any, Buffer, int, int]] = {}
        self._shared: dict[tuple[int, int, int], tuple[Buffer, int]] = {}  # one block, many peers
        if staging is not None:
            staging.start()

    def mr(self, buf: Buffer, remote: bool) -> Any:
        """Registered on first use: eager blocks never need the caller's buffers registered."""
        key = (id(buf), remote)
        if key not in self._mrs:
            self._mrs[key] = self.register(buf, remote)
        return self._mrs[key]

    # the layout as its kind: what an algorithm of blocks, a reduction or a broadcast reads
    @property
    def blocks(self) -> Blocks:
        return self.layout  # type: ignore[return-value]

    @property
    def reduction(self) -> Reduction:
        return self.layout  # type: ignore[return-value]

    @property
    def rooted(self) -> Rooted:
        return self.layout  # type: ignore[return-value]

    @property
    def send_mr(self) -> Any:
        return self.mr(self.layout.send, False)

    @property
    def recv_mr(self) -> Any:
        return self.mr(self.layout.recv, True)

    def tag(self, sub: int) -> int:
        if sub > MAX_SUB:
            raise ConfigError(f"{self.name}: schedule too long for one call ({sub} steps)")
        return (self.seq << 16) | sub

    # ---- moves --------------------------------------------------------------------
    def eager(self, length: int) -> bool:
        return length <= self.engine.eager_limit

    def coded(self, length: int) -> bool:
        """A rendezvous block of a call with a codec: it travels coded, through staging."""
        return self.codec is not None and length > self.engine.eager_limit

    def expect(self, peer: int, sub: int, offset: int, length: int,
               into: Buffer | None = None) -> None:
        """Get ready for `peer`'s block at `offset` of our receive buffer (or of `into`): for a
        rendezvous block, tell the peer where to write it; an eager one needs nothing."""
        if self.coded(length):
            self._advertise_staging(peer, sub, offset, length, into or self.layout.recv)
        elif not self.eager(length):
            self.advertise(peer, sub, offset, length, into)

    def _advertise_staging(self, peer: int, sub: int, offset: int, length: int,
                           dest: Buffer) -> None:
        """Advertise a staging area for `peer`'s coded block; it is decoded into `dest` at
        `offset` when it arrives (recv_block)."""
        assert self.codec is not None and self.staging is not None
        area, arr = self.staging.area(RECEIVING, self.codec.room(length))
        mr = self.mr(area, True)
        self._landing[(peer, sub)] = (arr, dest, offset, length)
        self.engine.send_ctrl(peer, RTR, self.tag(sub), mr.rkey, area.address,
                              self.codec.room(length), codec=self.codec.id)

    def send_block(self, peer: int, sub: int, offset: int, length: int,
                   from_recv: bool = False, acked: bool = False,
                   source: Buffer | None = None, shared: bool = False) -> WriteOp | SendOp:
        """Start sending a block of the send buffer (or the receive buffer, or `source`);
        with acked, its op completes when the peer has it. shared: the same block goes, as
        it is, to several peers in this call (a broadcast's): coded once for all of them."""
        buf = source or (self.layout.recv if from_recv else self.layout.send)
        if self.eager(length):
            return self.engine.send_eager(peer, buf.address + offset, length, self.tag(sub),
                                          acked)
        if self.layout.vector:  # the receiver may expect another size: tell it ours first
            self.engine.send_ctrl(peer, RTS, self.tag(sub), length=length)
        if self.codec is not None:
            return self._send_coded(peer, sub, buf, offset, length, shared)
        return self.write_to(peer, sub, offset, length, source=buf)

    def _send_coded(self, peer: int, sub: int, buf: Buffer, offset: int, length: int,
                    shared: bool) -> WriteOp:
        """Code the block into a staging area (while the receiver gets ready), then write it
        into the receiver's. A lossy codec rounds the block in place too, so the sender keeps
        the values the receiver gets - but never in the caller's send buffer. A shared block
        is coded once and its area written to every peer (it is only read while in flight)."""
        codec, staging = self.codec, self.staging
        assert codec is not None and staging is not None
        key = (buf.address, offset, length)
        found = self._shared.get(key) if shared else None
        if found is None:
            area, arr = staging.area(SENDING, codec.room(length))
            own = buf.writable and (buf is not self.layout.send or
                                    self.layout.send is self.layout.recv)
            wire, seconds = codecs.encode(codec, buf.address + offset, length, buf.dtype, arr, own)
            self.engine.counters.codec_seconds += seconds
            if shared:
                self._shared[key] = (area, wire)
        else:
            area, wire = found
        counters = self.engine.counters
        counters.coded_raw += length
        counters.coded_wire += wire
        addr, rkey, room = self.engine.wait_rtr(peer, self.tag(sub), self.name, codec.id)
        if room != codec.room(length):  # the receiver's own block, from the room it made:
            # none below a header's room (never an honest receiver's: a coded block is longer
            # than the eager limit), so never a negative count, which no notice can carry
            self._count_mismatch(peer, max(0, room - codecs.HEADER.size), length)
        mr = self.mr(area, False)
        return self.engine.write(peer, area.address, mr.lkey, wire, addr, rkey, self.tag(sub),
                                 watchers=self.watchers)

    def _count_mismatch(self, peer: int, room: int, length: int) -> None:
        m = Mismatch(self.rank, peer, length, room)
        raise MismatchError(f"{self.name}: {m.words(self.rank)}", peer=peer, mismatch=m,
                            hint="send and receive counts must match pairwise")

    def recv_block(self, peer: int, sub: int, offset: int, length: int,
                   into: Buffer | None = None, patience: float = 1.0) -> None:
        if self.eager(length):
            buf = into or self.layout.recv
            self.engine.recv_eager(peer, self.tag(sub), buf.address + offset, length, self.name,
                                   patience)
        else:
            self.engine.wait_data(peer, self.tag(sub), length, self.name, patience)
            if self.codec is not None:
                self._decode(peer, sub)

    def _decode(self, peer: int, sub: int) -> None:
        assert self.codec is not None
        arr, dest, offset, length = self._landing.pop((peer, sub))
        wire, seconds = codecs.decode(self.codec, arr, dest.address + offset, length, dest.dtype,
                                      peer)
        counters = self.engine.counters
        counters.bytes_received += wire - length  # wait_data counted the block's own size
        counters.codec_seconds += seconds

    def advertise(self, peer: int, sub: int, offset: int, length: int,
                  into: Buffer | None = None) -> None:
        """Tell `peer` it may write `length` bytes at `offset` of our receive buffer (or of
        `into`)."""
        buf = into or self.layout.recv
        mr = self.mr(buf, True)
        self.engine.send_ctrl(peer, RTR, self.tag(sub), mr.rkey if mr is not None else 0,
                              buf.address + offset, length)

    def write_to(self, peer: int, sub: int, offset: int, length: int,
                 from_recv: bool = False, source: Buffer | None = None) -> WriteOp:
        """Wait for `peer`'s advertisement, then write our bytes there."""
        addr, rkey, room = self.engine.wait_rtr(peer, self.tag(sub), self.name)
        if length != room:
            self._count_mismatch(peer, room, length)
        buf = source or (self.layout.recv if from_recv else self.layout.send)
        mr = self.mr(buf, buf is self.layout.recv)
        lkey = mr.lkey if mr is not None else 0
        return self.engine.write(peer, buf.address + offset, lkey, length, addr, rkey,
                                 self.tag(sub), watchers=self.watchers)

    def receive(self, peer: int, sub: int, length: int) -> None:
        self.engine.wait_data(peer, self.tag(sub), length, self.name)

    def copy_own_block(self, send_off: int, recv_off: int, length: int) -> None:
        if length:
            ctypes.memmove(self.layout.recv.address + recv_off,
                           self.layout.send.address + send_off, length)

    def local(self, nbytes: int, work: Callable[[], Any]) -> None:
        """Local work on nbytes (copies between the call's buffers and its workspace, done
        by `work`): a recording engine counts it instead (rxelab.trace)."""
        if nbytes:
            work()

    def workspace(self, kind: int, nbytes: int) -> tuple[Buffer, Any]:
        """An area of the plan's own (a Buffer and its numpy bytes) for an algorithm that
        packs or rotates blocks (Bruck's): the same areas, in the same order, every call, so
        their registrations are found again."""
        assert self.staging is not None, "every plan has staging areas"
        return self.staging.area(kind, nbytes)

    def settle(self, result: Any) -> None:
        """With a lossy codec, round a reduction's result as the wire would (rxelab.codecs
        .settle): for algorithms whose ranks end with sums some of them never sent."""
        if self.codec is not None and self.codec.lossy and self.coded(result.nbytes):
            t0 = time.thread_time()
            codecs.settle(self.codec, result)
            self.engine.counters.codec_seconds += time.thread_time() - t0

    def pass_turn(self, peer: int, index: int) -> None:
        """A token for `peer`'s turn number `index` (its own count: under p for any p)."""
        self.engine.send_ctrl(peer, TOKEN, self.tag(STEP0 + index))

    def await_turn(self, leader: int, turn: schedules.Turn) -> None:
        self.engine.wait_token(leader, self.tag(STEP0 + turn.index),
                               f"{self.name} step {turn.step}", patience=turn.patience)

    def finish(self, ops: Sequence[WriteOp | SendOp], strict: bool = False) -> None:
        """Wait until the peers acknowledged our writes (they read our buffers until then);
        with strict, our eager blocks too (the sequential schedule's 'exchange complete')."""
        self.engine.wait_ops([op for op in ops if strict or isinstance(op, WriteOp)], self.name)


def sequential_walk(c: Call, send: Callable[[int], WriteOp | SendOp],
                    receive: Callable[[int, float], None]) -> None:
    """Take part in the sequential schedule, at most layout.window pairs at once, by the turn
    rules of schedules (module docstring): for each of this rank's pairs, in the global order,
    - starter (was in the step `window` places before): close that step, then send;
    - follower: the starter's block is the turn: receive it, then send ours;
    - otherwise: the first steps start at once; later ones wait for a token.
    A pair is over for a rank once it has the partner's block and knows the partner has its
    own: acknowledged, or answered (a starter's block was received before the follower sent).
    The step's leader then hands the turn on by token where the next step needs one. With
    window 1 every pair is over before the next one starts: one pair in the job at a time
    (within a call: the next call's first pair may start before this call's last is over).
    Before waiting for a turn a rank closes every pair it has open, so a token it owes is
    never held back by its own wait (closing a pair waits only on that pair's two ranks)."""
    w = c.blocks.window
    open_pairs: dict[int, tuple[schedules.Turn, WriteOp | SendOp]] = {}  # step -> its turn, our send

    def close(k: int) -> None:
        turn, op = open_pairs.pop(k)
        if turn.role != ANSWERED:
            receive(turn.partner, 1.0)
        c.finish([op], strict=turn.role != STARTED)  # a starter's block was answered: it arrived
        for r, index in zip(turn.hands_to, turn.hand_index, strict=True):
            c.pass_turn(r, index)

    def close_all(up_to: int | None = None) -> None:
        for j in sorted(open_pairs):
            if up_to is None or j <= up_to:
                close(j)

    for turn in schedules.sequential_turns(c.size, c.rank, w):
        k = turn.step
        # A wait for a turn allows each step between this rank's last and it the deadline;
        # and the ranks of later steps wait behind this one: a long transfer of ours tells
        # them it moves (a wait that sees nothing would give up on a slow pair).
        if turn.role == STARTED:
            close_all(k - w)
        elif turn.role == ANSWERED:  # the starter's block is the turn
            close_all(k)
            receive(turn.partner, turn.patience)
        elif turn.token_from is not None:
            close_all(k)
            c.await_turn(turn.token_from, turn)
        c.watchers = turn.watchers
        open_pairs[k] = (turn, send(turn.partner))
    close_all()

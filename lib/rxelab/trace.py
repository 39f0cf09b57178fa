"""Each rank's moves in a collective call, recorded from the library's own algorithm functions
and its real Call, with an engine that records where rxelab.engine.Engine posts work requests:
what a simulator replays to predict the library beyond the lab's size (experiments' `fab
simulate`), and what the tests hold against the in-memory fabric's deliveries.

A move is one of
- SEND: a message to a peer (a ready-to-receive, a size notice, a token, an eager block, an
  RDMA write), with the bytes it carries and the tag it is filed under;
- RECV: wait until a peer's message has arrived (matched to exactly one SEND of that peer);
- WAIT: wait until the peers acknowledged some of this rank's own SENDs (RC acknowledgements:
  a write's, an acknowledged eager block's): the SENDs' ids;
- COPY, REDUCE: local work on that many bytes;
- CALL: where a call starts (a call's own fixed cost is charged there).

Pure Python and numpy: no pyverbs. The call's buffers are allocated but never written, so a
p = 1024 all-to-all of 1 MiB blocks costs address space, not memory. Sizes are not checked
against the peers' (a peer's advertised room reads as equal to any size): a run on the fabric
checks them, and the tests check the recording against such a run.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import numpy as np

from rxelab import checks, ops
from rxelab.collectives.common import Call, Staging
from rxelab.errors import ConfigError
from rxelab.messages import CTRL, RTR, RTS, TOKEN, UNTRACKED, SendOp, WriteOp, ring_bytes
from rxelab.registry import pinned_size
from rxelab.settings import BY_NAME
from rxelab.waits import Counters

SEND, RECV, WAIT, COPY, REDUCE, CALL = range(6)
EAGER, WRITE = 16, 17  # message kinds beside the control messages' own (RTR, RTS, TOKEN)
KINDS = {RTR: "rtr", RTS: "rts", TOKEN: "token", EAGER: "eager", WRITE: "write"}
MOVES = ("send", "recv", "wait", "copy", "reduce", "call")
MAX_RANKS = 4096


class Move(NamedTuple):
    kind: int  # SEND, RECV, WAIT, COPY, REDUCE; CALL marks where each call starts
    peer: int = -1
    nbytes: int = 0
    tag: int = 0
    what: int = 0  # SEND and RECV: the message's kind (KINDS)
    ids: tuple[int, ...] = ()  # SEND: its own id (this rank's count); WAIT: the ids waited for

    def __str__(self) -> str:
        if self.kind in (SEND, RECV):
            return (f"{MOVES[self.kind]} {KINDS[self.what]} {'to' if self.kind == SEND else 'from'}"
                    f" {self.peer} tag {self.tag:#x} {self.nbytes} B")
        if self.kind == WAIT:
            return f"wait for sends {list(self.ids)}"
        if self.kind == CALL:
            return "call"
        return f"{MOVES[self.kind]} {self.nbytes} B"


class TraceError(Exception):
    """A recording whose moves do not pair up: a wait without its message, a message nobody
    waits for, a wait for a send that was never made."""


class RecordedSend(SendOp):
    """An acknowledged eager block or control message: its send's id, for a WAIT."""

    __slots__ = ("send",)

    def __init__(self, peer: int, send: int) -> None:
        super().__init__(peer)
        self.send = send


@dataclass
class RecordedWrite(WriteOp):
    send: int = -1


class AnyRoom(int):
    """A peer's advertised room as a recording sees it: equal to whatever size is compared
    with it (the peer's own recording says what it advertised)."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = int.__hash__


class Recorder:
    """Stands in for the engine under a Call: its methods, each appending a move."""

    def __init__(self, eager_limit: int) -> None:
        self.eager_limit = eager_limit
        self.counters = Counters()
        self.moves: list[Move] = []
        self.ids = itertools.count()
        self.registered: set[tuple[int, int, bool]] = set()
        self.pinned = 0  # bytes the calls registered, as the library's registry pins them

    def register(self, buf: Any, remote: bool) -> None:
        """The call's registration of a buffer (its writes' source, a target it advertises):
        counted once per buffer and access, as rxelab.registry keeps them."""
        key = (buf.address, buf.nbytes, remote)
        if key not in self.registered:
            self.registered.add(key)
            self.pinned += pinned_size(buf.address, buf.nbytes)

    def _send(self, peer: int, nbytes: int, tag: int, what: int) -> int:
        n = next(self.ids)
        self.moves.append(Move(SEND, peer, nbytes, tag, what, (n,)))
        return n

    def send_ctrl(self, peer: int, kind: int, tag: int, rkey: int = 0, addr: int = 0,
                  length: int = 0, acked: bool = False, codec: int = 0) -> SendOp:
        n = self._send(peer, CTRL.size, tag, kind)
        return RecordedSend(peer, n) if acked else UNTRACKED

    def send_eager(self, peer: int, addr: int, length: int, tag: int,
                   acked: bool = False) -> SendOp:
        n = self._send(peer, length, tag, EAGER)
        return RecordedSend(peer, n) if acked else UNTRACKED

    def write(self, peer: int, addr: int, lkey: int, length: int, remote_addr: int, rkey: int,
              tag: int, imm: bool = True, notify: bool = True,
              watchers: Iterable[int] = ()) -> WriteOp:
        n = self._send(peer, length, tag, WRITE)
        return RecordedWrite(peer, tag, addr, lkey, length, remote_addr, rkey, send=n)

    def wait_rtr(self, peer: int, tag: int, what: str, codec: int = 0) -> tuple[int, int, int]:
        self.moves.append(Move(RECV, peer, CTRL.size, tag, RTR))
        return 0, 0, AnyRoom(0)

    def wait_token(self, peer: int, tag: int, what: str, patience: float = 1.0) -> None:
        self.moves.append(Move(RECV, peer, CTRL.size, tag, TOKEN))

    def wait_data(self, peer: int, tag: int, length: int, what: str, patience: float = 1.0) -> None:
        self.moves.append(Move(RECV, peer, length, tag, WRITE))

    def recv_eager(self, peer: int, tag: int, dest: int, length: int, what: str,
                   patience: float = 1.0) -> None:
        self.moves.append(Move(RECV, peer, length, tag, EAGER))

    def wait_ops(self, ops: Sequence[WriteOp | SendOp], what: str) -> None:
        ids = tuple(op.send for op in ops if isinstance(op, (RecordedWrite, RecordedSend)))
        if ids:
            self.moves.append(Move(WAIT, ids=ids))

    def reduce(self, a: Any, b: Any, out: Any) -> None:
        """A reduction's ufunc, recorded (out is where the result goes: its bytes)."""
        self.moves.append(Move(REDUCE, nbytes=int(out.nbytes)))


class RecordingCall(Call):
    """The real Call; only its local work (copies, Bruck's rotations) is recorded instead of
    done (the buffers stay untouched)."""

    __slots__ = ()

    def copy_own_block(self, send_off: int, recv_off: int, length: int) -> None:
        if length:
            cast(Recorder, self.engine).moves.append(Move(COPY, nbytes=length))

    def local(self, nbytes: int, work: Callable[[], Any]) -> None:
        if nbytes:
            cast(Recorder, self.engine).moves.append(Move(COPY, nbytes=nbytes))


@dataclass
class Trace:
    collective: str
    algorithm: str
    p: int
    size: int  # as the benchmark and the specs give it (the description's unit)
    eager_limit: int
    pairs: int
    calls: int
    ranks: list[list[Move]]
    pinned: list[int]  # per rank: bytes its calls registered (eager blocks go through slots)

    def peak_pinned(self, slots: int | None = None) -> list[int]:
        """Per rank, the bytes pinned during the calls, as the library's Stats.peak_pinned
        says them: every connection's slots (one per peer, whatever the algorithm) and the
        buffers the calls registered."""
        chosen = BY_NAME["slots"].check(BY_NAME["slots"].default if slots is None else slots)
        rings = (self.p - 1) * ring_bytes(int(chosen), self.eager_limit)
        return [rings + n for n in self.pinned]

    @property
    def events(self) -> int:
        return sum(len(moves) for moves in self.ranks)

    def messages(self) -> Counter[tuple[int, int, int, int, int]]:
        """Every message sent: (source, destination, kind, tag, bytes), counted."""
        return Counter((src, m.peer, m.what, m.tag, m.nbytes)
                       for src, moves in enumerate(self.ranks) for m in moves if m.kind == SEND)

    def turns_of_rank_0(self) -> bool:
        """Whether every rank r's moves are rank 0's with each peer r further on (mod p):
        then on a platform where every host is like every other (a crossbar cluster), every
        rank's replay is rank 0's, and the replay of rank 0 alone gives them all."""
        p, first = self.p, self.ranks[0]
        for r in range(1, p):
            moves = self.ranks[r]
            if len(moves) != len(first):
                return False
            for m, m0 in zip(moves, first, strict=True):
                peer = m0.peer if m0.peer < 0 else (m0.peer + r) % p
                if m.kind != m0.kind or m.peer != peer or m[2:] != m0[2:]:
                    return False
        return True

    def matched(self) -> list[tuple[int, int, int, int]]:
        """(source, its SEND's index, destination, its RECV's index) of every message, in the
        order each destination waits (messages of one kind and tag between two ranks pair up
        first in, first out, as RC delivers them). Raises TraceError when they do not pair
        up, or a WAIT names a send its rank never made."""
        sent: dict[tuple[int, int, int, int], deque[tuple[int, int]]] = defaultdict(deque)
        for src, moves in enumerate(self.ranks):
            made: set[int] = set()
            for i, m in enumerate(moves):
                if m.kind == SEND:
                    sent[(src, m.peer, m.what, m.tag)].append((i, m.nbytes))
                    made.update(m.ids)
                elif m.kind == WAIT and not set(m.ids) <= made:
                    raise TraceError(f"rank {src} move {i} waits for sends it has not made: "
                                     f"{sorted(set(m.ids) - made)}")
        pairs = []
        for dst, moves in enumerate(self.ranks):
            for i, m in enumerate(moves):
                if m.kind != RECV:
                    continue
                queue = sent.get((m.peer, dst, m.what, m.tag))
                if not queue:
                    raise TraceError(f"rank {dst} move {i} ({m}) has no message to wait for")
                j, nbytes = queue.popleft()
                if nbytes != m.nbytes:
                    raise TraceError(f"rank {dst} move {i} ({m}) waits for {m.nbytes} B; rank "
                                     f"{m.peer} sends {nbytes} B")
                pairs.append((m.peer, j, dst, i))
        left = [(k, len(q)) for k, q in sent.items() if q]
        if left:
            (src, dst, what, tag), n = left[0]
            raise TraceError(f"{sum(n for _, n in left)} messages nobody waits for, e.g. {n} "
                             f"{KINDS[what]} from rank {src} to rank {dst} tag {tag:#x}")
        return pairs


def record(collective: str, algorithm: str | None, p: int, size: int, *, pairs: int = 1,
           eager_limit: int | None = None, calls: int = 1, op: str = "sum") -> Trace:
    """Every rank's moves in `calls` back-to-back calls of the collective as the benchmark
    makes it (its test data's layout and dtype; `size` in the description's unit, bytes),
    on p ranks."""
    c = ops.collective(collective)
    chosen = checks.algorithm(c, algorithm)
    run = ops.runner(c, chosen)  # an unknown algorithm is said first
    p = checks.whole(p, "p")
    if not 1 <= p <= MAX_RANKS:
        raise ConfigError(f"p={p}: from 1 to {MAX_RANKS} ranks")
    calls = checks.whole(calls, "calls")
    if not 1 <= calls <= 0x3FFF:
        raise ConfigError(f"calls={calls}: from 1 to {0x3FFF}")
    limit = BY_NAME["eager_limit"].check(BY_NAME["eager_limit"].default if eager_limit is None
                                         else eager_limit)
    item = np.dtype(c.dtype).itemsize
    size = checks.whole(size, "size")
    if size < 0 or size % item:
        raise ConfigError(f"size={size}: {collective} moves {c.dtype}: a multiple of {item} "
                          "bytes, 0 or more")
    count = size // item
    ranks, pinned = [], []
    known: dict[int, tuple[int, int]] = {}
    for rank in range(p):
        recorder = Recorder(int(limit))
        send, recv = _buffers(c, rank, p, count, known)
        args = checks.arguments(c, chosen, c.arguments(p, op, pairs, rank, send), rank, p)
        layout = c.layout(send, recv, p, rank, **args)
        if hasattr(layout, "reduce"):
            layout.reduce = recorder.reduce
        staging = Staging()  # the plan's areas (Bruck's workspace): allocated, never written
        for seq in range(1, calls + 1):
            recorder.moves.append(Move(CALL))
            run(RecordingCall(cast(Any, recorder), rank, p, seq, f"{collective}/{chosen}", layout,
                              recorder.register, staging=staging))
        ranks.append(recorder.moves)
        pinned.append(recorder.pinned)
    _receive_size_notices(ranks)
    return Trace(collective, chosen, p, size, int(limit), pairs, calls, ranks, pinned)


def _buffers(c: ops.Collective, rank: int, p: int, count: int,
             known: dict[int, tuple[int, int]]) -> tuple[Any, Any]:
    """Unwritten buffers of the test data's sizes (linear in count: found at counts 0 and 1,
    without making count's data; once per call when every rank's are the same)."""
    def elements(n: int) -> tuple[int, int]:
        if c.counts is None and n in known:
            return known[n]
        send, want = c.data(rank, p, n, c.dtype, 0, "sum")
        known[n] = send.size, want.size
        return known[n]
    (s0, r0), (s1, r1) = elements(0), elements(1)
    send = np.empty(s0 + (s1 - s0) * count, c.dtype)
    return send, (None if c.in_place else np.empty(r0 + (r1 - r0) * count, c.dtype))


def _receive_size_notices(ranks: list[list[Move]]) -> None:
    """A vector collective's sender says its block's size first (RTS); the engine files it
    with the data's arrival (rxelab.waits.wait_data). As a move: a RECV of it just before
    the RECV of the data it announces."""
    notices: dict[tuple[int, int, int], int] = Counter()
    for src, moves in enumerate(ranks):
        for m in moves:
            if m.kind == SEND and m.what == RTS:
                notices[(src, m.peer, m.tag)] += 1
    if not notices:
        return
    for dst, moves in enumerate(ranks):
        out: list[Move] = []
        for m in moves:
            key = (m.peer, dst, m.tag)
            if m.kind == RECV and m.what in (WRITE, EAGER) and notices.get(key):
                notices[key] -= 1
                out.append(Move(RECV, m.peer, CTRL.size, m.tag, RTS))
            out.append(m)
        moves[:] = out

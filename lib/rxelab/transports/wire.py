"""RC's semantics over one ordered byte stream (a TCP connection, a QUIC stream), without any
I/O: the tcp and quic transports move the bytes, this decides what they mean.

Built sans-IO, the way aioquic is, so that every rule is tested and fuzzed without a socket:
- a sender posts work requests (post) and sends what out() gives, in order;
- a receiver reads into target() and says how much came (received), or hands over bytes it
  was given (feed);
- both take the completions their posts and receive slots earned (take).

The rules are those the engine relies on (docs/design/transports.md, 1.2 and 3):
- one order per connection: a frame is placed only after every frame before it;
- a signaled request completes when the peer says it placed it (a cumulative ACK), and that
  completion answers for the unsignaled requests before it, which get none of their own;
- a SEND, SEND_WITH_IMM or WRITE_WITH_IMM takes one of the receiver's posted slots. The
  sender counts the slots the receiver has free (credits) and holds such a request, and all
  behind it, until one is free: RC's receiver-not-ready with endless retries, at the sender,
  so the receiver always drains its stream (its ACKs for our writes travel on it too);
- a write lands at its address only inside a live remote-writable registration of its rkey
  (a zero-length write needs none). Otherwise it is dropped, the sender's request completes
  with REM_ACCESS_ERR, and both sides go to the error state: every request and posted
  receive left completes with WR_FLUSH_ERR, as an RC QP in error flushes;
- a stream that ends before a goodbye fails what is outstanding with RETRY_EXC_ERR.
"""

from __future__ import annotations

import ctypes
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rxelab.errors import ProtocolError
from rxelab.transports import base

HEADER = struct.Struct("!BBHIIIQQ")  # kind, flags, credits, imm, rkey, length, remote_addr, seq
SEND, SEND_IMM, WRITE, WRITE_IMM, ACK, NAK, BYE = range(1, 8)
SIGNALED = 1  # flags: the sender wants an ACK once the frame is placed
MAX_LENGTH = 1 << 30  # settings' largest chunk and eager limit
MAX_CREDITS = 0xFFFF
WC_SEND, WC_RDMA_WRITE = 0, 1  # ibv_wc_opcode of a send-side completion
OPCODES = {base.WR_SEND: SEND, base.WR_SEND_WITH_IMM: SEND_IMM, base.WR_RDMA_WRITE: WRITE,
           base.WR_RDMA_WRITE_WITH_IMM: WRITE_IMM}
TAKES_SLOT = (SEND, SEND_IMM, WRITE_IMM)
DISCARD = 1 << 16

# (key, address, length, access) -> whether a live registration of that key covers the range
# with that access (0: read locally)
Covers = Callable[[int, int, int, int], bool]
Frame = list[bytes | memoryview]  # a header, and the payload if it has one


class Completion:
    """One completion, with pyverbs' WC's fields (rxelab.transports.base.Completion)."""

    __slots__ = ("wr_id", "status", "opcode", "vendor_err", "byte_len", "imm_data", "wc_flags")

    def __init__(self, wr_id: int, status: int, opcode: int, byte_len: int = 0,
                 imm_data: int = 0, wc_flags: int = 0) -> None:
        self.wr_id, self.status, self.opcode = wr_id, status, opcode
        self.vendor_err, self.byte_len, self.imm_data, self.wc_flags = 0, byte_len, imm_data, wc_flags

    def __repr__(self) -> str:
        return f"Completion(wr_id={self.wr_id:#x}, status={self.status}, opcode={self.opcode})"


@dataclass
class Request:
    """One posted work request, from its post to its completion."""

    wr_id: int
    kind: int
    addr: int
    length: int
    remote_addr: int
    rkey: int
    imm: int
    signaled: bool
    seq: int = 0


@dataclass
class Arriving:
    """The frame being received: its header, and where the rest of its payload goes."""

    kind: int
    flags: int
    imm: int
    length: int
    seq: int
    dest: int  # an address, or 0: the payload is dropped
    slot: int | None
    done: int = 0
    rkey: int = 0  # a write into registered memory: the key it must still hold, piece by piece


_FROM_MEMORY = ctypes.pythonapi.PyMemoryView_FromMemory
_FROM_MEMORY.restype = ctypes.py_object
_FROM_MEMORY.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PYBUF_WRITE = 0x200


def memory(address: int, length: int) -> memoryview:
    """The bytes at an address, without a copy. Not through a ctypes array: each new length
    made (and kept for good) a new array type, ~16 us each on a quiet host, and a read of a
    large block's rest has a new length almost every time."""
    return _FROM_MEMORY(address, length, _PYBUF_WRITE)  # type: ignore[no-any-return]


class Wire:
    """One connection's two directions: what we post to the peer, what the peer sends us."""

    def __init__(self, peer: int, slots: int, slot_size: int, recv_base: int,
                 covers: Covers) -> None:
        self.peer, self.slot_size, self.recv_base, self.covers = peer, slot_size, recv_base, covers
        self.error: int | None = None  # the status that put this connection in error
        self.said_bye = self.heard_bye = False
        self.gone = False  # the stream ended after the peer's goodbye
        self.done: list[Completion] = []
        # sending
        self.credits = slots  # the peer's free receive slots (both sides have `slots`)
        self.queued: deque[Request] = deque()
        self.unacked: deque[Request] = deque()
        self.next_seq = 1
        # receiving
        self.posted: deque[int] = deque(range(slots))
        self.expected_seq = 1
        self.placed_seq = 0
        self.ack_due = False
        self.credits_due = 0
        self.nak: tuple[int, int] | None = None
        self.header = bytearray(HEADER.size)
        self.header_got = 0
        self.arriving: Arriving | None = None
        self.discard = bytearray(DISCARD)

    # ---- sending -------------------------------------------------------------------------
    def post(self, wr_id: int, opcode: int, addr: int, length: int, lkey: int,
             remote_addr: int = 0, rkey: int = 0, imm: int = 0, signaled: bool = True) -> None:
        kind = OPCODES.get(opcode)
        if kind is None or not 0 <= length <= MAX_LENGTH:
            raise ValueError(f"a work request of opcode {opcode} and length {length}")
        request = Request(wr_id, kind, addr, length, remote_addr, rkey, imm, signaled)
        if self.gone:  # the peer said goodbye and hung up: as an RC peer past its retries
            self._complete(request, base.WC_RETRY_EXC_ERR)
            self._fail(base.WC_RETRY_EXC_ERR)
        elif self.error is not None or self.said_bye:
            self._complete(request, base.WC_WR_FLUSH_ERR)
        elif length and not self.covers(lkey, addr, length, 0):
            self._complete(request, base.WC_LOC_PROT_ERR)
            self._fail(base.WC_LOC_PROT_ERR)
        else:
            self.queued.append(request)

    def out(self) -> list[Frame]:
        """What to send now, frame by frame, in order: our ACK or NAK first, then the requests
        the peer has room for. The payloads are the posted memory itself, read as it goes out."""
        frames: list[Frame] = []
        if self.nak is not None:
            seq, status = self.nak
            frames.append([HEADER.pack(NAK, 0, 0, status, 0, 0, 0, seq)])
            self.nak = None
        if self.ack_due or self.credits_due:
            credits = min(self.credits_due, MAX_CREDITS)
            frames.append([HEADER.pack(ACK, 0, credits, 0, 0, 0, 0, self.placed_seq)])
            self.credits_due -= credits
            self.ack_due = False
        while self.queued and self.error is None:
            r = self.queued[0]
            if r.kind in TAKES_SLOT:
                if not self.credits:
                    break
                self.credits -= 1
            self.queued.popleft()
            r.seq, self.next_seq = self.next_seq, self.next_seq + 1
            header = HEADER.pack(r.kind, SIGNALED if r.signaled else 0, 0, r.imm, r.rkey,
                                 r.length, r.remote_addr, r.seq)
            frames.append([header, memory(r.addr, r.length)] if r.length else [header])
            self.unacked.append(r)
        return frames

    def bye(self) -> bytes:
        """Our goodbye: the stream may end after it without failing anything of the peer's."""
        self.said_bye = True
        return HEADER.pack(BYE, 0, 0, 0, 0, 0, 0, 0)

    # ---- receiving -----------------------------------------------------------------------
    def repost(self, slot: int) -> None:
        """A receive slot is free again: the peer may send into it (told in our next ACK)."""
        if self.error is not None:
            self.done.append(Completion((self.peer << 32) | slot, base.WC_WR_FLUSH_ERR, base.WC_RECV))
            return
        self.posted.append(slot)
        self.credits_due += 1

    def target(self) -> memoryview:
        """Where the next bytes of the stream go (never empty)."""
        a = self.arriving
        if a is None:
            return memoryview(self.header)[self.header_got:]
        n = a.length - a.done
        if a.rkey and not self.covers(a.rkey, a.dest + a.done, n, base.ACCESS_REMOTE_WRITE):
            # revoked mid-frame (a failed communicator's guard): the rest never lands
            self._refuse(a, base.WC_REM_ACCESS_ERR, base.WC_WR_FLUSH_ERR)
            a.dest = a.rkey = 0
        if not a.dest:
            return memoryview(self.discard)[:min(n, DISCARD)]
        return memory(a.dest + a.done, n)

    def received(self, n: int) -> None:
        """n bytes of the stream landed in target()."""
        a = self.arriving
        if a is None:
            self.header_got += n
            if self.header_got == HEADER.size:
                self.header_got = 0
                self._header(*HEADER.unpack(self.header))
        else:
            a.done += n
            if a.done == a.length:
                self._placed(a)

    def feed(self, data: bytes | memoryview) -> None:
        """The stream's next bytes, as a stream API hands them over (copied into place)."""
        view = memoryview(data).cast("B")
        while view:
            into = self.target()
            n = min(len(into), len(view))
            into[:n] = view[:n]
            view = view[n:]
            self.received(n)

    def lost(self) -> None:
        """The stream ended or broke: after the peer's goodbye that fails only what we still
        had outstanding; otherwise the peer is gone, as an RC peer past its retries."""
        if self.error is None and (self.queued or self.unacked or not self.heard_bye):
            self._fail(base.WC_RETRY_EXC_ERR)
        self.gone = True

    def fail(self) -> None:
        """The transport itself broke (not the peer's stream): everything outstanding fails."""
        self._fail(base.WC_RETRY_EXC_ERR)

    def take(self) -> list[Completion]:
        done, self.done = self.done, []
        return done

    # ---- what a frame means ----------------------------------------------------------------
    def _header(self, kind: int, flags: int, credits: int, imm: int, rkey: int, length: int,
                remote_addr: int, seq: int) -> None:
        if kind == ACK:
            self._acked(seq, credits)
            return
        if kind == NAK:
            self._naked(seq, imm)
            return
        if kind == BYE:
            self.heard_bye = True
            return
        if kind not in OPCODES.values() or flags & ~SIGNALED or credits:
            raise ProtocolError(f"rank {self.peer} sent a frame of kind {kind}, flags {flags}")
        if seq != self.expected_seq or length > MAX_LENGTH:
            raise ProtocolError(f"rank {self.peer} sent frame {seq} of {length} bytes; "
                                f"expected frame {self.expected_seq}")
        self.expected_seq += 1
        a = Arriving(kind, flags, imm, length, seq, dest=0, slot=None)
        if self.error is None:
            self._place(a, rkey, remote_addr)
        self.arriving = a
        if not length:
            self._placed(a)

    def _place(self, a: Arriving, rkey: int, remote_addr: int) -> None:
        """Where an arriving frame's payload goes, and whether it may land at all."""
        if a.kind in TAKES_SLOT:
            if not self.posted:
                raise ProtocolError(f"rank {self.peer} sent past the receive slots it was given")
            a.slot = self.posted.popleft()
        if a.kind in (SEND, SEND_IMM):
            if a.length > self.slot_size:
                self._refuse(a, base.WC_REM_INV_REQ_ERR, base.WC_LOC_LEN_ERR)
            else:
                assert a.slot is not None
                a.dest = self.recv_base + a.slot * self.slot_size
        elif a.length and not self.covers(rkey, remote_addr, a.length, base.ACCESS_REMOTE_WRITE):
            self._refuse(a, base.WC_REM_ACCESS_ERR, base.WC_WR_FLUSH_ERR)
        else:
            a.dest, a.rkey = remote_addr, rkey if a.length else 0

    def _refuse(self, a: Arriving, theirs: int, ours: int) -> None:
        """The frame breaks RC's rules: its payload is dropped, its sender told (`theirs`),
        the slot it took completes with `ours`, and this connection goes to the error state."""
        self.nak = (a.seq, theirs)
        if a.slot is not None:
            self.done.append(Completion((self.peer << 32) | a.slot, ours, base.WC_RECV))
            a.slot = None
        self._fail(theirs)

    def _placed(self, a: Arriving) -> None:
        self.arriving = None
        if self.error is not None:
            return
        self.placed_seq = a.seq
        if a.flags & SIGNALED:
            self.ack_due = True
        if a.slot is not None:
            recv = base.WC_RECV_RDMA_WITH_IMM if a.kind == WRITE_IMM else base.WC_RECV
            self.done.append(Completion((self.peer << 32) | a.slot, base.WC_SUCCESS, recv,
                                        byte_len=a.length, imm_data=a.imm,
                                        wc_flags=0 if a.kind == SEND else base.WC_WITH_IMM))

    def _acked(self, seq: int, credits: int) -> None:
        if seq >= self.next_seq or (seq and self.unacked and seq < self.unacked[0].seq - 1):
            raise ProtocolError(f"rank {self.peer} acknowledged frame {seq}, which we never sent")
        self.credits += credits
        while self.unacked and self.unacked[0].seq <= seq:
            r = self.unacked.popleft()
            if r.signaled:
                self._complete(r, base.WC_SUCCESS)

    def _naked(self, seq: int, status: int) -> None:
        if not self.unacked or not self.unacked[0].seq <= seq <= self.unacked[-1].seq:
            raise ProtocolError(f"rank {self.peer} refused frame {seq}, which is not outstanding")
        while self.unacked[0].seq < seq:  # placed before the refused one
            r = self.unacked.popleft()
            if r.signaled:
                self._complete(r, base.WC_SUCCESS)
        self._complete(self.unacked.popleft(), status)
        self._fail(status)

    # ---- completions and the error state ----------------------------------------------------
    def _complete(self, r: Request, status: int) -> None:
        opcode = WC_SEND if r.kind in (SEND, SEND_IMM) else WC_RDMA_WRITE
        self.done.append(Completion(r.wr_id, status, opcode))

    def _fail(self, status: int) -> None:
        """The error state: what was outstanding completes (`status` first, flushes after),
        every posted receive flushes, and nothing more is placed or sent."""
        if self.error is not None:
            return
        self.error = status
        first = status if status == base.WC_RETRY_EXC_ERR else base.WC_WR_FLUSH_ERR
        for r in (*self.unacked, *self.queued):
            self._complete(r, first)
            first = base.WC_WR_FLUSH_ERR
        self.unacked.clear()
        self.queued.clear()
        for slot in self.posted:
            self.done.append(Completion((self.peer << 32) | slot, base.WC_WR_FLUSH_ERR, base.WC_RECV))
        self.posted.clear()
        self.credits_due = 0
        if self.arriving is not None:  # nothing more of it is placed: the rest is dropped
            self.arriving.dest = self.arriving.rkey = 0

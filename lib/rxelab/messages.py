"""What the progress engine puts on the wire and tracks, without the engine: the control
message's format and kinds, why a rank aborted (a rxelab.errors.Reason, or MISMATCH) and
its code on the wire, the mismatch an abort may carry (CAUSE), the work-request ids, and
the operations an algorithm holds while its data moves (WriteOp, SendOp).
rxelab.abort_notices checks an abort notice that arrives.

Pure Python: the algorithms (rxelab.collectives) and a recording engine import it on a host
without pyverbs; only rxelab.verbs imports that.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from rxelab.errors import Reason

CTRL = struct.Struct("!BBHIIIQQ")  # kind, version, reserved, tag, rkey, codec, addr, length
CTRL_VERSION = 2  # 2: a ready-to-receive names the codec of the block it awaits
RTR, TOKEN, ABORT, RTS, MOVING = 1, 2, 3, 4, 5
# Why a rank aborted, as its abort notice says: the Reason it stopped for (rxelab.comm.guard
# sends a silent peer as dead, an abort it was told of as its own failure), or MISMATCH: it
# and a peer disagree on the call (a MismatchError or a ProtocolError, which carry no Reason).
MISMATCH: Final = "mismatch"
AbortReason = Literal[Reason.FAILED, Reason.STALLED, Reason.DIED, "mismatch"]
# its code in the notice's rkey, the same for every version of rxelab (ranks of two versions
# read each other's notices): never renumber one
ABORT_CODE: dict[AbortReason, int] = {Reason.FAILED: 0, Reason.STALLED: 1, Reason.DIED: 2,
                                      MISMATCH: 3}
ABORT_REASON: dict[int, AbortReason] = {code: why for why, code in ABORT_CODE.items()}
ABORT_WORDS: dict[AbortReason, str] = {Reason.FAILED: "it failed",  # how a notice is told
                                       Reason.STALLED: "no progress from",
                                       Reason.DIED: "it found dead",
                                       MISMATCH: "counts disagree with"}
# The immediate of a progress notice: no tag is all ones (collective tags use 30 bits, p2p
# and user tags leave bits clear), and it reads the same in either byte order.
PROGRESS_IMM = 0xFFFFFFFF
CTRL_SLOT = 64  # bytes of a slot holding a control message; slots grow to the eager limit
# what an abort notice for a mismatch carries after its control message: the block's sender
# and receiver and their two sizes (rxelab.errors.Mismatch), so every rank says the first
# cause, whichever notice reaches it first; it fills a control slot exactly
CAUSE = struct.Struct("!IIQQ")
assert CTRL.size + CAUSE.size <= CTRL_SLOT
SEND_BIT = 1 << 63
DATA_BIT = 1 << 62


def slot_size(eager_limit: int) -> int:
    """Bytes of each of a connection's receive and send slots: a control message or an eager
    block."""
    return max(CTRL_SLOT, eager_limit)


def ring_bytes(slots: int, eager_limit: int) -> int:
    """Bytes one connection keeps pinned for its receive and send slots, whatever the calls."""
    return 2 * slots * slot_size(eager_limit)


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


class SendOp:
    """An eager block or control message on its way; done once the peer acknowledged it."""

    __slots__ = ("peer", "done")

    def __init__(self, peer: int, done: bool = False) -> None:
        self.peer, self.done = peer, done

    @property
    def complete(self) -> bool:
        return self.done


UNTRACKED = SendOp(-1, done=True)  # what an unacknowledged eager send returns: nothing to wait on

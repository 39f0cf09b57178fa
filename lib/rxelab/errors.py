"""Exceptions of the library. Each says what went wrong and, where it can, with whom."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Reason(StrEnum):
    """Why a peer let this rank down, set where the error is raised: what a caller (and the
    abort notice to the other ranks) acts on, never read back out of a message's text.
    Below each, the modules that find it. Passed on as it is: a control plane's abort
    carries its sender's Reason (control/framing.py, control/plane.py); an RDMA abort notice
    carries it as a code (messages.ABORT_CODE: a lost peer as DIED, ABORTED as FAILED) and
    stops the call as ABORTED. Not a probe's outcome: that is control/liveness.py's
    Verdict, whose rank, once gone, is DIED (liveness.GONE_REASON)."""

    # its process or connection is gone: control/plane.py (a control connection closed, a
    # rank gone at a barrier), control/framing.py (the other end closed or broke mid-read),
    # control/rendezvous.py (a rank's connection broke as it joined, its listener gone by
    # control/liveness.py's verdicts, rank 0 gone), transports/tcp.py (its data listener
    # gone)
    DIED = "died"
    # it stopped answering: control/plane.py (no heartbeat for liveness.SILENT_S),
    # control/framing.py (no reply by the deadline), control/rendezvous.py (ranks that did
    # not join in time, rank 0 out of reach), membership/agreement.py (a shrink's candidate
    # did not answer), torch/rendezvous.py (nothing in torch's store in time),
    # transports/tcp.py (its data connection never came)
    SILENT = "silent"
    # an operation made no progress for the timeout: waits.py (an RDMA wait),
    # control/plane.py (a barrier not reached or released), control/rendezvous.py (rank 0
    # not gathering the generation)
    STALLED = "no progress"
    # a rank stopped the operation and said so: waits.py (its RDMA abort notice,
    # abort_notices.py), control/rendezvous.py (rank 0 refused the join)
    ABORTED = "aborted by a peer"
    # a work completion or a message failed otherwise: engine.py (a work completion's
    # status), control/plane.py (a bad control message), comm/guard.py (a failure that is
    # no PeerError, told to the control plane); the default of PeerError (membership/,
    # control/rendezvous.py)
    FAILED = "failed"


class RdmaError(Exception):
    """Base class: anything the library raises on purpose."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message if hint is None else f"{message} (hint: {hint})")
        self.hint = hint


class ConfigError(RdmaError):
    """Bad arguments or environment, found before anything was posted."""


@dataclass(frozen=True)
class Mismatch:
    """A block whose size its two ranks disagree on: the first cause of the call's failure,
    which travels in abort notices (rxelab.engine) so that each rank it concerns says it in
    its own words, whoever's notice reaches it first."""

    sender: int
    receiver: int
    sent: int  # bytes the sender has for the block
    expected: int  # bytes the receiver expects

    def words(self, rank: int | None = None) -> str:
        """The mismatch as `rank` says it: the receiver, the sender, or a bystander (None:
        words any rank can read as they are)."""
        if rank == self.receiver:
            return f"rank {self.sender} sends {self.sent} bytes to this rank, which expects " \
                   f"{self.expected}"
        if rank == self.sender:
            return f"rank {self.receiver} expects {self.expected} bytes from rank " \
                   f"{self.sender}, which has {self.sent} for it"
        return f"rank {self.sender} sends {self.sent} bytes to rank {self.receiver}, which " \
               f"expects {self.expected}"

    def other(self, rank: int | None) -> int | None:
        """The rank `rank` disagrees with (None for a bystander)."""
        return self.sender if rank == self.receiver else \
            self.receiver if rank == self.sender else None


class ProtocolError(RdmaError):
    """A malformed, truncated, oversized or wrong-version out-of-band message."""


class MismatchError(ConfigError, ProtocolError):
    """This rank and a peer disagree on a call (counts, sizes, codec), found as it ran: the
    arguments disagree (a ConfigError), found in what a peer sent (a ProtocolError, as a
    receiver's finding always was). `peer` the rank it disagrees with, `mismatch` the
    block's two sizes where they are what disagrees."""

    def __init__(self, message: str, *, peer: int | None = None,
                 mismatch: Mismatch | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.peer = peer
        self.mismatch = mismatch


class PeerError(RdmaError):
    """A peer died, stopped answering, or a work completion failed: `reason` says which,
    `peer` (where known) who; `mismatch`, the disagreement that stopped the call where one
    did (passed on in this rank's own abort notices)."""

    def __init__(self, message: str, *, peer: int | None = None, reason: Reason = Reason.FAILED,
                 hint: str | None = None, mismatch: Mismatch | None = None) -> None:
        super().__init__(message, hint=hint)
        self.peer = peer
        self.reason = Reason(reason)
        self.mismatch = mismatch

    @property
    def lost(self) -> bool:
        """Whether the peer is taken for dead (gone, or silent past its heartbeat)."""
        return self.reason in (Reason.DIED, Reason.SILENT)


class ClosedError(RdmaError):
    """The communicator was used after close()."""


class AuthError(ProtocolError):
    """The other end of a control connection did not prove it holds the job's credential."""

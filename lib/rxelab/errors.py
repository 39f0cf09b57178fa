"""Exceptions of the library. Each says what went wrong and, where it can, with whom."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Reason(StrEnum):
    """Why a peer let this rank down, set where the error is raised: what a caller (and the
    abort notice to the other ranks) acts on, never read back out of a message's text."""

    DIED = "died"  # its process or connection is gone
    SILENT = "silent"  # it stopped answering: no heartbeat, no reply in time
    STALLED = "no progress"  # an operation made no progress for the timeout
    ABORTED = "aborted by a peer"  # a rank stopped the operation and said so
    FAILED = "failed"  # a work completion or a message failed otherwise


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

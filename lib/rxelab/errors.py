"""Exceptions of the library. Each says what went wrong and, where it can, with whom."""

from __future__ import annotations

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


class MismatchError(ConfigError):
    """This rank and a peer disagree on a call (counts, sizes, codec), found as it ran."""


class ProtocolError(RdmaError):
    """A malformed, truncated, oversized or wrong-version out-of-band message."""


class PeerError(RdmaError):
    """A peer died, stopped answering, or a work completion failed: `reason` says which,
    `peer` (where known) who."""

    def __init__(self, message: str, *, peer: int | None = None, reason: Reason = Reason.FAILED,
                 hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.peer = peer
        self.reason = Reason(reason)

    @property
    def lost(self) -> bool:
        """Whether the peer is taken for dead (gone, or silent past its heartbeat)."""
        return self.reason in (Reason.DIED, Reason.SILENT)


class ClosedError(RdmaError):
    """The communicator was used after close()."""


class AuthError(ProtocolError):
    """The other end of a control connection did not prove it holds the job's credential."""

"""Exceptions of the library. Each says what went wrong and, where it can, with whom."""

from __future__ import annotations


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
    """A peer died, stopped answering, or a work completion failed."""

    def __init__(self, message: str, *, peer: int | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.peer = peer


class ClosedError(RdmaError):
    """The communicator was used after close()."""


class AuthError(ProtocolError):
    """The other end of a control connection did not prove it holds the job's credential."""

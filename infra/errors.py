"""One exception type for operator-facing failures, so the CLI edge can print one clear line."""

from __future__ import annotations


class LabError(Exception):
    """A failure the user can act on: `message` says what went wrong, `hint` what to do about it."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"

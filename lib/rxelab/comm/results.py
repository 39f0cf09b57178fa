"""What the communicator's calls hand back: a collective's figures (what experiments
record) and a peer's exposed buffer (what one-sided writes aim at)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Stats(NamedTuple):
    """What one collective did (a NamedTuple: made on every call, so cheap to make)."""

    operation: str
    algorithm: str
    bytes_sent: int
    bytes_received: int
    peak_pinned: int
    peak_inflight: int
    seconds: float
    coded_raw: int = 0  # bytes of blocks this rank sent coded (compression=), before coding
    coded_wire: int = 0  # what they took on the wire (coded_raw / coded_wire: the ratio)
    codec_seconds: float = 0.0  # CPU time this rank spent coding and decoding
    empty_polls: int = 0  # completion-queue polls that found nothing while it waited
    sleeps: int = 0  # waits on the completion channel (select); one finding an event there returns at once


@dataclass(frozen=True)
class RemoteBuffer:
    """A peer's buffer we may write into (from Communicator.remote)."""

    peer: int
    addr: int
    rkey: int
    length: int

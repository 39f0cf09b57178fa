"""The admit: between collectives a running elastic job lets the newcomers waiting at its
rendezvous in (rxelab.membership.newcomers has their side). Rank 0 hears them; every rank
learns how many came; if any, the next, larger communicator is built with the old ranks
first and the newcomers after them. If a rank dies while it is built, the old members
shrink among themselves instead (the newcomers may knock again).

Generic in what is built: the communicator passes itself as a Member and its builder in."""

from __future__ import annotations

import dataclasses
import operator
import time
from collections.abc import Callable
from typing import Any, Protocol

from rxelab.errors import ConfigError, PeerError
from rxelab.membership import newcomers
from rxelab.membership.agreement import shrink
from rxelab.membership.seat import Build, Formed, Seat, T, check_quorum, deadline_of


class Member(Protocol):
    """What admit needs of the communicator it grows."""

    rank: int
    size: int
    timeout: float

    def seat(self, what: str) -> Seat:
        """Where this rank sits in the job (a ConfigError unless it is elastic)."""

    def leave(self, what: str, farewell: bool) -> Seat:
        """Close the communicator for the change, keeping the listener."""

    def agree_on(self, count: int) -> int:
        """Rank 0's count, on every rank, every rank holding it before any acts on it."""


def admit(member: Member, build_on: Callable[[Seat], Build[T]], timeout: float, wanted: int,
          quorum: str | int, fits: Callable[[dict[str, Any]], str | None],
          watch: Callable[[], None]) -> Formed[T] | None:
    """The larger communicator, or None when nobody came (the member goes on as it was).
    fits(a newcomer's settings) says why they differ from the job's, or None."""
    seat = member.seat("admit")
    try:
        if isinstance(wanted, bool):
            raise TypeError
        wanted = operator.index(wanted)
    except TypeError:
        raise ConfigError(f"wanted={wanted!r} must be a whole number") from None
    if not 0 <= wanted <= newcomers.MAX_NEWCOMERS:
        raise ConfigError(f"wanted={wanted} must be 0..{newcomers.MAX_NEWCOMERS}")
    deadline_of(timeout, 0.0)  # checked
    quorum = check_quorum(quorum, member.size)
    wait = min(float(timeout), member.timeout * newcomers.ADMIT_SHARE)
    arrived = (newcomers.hear_newcomers(seat, wait, wanted,
                                        member.timeout * newcomers.OFFER_SHARE, fits, watch)
               if member.rank == 0 else [])
    try:
        count = member.agree_on(len(arrived))
    except BaseException:
        newcomers.turn_away(arrived, "a rank of the job failed while admitting")
        raise
    if not count:
        return None
    generation, size = seat.generation, member.size
    newcomers.welcome(arrived, size, generation + 1, seat.job.job_id)
    seat = member.leave("admit", farewell=True)
    started = time.monotonic()
    host, port = seat.directory[0]
    job = dataclasses.replace(seat.job, world_size=size + count, master_addr=host,
                              master_port=port, source="admit")
    build = build_on(seat)
    try:
        try:
            made = build(job, generation + 1, None)
        except PeerError:  # the old members go on among themselves, leaving this one
            return shrink(seat, build, time.monotonic() + member.timeout, quorum)
    except BaseException:
        seat.server.close(listener=True)
        raise
    return Formed(made, {"how": "admit", "members": list(range(size)), "lost": [],
                         "admitted": list(range(size, size + count)),
                         "build_s": time.monotonic() - started, "generation": generation + 1})

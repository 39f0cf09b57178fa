"""What a rank of an elastic job carries from one communicator to the next (its Seat), what
a change of membership hands back (Formed: the new communicator, and how it formed), and the
checks of a change's arguments. Generic in what is built: nothing here knows the
communicator's type (rxelab.comm sits above and passes its builder in)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rxelab.bootstrap import JobInfo
from rxelab.control.connection import Link, dial
from rxelab.control.liveness import CONNECT_S, PROBE_S, Verdict, probe
from rxelab.control.server import Server
from rxelab.errors import ConfigError

T = TypeVar("T")
READ_S = 2.0  # an answer to a member, or a newcomer's to its offer, is taken within this
# makes the communicator of a job and generation on the seat's server; look(new rank) says
# whether a member that has not come yet still lives (rxelab.control.liveness's verdict)
Build = Callable[[JobInfo, int, Callable[[int], Verdict] | None], T]


@dataclass
class Formed(Generic[T]):
    """What a change of membership made, and how: {"how": shrink|admit, "members",
    "lost", "admitted", "generation", and the seconds each part took}."""

    made: T
    how: dict[str, Any]


@dataclass
class Seat:
    """What a rank carries from one communicator to the next: the job (with its id), its
    server, where the others listen, how it opened its device and set its options, and which
    ranks its heartbeats said lived as it left (rxelab.control.plane: a connect that times out
    towards one of them is a crowded listener, not a death, rxelab.control.liveness)."""

    job: JobInfo
    server: Server
    directory: dict[int, tuple[str, int]]
    generation: int
    opened: dict[str, Any]  # device=, port=, gid_index= and the settings, for the next init
    lively: frozenset[int] = frozenset()

    def probe(self, rank: int, generation: int) -> Verdict:
        """Whether old rank `rank` still lives (rxelab.control.liveness: a proven answer from its
        listener, for that rank of that generation)."""
        return probe(self.directory[rank], self.job.credential, scope=self.job.job_id,
                     rank=self.job.rank, to=rank, generation=generation)

    def dial(self, rank: int, kind: str, generation: int, deadline: float) -> Link:
        return dial(self.directory[rank], self.job.credential, kind=kind, rank=self.job.rank,
                    to=rank, generation=generation, scope=self.job.job_id,
                    deadline=min(deadline, time.monotonic() + PROBE_S), connect_s=CONNECT_S)


def quorate(decided: list[int], members: list[int], quorum: str | int) -> bool:
    """Whether `decided` of `members` may go on: "any" survivors; at least N; or ("majority")
    more than half, or exactly half holding the lowest member (one side of a split at most)."""
    if quorum == "any":
        return bool(decided)
    if isinstance(quorum, int):
        return len(decided) >= quorum
    return 2 * len(decided) > len(members) or (2 * len(decided) == len(members)
                                               and members[0] in decided)


def check_quorum(quorum: Any, size: int) -> str | int:
    if quorum in ("any", "majority"):
        return str(quorum)
    if isinstance(quorum, int) and not isinstance(quorum, bool) and 1 <= quorum <= size:
        return quorum
    raise ConfigError(f"quorum={quorum!r} must be 'majority', 'any' or a number of ranks "
                      f"from 1 to {size}")


def deadline_of(seconds: Any, default: float, name: str = "timeout") -> float:
    if seconds is None:
        return time.monotonic() + default
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= 86400:
        raise ConfigError(f"{name}={seconds!r} must be a number of seconds from 0 to 86400")
    return time.monotonic() + float(seconds)


def say(link: Link, message: dict[str, Any]) -> None:
    """Best effort: the other end may be gone."""
    try:
        link.sock.settimeout(READ_S)
        link.send(message)
    except OSError:
        pass

"""Elastic membership: after a rank dies the survivors agree on who is left and go on in a new
communicator (shrink, as ULFM's MPIX_Comm_shrink); between steps a running job lets newcomers
in (admit, and join on the newcomer's side). MPI, Gloo and NCCL end the job instead.

Every rank of an elastic job keeps a listener for the job's life, served by its porter
(rxelab.porter: rank 0's is the job's rendezvous), and knows where the others listen. Every
connection between them is proven both ways and sealed (rxelab.auth): a process without the
job's secret can neither answer for a rank, nor coordinate a shrink, nor learn the secret.
A shrink needs no rank in particular to have survived:

- The coordinator is the lowest old rank whose listener still answers, proven: each survivor
  tries them in order, and a refused or unanswered connection, or a listener that cannot
  prove itself (a stranger on a dead rank's port), moves it on to the next. A live process
  keeps its listener, so every survivor finds the same one.
- The coordinator waits for each old rank to come, or to be found dead: it probes the
  listeners of those that have not come (a proven answer means alive). Views of who died may
  differ; its decision is the one set everybody takes. A rank that dies during the agreement
  (its connection closes) is counted dead; a coordinator that dies before or after deciding
  sends its survivors to the next one at once (nothing listens where it did).
- Unless told otherwise, the survivors go on only as a majority of the old communicator (or
  exactly half holding its lowest rank): in a network partition one side at most carries on,
  and the other is told why it stopped.
- The new communicator is built as init() builds one (its rank 0, the coordinator, serves the
  exchange on its listener): ranks renumbered densely in the old order, a fresh mesh of RC
  QPs, nothing of the old one left. If a member dies while it is built, the agreement runs
  again among those decided.

A newcomer is taken in only if it proved the secret, has the job's settings (else it is
refused and the job is left as it was), and accepted the offer while it still waited
(rxelab.newcomers).

No collective is ever in flight across a change: shrink and admit are called by the
application between collectives, on every rank; the collective a failure interrupted has an
undefined result everywhere and is redone on the new communicator.
"""

from __future__ import annotations

import queue
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rxelab.bootstrap import JobInfo
from rxelab.errors import AuthError, ConfigError, PeerError, ProtocolError
from rxelab.link import Link, dial
from rxelab.liveness import CONNECT_S, GONE, PROBE_S, SILENT, Watch, probe
from rxelab.porter import Porter, answer

if TYPE_CHECKING:
    from rxelab.comm import Communicator

READ_S = 2.0  # an answer to a member, or a newcomer's to its offer, is taken within this
# makes the communicator of a job and generation on the seat's porter; look(new rank) says
# whether a member that has not come yet still lives (rxelab.liveness's verdict)
Build = Callable[[JobInfo, int, Callable[[int], str] | None], "Communicator"]


@dataclass
class Seat:
    """What a rank carries from one communicator to the next: the job (with its id), its
    porter, where the others listen, and how it opened its device and set its options."""

    job: JobInfo
    porter: Porter
    directory: dict[int, tuple[str, int]]
    generation: int
    opened: dict[str, Any]  # device=, port=, gid_index= and the settings, for the next init

    def probe(self, rank: int, generation: int) -> str:
        """Whether old rank `rank` still lives (rxelab.liveness: a proven answer from its
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


# ---- shrink --------------------------------------------------------------------------------
def shrink(seat: Seat, build: Build, deadline: float, quorum: str | int) -> Communicator:
    """The survivors' new communicator (see the module's docstring). `build` makes the
    communicator of a job and generation on the seat's porter; the seat's communicator is
    closed already."""
    me = seat.job.rank
    members = list(range(seat.job.world_size))
    dead: set[int] = set()  # whose listener no longer answers, proven
    # the communicator being left: a build that fails makes none, so every retry (and every
    # rank, whichever attempt it saw fail) still speaks of this one, in its numbering
    generation = seat.generation
    started = time.monotonic()
    while True:
        decided, coordinator = agree(seat, members, dead, generation, deadline, quorum)
        agreed = time.monotonic()
        host, port = seat.directory[coordinator]
        job = replace(seat.job, rank=decided.index(me), world_size=len(decided),
                      master_addr=host, master_port=port, source="shrink")
        formed = {"how": "shrink", "members": decided,
                  "lost": [m for m in range(seat.job.world_size) if m not in decided],
                  "agree_s": agreed - started}

        def look(rank: int, decided: list[int] = decided) -> str:
            return seat.probe(decided[rank], generation)
        try:
            comm = build(job, generation + 1, look)
        except PeerError as err:  # a member died while the mesh was built: agree again
            if time.monotonic() >= deadline:
                raise PeerError(f"shrink: the new communicator of ranks {decided} could not be "
                                f"built in time: {err}", peer=err.peer) from None
            time.sleep(0.2)
            continue
        comm.formed = {**formed, "build_s": time.monotonic() - agreed,
                       "generation": comm.control.generation}
        return comm


def agree(seat: Seat, members: list[int], dead: set[int], generation: int, deadline: float,
          quorum: str | int) -> tuple[list[int], int]:
    """The decided members (old ranks, in order) and who coordinated."""
    me = seat.job.rank
    for candidate in members:
        if candidate == me:
            return coordinate(seat, members, dead, generation, deadline, quorum), me
        if candidate in dead:
            continue
        while (decided := ask(seat, candidate, generation, deadline)) == "later":
            time.sleep(0.2)  # it is busy (admitting, building, not failed yet): it will come
        if isinstance(decided, list):
            return decided, candidate
        dead.add(candidate)
    raise AssertionError("a rank is always among the members it agrees with")  # pragma: no cover


def ask(seat: Seat, candidate: int, generation: int, deadline: float) -> list[int] | str | None:
    """The candidate's decision, None when it is gone (nothing listens there, or what does
    cannot prove it is of this job), or "later" when it is not coordinating yet."""
    try:
        link = seat.dial(candidate, "shrink", generation, deadline)
    except (OSError, AuthError):  # nothing listens there, or a stranger does: gone
        return None
    except (ProtocolError, PeerError) as err:  # it closed on us, or said nothing
        if time.monotonic() >= deadline:
            raise PeerError(f"shrink: rank {candidate} did not answer in time: {err}",
                            peer=candidate) from None
        # a live porter does neither for long: silent (or gone) twice in a row means gone
        verdict = seat.probe(candidate, generation)
        return None if verdict == GONE or (verdict == SILENT and "in time" in str(err)) \
            else "later"
    try:
        link.send({"type": "shrink", "rank": seat.job.rank, "generation": generation})
        # a little past our deadline: the coordinator's verdict at its own comes first
        reply = link.recv(deadline=deadline + READ_S, peer=f"rank {candidate}")
    except (OSError, ProtocolError, PeerError) as err:
        if time.monotonic() >= deadline:
            raise PeerError(f"shrink: rank {candidate} (the lowest rank whose listener "
                            f"answers) did not coordinate it in time: {err}",
                            peer=candidate) from None
        return "later"
    finally:
        link.close()
    if reply["type"] == "members" and seat.job.rank in reply["members"]:
        return [int(m) for m in reply["members"]]
    if reply["type"] == "failed":
        raise PeerError(f"shrink: {reply['reason']}", peer=candidate)
    if reply["type"] == "later":
        return "later"
    raise PeerError(f"shrink: rank {candidate} answered {reply['type']} "
                    f"{reply.get('members', '')}", peer=candidate)


def closed(link: Link) -> bool:
    """Whether the other end of a link that owes us nothing has gone."""
    try:
        ready, _, _ = select.select([link.sock], [], [], 0)
        return bool(ready) and link.sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def coordinate(seat: Seat, members: list[int], dead: set[int], generation: int, deadline: float,
               quorum: str | int) -> list[int]:
    me = seat.job.rank
    joined: dict[int, Link] = {}
    watch = Watch(lambda r: seat.probe(r, generation))
    try:
        with seat.porter.serving("shrink") as inbox:  # ended before the verdict is told: a
            # member's hello for the next generation must not find this rank agreeing
            while True:
                for r in [r for r, link in joined.items() if closed(link)]:
                    joined.pop(r).close()  # it died while we agreed
                    dead.add(r)
                missing = [m for m in members if m != me and m not in joined and m not in dead]
                if not missing:
                    break
                if time.monotonic() >= deadline:
                    why = (f"ranks {missing} are alive (their listeners answer) but did not come "
                           "to the shrink in time")
                    tell(joined, {"type": "failed", "reason": why})
                    raise PeerError(f"shrink: {why}", peer=missing[0],
                                    hint="every surviving rank must call shrink()")
                dead.update(watch.gone(missing))
                try:
                    link, message = inbox.get(timeout=0.2)
                except queue.Empty:
                    continue
                _heard(link, message, members, joined, dead, watch, generation, me)
        decided = sorted([me, *joined])
        if not quorate(decided, members, quorum):
            why = (f"only ranks {decided} of {members} are left on this side (quorum "
                   f"{quorum}): the others may go on without them")
            tell(joined, {"type": "failed", "reason": why})
            raise PeerError(f"shrink: {why}", hint="a network partition? quorum='any' lets any "
                                                   "group of survivors go on")
        seat.porter.hold(generation + 1, 0)  # its members dial it at once
        tell(joined, {"type": "members", "generation": generation, "members": decided})
        return decided
    finally:
        for link in joined.values():
            link.close()


def _heard(link: Link, message: dict[str, Any], members: list[int], joined: dict[int, Link],
           dead: set[int], watch: Watch, generation: int, me: int) -> None:
    r = message["rank"]
    if r not in members or r == me or r in joined:
        answer(link, None)
    elif message["generation"] == generation:
        joined[r] = link
        dead.discard(r)  # it is here: whatever a probe thought
        watch.forget(r)
    else:
        # a member that saw another membership (it built, or failed to build, a communicator
        # the others did not): it cannot be taken in; it is told why and left out, so no
        # two groups form
        dead.add(r)
        answer(link, {"type": "failed", "reason": (
            f"rank {r} left generation {message['generation']}, this shrink leaves generation "
            f"{generation}: the ranks saw different memberships, and this one is left out")})


def tell(joined: dict[int, Link], message: dict[str, Any]) -> None:
    for link in joined.values():
        say(link, message)


def say(link: Link, message: dict[str, Any]) -> None:
    """Best effort: the other end may be gone."""
    try:
        link.sock.settimeout(READ_S)
        link.send(message)
    except OSError:
        pass

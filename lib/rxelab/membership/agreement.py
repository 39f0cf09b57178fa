"""The shrink: after a rank died the survivors agree on who is left (one coordinator's
decision, see rxelab.membership) and build the next communicator among themselves."""

from __future__ import annotations

import queue
import select
import socket
import time
from dataclasses import replace
from typing import Any

from rxelab.control.connection import Link
from rxelab.control.liveness import Doubts, Verdict, Watch, verdict_of
from rxelab.control.server import answer
from rxelab.errors import PeerError, ProtocolError, Reason
from rxelab.membership.seat import READ_S, Build, Formed, Seat, T, quorate, say


def shrink(seat: Seat, build: Build[T], deadline: float, quorum: str | int) -> Formed[T]:
    """The survivors' new communicator (see the module's docstring). `build` makes the
    communicator of a job and generation on the seat's server; the seat's communicator is
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

        def look(rank: int, decided: list[int] = decided) -> Verdict:
            return seat.probe(decided[rank], generation)
        try:
            comm = build(job, generation + 1, look)
        except PeerError as err:  # a member died while the mesh was built: agree again
            if time.monotonic() >= deadline:
                raise PeerError(f"shrink: the new communicator of ranks {decided} could not be "
                                f"built in time: {err}", peer=err.peer) from None
            time.sleep(0.2)
            continue
        return Formed(comm, {**formed, "build_s": time.monotonic() - agreed,
                             "generation": generation + 1})


def agree(seat: Seat, members: list[int], dead: set[int], generation: int, deadline: float,
          quorum: str | int) -> tuple[list[int], int]:
    """The decided members (old ranks, in order) and who coordinated."""
    me = seat.job.rank
    doubts = Doubts(seat.lively)
    for candidate in members:
        if candidate == me:
            return coordinate(seat, members, dead, generation, deadline, quorum), me
        if candidate in dead:
            continue
        while (decided := ask(seat, candidate, generation, deadline, doubts)) == "later":
            time.sleep(0.2)  # it is busy (admitting, building, not failed yet): it will come
        if isinstance(decided, list):
            return decided, candidate
        dead.add(candidate)
    raise AssertionError("a rank is always among the members it agrees with")  # pragma: no cover


def ask(seat: Seat, candidate: int, generation: int, deadline: float,
        doubts: Doubts) -> list[int] | str | None:
    """The candidate's decision, None when it is gone (nothing listens there, what does
    cannot prove it is of this job, or it gave no proof for long: rxelab.control.liveness), or
    "later" when it is not coordinating yet, or not proven either way yet."""
    began = time.monotonic()
    try:
        link = seat.dial(candidate, "shrink", generation, deadline)
    except (OSError, ProtocolError, PeerError) as err:
        verdict = verdict_of(err)
        doubts.note(candidate, verdict, began)
        if verdict == Verdict.GONE or doubts.gone(candidate):
            return None
        if time.monotonic() >= deadline:
            raise PeerError(f"shrink: rank {candidate} did not answer in time: {err}",
                            peer=candidate, reason=Reason.SILENT) from None
        return "later"  # closed on us, said nothing, or its connect timed out: once more
    doubts.note(candidate, Verdict.ALIVE, began)
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
    watch = Watch(lambda r: seat.probe(r, generation), seat.lively)
    try:
        with seat.server.serving("shrink") as inbox:  # ended before the verdict is told: a
            # member's hello for the next generation must not find this rank agreeing
            while True:
                for r in [r for r, link in joined.items() if closed(link)]:
                    joined.pop(r).close()  # it died while we agreed
                    dead.add(r)
                missing = [m for m in members if m != me and m not in joined and m not in dead]
                if not missing:
                    break
                if time.monotonic() >= deadline:
                    # "unsure" ends here: a rank that never proved it lives is gone
                    dead.update(m for m in missing if not watch.alive(m))
                    if not (missing := [m for m in missing if m not in dead]):
                        break
                    why = (f"ranks {missing} are alive (their listeners answer, or their "
                           "heartbeats did) but did not come to the shrink in time")
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
        seat.server.hold(generation + 1, 0)  # its members dial it at once
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

"""Elastic membership: after a rank dies the survivors agree on who is left and go on in a new
communicator (shrink, as ULFM's MPIX_Comm_shrink); between steps a running job lets newcomers
in (admit, and join on the newcomer's side). MPI, Gloo and NCCL end the job instead.

Every rank of an elastic job keeps a TCP listener for the job's life (rank 0's is the job's
rendezvous address) and knows where the others listen. A shrink needs no rank in particular
to have survived:

- The coordinator is the lowest old rank whose listener still answers: each survivor tries
  them in order, and a refused or unanswered connection (a dead process, a powered-off node,
  a partition) moves it on to the next. A live process keeps its listener open, so every
  survivor finds the same one.
- The coordinator waits for each old rank to come, or to be found dead: it probes the
  listeners of those that have not come. Views of who died may differ; its decision is the one
  set everybody takes. A rank that dies during the agreement (its connection closes) is
  counted dead; a coordinator that dies sends its survivors to the next one.
- Unless told otherwise, the survivors go on only as a majority of the old communicator (or
  exactly half holding its lowest rank): in a network partition one side at most carries on,
  and the other is told why it stopped.
- The new communicator is built as init() builds one (its rank 0, the coordinator, serves the
  exchange on its listener): ranks renumbered densely in the old order, a fresh mesh of RC
  QPs, nothing of the old one left. If a member dies while it is built, the agreement runs
  again among those decided.

No collective is ever in flight across a change: shrink and admit are called by the
application between collectives, on every rank; the collective a failure interrupted has an
undefined result everywhere and is redone on the new communicator.
"""

from __future__ import annotations

import contextlib
import hmac
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rxelab import wire
from rxelab.bootstrap import JobInfo
from rxelab.errors import ConfigError, PeerError, ProtocolError, RdmaError
from rxelab.hall import Hall

if TYPE_CHECKING:
    from rxelab.comm import Communicator

CONNECT_S = 3.0  # a listener that has not answered a connection by then is taken for dead
PROBE_EVERY_S = 1.0  # the coordinator looks again at the listeners of ranks not yet come
READ_S = 2.0  # a connection to a listener must say what it wants within this long
MAX_NEWCOMERS = 64  # per admit
# makes the communicator of a job and generation on the seat's listener; alive(new rank) says
# whether a member that has not come yet still lives
Build = Callable[[JobInfo, int, Callable[[int], bool] | None], "Communicator"]
GRACE_S = 0.1  # admit listens at least this long: newcomers queued before it say their join


@dataclass
class Seat:
    """What a rank carries from one communicator to the next: the job, its listener, where
    the others listen, and how it opened its device and set its options."""

    job: JobInfo
    listener: socket.socket
    directory: dict[int, tuple[str, int]]
    generation: int
    opened: dict[str, Any]  # device=, port=, gid_index= and the settings, for the next init


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
    communicator of a job and generation on the seat's listener; the seat's communicator is
    closed already."""
    me = seat.job.rank
    members = list(range(seat.job.world_size))
    dead: set[int] = set()  # whose listener a connection no longer reaches
    # the communicator being left: a build that fails makes none, so every retry (and every
    # rank, whichever attempt it saw fail) still speaks of this one, in its numbering
    generation = seat.generation
    started = time.monotonic()
    while True:
        decided, coordinator = agree(seat, members, dead, generation, deadline, quorum)
        agreed = time.monotonic()
        host, port = seat.directory[coordinator]
        job = JobInfo(decided.index(me), len(decided), host, port, "shrink", seat.job.token,
                      seat.job.token_source)
        formed = {"how": "shrink", "members": decided,
                  "lost": [m for m in range(seat.job.world_size) if m not in decided],
                  "agree_s": agreed - started}

        def alive(rank: int, decided: list[int] = decided) -> bool:
            return answers(seat.directory[decided[rank]], deadline)
        try:
            comm = build(job, generation + 1, alive)
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
            time.sleep(0.2)  # it is busy (admitting, say): it will come to the shrink
        if isinstance(decided, list):
            return decided, candidate
        dead.add(candidate)
    raise AssertionError("a rank is always among the members it agrees with")  # pragma: no cover


def ask(seat: Seat, candidate: int, generation: int, deadline: float) -> list[int] | str | None:
    """The candidate's decision, None when it is gone (its listener no longer answers), or
    "later" when it is not shrinking yet (it said so, or closed on us: a live process keeps
    its listener, so only a failed connection means it is gone)."""
    addr = seat.directory[candidate]
    try:
        sock = socket.create_connection(addr, timeout=max(0.1, min(CONNECT_S, deadline - time.monotonic())))
    except OSError:
        return None
    with sock:
        try:
            wire.send(sock, {"type": "shrink", "rank": seat.job.rank, "generation": generation,
                             "token": seat.job.token})
            # a little past our deadline: the coordinator's verdict at its own comes first
            reply = wire.recv(sock, deadline=deadline + READ_S, peer=f"rank {candidate}")
        except (OSError, ProtocolError, PeerError) as err:
            if time.monotonic() >= deadline:
                raise PeerError(f"shrink: rank {candidate} (the lowest rank whose listener "
                                f"answers) did not coordinate it in time: {err}",
                                peer=candidate) from None
            return "later"
    if reply["type"] == "members" and seat.job.rank in reply["members"]:
        return [int(m) for m in reply["members"]]
    if reply["type"] == "failed":
        raise PeerError(f"shrink: {reply['reason']}", peer=candidate)
    if reply["type"] == "later":
        return "later"
    raise PeerError(f"shrink: rank {candidate} answered {reply['type']} "
                    f"{reply.get('members', '')}", peer=candidate)


def answers(addr: tuple[str, int], deadline: float) -> bool:
    """Whether a listener is there: a live process's answers at once."""
    try:
        socket.create_connection(addr, timeout=max(0.1, min(1.0, deadline - time.monotonic()))).close()
        return True
    except OSError:
        return False


def coordinate(seat: Seat, members: list[int], dead: set[int], generation: int, deadline: float,
               quorum: str | int) -> list[int]:
    me = seat.job.rank
    joined: dict[int, socket.socket] = {}
    hall = Hall(seat.listener, patience=READ_S, limit=MAX_NEWCOMERS)
    probed = 0.0
    try:
        while True:
            missing = [m for m in members if m != me and m not in joined and m not in dead]
            if not missing:
                break
            now = time.monotonic()
            if now >= deadline:
                why = (f"ranks {missing} are alive (their listeners answer) but did not come to "
                       f"the shrink in time")
                tell(joined, {"type": "failed", "reason": why})
                raise PeerError(f"shrink: {why}", peer=missing[0],
                                hint="every surviving rank must call shrink()")
            if now - probed >= PROBE_EVERY_S:
                probed = now
                dead.update(m for m in missing if not answers(seat.directory[m], deadline))
            for sock, message in hall.hear(min(0.2, max(0.0, deadline - now))):
                if message is None:  # a member's connection closed: it died while we agreed
                    gone = [r for r, s in joined.items() if s is sock]
                    for r in gone:
                        del joined[r]
                        dead.add(r)
                    sock.close()
                elif (message["type"] == "shrink" and message["generation"] == generation
                      and message["rank"] in members and message["rank"] not in joined
                      and message["rank"] != me
                      and hmac.compare_digest(message["token"], seat.job.token)):
                    joined[message["rank"]] = sock
                    dead.discard(message["rank"])  # it is here: whatever a probe thought
                    hall.keep(sock)
                elif (message["type"] == "shrink" and message["rank"] in members
                      and message["rank"] != me
                      and hmac.compare_digest(message["token"], seat.job.token)):
                    # a member that saw another membership (it built, or failed to build, a
                    # communicator the others did not): it cannot be taken in; it is told
                    # why and left out, so no two groups form
                    dead.add(message["rank"])
                    say(sock, {"type": "failed", "reason": (
                        f"rank {message['rank']} left generation {message['generation']}, "
                        f"this shrink leaves generation {generation}: the ranks saw different "
                        "memberships, and this one is left out")})
                    sock.close()
                else:  # a newcomer (admitted later), another generation's, a stranger
                    say(sock, {"type": "later", "reason": "the job is changing its members"}
                        if message is not None and message["type"] == "join" else None)
        decided = sorted([me, *joined])
        if not quorate(decided, members, quorum):
            why = (f"only ranks {decided} of {members} are left on this side (quorum "
                   f"{quorum}): the others may go on without them")
            tell(joined, {"type": "failed", "reason": why})
            raise PeerError(f"shrink: {why}", hint="a network partition? quorum='any' lets any "
                                                   "group of survivors go on")
        tell(joined, {"type": "members", "generation": generation, "members": decided})
        return decided
    finally:
        for sock in joined.values():
            sock.close()
        hall.close()


def tell(joined: dict[int, socket.socket], message: dict[str, Any]) -> None:
    for sock in joined.values():
        say(sock, message)


def say(sock: socket.socket, message: dict[str, Any] | None) -> None:
    """Best effort: the other end may be gone."""
    with contextlib.suppress(OSError):
        if message is not None:
            sock.settimeout(READ_S)
            wire.send(sock, message)
    if message is None or message["type"] == "later":
        sock.close()


# ---- grow ----------------------------------------------------------------------------------
def hear_newcomers(seat: Seat, wait: float, wanted: int,
                   watch: Callable[[], None] = lambda: None) -> list[socket.socket]:
    """Rank 0: the newcomers at the rendezvous (with the job's secret), waiting up to `wait`
    seconds for `wanted` of them; whoever is there already comes in too. watch() raises a
    failure of the job found meanwhile (a rank gone)."""
    hall = Hall(seat.listener, patience=READ_S, limit=MAX_NEWCOMERS)
    found: list[socket.socket] = []
    grace = time.monotonic() + GRACE_S
    end = max(grace, time.monotonic() + wait)
    try:
        while len(found) < MAX_NEWCOMERS:
            watch()
            now = time.monotonic()
            enough = len(found) >= wanted and now >= grace
            if ((enough or now >= end) and not hall.pending) or now >= end + READ_S:
                break
            for sock, message in hall.hear(0.05):
                if (message is not None and message["type"] == "join"
                        and hmac.compare_digest(message["token"], seat.job.token)):
                    found.append(sock)
                else:  # a stranger; or a member that shrinks already: we soon will too
                    say(sock, {"type": "later", "reason": "not shrinking yet"}
                        if message is not None and message["type"] == "shrink" else None)
    except BaseException:
        for sock in found:
            sock.close()
        raise
    finally:
        hall.close()
    return found


def welcome(newcomers: list[socket.socket], size: int, generation: int) -> None:
    for i, sock in enumerate(newcomers):
        with sock:
            say(sock, {"type": "welcome", "rank": size + i, "world_size": size + len(newcomers),
                       "generation": generation})


def turn_away(newcomers: list[socket.socket], why: str) -> None:
    for sock in newcomers:
        say(sock, {"type": "later", "reason": why[:1000]})


def knock(job: JobInfo, deadline: float) -> dict[str, Any]:
    """A newcomer: ask the job's rank 0 to be let in, until it is (the welcome) or the
    deadline. The job lets newcomers in only when it calls admit(), so this waits."""
    addr = (job.master_addr, job.master_port)
    last = "nothing yet"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PeerError(f"join: not admitted by the job at {addr[0]}:{addr[1]} in time "
                            f"({last})", hint="the job admits newcomers when it calls "
                                              "comm.admit(); is it running, with this secret?")
        try:
            with socket.create_connection(addr, timeout=min(CONNECT_S, remaining)) as sock:
                wire.send(sock, {"type": "join", "token": job.token,
                                 "host": socket.gethostname()[:200] or "?"})
                reply = wire.recv(sock, deadline=deadline, peer=f"the job at {addr[0]}:{addr[1]}")
        except (OSError, RdmaError) as err:
            last = str(err)
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
            continue
        if reply["type"] == "welcome":
            return reply
        last = reply.get("reason", reply["type"])
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


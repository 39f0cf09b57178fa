"""Newcomers to a running elastic job (rxelab.membership.admitting has the job's side of a change):
rank 0's admit() hears the joins waiting at the rendezvous (parked there by its server until
it admits), refuses those whose settings differ from the job's, offers each a place and takes
only those that accept while they still wait; the newcomer's join() knocks until it is
welcomed, and once it has accepted it is the job's.
"""

from __future__ import annotations

import queue
import socket
import time
from collections.abc import Callable
from typing import Any

from rxelab.bootstrap import JobInfo
from rxelab.control import addresses
from rxelab.control.connection import Link, dial
from rxelab.control.liveness import CONNECT_S, PROBE_S
from rxelab.control.server import answer
from rxelab.errors import ConfigError, PeerError, ProtocolError
from rxelab.membership.seat import READ_S, Seat, say

MAX_NEWCOMERS = 64  # per admit
GRACE_S = 0.1  # admit listens at least this long: newcomers queued before it say their join
ADMIT_SHARE = 0.5  # of the communicator's timeout, admit listens at most (the others wait)
OFFER_SHARE = 0.25  # and the offers' answers take at most this much of it


def hear_newcomers(seat: Seat, wait: float, wanted: int, offer_s: float,
                   fits: Callable[[dict[str, Any]], str | None],
                   watch: Callable[[], None] = lambda: None) -> list[Link]:
    """Rank 0: the newcomers at the rendezvous, waiting up to `wait` seconds for `wanted` of
    them (whoever is there already comes in too). Each has proven the secret; one whose
    settings do not fit the job (fits says why) is refused; each is then offered its place
    and taken only if it accepts within offer_s (one that gave up meanwhile is not). watch()
    raises a failure of the job found meanwhile (a rank gone)."""
    found: list[Link] = []
    start = time.monotonic()
    grace, end = start + GRACE_S, start + max(GRACE_S, wait)
    try:
        with seat.server.serving("join") as inbox:
            while len(found) < MAX_NEWCOMERS:
                watch()
                now = time.monotonic()
                if now >= end or (len(found) >= wanted and now >= grace):
                    break
                try:
                    link, join = inbox.get(timeout=min(0.05, end - now))
                except queue.Empty:
                    continue
                if (why := fits(join["settings"])) is not None:
                    answer(link, {"type": "failed", "reason": why[:1000]})
                else:
                    found.append(link)
        return _offer(found, offer_s)
    except BaseException:
        for link in found:
            link.close()
        raise


def _offer(found: list[Link], offer_s: float) -> list[Link]:
    """Those of `found` that accept their place within offer_s."""
    asked: list[Link] = []
    for link in found:
        try:
            link.sock.settimeout(READ_S)
            link.send({"type": "offer"})
            asked.append(link)
        except OSError:
            link.close()
    deadline = time.monotonic() + offer_s
    taken: list[Link] = []
    for link in asked:
        try:
            if link.recv(deadline=deadline, peer="a newcomer", expect="accept"):
                taken.append(link)
        except (OSError, ProtocolError, PeerError):
            link.close()
    return taken


def welcome(newcomers: list[Link], size: int, generation: int, job_id: str) -> None:
    for i, link in enumerate(newcomers):
        say(link, {"type": "welcome", "rank": size + i, "world_size": size + len(newcomers),
                   "generation": generation, "job": job_id})
        link.close()


def turn_away(newcomers: list[Link], why: str) -> None:
    for link in newcomers:
        answer(link, {"type": "later", "reason": why[:1000]})


def knock(job: JobInfo, settings: dict[str, Any], deadline: float,
          committed_s: float) -> dict[str, Any]:
    """A newcomer: ask the job's rank 0 to be let in, until it is (the welcome) or the
    deadline. The job lets newcomers in only when it calls admit(), so this waits. Once it has
    accepted an offer it is the job's: it waits for its welcome up to committed_s more.
    Under srun rank 0 listens on the first of the step's ports free on its node: each is
    knocked at in turn (bound to that port: only rank 0's listener, where it is, takes it),
    and the one that answered first from then on; the welcome says which ("port")."""
    last = "nothing yet"
    ports = [job.master_port, *job.more_ports]
    where = f"{job.master_addr}:{'/'.join(str(p) for p in ports)}"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PeerError(f"join: not admitted by the job at {where} in time ({last})",
                            hint="the job admits newcomers when it calls comm.admit(); is it "
                                 "running, with this secret?")
        for addr in [a for port in ports for a in addresses.addresses(job.master_addr, port)
                     or [(job.master_addr, port)]]:
            try:
                link = dial(addr, job.credential, kind="join", rank=-1, to=0, generation=0,
                            scope=f"join {addr[1]}",
                            deadline=min(deadline, time.monotonic() + PROBE_S),
                            connect_s=CONNECT_S)
            except (OSError, ProtocolError, PeerError) as err:
                last = str(err)
                continue
            ports.remove(addr[1])
            ports.insert(0, addr[1])  # rank 0's: knocked at first from now on
            try:
                got = _ask_in(link, settings, deadline, committed_s, where)
            finally:
                link.close()
            if isinstance(got, dict):
                return {**got, "port": addr[1]}
            last = got
            break
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def _ask_in(link: Link, settings: dict[str, Any], deadline: float, committed_s: float,
            where: str) -> dict[str, Any] | str:
    """The welcome, or why not yet."""
    try:
        link.send({"type": "join", "host": socket.gethostname()[:200] or "?", "settings": settings})
        reply = link.recv(deadline=deadline, peer=f"the job at {where}")
    except (OSError, ProtocolError, PeerError) as err:
        return str(err)
    if reply["type"] == "failed":
        raise ConfigError(f"join: the job at {where} refused this newcomer: {reply['reason']}",
                          hint="give join() the options the job's ranks have")
    if reply["type"] != "offer":
        return str(reply.get("reason", reply["type"]))
    if time.monotonic() >= deadline:
        return "offered a place after this newcomer's wait ran out"
    try:
        link.send({"type": "accept"})  # from here on this process is the job's
    except OSError as err:  # the accept never reached the job: knock again
        return str(err)
    reply = link.recv(deadline=time.monotonic() + committed_s, peer=f"the job at {where}")
    if reply["type"] == "welcome":
        return reply
    return str(reply.get("reason", reply["type"]))  # turned away after all: knock again

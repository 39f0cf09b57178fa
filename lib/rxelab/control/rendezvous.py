"""How a communicator forms over TCP: rank 0 gathers every rank's hello (its QP endpoints,
settings and, in an elastic job, its listener) and hands each rank the endpoints it must
connect to; every other rank dials rank 0 and waits for its table. Each connection is proven
first (rxelab.control.handshake), so nothing is sent to, or taken from, a process without the job's secret.

Rank 0 hears all hellos at once (its server handshakes with every connection in parallel), so
one slow or idle connection holds up nobody; what is not of this job is dropped and named in
the error if the job cannot form.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import queue
import secrets
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rxelab import codecs, settings
from rxelab.control import addresses
from rxelab.control.liveness import CONNECT_S, GONE_REASON, PROBE_S, STRIKES, Verdict, Watch
from rxelab.control.server import Server, answer
from rxelab.errors import AuthError, ConfigError, PeerError, ProtocolError, Reason

if TYPE_CHECKING:
    from rxelab.bootstrap import JobInfo
    from rxelab.control.connection import Link


class Plane(Protocol):
    """What forming reads and fills in of the control plane it forms (rxelab.control.plane, which
    calls in here: declared, so this module does not import it back)."""

    job: JobInfo
    timeout: float
    elastic: bool
    server: Server | None
    generation: int
    look: Callable[[int], Verdict] | None
    job_id: str
    directory: dict[int, tuple[str, int]]
    peers: dict[int, Link]
    root: Link | None
    listener: socket.socket | None  # rank 0's rendezvous, listening already if given

    def abort(self, reason: str, blamed: int, skip: int | None = None,
              why: Reason = Reason.FAILED) -> None: ...

    def close(self) -> None: ...

log = logging.getLogger(__name__)
SAME_HOST = ""  # a listener's host in the directory: at MASTER_ADDR, beside rank 0
LATER_S = 5.0  # a later generation's rank 0 that answers "later" longer than this is not
# going to gather it (it moved on)
FIRST_RETRY_S, RETRY_S = 0.01, 0.2  # dialling rank 0 again: doubling from the first to the most


def _rendezvous(plane: Plane) -> socket.socket:
    """Rank 0's listener: the one its starter made (rxelab.torch publishes its port in torch's
    store before the job forms), else one at MASTER_ADDR:MASTER_PORT, or under srun on the
    first of the step's ports that is free here (another user or job may hold one: the ranks
    dial each in turn, rxelab.bootstrap.slurm_ports)."""
    given, plane.listener = plane.listener, None
    if given is not None:
        return given
    ports = _ports(plane.job)
    for i, port in enumerate(ports):
        try:
            return addresses.listen(dataclasses.replace(plane.job, master_port=port))
        except ConfigError as err:
            if len(ports) == 1 or not _taken(err):
                raise
            if i + 1 == len(ports):
                raise ConfigError(f"rank 0 cannot listen on any of the step's rendezvous ports "
                                  f"{ports}: other processes on this node hold them all",
                                  hint="another user may be holding them: set MASTER_PORT to a "
                                       "port of your choice") from None
    raise AssertionError("there is always a port to try")  # pragma: no cover


def _taken(err: ConfigError) -> bool:
    """Whether addresses.listen failed because the port is held (its one-line error keeps
    the OSError it came from as its context, or at least its words)."""
    cause = err.__context__
    return (isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE) or \
        os.strerror(errno.EADDRINUSE) in str(err)


def _ports(job: JobInfo) -> list[int]:
    """Where rank 0 of a first generation may listen, in the order tried."""
    return [job.master_port, *job.more_ports]


def alone(plane: Plane) -> None:
    """An elastic job of one rank: nobody to gather, but the rendezvous stays open for
    newcomers."""
    job = plane.job
    plane.job_id = job.job_id or secrets.token_hex(16)
    if plane.server is None:
        plane.server = Server(_rendezvous(plane), job.credential, set(), rank=0,
                              generation=plane.generation)
    plane.server.update(rank=0, generation=plane.generation,
                        scopes={plane.job_id, f"join {plane.server.port}"})
    plane.directory = {0: (job.master_addr, plane.server.port)}


def serve(plane: Plane, mine: dict[int, dict[str, Any]],
          options: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Rank 0: every rank's hello, then each rank's table; the others' endpoints for us."""
    job = plane.job
    deadline = time.monotonic() + plane.timeout
    plane.job_id = job.job_id or secrets.token_hex(16)
    server = plane.server or Server(_rendezvous(plane), job.credential, set(), rank=0,
                                    generation=plane.generation)
    server.update(rank=0, generation=plane.generation, scopes={job.scope(), plane.job_id}
                  | ({f"join {server.port}"} if plane.elastic else set()))
    if plane.elastic:
        plane.server = server
    hellos: dict[int, dict[str, Any]] = {0: {"endpoints": {str(k): v for k, v in mine.items()}}}
    log.debug("rank 0 gathers %d ranks at port %d, for %g s", job.world_size, server.port,
              plane.timeout)
    where: dict[int, str] = {}  # the address each rank reached us from
    # a shrink's members proved themselves in its agreement moments ago: a connect that
    # times out is a crowded listener, not a death, until SILENT_S from now (rxelab.control.liveness:
    # then a member that stopped or powered off as the mesh was built is gone)
    watch = Watch(plane.look, range(job.world_size)) if plane.look is not None else None
    beside: set[int] = set()
    try:
        with server.serving("hello", "shrink") as inbox:
            while len(hellos) < job.world_size:
                missing = sorted(set(range(job.world_size)) - set(hellos))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    dropped = server.dropped
                    raise PeerError(f"ranks {missing} did not join within {plane.timeout:g} s"
                                    + (f" (connections dropped: {'; '.join(dropped[-3:])})"
                                       if dropped else ""), peer=missing[0], reason=Reason.SILENT,
                                    hint=f"are they started, with MASTER_ADDR={job.master_addr} "
                                         f"and MASTER_PORT={server.port}? A slow start "
                                         f"(a busy host) needs a longer RXELAB_TIMEOUT "
                                         f"(init(timeout=...))")
                if watch is not None and (gone := watch.gone(missing)):
                    r = min(gone)
                    raise PeerError(f"rank {r} is gone (its listener no longer answers) before "
                                    "it joined", peer=r, reason=GONE_REASON)
                try:
                    link, hello = inbox.get(timeout=min(remaining, 0.5))
                except queue.Empty:
                    continue
                try:
                    _accept_hello(plane, hello, hellos)
                except ProtocolError as err:
                    server.acceptor.dropped.append(f"rank {hello.get('rank')}: {err}")
                    answer(link, None)
                    continue
                except BaseException:
                    link.close()
                    raise
                plane.peers[hello["rank"]] = link
                with contextlib.suppress(OSError):
                    where[hello["rank"]] = link.sock.getpeername()[0]
                log.debug("rank %d (host %s) joined: %d of %d ranks in", hello["rank"],
                          hello.get("host"), len(hellos), job.world_size)
    except BaseException as err:
        # those that said hello hear why (not a goodbye, which says all is well)
        plane.abort(f"rank 0 could not gather the job: {err}", getattr(err, "peer", None) or 0,
                    why=err.reason if isinstance(err, PeerError) else Reason.FAILED)
        plane.close()
        if not plane.elastic:
            server.close(listener=True)
        raise
    if not plane.elastic:
        server.close(listener=True)
    for r in sorted(hellos):  # every rank is in: all of them hear why, if it must end
        if r and (why := settings.disagreement(options, hellos[r]["settings"], r,
                                               codecs.NAMES_BY_ID)):
            plane.abort(why, r)
            plane.close()
            raise ConfigError(why, hint="give init() (or the flags) the same values on every rank")
    if plane.elastic:
        lost = sorted(set(plane.peers) - set(where))
        if lost:
            why = f"rank {lost[0]}'s connection broke as it joined"
            plane.abort(why, lost[0], why=Reason.DIED)
            plane.close()
            raise PeerError(why, peer=lost[0], reason=Reason.DIED)
        # a rank on this host that came over loopback is reached where the others reach us
        beside = {r for r in plane.peers if addresses.loopback(where[r])}
        plane.directory = {0: (job.master_addr, server.port), **{
            r: (job.master_addr if r in beside else where[r], hellos[r]["listen"])
            for r in plane.peers}}
    shown = {str(r): [SAME_HOST if r in beside else a[0], a[1]] for r, a in plane.directory.items()}
    for r, link in plane.peers.items():
        table = {str(p): hellos[p]["endpoints"][str(r)] for p in hellos if p != r}
        try:
            link.send({"type": "table", "endpoints": table, "directory": shown, "job": plane.job_id})
        except OSError as err:  # it said hello, then died: the others hear who, as above
            why = f"rank {r}'s connection broke as the table went out: {err}"
            plane.abort(why, r, why=Reason.DIED)
            plane.close()
            raise PeerError(why, peer=r, reason=Reason.DIED) from None
    return {p: hellos[p]["endpoints"]["0"] for p in hellos if p != 0}


def _accept_hello(plane: Plane, hello: dict[str, Any],
                  hellos: dict[int, dict[str, Any]]) -> None:
    """A ProtocolError drops the connection: not fit for this job (another size, another
    generation, a rank it does not have). Two proven processes that claim one rank are an
    error of the job (PeerError ends it)."""
    job = plane.job
    if hello["type"] == "shrink":
        if plane.elastic and hello["generation"] == plane.generation - 1:
            # a member of the communicator being left saw it fail and shrinks it: this one
            # cannot be built (ends the gather; the caller agrees again)
            raise PeerError(f"rank {hello['rank']} of generation {hello['generation']} shrinks "
                            "it while this rank builds the next: the membership changed",
                            peer=hello["rank"])
        raise ProtocolError(f"a shrink of generation {hello['generation']} while generation "
                            f"{plane.generation} forms")
    r = hello["rank"]
    if hello["world_size"] != job.world_size:
        raise ProtocolError(f"a process of a job of {hello['world_size']} ranks claimed rank {r} "
                            f"(this job has {job.world_size})")
    if hello["generation"] != plane.generation:
        raise ProtocolError(f"rank {r} of membership generation {hello['generation']} "
                            f"(this one is {plane.generation})")
    if plane.elastic and not hello["listen"]:
        raise ProtocolError(f"rank {r} keeps no listener in an elastic job")
    if not 0 < r < job.world_size:
        raise ProtocolError(f"a hello from rank {r}, outside 1..{job.world_size - 1}")
    if r in hellos:
        raise PeerError(f"two processes claim rank {r}", peer=r)
    expected = {str(p) for p in range(job.world_size) if p != r}
    if set(hello["endpoints"]) != expected:
        raise ProtocolError(f"rank {r} sent endpoints for {sorted(hello['endpoints'])}")
    hellos[r] = hello


def join(plane: Plane, mine: dict[int, dict[str, Any]],
         options: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Any other rank: dial rank 0 (each address MASTER_ADDR resolves to, until one proves
    itself), say hello, take the table. A first generation's rank 0 may not listen yet:
    tried until the deadline. A later generation's listens already (it is a member's, kept
    for the job's life): refused everywhere means it is gone, said at once."""
    job = plane.job
    deadline = time.monotonic() + plane.timeout
    if plane.elastic and plane.server is None:
        plane.server = Server(addresses.own(job), job.credential, set(), rank=job.rank,
                              generation=plane.generation)
    hello = {"type": "hello", "rank": job.rank, "world_size": job.world_size,
             "host": socket.gethostname()[:200] or "?", "settings": options,
             "generation": plane.generation,
             "listen": plane.server.port if plane.server else 0,
             "endpoints": {str(k): v for k, v in mine.items()}}
    last, unproven, silent = "nothing answered", "", 0
    later_until = time.monotonic() + LATER_S  # a later generation's rank 0 gathers at once
    # under srun the first generation's rank 0 listens on the first of the step's ports free
    # on its node: each is dialled in turn, and only a listener that proves itself is taken
    ports = _ports(job) if plane.generation == 0 else [job.master_port]
    where = f"{job.master_addr}:{'/'.join(str(p) for p in ports)}"
    pause = FIRST_RETRY_S  # ranks start together: rank 0 most often listens within milliseconds
    while True:
        refused = 0
        targets = [a for port in ports for a in addresses.addresses(job.master_addr, port)]
        if not targets:
            last = f"{job.master_addr} does not resolve"
        for addr in targets:
            try:
                link = _dial_root(plane, addr, deadline)
            except ConnectionRefusedError as err:
                refused += 1
                last = str(err)
                continue
            except AuthError as err:  # a stranger there: said, whatever comes after
                unproven = str(err)
                refused += 1  # a member's listener is kept for the job's life: gone
                continue
            except (OSError, PeerError) as err:  # no answer
                last = str(err)
                # a server answers at once: twice silent is gone
                silent += isinstance(err, PeerError) and err.reason == Reason.SILENT
                refused += silent >= STRIKES
                continue
            table = _hello(plane, link, hello, deadline)
            if table is not None:
                log.debug("rank %d reached rank 0 at %s:%d and has its table", job.rank,
                          addr[0], addr[1])
                return _take_table(plane, table, addr[1])
            last = "rank 0 was not gathering this generation yet"
            if plane.generation > 0 and time.monotonic() > later_until:
                raise PeerError(f"rank 0 of generation {plane.generation} is not gathering it "
                                f"(it answered 'later' for {LATER_S:g} s)", peer=0,
                                reason=Reason.STALLED)
        if plane.generation > 0 and targets and refused == len(targets):
            raise PeerError(f"rank 0 of generation {plane.generation} is gone (nothing of the "
                            f"job listens at {job.master_addr}:{job.master_port} any more)",
                            peer=0, reason=Reason.DIED)
        if time.monotonic() > deadline:
            raise PeerError(f"cannot reach rank 0 at {where} within "
                            f"{plane.timeout:g} s: {unproven or last}", peer=0,
                            reason=Reason.SILENT,
                            hint="a process without the job's secret holds the port" if unproven
                            else None)
        if pause == FIRST_RETRY_S:  # once: a rank that waits here says so, not each retry
            log.debug("rank %d cannot reach rank 0 at %s yet (%s): trying until %g s have passed",
                      job.rank, where, unproven or last, plane.timeout)
        time.sleep(pause)
        pause = min(2 * pause, RETRY_S)


def _dial_root(plane: Plane, addr: tuple[str, int], deadline: float) -> Link:
    from rxelab.control.connection import dial

    job = plane.job
    return dial(addr, job.credential, kind="hello", rank=job.rank, to=0,
                generation=plane.generation,
                scope=job.scope(), deadline=min(deadline, time.monotonic() + PROBE_S),
                connect_s=CONNECT_S)


def _hello(plane: Plane, link: Link, hello: dict[str, Any],
           deadline: float) -> dict[str, Any] | None:
    """The table, or None when rank 0 said to come back later (it is not gathering yet)."""
    try:
        link.send(hello)
        reply = link.recv(deadline=deadline, peer="rank 0")
    except OSError as err:  # it closed before our hello (recv says so itself): rank 0 is gone
        link.close()
        raise PeerError(f"connection to rank 0 failed: {err}", peer=0, reason=Reason.DIED) from None
    except BaseException:
        link.close()
        raise
    if reply["type"] == "later":
        link.close()
        time.sleep(0.1)
        return None
    if reply["type"] == "failed":
        link.close()
        raise PeerError(f"rank 0: {reply['reason']}", peer=0, reason=Reason.ABORTED)
    if reply["type"] != "table":
        link.close()
        raise ProtocolError(f"expected a table message from rank 0, got {reply['type']}")
    plane.root = link
    return reply


def _take_table(plane: Plane, table: dict[str, Any], port: int) -> dict[int, dict[str, Any]]:
    """port: where this rank reached rank 0."""
    job = plane.job
    got = {int(k): v for k, v in table["endpoints"].items()}
    if set(got) != set(range(job.world_size)) - {job.rank}:
        raise ProtocolError(f"rank 0 sent endpoints for ranks {sorted(got)}")
    plane.job_id = table["job"]
    if plane.elastic:
        directory = {int(k): (str(a[0]) or job.master_addr, int(a[1]))
                     for k, a in table["directory"].items()}
        if set(directory) != set(range(job.world_size)):
            raise ProtocolError(f"rank 0 sent listeners of ranks {sorted(directory)}")
        directory[0] = (job.master_addr, port)  # as this rank reaches it
        plane.directory = directory
        assert plane.server is not None
        plane.server.update(rank=job.rank, generation=plane.generation, scopes={plane.job_id})
    return got

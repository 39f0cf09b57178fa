"""The TCP control plane: rank 0 collects every rank's QP endpoints and hands each rank the
endpoints it must connect to; later it serves barriers and goodbyes. The connections stay open
for the life of the communicator, so a rank that dies is noticed (its socket closes).

After the exchange a reader thread on every rank takes whatever arrives, at any time: on
rank 0 a closed connection or an abort is passed on to every other rank at once, whatever
rank 0 itself is doing (computing between collectives, in a barrier, waiting on RDMA), so a
dead rank is reported everywhere within a second or so; barriers and goodbyes wait on what
the thread filed. The RDMA waits look at the thread's findings (watch) several times a
second.
"""

from __future__ import annotations

import contextlib
import hmac
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rxelab import codecs, settings, wire
from rxelab.bootstrap import JobInfo
from rxelab.errors import ConfigError, PeerError, ProtocolError
from rxelab.hall import Hall

HELLO_S = 10.0  # a connection must say hello within this long, or it is dropped
MAX_PENDING = 64  # connections that have not said hello yet: beyond this the oldest goes
# an elastic rank's listener is read only while the membership changes: room for the probes
# and knocks that wait until then (the kernel caps it at net.core.somaxconn)
BACKLOG = 1024
# Elastic jobs: a node that powers off or drops off the network closes no connection, and a
# rank waiting to receive from it posts nothing that could fail; without heartbeats it would
# be found only by the no-progress timeout. Each end beats once a second; a link silent for
# SILENT_S means the rank behind it is gone.
BEAT_S = 1.0
SILENT_S = 10.0


def _loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1"


def listen(job: JobInfo) -> socket.socket:
    """A job with a secret listens on every interface (strangers are dropped at their hello).
    One without listens only on MASTER_ADDR's address, preferring one that is not loopback
    (Debian maps a host's own name to 127.0.1.1 too); where MASTER_ADDR is a name that this
    host resolves to loopback only (other hosts resolve it by DNS), on every interface."""
    port = job.master_port
    addresses: list[tuple[str, socket.AddressFamily]]
    if job.token:
        addresses = [("", socket.AF_INET)]
    else:
        try:
            infos = socket.getaddrinfo(job.master_addr, port, type=socket.SOCK_STREAM)
        except OSError as err:
            raise ConfigError(f"MASTER_ADDR={job.master_addr} does not resolve: {err}") from None
        found = sorted({(str(info[4][0]), socket.AddressFamily(info[0])) for info in infos},
                       key=lambda a: (_loopback(a[0]), a[0]))
        named_loopback = job.master_addr == "localhost" or _loopback(job.master_addr)
        if all(_loopback(a) for a, _ in found) and not named_loopback:
            found = [("", socket.AF_INET)]
        where = "every interface" if found[0][0] == "" else f"{found[0][0]}:{port} only"
        print(f"rxelab: this job has no secret (RXELAB_JOB_TOKEN): rank 0 listens on {where}, "
              "and any process that reaches it while the job starts can join; export "
              "RXELAB_JOB_TOKEN to every rank to keep strangers out", file=sys.stderr, flush=True)
        addresses = found
    last: OSError | None = None
    for host, family in addresses:
        try:
            return socket.create_server((host, port), family=family, reuse_port=False,
                                        backlog=BACKLOG)
        except OSError as err:
            last = err
    if last is not None and last.errno == 99:  # EADDRNOTAVAIL
        raise ConfigError(f"rank 0 cannot listen on MASTER_ADDR={job.master_addr}: not an address "
                          "of this host", hint="start rank 0 on the host MASTER_ADDR names")
    raise ConfigError(f"rank 0 cannot listen on port {port}: {getattr(last, 'strerror', None) or last}",
                      hint="another job (or torchrun's store) holds it: choose another "
                           "MASTER_PORT, or set RXELAB_MASTER_PORT")


class ControlPlane:
    def __init__(self, job: JobInfo, timeout: float, *, elastic: bool = False,
                 listener: socket.socket | None = None, generation: int = 0,
                 alive: Callable[[int], bool] | None = None) -> None:
        """elastic: this rank keeps a listener for the job's life (rxelab.membership), given
        (a later generation's) or made here (rank 0's is the rendezvous; another rank's is on
        the address it reaches rank 0 from), and every rank learns where the others listen.
        alive(rank): whether a rank that has not said hello yet still lives (a shrink's
        members, whose listeners are known): rank 0 stops waiting for one that is gone."""
        self.job = job
        self.timeout = timeout
        self.elastic = elastic or listener is not None
        self.listener = listener  # elastic: never closed here (the membership owns it)
        self.generation = generation
        self.alive = alive
        self.directory: dict[int, tuple[str, int]] = {}  # elastic: where each rank listens
        self.peers: dict[int, socket.socket] = {}  # rank 0: every other rank
        self.root: socket.socket | None = None  # other ranks: rank 0
        self.barrier_seq = 0
        self.state = threading.Condition()  # guards what the reader files below
        self.at_barrier: dict[int, set[int]] = {}  # rank 0: barrier -> ranks that reached it
        self.released = 0  # other ranks: the last barrier rank 0 released
        self.left: set[int] = set()  # ranks that said bye: their closed socket is no news
        self.failure: tuple[str, int | None] | None = None  # what ended the job, and who
        self.send_locks: dict[socket.socket, threading.Lock] = {}
        self.said_bye: set[socket.socket] = set()
        self.reader: threading.Thread | None = None
        self.beater: threading.Thread | None = None
        self.quiet = threading.Event()  # set when the beats must stop
        self.heard: dict[int, float] = {}  # elastic: when each link last said anything
        self.stopping = False

    def exchange(self, endpoints: dict[int, dict[str, Any]],
                 options: dict[str, Any] | None = None) -> dict[int, dict[str, Any]]:
        """Give our endpoint for each peer; get each peer's endpoint for us. `options` are the
        settings every rank must share: rank 0 compares each rank's with its own."""
        if self.job.world_size == 1:
            if self.elastic:  # alone, but others may join: the rendezvous stays open
                self.listener = self.listener or listen(self.job)
                self.directory = {0: (self.job.master_addr, self.listener.getsockname()[1])}
            return {}
        if self.job.rank == 0:
            found = self._serve(endpoints, options or {})
        else:
            found = self._join(endpoints, options or {})
        self._start_reader()
        return found

    def _serve(self, mine: dict[int, dict[str, Any]],
               options: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Rank 0: hear every rank's hello, all at once (one slow or idle connection holds
        up nobody), dropping what is not ours - another program, another job's process, a
        malformed or oversized message - and keep serving; then send each rank its table."""
        job = self.job
        deadline = time.monotonic() + self.timeout
        listener = self.listener or listen(job)
        if self.elastic:
            self.listener = listener
        hellos: dict[int, dict[str, Any]] = {0: {"endpoints": {str(k): v for k, v in mine.items()}}}
        where: dict[int, str] = {}  # the address each rank reached us from
        looked = time.monotonic()  # when alive() was last asked
        hall = Hall(listener, patience=HELLO_S, limit=MAX_PENDING)
        try:
            while len(hellos) < job.world_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(job.world_size)) - set(hellos))
                    raise PeerError(f"ranks {missing} did not join within {self.timeout:g} s"
                                    + (f" (connections dropped: {'; '.join(hall.dropped[-3:])})"
                                       if hall.dropped else ""), peer=missing[0],
                                    hint=f"are they started, with MASTER_ADDR={job.master_addr} "
                                         f"and MASTER_PORT={job.master_port}?")
                now = time.monotonic()
                if self.alive is not None and now - looked >= 1.0:
                    looked = now
                    for r in sorted(set(range(job.world_size)) - set(hellos)):
                        if not self.alive(r):
                            raise PeerError(f"rank {r} is gone (its listener closed) before "
                                            "it joined", peer=r)
                batch = hall.hear(min(remaining, 1.0))
                for i, (sock, hello) in enumerate(batch):
                    if hello is None:  # pragma: no cover - only kept connections report None
                        continue
                    try:
                        self._accept_hello(hello, hellos)
                    except ProtocolError as err:
                        hall.reject(sock, str(err))
                        continue
                    except BaseException:
                        for other, _ in batch[i:]:  # heard with it, not yet taken in
                            other.close()
                        raise
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.peers[hello["rank"]] = sock
                    with contextlib.suppress(OSError):
                        where[hello["rank"]] = sock.getpeername()[0]
        except BaseException as err:
            # those that said hello hear why (not a goodbye, which says all is well)
            self.abort(f"rank 0 could not gather the job: {err}", getattr(err, "peer", None) or 0)
            self.close()
            raise
        finally:
            hall.close()
            if not self.elastic:
                listener.close()
        for r in sorted(hellos):  # every rank is in: all of them hear why, if it must end
            if r and (why := settings.disagreement(options, hellos[r]["settings"], r,
                                                   codecs.NAMES_BY_ID)):
                self.abort(why, r)
                self.close()
                raise ConfigError(why, hint="give init() (or the flags) the same values on every rank")
        if self.elastic:
            lost = sorted(set(self.peers) - set(where))
            if lost:
                why = f"rank {lost[0]}'s connection broke as it joined"
                self.abort(why, lost[0])
                self.close()
                raise PeerError(why, peer=lost[0])
            self.directory = {0: (job.master_addr, listener.getsockname()[1]), **{
                r: (where[r], hellos[r]["listen"]) for r in self.peers}}
        shown = {str(r): list(a) for r, a in self.directory.items()}
        for r, sock in self.peers.items():
            table = {str(p): hellos[p]["endpoints"][str(r)] for p in hellos if p != r}
            wire.send(sock, {"type": "table", "endpoints": table, "directory": shown})
        return {p: hellos[p]["endpoints"]["0"] for p in hellos if p != 0}

    def _accept_hello(self, hello: dict[str, Any], hellos: dict[int, dict[str, Any]]) -> None:
        """A ProtocolError drops the connection: not ours (another program, another job's
        process, whatever claims a rank this job does not have). Two processes of this job
        (same secret) that claim one rank are an error of the job (PeerError ends it)."""
        job = self.job
        if (hello["type"] == "shrink" and self.elastic and hello["generation"] == self.generation - 1
                and hmac.compare_digest(hello["token"], job.token)):
            # a member of the communicator being left saw it fail and shrinks it: this one
            # cannot be built (ends the gather; the caller agrees again)
            raise PeerError(f"rank {hello['rank']} of generation {hello['generation']} shrinks it "
                            "while this rank builds the next: the membership changed",
                            peer=hello["rank"])
        if hello["type"] != "hello":
            raise ProtocolError(f"a {hello['type']} message where a hello belongs")
        if not hmac.compare_digest(hello["token"], job.token):
            raise ProtocolError("a hello without this job's secret (a stranger, or a stray or "
                                "stale process of another job)")
        r = hello["rank"]
        if hello["world_size"] != job.world_size:
            raise ProtocolError(f"a process of a job of {hello['world_size']} ranks claimed rank {r} "
                                f"(this job has {job.world_size})")
        if hello["generation"] != self.generation:
            raise ProtocolError(f"rank {r} of membership generation {hello['generation']} "
                                f"(this one is {self.generation})")
        if self.elastic and not hello["listen"]:
            raise ProtocolError(f"rank {r} keeps no listener in an elastic job")
        if not 0 < r < job.world_size:
            raise ProtocolError(f"a hello from rank {r}, outside 1..{job.world_size - 1}")
        if r in hellos:
            raise PeerError(f"two processes claim rank {r}", peer=r)
        expected = {str(p) for p in range(job.world_size) if p != r}
        if set(hello["endpoints"]) != expected:
            raise ProtocolError(f"rank {r} sent endpoints for {sorted(hello['endpoints'])}")
        hellos[r] = hello

    def _join(self, mine: dict[int, dict[str, Any]],
              options: dict[str, Any]) -> dict[int, dict[str, Any]]:
        job = self.job
        deadline = time.monotonic() + self.timeout
        last_error: OSError | None = None
        while self.root is None:
            try:
                self.root = socket.create_connection((job.master_addr, job.master_port), timeout=5)
            except OSError as err:  # rank 0 may not be listening yet
                last_error = err
                if time.monotonic() > deadline:
                    raise PeerError(f"cannot reach rank 0 at {job.master_addr}:{job.master_port} "
                                    f"within {self.timeout:g} s: {last_error}", peer=0) from None
                time.sleep(0.2)
        self.root.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.elastic and self.listener is None:  # where the others can reach us: the
            # address rank 0 sees us from (the job's network), any free port
            try:
                self.listener = socket.create_server((self.root.getsockname()[0], 0),
                                                     backlog=BACKLOG)
            except OSError as err:
                raise ConfigError(f"this rank cannot listen for the job's membership: {err}") from None
        wire.send(self.root, {"type": "hello", "rank": job.rank, "world_size": job.world_size,
                              "host": socket.gethostname()[:200] or "?", "token": job.token,
                              "settings": options, "generation": self.generation,
                              "listen": self.listener.getsockname()[1] if self.listener else 0,
                              "endpoints": {str(k): v for k, v in mine.items()}})
        table = wire.recv(self.root, deadline=deadline, peer="rank 0", expect="table")
        got = {int(k): v for k, v in table["endpoints"].items()}
        if set(got) != set(range(job.world_size)) - {job.rank}:
            raise ProtocolError(f"rank 0 sent endpoints for ranks {sorted(got)}")
        if self.elastic:
            directory = {int(k): (str(a[0]), int(a[1])) for k, a in table["directory"].items()}
            if set(directory) != set(range(job.world_size)):
                raise ProtocolError(f"rank 0 sent listeners of ranks {sorted(directory)}")
            directory[0] = (job.master_addr, job.master_port)  # as this rank reaches it
            self.directory = directory
        return got

    # ---- after the exchange: the reader thread and what it files ------------------------
    def _links(self) -> dict[int, socket.socket]:
        return dict(self.peers) if self.job.rank == 0 else ({0: self.root} if self.root else {})

    def _start_reader(self) -> None:
        for sock in self._links().values():
            sock.settimeout(self.timeout)  # a send to a rank that reads nothing ends, too
            self.send_locks[sock] = threading.Lock()
        self.reader = threading.Thread(target=self._read, name="rxelab-control", daemon=True)
        self.reader.start()
        if self.elastic:
            self.beater = threading.Thread(target=self._beat, name="rxelab-beat", daemon=True)
            self.beater.start()

    def _beat(self) -> None:
        while not self.quiet.wait(BEAT_S):
            for sock in list(self._links().values()):
                if sock not in self.said_bye:
                    try:
                        self._send(sock, {"type": "beat", "rank": self.job.rank})
                    except OSError:  # the reader finds out why
                        pass

    def _send(self, sock: socket.socket, message: dict[str, Any]) -> None:
        with self.send_locks.setdefault(sock, threading.Lock()):
            wire.send(sock, message)

    def _read(self) -> None:
        links = self._links()
        rank_of = {sock: r for r, sock in links.items()}
        buffers = {sock: bytearray() for sock in links.values()}
        sel = selectors.DefaultSelector()
        for sock in links.values():
            sel.register(sock, selectors.EVENT_READ)  # read only when readable: never blocks
        self.heard = {r: time.monotonic() for r in links}
        try:
            while not self.stopping and sel.get_map():
                if self.elastic:
                    self._silence(sel, rank_of)
                for key, _ in sel.select(timeout=0.2):
                    sock = key.fileobj  # type: ignore[assignment]
                    r = rank_of[sock]
                    try:
                        data = sock.recv(1 << 16)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(sock)
                        self._gone(r)
                        continue
                    self.heard[r] = time.monotonic()
                    buf = buffers[sock]
                    buf += data
                    try:
                        while (got := wire.split_frame(buf)) is not None:
                            message, used = got
                            del buf[:used]
                            self._file(r, message)
                    except ProtocolError as err:
                        sel.unregister(sock)
                        self._end(f"rank {r} sent a bad control message: {err}", r, skip=r)
        finally:
            sel.close()

    def _silence(self, sel: selectors.BaseSelector, rank_of: dict[socket.socket, int]) -> None:
        """A link that has not beaten for SILENT_S: the rank behind it is gone."""
        now = time.monotonic()
        for sock in [k.fileobj for k in list(sel.get_map().values())]:
            r = rank_of[sock]  # type: ignore[index]
            if now - self.heard.get(r, now) > SILENT_S and r not in self.left:
                sel.unregister(sock)
                self._end(f"rank {r} has been silent for {SILENT_S:g} s (no heartbeat): its node "
                          "is down or cut off from this one", r, skip=r)

    def _file(self, r: int, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "beat":
            return
        if kind == "abort":
            if self.job.rank == 0:  # pass it on; say who stopped and why
                self._end(f"rank {r} stopped: {message['reason']}", message["rank"], skip=r)
            else:  # rank 0 passes on what another said, or says what it found: say it as is
                self._end(str(message["reason"]), message["rank"])
            return
        with self.state:
            if kind == "barrier" and self.job.rank == 0:
                self.at_barrier.setdefault(message["seq"], set()).add(r)
            elif kind == "release" and self.job.rank != 0:
                self.released = max(self.released, message["seq"])
            elif kind == "bye":
                self.left.add(r)
            self.state.notify_all()

    def _gone(self, r: int) -> None:
        with self.state:
            if r in self.left or self.stopping:  # a goodbye came first, or we are closing
                return
        self._end(f"rank {r}'s process is gone (its control connection closed)", r, skip=r)

    def _end(self, why: str, blamed: int | None, skip: int | None = None) -> None:
        """The job cannot go on: remember why (the first reason stands), and on rank 0 tell
        every other rank."""
        with self.state:
            first = self.failure is None
            if first:
                self.failure = (why, blamed)
            self.state.notify_all()
        if first and self.job.rank == 0:
            self.abort(why, blamed if blamed is not None else 0, skip=skip)

    def _raise_failure(self) -> None:
        assert self.failure is not None
        why, who = self.failure
        raise PeerError(why, peer=who, hint="see that rank's own output for why it stopped")

    def watch(self) -> None:
        """Called while waiting on RDMA: raise what the reader found (a rank gone, an abort)."""
        if self.failure is not None:
            self._raise_failure()

    def abort(self, reason: str, blamed: int, skip: int | None = None) -> None:
        """Tell the job over TCP too (the RDMA path to a peer may be what broke): rank 0
        tells every other rank, the others tell rank 0, which passes it on."""
        for other, sock in self._links().items():
            if other != skip and other not in self.left:
                try:
                    self._send(sock, {"type": "abort", "rank": blamed, "reason": reason[:1000]})
                except OSError:
                    pass

    def _wait(self, done: Callable[[], bool], deadline: float) -> bool:
        """Until done() or a failure (raised) or the deadline (False)."""
        with self.state:
            while not done():
                if self.failure is not None:
                    self._raise_failure()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.state.wait(min(remaining, 0.5))
        return True

    def barrier(self) -> None:
        if self.job.world_size == 1:
            return
        self.barrier_seq += 1
        seq = self.barrier_seq
        deadline = time.monotonic() + self.timeout
        if self.job.rank == 0:
            others = set(self.peers)
            if not self._wait(lambda: self.at_barrier.get(seq, set()) >= others, deadline):
                missing = sorted(others - self.at_barrier.get(seq, set()))
                raise PeerError(f"ranks {missing} did not reach barrier {seq} within "
                                f"{self.timeout:g} s", peer=missing[0])
            with self.state:
                self.at_barrier.pop(seq, None)
            for r, sock in self.peers.items():
                try:
                    self._send(sock, {"type": "release", "seq": seq})
                except OSError as err:
                    raise PeerError(f"rank {r} is gone: {err}", peer=r) from None
        else:
            assert self.root is not None
            try:
                self._send(self.root, {"type": "barrier", "rank": self.job.rank, "seq": seq})
            except OSError as err:
                raise PeerError(f"rank 0 is gone: {err}", peer=0) from None
            if not self._wait(lambda: self.released >= seq, deadline):
                raise PeerError(f"rank 0 did not release barrier {seq} within {self.timeout:g} s "
                                "(a rank did not reach it)", peer=0)

    def farewell(self, seconds: float) -> None:
        """Leave as a job, then close: no rank takes its QPs down while another may still be
        draining work towards them (a flush to a destroyed QP never completes, and its
        sender would wait out its drain bound). Each rank says goodbye to rank 0 and waits
        for rank 0's goodbye, which rank 0 sends once every rank has said its own; a closed
        connection, an abort or the deadline ends a wait early."""
        deadline = time.monotonic() + seconds
        try:
            if self.job.rank == 0:
                self._wait(lambda: set(self.peers) <= self.left, deadline)
            elif self.root is not None:
                self._say_bye(self.root)
                self._wait(lambda: 0 in self.left, deadline)
        except PeerError:  # gone or aborted: nobody to wait for
            pass
        self.close()

    def _say_bye(self, sock: socket.socket) -> None:
        if sock in self.said_bye:
            return
        self.said_bye.add(sock)
        try:
            self._send(sock, {"type": "bye", "rank": self.job.rank})
        except OSError:
            pass

    def close(self) -> None:
        """Say goodbye (a closed connection without one means a dead rank), then close."""
        socks = list(self._links().values())
        for sock in socks:
            self._say_bye(sock)
        with self.state:
            self.stopping = True
        self.quiet.set()
        if self.beater is not None and self.beater is not threading.current_thread():
            self.beater.join(timeout=2)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self.reader is not None and self.reader is not threading.current_thread():
            self.reader.join(timeout=2)
        for sock in socks:
            try:
                sock.close()
            except OSError:
                pass
        self.peers.clear()
        self.root = None

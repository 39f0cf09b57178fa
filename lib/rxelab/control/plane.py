"""The TCP control plane: rank 0 collects every rank's QP endpoints and hands each rank the
endpoints it must connect to (rxelab.control.rendezvous); later it serves barriers and goodbyes. The
connections stay open for the life of the communicator, so a rank that dies is noticed (its
socket closes). Every connection was proven at its start and every message on it is sealed
(rxelab.control.handshake).

After the exchange a reader thread on every rank takes whatever arrives, at any time: on
rank 0 a closed connection or an abort is passed on to every other rank at once, whatever
rank 0 itself is doing (computing between collectives, in a barrier, waiting on RDMA), so a
dead rank is reported everywhere within a second or so; barriers and goodbyes wait on what
the thread filed. The RDMA waits look at the thread's findings (watch) several times a
second.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from rxelab.bootstrap import JobInfo
from rxelab.control import rendezvous
from rxelab.control.connection import Link
from rxelab.control.liveness import SILENT_S, Lively, Verdict
from rxelab.control.server import Server
from rxelab.errors import PeerError, ProtocolError, Reason

# Elastic jobs: a node that powers off or drops off the network closes no connection, and a
# rank waiting to receive from it posts nothing that could fail; without heartbeats it would
# be found only by the no-progress timeout. Each end beats once a second; a link silent for
# SILENT_S (rxelab.control.liveness: heartbeats vouch for a rank that long, in a shrink too) means
# the rank behind it is gone.
BEAT_S = 1.0


class ControlPlane:
    def __init__(self, job: JobInfo, timeout: float, *, elastic: bool = False,
                 server: Server | None = None, generation: int = 0,
                 look: Callable[[int], Verdict] | None = None,
                 listener: socket.socket | None = None) -> None:
        """elastic: this rank keeps a listener, served by a thread of its own (a Server), for the job's life
        (rxelab.membership), given (a later generation's) or made here (rank 0's is the
        rendezvous), and every rank learns where the others listen. look(rank): whether a
        rank that has not said hello yet still lives (rxelab.control.liveness's verdict on a shrink's
        member, whose listener is known): rank 0 stops waiting for one that is gone.
        listener: rank 0's rendezvous, listening already (its starter published the port)."""
        self.listener = listener  # taken by forming; closed here if it never was
        self.job = job
        self.timeout = timeout
        self.elastic = elastic or server is not None
        self.server = server  # elastic: never closed here (the membership owns it)
        self.generation = generation
        self.look = look
        self.job_id = job.job_id  # drawn by rank 0 as the job forms, if not given
        self.directory: dict[int, tuple[str, int]] = {}  # elastic: where each rank listens
        self.peers: dict[int, Link] = {}  # rank 0: every other rank
        self.root: Link | None = None  # other ranks: rank 0
        self.barrier_seq = 0
        self.state = threading.Condition()  # guards what the reader files below
        self.at_barrier: dict[int, set[int]] = {}  # rank 0: barrier -> ranks that reached it
        self.released = 0  # other ranks: the last barrier rank 0 released
        self.left: set[int] = set()  # ranks that said bye: their closed socket is no news
        self.failure: tuple[str, int | None, Reason] | None = None  # what ended the job, who, why
        self.send_locks: dict[Link, threading.Lock] = {}
        # rank 0: a barrier's releases go out whole before any abort, so a death just after
        # a barrier leaves every rank past it (never some past it and some not)
        self.releasing = threading.RLock()
        self.said_bye: set[Link] = set()
        self.reader: threading.Thread | None = None
        self.beater: threading.Thread | None = None
        self.quiet = threading.Event()  # set when the beats must stop
        self.heard: dict[int, float] = {}  # elastic: when each link last said anything
        self.lost: set[int] = set()  # ranks whose link closed without a goodbye, or went silent
        self.stopping = False

    def exchange(self, endpoints: dict[int, dict[str, Any]],
                 options: dict[str, Any] | None = None) -> dict[int, dict[str, Any]]:
        """Give our endpoint for each peer; get each peer's endpoint for us. `options` are the
        settings every rank must share: rank 0 compares each rank's with its own."""
        if self.job.world_size == 1:
            if self.elastic:  # alone, but others may join: the rendezvous stays open
                rendezvous.alone(self)
            return {}
        if self.job.rank == 0:
            found = rendezvous.serve(self, endpoints, options or {})
        else:
            found = rendezvous.join(self, endpoints, options or {})
        self._start_reader()
        return found

    # ---- after the exchange: the reader thread and what it files ------------------------
    def _links(self) -> dict[int, Link]:
        return dict(self.peers) if self.job.rank == 0 else ({0: self.root} if self.root else {})

    def _start_reader(self) -> None:
        for link in self._links().values():
            link.sock.settimeout(self.timeout)  # a send to a rank that reads nothing ends, too
            self.send_locks[link] = threading.Lock()
        self.reader = threading.Thread(target=self._read, name="rxelab-control", daemon=True)
        self.reader.start()
        if self.elastic:
            self.beater = threading.Thread(target=self._beat, name="rxelab-beat", daemon=True)
            self.beater.start()

    def _beat(self) -> None:
        while not self.quiet.wait(BEAT_S):
            for link in list(self._links().values()):
                if link not in self.said_bye:
                    try:
                        self._send(link, {"type": "beat", "rank": self.job.rank})
                    except OSError:  # the reader finds out why
                        pass

    def _send(self, link: Link, message: dict[str, Any]) -> None:
        with self.send_locks.setdefault(link, threading.Lock()):  # in sequence: sealed
            link.send(message)

    def _read(self) -> None:
        links = self._links()
        rank_of = {link.sock: r for r, link in links.items()}
        link_of = {link.sock: link for link in links.values()}
        sel = selectors.DefaultSelector()
        for link in links.values():
            sel.register(link.sock, selectors.EVENT_READ)  # read only when readable: never blocks
        self.heard = {r: time.monotonic() for r in links}
        try:
            while not self.stopping and sel.get_map():
                if self.elastic:
                    self._silence(sel, rank_of)
                for key, _ in sel.select(timeout=0.2):
                    sock: socket.socket = key.fileobj  # type: ignore[assignment]
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
                    try:
                        for message in link_of[sock].take(data):
                            self._file(r, message)
                    except ProtocolError as err:
                        sel.unregister(sock)
                        self.lost.add(r)
                        self._end(f"rank {r} sent a bad control message: {err}", r, Reason.FAILED, skip=r)
        finally:
            sel.close()

    def _silence(self, sel: selectors.BaseSelector, rank_of: dict[socket.socket, int]) -> None:
        """A link that has not beaten for SILENT_S: the rank behind it is gone."""
        now = time.monotonic()
        for sock in [k.fileobj for k in list(sel.get_map().values())]:
            r = rank_of[sock]  # type: ignore[index]
            if now - self.heard.get(r, now) > SILENT_S and r not in self.left:
                sel.unregister(sock)
                self.lost.add(r)
                self._end(f"rank {r} has been silent for {SILENT_S:g} s (no heartbeat): its node "
                          "is down or cut off from this one", r, Reason.SILENT, skip=r)

    def _file(self, r: int, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "beat":
            return
        if kind == "abort":
            # what befell the blamed rank, as the rank that found it said (a death stays one)
            why = Reason(message["why"])
            if self.job.rank == 0:  # pass it on; say who stopped and why
                self._end(f"rank {r} stopped: {message['reason']}", message["rank"], why, skip=r)
            else:  # rank 0 passes on what another said, or says what it found: say it as is
                self._end(str(message["reason"]), message["rank"], why)
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
            self.lost.add(r)
        self._end(f"rank {r}'s process is gone (its control connection closed)", r, Reason.DIED,
                  skip=r)

    def lively(self) -> Lively:
        """The ranks whose heartbeats say they live, each until SILENT_S after it was last
        heard: a link that closed without a goodbye or went silent vouches for nobody; one
        that said goodbye (left on purpose, for a shrink say) vouches from its last word. A
        shrink does not take a connect that times out towards one of them for its death while
        they vouch for it (a flood of connects can fill a live listener's queue), and takes it
        for one once they lapse (a node that powered off as the shrink began)."""
        with self.state:
            return Lively({r: t + SILENT_S for r, t in self.heard.items() if r not in self.lost})

    def _end(self, why: str, blamed: int | None, reason: Reason,
             skip: int | None = None) -> None:
        """The job cannot go on: remember why (the first reason stands), and on rank 0 tell
        every other rank."""
        with self.state:
            first = self.failure is None
            if first:
                self.failure = (why, blamed, reason)
            self.state.notify_all()
        if first and self.job.rank == 0:
            self.abort(why, blamed if blamed is not None else 0, skip=skip, why=reason)

    def _raise_failure(self) -> None:
        assert self.failure is not None
        why, who, reason = self.failure
        raise PeerError(why, peer=who, reason=reason,
                        hint="see that rank's own output for why it stopped")

    def watch(self) -> None:
        """Called while waiting on RDMA: raise what the reader found (a rank gone, an abort)."""
        if self.failure is not None:
            self._raise_failure()

    def abort(self, reason: str, blamed: int, skip: int | None = None,
              why: Reason = Reason.FAILED) -> None:
        """Tell the job over TCP too (the RDMA path to a peer may be what broke): rank 0
        tells every other rank, the others tell rank 0, which passes it on."""
        with self.releasing:
            self._abort(reason, blamed, skip, why)

    def _abort(self, reason: str, blamed: int, skip: int | None, why: Reason) -> None:
        for other, link in self._links().items():
            if other != skip and other not in self.left:
                try:
                    self._send(link, {"type": "abort", "rank": blamed, "reason": reason[:1000],
                                            "why": why.value})
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
                                f"{self.timeout:g} s", peer=missing[0], reason=Reason.STALLED)
            with self.state:
                self.at_barrier.pop(seq, None)
            with self.releasing:
                for r, link in self.peers.items():
                    try:
                        self._send(link, {"type": "release", "seq": seq})
                    except OSError as err:
                        raise PeerError(f"rank {r} is gone: {err}", peer=r,
                                        reason=Reason.DIED) from None
        else:
            assert self.root is not None
            try:
                self._send(self.root, {"type": "barrier", "rank": self.job.rank, "seq": seq})
            except OSError as err:
                raise PeerError(f"rank 0 is gone: {err}", peer=0, reason=Reason.DIED) from None
            if not self._wait(lambda: self.released >= seq, deadline):
                raise PeerError(f"rank 0 did not release barrier {seq} within {self.timeout:g} s "
                                "(a rank did not reach it)", peer=0, reason=Reason.STALLED)

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

    def _say_bye(self, link: Link) -> None:
        if link in self.said_bye:
            return
        self.said_bye.add(link)
        try:
            self._send(link, {"type": "bye", "rank": self.job.rank})
        except OSError:
            pass

    def close(self) -> None:
        """Say goodbye (a closed connection without one means a dead rank), then close."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        links = list(self._links().values())
        for link in links:
            self._say_bye(link)
        with self.state:
            self.stopping = True
        self.quiet.set()
        if self.beater is not None and self.beater is not threading.current_thread():
            self.beater.join(timeout=2)
        for link in links:
            try:
                link.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self.reader is not None and self.reader is not threading.current_thread():
            self.reader.join(timeout=2)
        for link in links:
            link.close()
        self.peers.clear()
        self.root = None

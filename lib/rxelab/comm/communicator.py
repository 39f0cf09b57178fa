"""The communicator: what applications hold. It opens a transport (rxelab.transports: verbs'
device by default), builds a full mesh of connections (endpoints swapped over the TCP control
plane), runs every described collective through one generic path (collective() and start();
the named methods are that, spelt out), and close() (or the with-block) releases everything
in the right order.

Its parts live beside it: the plans and their cache (plans.py), the caller guard and failure
handling (guard.py), argument checks (rxelab.checks), point to point and one-sided calls
(p2p.py), the named collectives (named.py), and init()/join() (starting.py). Changes of
membership are rxelab.membership's, below it: shrink() and admit() hand it this
communicator's builder.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rxelab import bootstrap, checks, codecs, logs, membership, messages, settings, transports
from rxelab.buffers import Buffer
from rxelab.collectives.common import DATA, Call
from rxelab.comm import guard
from rxelab.comm.named import NamedCollectives
from rxelab.comm.p2p import PointToPoint
from rxelab.comm.plans import Plan, PlanCache, Planner
from rxelab.comm.results import Stats
from rxelab.control.liveness import Verdict
from rxelab.control.plane import ControlPlane
from rxelab.engine import Engine
from rxelab.errors import ClosedError, ConfigError, RdmaError
from rxelab.registry import Registry
from rxelab.requests import ProgressThread, Request
from rxelab.transports.base import (
    ACCESS_LOCAL_WRITE,
    ACCESS_REMOTE,
    Connection,
    Device,
    Fabric,
    Meeting,
)

log = logging.getLogger(__name__)


def shared_settings(options: dict[str, Any], codec: codecs.Codec | None,
                    transport: str) -> dict[str, Any]:
    """What every rank (and a newcomer) must agree on, as the hello and the join carry it."""
    return {**{k: options[k] for k in settings.SHARED}, settings.CODEC: codecs.id_of(codec),
            settings.TRANSPORT: transports.id_of(transport)}


class Communicator(PointToPoint, NamedCollectives):
    def __init__(self, job: bootstrap.JobInfo, *, device: str | None = None,
                 port: int | None = None, gid_index: int | None = None, elastic: bool = False,
                 _server: Any = None, _generation: int = 0,
                 _look: Callable[[int], Verdict] | None = None, compression: str | None = None,
                 _listener: socket.socket | None = None, transport: str | None = None,
                 **options: Any) -> None:
        """options: those of rxelab.settings (timeout, eager_limit, chunk, window, slots,
        send_depth, pin_limit, qp_timeout, retry_cnt), each checked there. elastic: this
        rank keeps a listener, so the job can shrink() and admit() (rxelab.membership).
        compression: how every collective's rendezvous blocks travel unless the call says
        otherwise (rxelab.codecs: none, lz4, zstd; fp16, bf16 for float sums). transport:
        what the collectives run over (rxelab.transports; default RXELAB_TRANSPORT, else verbs)."""
        logs.configure()
        logs.at_rank(job.rank)
        self.compression = codecs.lookup(compression)
        codecs.check_use(self.compression, "every collective", True, "sum", "float32", job.world_size)
        if not isinstance(elastic, bool):
            raise ConfigError(f"elastic={elastic!r} must be True or False")
        if job.world_size > bootstrap.MAX_RANKS:
            raise ConfigError(f"a communicator of {job.world_size} ranks: rxelab supports "
                              f"{bootstrap.MAX_RANKS} at most")
        if elastic and not job.secured:
            raise ConfigError("an elastic job needs a secret: every rank keeps a listener for the "
                              "job's life, and newcomers get the training state",
                              hint="our launcher makes one; else export RXELAB_JOB_TOKEN (or "
                                   "RXELAB_JOB_TOKEN_FILE) to every rank")
        self.options = settings.resolve(options)
        self.transport = transports.choose(transport)
        transports.load(self.transport)
        at = transports.where(self.transport, device, port, gid_index)  # or the environment's
        device, port, gid_index = at.device, at.port, at.gid_index
        log.debug("rank %d of %d opens transport %s; rank 0 at %s:%d (said by: %s)", job.rank,
                  job.world_size, self.transport, job.master_addr, job.master_port, job.source)
        self.job = job
        self.opened = {"device": device, "port": port, "gid_index": gid_index,
                       "compression": compression, "transport": self.transport}
        self.formed: dict[str, Any] = {}  # how membership made it (shrink, admit, join)
        # a server handed over by a change of membership stays its giver's until we stand
        self._keep_server = _server is not None
        timeout = float(self.options["timeout"])
        slots, send_depth = int(self.options["slots"]), int(self.options["send_depth"])
        eager_limit = int(self.options["eager_limit"])
        self.rank, self.size = job.rank, job.world_size
        self.timeout = timeout
        self.closed = False
        self.failed: str | None = None  # set when a collective failed part-way
        self.conns: dict[int, Connection] = {}
        self.control = ControlPlane(job, timeout, elastic=elastic, server=_server,
                                    generation=_generation, look=_look, listener=_listener)
        self.fabric: Fabric | None = None
        self.dev: Device | None = None
        self.registry: Registry | None = None
        self.seq = 0
        self.p2p_sent: dict[int, int] = {}
        self.p2p_recv: dict[int, int] = {}
        self.exposed: dict[int, int] = {}  # buffers exposed to each peer
        self.remotes: dict[int, int] = {}  # buffers each peer exposed to us
        self.plans: PlanCache | None = None
        self.progress = ProgressThread()
        self.lock = threading.RLock()  # plans and registrations: caller and progress thread
        self.guard = guard.CallerGuard()  # the application thread inside the library
        try:
            fabric = self.fabric = transports.open_fabric(
                self.transport, device=device, port=port, gid_index=gid_index,
                cq_depth=max(1024, 2 * self.size * (slots + send_depth)), toward=job.master_addr)
            self.dev = fabric.device
            self.registry = Registry(fabric.register, int(self.options["pin_limit"]))
            self.plans = PlanCache(self.registry, self.lock, self.size)
            self.planner = Planner(self.plans, self.rank, self.size, self.compression)
            for peer in range(self.size):
                if peer != self.rank:
                    self.conns[peer] = fabric.connection(self.registry, peer, slots, send_depth,
                                                         messages.slot_size(eager_limit))
            remote = self.control.exchange({p: c.endpoint().to_dict() for p, c in self.conns.items()},
                                           shared_settings(self.options, self.compression,
                                                           self.transport))
            fabric.connect(remote, Meeting(
                self.rank, self.control.generation, self.control.job_id or job.scope(),
                job.credential, time.monotonic() + timeout, int(self.options["qp_timeout"]),
                int(self.options["retry_cnt"])))
            self.engine = Engine(self.dev, self.conns, timeout=timeout,
                                 window=int(self.options["window"]), chunk=int(self.options["chunk"]),
                                 send_depth=send_depth, eager_limit=eager_limit,
                                 watch=self.control.watch,
                                 spin_s=int(self.options["spin_us"]) * 1e-6)
            self.control.barrier()  # every QP is ready to receive before anyone sends
        except BaseException:
            self.close()
            raise
        log.debug("rank %d of %d formed job %s, generation %d, over %s", self.rank, self.size,
                  self.control.job_id, self.control.generation, self.transport)
        self._keep_server = False

    # ---- lifecycle ------------------------------------------------------------------
    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release QPs, registrations, CQ, PD, context and sockets, children first. A call
        another thread is inside is let finish first (bounded by that call's own deadlines)."""
        if self.closed:
            return
        claimed = self.guard.lock.acquire(timeout=self.timeout + 10)
        try:
            self._close()
        finally:
            if claimed:
                self.guard.release()

    def _close(self) -> None:
        if self.closed:
            return
        self.progress.stop()
        self.closed = True
        engine = getattr(self, "engine", None)
        if engine is not None and self.failed is None:
            try:  # what we sent last (a token, a write) must arrive before our QPs go
                engine.drain(min(self.timeout, 10.0))
            except RdmaError:
                pass
            # and ours stay up until every rank has drained what it sent to us
            self.control.farewell(min(self.timeout, 30.0))
        if self.plans is not None:
            self.plans.clear()
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()
        if self.registry is not None:
            self.registry.close()
        if self.fabric is not None:
            self.fabric.close()
        self.control.close()
        if self.control.server is not None and not self._keep_server:
            self.control.server.close(listener=True)
        log.debug("rank %d of %d closed its communicator%s", self.rank, self.size,
                  f" (failed: {self.failed})" if self.failed else "")

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("the communicator is closed")
        if self.failed is not None:
            # Peers may be anywhere in the failed operation: nothing after it can be trusted.
            raise ClosedError(f"the communicator failed earlier ({self.failed}); close it and "
                              f"start a new one")

    def _peer(self, peer: int) -> int:
        return checks.peer(peer, self.rank, self.size)

    def _mr(self, buf: Buffer, remote: bool, hold: bool = False) -> Any:
        if buf.nbytes == 0:
            return None
        assert self.registry is not None
        access = ACCESS_REMOTE if remote else (ACCESS_LOCAL_WRITE if buf.writable else 0)
        with self.lock:
            return self.registry.register(buf, access, hold)

    # ---- collectives ----------------------------------------------------------------
    def collective(self, name: str, sendbuf: Any, recvbuf: Any = None,
                   algorithm: str | None = None, **arguments: Any) -> Stats:
        """Any described collective (rxelab.ops): comm.collective("alltoall", s, r,
        algorithm="sequential", pairs=2). The named methods are this, spelt out."""
        return self._run(self._prepare(name, sendbuf, recvbuf, algorithm, arguments))

    def start(self, name: str, sendbuf: Any, recvbuf: Any = None, algorithm: str | None = None,
              **arguments: Any) -> Request:
        """Any described collective, started: its arguments are checked now (errors are
        raised here, as the blocking call raises them); it runs on the progress thread
        (rxelab.requests) and the Request says when it is done."""
        return self._submit(f"i{name}", lambda: self._prepare(name, sendbuf, recvbuf, algorithm,
                                                                arguments))

    def _prepare(self, name: str, sendbuf: Any, recvbuf: Any, algorithm: str | None,
                 given: dict[str, Any]) -> Plan:
        return self.planner.described(name, sendbuf, recvbuf, algorithm, given, self._check_open)

    def _submit(self, what: str, prepare: Callable[[], Plan]) -> Request:
        """Prepare a plan and hand it to the progress thread, as one step of this thread's."""
        self._check_open()
        with self.guard.exclusive(what):
            plan = prepare()
            return self.progress.submit(plan.name, lambda: self._run(plan, in_worker=True))

    def _run(self, plan: Plan, in_worker: bool = False) -> Stats:
        """Every collective's hot path (the guard spelt out: taken without a context
        manager)."""
        if not in_worker and not self.guard.lock.acquire(False):
            self.guard.claim(plan.name)  # raises, saying why
        try:
            # started requests first (a no-op on the progress thread itself): they took their
            # call numbers before this one, on every rank in the same order
            self.progress.quiesce()
            if self.closed or self.failed is not None:
                self._check_open()
            registry = self.registry
            assert registry is not None
            counters = self.engine.counters
            sent0, recv0 = counters.bytes_sent, counters.bytes_received
            # this call's own bytes in flight: earlier calls' unacknowledged eager blocks are
            # counted until a later completion answers for them, and are not this call's
            base = counters.peak_inflight = counters.inflight
            registry.peak = registry.pinned
            started = time.perf_counter()
            self.seq = (self.seq + 1) & 0x3FFF
            coded0 = (counters.coded_raw, counters.coded_wire, counters.codec_seconds)
            waits0 = (counters.empty_polls, counters.sleeps)
            call = Call(self.engine, self.rank, self.size, self.seq, plan.name, plan.layout, self._mr,
                        plan.codec, plan.staging)
            try:
                plan.run(call)
            except BaseException as err:
                guard.fail(self, plan.name, call.tag(DATA), err)
                raise
            finally:
                registry.end_call()
            return Stats(plan.operation, plan.algorithm, counters.bytes_sent - sent0,
                         counters.bytes_received - recv0, registry.peak,
                         counters.peak_inflight - base, time.perf_counter() - started,
                         counters.coded_raw - coded0[0], counters.coded_wire - coded0[1],
                         counters.codec_seconds - coded0[2], counters.empty_polls - waits0[0],
                         counters.sleeps - waits0[1])
        finally:
            if not in_worker:
                self.guard.release()

    def barrier(self) -> None:
        """Every rank has reached it. Failures are handled as a collective's are: a peer gone
        or an abort ends it at once on every rank, naming who; anything else inside it (Ctrl-C)
        fails the communicator and the peers are told."""
        self._check_open()
        with self.guard.exclusive("barrier"):
            self.progress.quiesce()
            try:
                self.control.barrier()
            except BaseException as err:
                guard.fail(self, "barrier", 0, err)
                raise

    # ---- membership (elastic jobs: rxelab.membership) ----------------------------------
    @property
    def rendezvous(self) -> tuple[str, int] | None:
        """Where newcomers knock (rank 0's listener, as this rank reaches it); None unless
        elastic."""
        return self.control.directory.get(0) if self.control.elastic else None

    def shrink(self, timeout: float | None = None, quorum: str | int = "majority") -> Communicator:
        """The survivors' communicator, after a rank died (a PeerError) - every surviving rank
        calls it. They agree on one set of survivors (whatever each saw), renumbered densely
        in the old order, on a fresh mesh; this communicator is closed (its collective that
        failed has an undefined result: redo it on the new one). quorum: "majority" (default:
        more than half of this communicator, or exactly half holding its lowest rank, go on;
        in a partition one side at most), "any", or a number of ranks. Bounded by timeout
        (default: the communicator's); the error names what it waited for."""
        quorum = membership.check_quorum(quorum, self.size)
        deadline = membership.deadline_of(timeout, self.timeout)
        seat = self.leave("shrink", farewell=False)
        try:
            return _formed(membership.shrink(seat, self._builder(seat), deadline, quorum))
        except BaseException:
            seat.server.close(listener=True)
            raise

    def admit(self, timeout: float = 0.0, wanted: int = 1,
              quorum: str | int = "majority") -> Communicator:
        """Let newcomers in (rxelab.join() on their side) - every rank calls it, between
        collectives. Rank 0 takes those waiting at the rendezvous, listening up to `timeout`
        seconds for `wanted` of them; if any came, every rank gets a new, larger communicator
        (ranks kept, newcomers after them) and this one is closed; if none, this one is
        returned. A newcomer whose settings differ from the job's is refused (the job goes on
        as it was). If a rank dies while the larger one is built, the old members shrink
        among themselves instead (with this quorum; the newcomers may knock again). Rank 0
        listens for at most half the communicator's timeout (the other ranks wait for it)."""
        mine = shared_settings(self.options, self.compression, self.transport)
        grown = membership.admit(self, self._builder, timeout, wanted, quorum,
                                 lambda theirs: settings.disagreement(mine, theirs, "the newcomer",
                                                                      codecs.NAMES_BY_ID),
                                 self.control.watch)
        return self if grown is None else _formed(grown)

    def seat(self, what: str) -> membership.Seat:
        """This rank's place in the job, as membership carries it to the next communicator."""
        self._check_open()
        return self._seat(what)

    def _seat(self, what: str = "a change of membership") -> membership.Seat:
        if not self.control.elastic:
            raise ConfigError(f"{what}: this communicator is not elastic",
                              hint="rxelab.init(elastic=True) on every rank")
        assert self.control.server is not None, "an elastic communicator has a listener"
        return membership.Seat(dataclasses.replace(self.job, job_id=self.control.job_id),
                               self.control.server, dict(self.control.directory),
                               self.control.generation, {**self.opened, **self.options},
                               self.control.lively())

    def agree_on(self, count: int) -> int:
        """Rank 0's count, on every rank; every rank holds it before any acts on it."""
        held = np.array([count], dtype=np.int64)
        self.bcast(held)
        if held[0]:
            self.barrier()
        return int(held[0])

    def leave(self, what: str, farewell: bool) -> membership.Seat:
        """Close this communicator for a change of membership, keeping the listener. A shrink
        waits for no rank (some are dead), but what this rank sent last still arrives first:
        a peer may yet need our last block to finish the collective it is in."""
        seat = self._seat(what)
        if self.closed:
            raise ClosedError(f"{what}: the communicator is closed")
        self._keep_server = True
        if not farewell and self.failed is None:  # the survivors do not wait for the dead
            with self.guard.exclusive(what):
                self.progress.quiesce()
                try:
                    self.engine.drain(min(self.timeout, 10.0))
                except RdmaError:  # a peer is gone: what went to it does not matter now
                    pass
            self.failed = f"left for {what}"
        self.close()
        return seat

    @staticmethod
    def _builder(seat: membership.Seat) -> membership.Build[Communicator]:
        """How membership makes the next communicator: on the seat's server, as it opened."""
        def build(job: bootstrap.JobInfo, generation: int,
                  look: Callable[[int], Verdict] | None = None) -> Communicator:
            return Communicator(job, elastic=True, _server=seat.server,
                                _generation=generation, _look=look, **seat.opened)
        return build


def _formed(formed: membership.Formed[Communicator]) -> Communicator:
    formed.made.formed = formed.how
    return formed.made

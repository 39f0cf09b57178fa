"""The communicator: what applications hold. init() bootstraps from the launcher's
environment, opens the device, builds a full mesh of RC QPs (endpoints swapped over the TCP
control plane) and returns a Communicator; close() (or the with-block) releases everything
in the right order.

Every collective checks its arguments before anything is posted, and returns the figures
experiments need: bytes sent and received, peak pinned memory, peak bytes in flight.
"""

from __future__ import annotations

import dataclasses
import importlib
import operator
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rxelab import bootstrap, codecs, layouts, membership, newcomers, ops, settings, verbs
from rxelab import engine as engine_mod
from rxelab.buffers import Buffer, as_buffer, host_array
from rxelab.collectives.common import DATA, Call, Staging
from rxelab.control import ControlPlane
from rxelab.engine import RTR, Engine
from rxelab.errors import ClosedError, ConfigError, MismatchError, PeerError, ProtocolError, RdmaError
from rxelab.layouts import Layout
from rxelab.registry import Registry
from rxelab.requests import ProgressThread, Request

P2P_BIT = 1 << 31
USER_BIT = 1 << 30


class Stats(NamedTuple):
    """What one collective did (a NamedTuple: made on every call, so cheap to make)."""

    operation: str
    algorithm: str
    bytes_sent: int
    bytes_received: int
    peak_pinned: int
    peak_inflight: int
    seconds: float
    coded_raw: int = 0  # bytes of blocks this rank sent coded (compression=), before coding
    coded_wire: int = 0  # what they took on the wire (coded_raw / coded_wire: the ratio)
    codec_seconds: float = 0.0  # CPU time this rank spent coding and decoding


@dataclass(frozen=True)
class RemoteBuffer:
    """A peer's buffer we may write into (from Communicator.remote)."""

    peer: int
    addr: int
    rkey: int
    length: int


MAX_PLANS = 8
_RUNNERS: dict[str, Callable[[Call], None]] = {}  # "module:function" -> the function


class Plan:
    """A collective call made ready: its checked layout and the algorithm that runs it."""

    __slots__ = ("operation", "algorithm", "name", "run", "layout", "exports", "held_version",
                 "given", "codec", "staging")

    def __init__(self, operation: str, algorithm: str, run: Callable[[Call], None],
                 layout: Layout, given: tuple[Any, ...] = (),
                 codec: codecs.Codec | None = None) -> None:
        self.operation, self.algorithm, self.run, self.layout = operation, algorithm, run, layout
        self.codec = codec  # how its rendezvous blocks travel (rxelab.codecs; None: as they are)
        # where its coded blocks pass through: the plan's own, so each area fits the block
        # it carries at every call (what pin_limit was checked against), and goes with it
        self.staging = Staging() if codec is not None else None
        # the caller's own objects, which the plan is found by (their ids): held, so no other
        # object can take an id while the plan is kept, even if a layout copied them
        self.given = given
        self.name = f"{operation}/{algorithm}"
        # numpy arrays cannot be resized while referenced; anything else is held by an export
        self.exports = [memoryview(b.owner) for b in (layout.send, layout.recv)
                        if not isinstance(b.owner, np.ndarray) and b.nbytes]
        self.held_version = -1  # what the registry held for peers when pin_limit was checked

    def usable(self) -> bool:
        recv = self.layout.recv.owner
        return not isinstance(recv, np.ndarray) or bool(recv.flags.writeable)


class Communicator:
    def __init__(self, job: bootstrap.JobInfo, *, device: str | None = None,
                 port: int | None = None, gid_index: int | None = None, elastic: bool = False,
                 _porter: Any = None, _generation: int = 0,
                 _look: Callable[[int], str] | None = None, compression: str | None = None,
                 **options: Any) -> None:
        """options: those of rxelab.settings (timeout, eager_limit, chunk, window, slots,
        send_depth, pin_limit, qp_timeout, retry_cnt), each checked there. elastic: this
        rank keeps a listener, so the job can shrink() and admit() (rxelab.membership).
        compression: how every collective's rendezvous blocks travel unless the call says
        otherwise (rxelab.codecs: none, lz4, zstd; fp16, bf16 for float sums)."""
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
        self.job = job
        self.opened = {"device": device, "port": port, "gid_index": gid_index,
                       "compression": compression}
        self.formed: dict[str, Any] = {}  # how membership made it (shrink, admit, join)
        # a porter handed over by a change of membership stays its giver's until we stand
        self._keep_porter = _porter is not None
        timeout = float(self.options["timeout"])
        slots, send_depth = int(self.options["slots"]), int(self.options["send_depth"])
        eager_limit = int(self.options["eager_limit"])
        self.rank, self.size = job.rank, job.world_size
        self.timeout = timeout
        self.closed = False
        self.failed: str | None = None  # set when a collective failed part-way
        self.conns: dict[int, verbs.Connection] = {}
        self.control = ControlPlane(job, timeout, elastic=elastic, porter=_porter,
                                    generation=_generation, look=_look)
        self.dev: verbs.Device | None = None
        self.registry: Registry | None = None
        self.seq = 0
        self.p2p_sent: dict[int, int] = {}
        self.p2p_recv: dict[int, int] = {}
        self.exposed: dict[int, int] = {}  # buffers exposed to each peer
        self.remotes: dict[int, int] = {}  # buffers each peer exposed to us
        self._plans: dict[tuple[Any, ...], Plan] = {}
        self._progress = ProgressThread()
        self._lock = threading.RLock()  # plans and registrations: caller and progress thread
        self._caller = threading.Lock()  # held by the application thread inside the library
        try:
            self.dev = verbs.Device(device, port, gid_index,
                                    cq_depth=max(1024, 2 * self.size * (slots + send_depth)))
            pd = self.dev.pd
            self.registry = Registry(lambda a, n, acc: verbs.register_mr(pd, a, n, acc),
                                     int(self.options["pin_limit"]))
            for peer in range(self.size):
                if peer != self.rank:
                    self.conns[peer] = verbs.Connection(
                        self.dev, self.registry, peer, slots, send_depth,
                        slot_size=max(verbs.CTRL_SLOT, eager_limit))
            remote = self.control.exchange({p: c.endpoint().to_dict() for p, c in self.conns.items()},
                                           shared_settings(self.options, self.compression))
            for peer, ep in remote.items():
                self.conns[peer].connect(verbs.Endpoint.from_dict(ep), int(self.options["qp_timeout"]),
                                         int(self.options["retry_cnt"]))
            self.engine = Engine(self.dev, self.conns, timeout=timeout,
                                 window=int(self.options["window"]), chunk=int(self.options["chunk"]),
                                 send_depth=send_depth, eager_limit=eager_limit,
                                 watch=self.control.watch)
            self.control.barrier()  # every QP is ready to receive before anyone sends
        except BaseException:
            self.close()
            raise
        self._keep_porter = False

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
        claimed = self._caller.acquire(timeout=self.timeout + 10)
        try:
            self._close()
        finally:
            if claimed:
                self._caller.release()

    def _close(self) -> None:
        if self.closed:
            return
        self._progress.stop()
        self.closed = True
        engine = getattr(self, "engine", None)
        if engine is not None and self.failed is None:
            try:  # what we sent last (a token, a write) must arrive before our QPs go
                engine.drain(min(self.timeout, 10.0))
            except RdmaError:
                pass
            # and ours stay up until every rank has drained what it sent to us
            self.control.farewell(min(self.timeout, 30.0))
        for plan in self._plans.values():
            for view in plan.exports:
                view.release()
        self._plans.clear()
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()
        if self.registry is not None:
            self.registry.close()
        if self.dev is not None:
            self.dev.close()
        self.control.close()
        if self.control.porter is not None and not self._keep_porter:
            self.control.porter.close(listener=True)

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("the communicator is closed")
        if self.failed is not None:
            # Peers may be anywhere in the failed operation: nothing after it can be trusted.
            raise ClosedError(f"the communicator failed earlier ({self.failed}); close it and "
                              f"start a new one")

    # ---- helpers --------------------------------------------------------------------
    def _peer(self, peer: int) -> int:
        peer = whole(peer, "peer")
        if not 0 <= peer < self.size or peer == self.rank:
            raise ConfigError(f"peer {peer!r} is not another rank of 0..{self.size - 1}")
        return peer

    def _mr(self, buf: Buffer, remote: bool, hold: bool = False) -> Any:
        if buf.nbytes == 0:
            return None
        assert self.registry is not None
        access = verbs.ACCESS_REMOTE if remote else (
            verbs.e.IBV_ACCESS_LOCAL_WRITE if buf.writable else 0)
        with self._lock:
            return self.registry.register(buf, access, hold)

    @contextmanager
    def _communicating(self, what: str, tag: int) -> Iterator[None]:
        """Around everything that talks to peers: any exception on the way (a peer's error, a
        pyverbs error, KeyboardInterrupt, MemoryError) leaves peers mid-operation and work
        queued, so the communicator is marked failed and the peers are told to stop waiting.
        Point-to-point calls do not wait for started nonblocking requests: MPI lets them run
        side by side, which this engine cannot (it serves one caller at a time), and waiting
        would deadlock where a peer's request waits for this call; so they are refused."""
        assert self.registry is not None
        with self._exclusive(what):
            if self._progress.pending:
                raise ConfigError(f"{what}: nonblocking collectives of this rank are still pending",
                                  hint="wait() for them first (point-to-point calls do not overlap "
                                       "with them here)")
            try:
                yield
            except BaseException as err:
                self._fail(what, tag, err)
                raise
            finally:
                self.registry.end_call()

    def _fail(self, what: str, tag: int, err: BaseException) -> None:
        """The communicator is failed: the peers are told to stop waiting (RDMA notices posted
        first, before anything they would queue behind could fail), no peer may write into this
        rank's memory any more (a late writer fails at its end), and the control plane says
        why."""
        self.failed = f"{what}: {type(err).__name__}: {err}"
        why, blamed = engine_mod.FAILED, getattr(err, "peer", None)
        if isinstance(err, ProtocolError | MismatchError):
            why = engine_mod.MISMATCH
        elif isinstance(err, PeerError):
            why = engine_mod.DIED if "is gone" in str(err) else \
                engine_mod.STALLED if "no progress" in str(err) else engine_mod.FAILED
        notices: list[Any] = []
        try:  # the notices go out first: a work request that still reads our memory would
            notices = self.engine.post_aborts(tag, why, blamed)  # fail, and take them along
        except BaseException:  # telling peers is best effort
            pass
        if self.registry is not None:
            try:
                with self._lock:  # the progress thread may fail while the caller plans
                    self.registry.revoke(verbs.e.IBV_ACCESS_REMOTE_WRITE)
            except BaseException:  # the rest must still happen
                pass
        try:
            self.control.abort(f"rank {self.rank} failed in {what}: {err}",
                               self.rank if blamed is None else blamed)
            self.engine.await_notices(notices)
        except BaseException:  # telling peers is best effort
            pass

    def _claim(self, what: str) -> None:
        """One application thread in the library at a time (MPI_THREAD_SERIALIZED): a second
        one is refused before anything is posted, rather than interleaving its work with the
        first's (wrong data, or a stall). Taken first, before anything else is looked at; the
        progress thread never takes it."""
        if not self._caller.acquire(blocking=False):
            raise ConfigError(f"{what}: this communicator is in use by another thread",
                              hint="rxelab serves one thread at a time per communicator: "
                                   "serialize the calls, or give each thread a communicator")

    @contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        self._claim(what)
        try:
            yield
        finally:
            self._caller.release()

    def _run(self, plan: Plan, in_worker: bool = False) -> Stats:
        """Every collective's hot path (spelt out, as _communicating and _claim do it)."""
        if not in_worker and not self._caller.acquire(False):
            self._claim(plan.name)  # raises, saying why
        try:
            # started requests first (a no-op on the progress thread itself): they took their
            # call numbers before this one, on every rank in the same order
            self._progress.quiesce()
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
            call = Call(self.engine, self.rank, self.size, self.seq, plan.name, plan.layout, self._mr,
                        plan.codec, plan.staging)
            try:
                plan.run(call)
            except BaseException as err:
                self._fail(plan.name, call.tag(DATA), err)
                raise
            finally:
                registry.end_call()
            return Stats(plan.operation, plan.algorithm, counters.bytes_sent - sent0,
                         counters.bytes_received - recv0, registry.peak,
                         counters.peak_inflight - base, time.perf_counter() - started,
                         counters.coded_raw - coded0[0], counters.coded_wire - coded0[1],
                         counters.codec_seconds - coded0[2])
        finally:
            if not in_worker:
                self._caller.release()

    def _plan(self, key: tuple[Any, ...], make: Callable[[], Plan]) -> Plan:
        """The checked layout of a call, kept for the next call with the same buffers: a
        training loop calls the same collective on the same buffers thousands of times, and
        checking them again each time costs more than a small collective. The plan holds the
        buffers (and an export of any that is not a numpy array) so they cannot move or
        resize while it is kept. The first look takes no lock: only the caller's thread
        changes the plans (an i-collective builds its plan there too), and this is every
        call's hot path."""
        plan = self._plans.get(key)
        assert self.registry is not None
        if plan is not None and plan.usable():
            if plan.held_version != self.registry.held_version:  # expose() pinned more since
                with self._lock:
                    self._check_fits(plan)
            return plan
        with self._lock:
            self._let_go_of_dropped_plans()
            plan = make()
            self._check_fits(plan)
            if len(self._plans) >= MAX_PLANS:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan
            return plan

    def _check_fits(self, plan: Plan) -> None:
        """Every buffer the call may register, each once, within pin_limit beside what is
        held for peers: refused here, before anything is posted."""
        assert self.registry is not None
        lay = plan.layout
        staging = codecs.staging_bound(plan.codec, lay, self.size, plan.algorithm)
        self.registry.check_fits(*{id(b): b for b in (lay.send, lay.recv, *lay.scratch_buffers())
                                   }.values(), staging=staging,
                                 why=f"compression={plan.codec.name}" if plan.codec else "")
        plan.held_version = self.registry.held_version

    def _let_go_of_dropped_plans(self) -> None:
        """Plans whose buffers only we still refer to (the application dropped them) go, so a
        loop that makes fresh buffers every call does not keep them alive."""
        assert self.registry is not None
        holders: dict[int, int] = {}  # id(object) -> references we hold to it
        objects: dict[int, Any] = {}
        for plan in self._plans.values():
            lay = plan.layout  # a Buffer refers to its owner once, even when send is recv
            for b in {id(lay.send): lay.send, id(lay.recv): lay.recv}.values():
                holders[id(b.owner)] = holders.get(id(b.owner), 0) + 1
                objects[id(b.owner)] = b.owner
        for plan in self._plans.values():
            for view in plan.exports:
                holders[id(view.obj)] = holders.get(id(view.obj), 0) + 1
            for obj in plan.given:  # the caller's objects, held by the plan itself
                if id(obj) in holders:
                    holders[id(obj)] += 1
            for arr in plan.layout.held_arrays():  # reductions' flat views
                if isinstance(arr, np.ndarray) and id(arr.base) in holders:
                    holders[id(arr.base)] += 1
        for entry in self.registry.entries.values():
            if id(entry.view.obj) in holders:
                holders[id(entry.view.obj)] += 1
        # references besides ours: `objects` and getrefcount's argument
        dropped = {i for i in objects if sys.getrefcount(objects[i]) - 2 <= holders[i]}
        # a buffer seen through (a tensor's array, host_array) is only ours: its plan lasts
        # while the caller's own object is referred to by more than our plans
        callers: dict[int, Any] = {}  # id(our array) -> the caller's object
        given_refs: dict[int, int] = {}  # id(caller's object) -> slots of plans' `given`
        for plan in self._plans.values():
            half = len(plan.given) // 2
            for given, seen in zip(plan.given[:half], plan.given[half:], strict=True):
                if given is not seen and given is not None:
                    callers[id(seen)] = given
            for obj in plan.given:
                given_refs[id(obj)] = given_refs.get(id(obj), 0) + 1
        for i, caller in callers.items():
            # references besides ours: `callers`, the loop's name, getrefcount's argument
            if i in dropped and sys.getrefcount(caller) - 3 > given_refs[id(caller)]:
                dropped.discard(i)
        for key, plan in list(self._plans.items()):
            if {id(plan.layout.send.owner), id(plan.layout.recv.owner)} <= dropped:
                for view in plan.exports:
                    view.release()
                del self._plans[key]

    def _window(self, algorithm: str, pairs: Any) -> int:
        pairs = whole(pairs, "pairs")
        if pairs < 1:
            raise ConfigError(f"pairs={pairs!r}: at least one pair must be able to exchange")
        if pairs != 1 and algorithm != "sequential":
            raise ConfigError(f"pairs= sets the sequential schedule's window, not {algorithm}'s")
        return min(pairs, max(1, self.size * (self.size - 1) // 2))

    def _algorithm(self, c: ops.Collective, algorithm: str) -> Callable[[Call], None]:
        """The function that runs it, imported when first used (descriptions name it)."""
        if algorithm not in c.algorithms:
            raise ConfigError(f"unknown {c.name} algorithm {algorithm!r}",
                              hint=f"use one of {', '.join(c.algorithms)}")
        found = _RUNNERS.get(c.algorithms[algorithm])
        if found is None:
            module, _, function = c.algorithms[algorithm].partition(":")
            found = _RUNNERS[c.algorithms[algorithm]] = getattr(importlib.import_module(module),
                                                                function)
        return found

    def _arguments(self, c: ops.Collective, algorithm: str, given: dict[str, Any]) -> dict[str, Any]:
        """The extra arguments the description takes, checked; anything else is refused."""
        unknown = sorted(given.keys() - set(c.takes))
        if unknown:
            raise ConfigError(f"{c.name} takes no {', '.join(unknown)}")
        out: dict[str, Any] = {}
        if "pairs" in c.takes:
            out["window"] = self._window(algorithm, given.get("pairs", 1))
        if "root" in c.takes:
            root = whole(given.get("root", 0), "root")
            if not 0 <= root < self.size:
                raise ConfigError(f"root {root!r} is not a rank of 0..{self.size - 1}")
            out["root"] = root
        if "op" in c.takes:
            names(op=given.get("op", "sum"))
            out["op"] = given.get("op", "sum")
        return out

    def _prepare(self, name: str, sendbuf: Any, recvbuf: Any, algorithm: str | None,
                 given: dict[str, Any]) -> Plan:
        """A described collective's call, checked and made ready - or, for a call just like
        an earlier one (same collective, algorithm, buffers and arguments, as the caller gave
        them), that call's plan, found before anything else is looked at: one path for every
        collective and its i-variant, and a short one for a training loop's thousandth call."""
        given_buffers = (sendbuf, recvbuf)
        sendbuf, recvbuf = seen_buffers(sendbuf, recvbuf)
        # names and types too: pairs=2.0 or root=True must not find the plan of pairs=2, root=1;
        # a tensor by its memory as well (`tensor.data = ...` swaps it under the same object)
        key = (name, algorithm, *map(id, given_buffers),
               *map(_memory, given_buffers, (sendbuf, recvbuf)),
               *[(k, type(v), v) for k, v in given.items()])
        try:
            plan = self._plans.get(key)
        except TypeError:  # an argument that cannot be hashed: the checks below say which
            plan = None
        registry = self.registry
        assert registry is not None
        if plan is not None and plan.usable() and plan.held_version == registry.held_version:
            return plan
        self._check_open()
        c = ops.collective(name)
        chosen = c.default if algorithm is None else algorithm
        names(algorithm=chosen)
        given = dict(given)
        asked = given.pop("compression", None)
        codec = self._codec(asked)
        args = self._arguments(c, chosen, given)

        def make() -> Plan:
            run = self._algorithm(c, chosen)
            layout = c.layout(sendbuf, recvbuf, self.size, self.rank, **args)
            mine = codec
            if asked is None and not codecs.fits(codec, c.reduces, args.get("op"), layout.recv.dtype):
                mine = None  # the communicator's lossy codec codes its float sums only
            codecs.check_use(mine, name, c.reduces, args.get("op"), layout.recv.dtype, self.size)
            return Plan(name, chosen, run, layout, (*given_buffers, sendbuf, recvbuf), mine)
        return self._plan(key, make)

    def _codec(self, compression: Any) -> codecs.Codec | None:
        """A call's codec: its own compression=, else the communicator's."""
        return self.compression if compression is None else codecs.lookup(compression)

    # ---- collectives ----------------------------------------------------------------
    def collective(self, name: str, sendbuf: Any, recvbuf: Any = None,
                   algorithm: str | None = None, **arguments: Any) -> Stats:
        """Any described collective (rxelab.ops): comm.collective("alltoall", s, r,
        algorithm="sequential", pairs=2). The named methods below are this, spelt out."""
        return self._run(self._prepare(name, sendbuf, recvbuf, algorithm, arguments))

    def start(self, name: str, sendbuf: Any, recvbuf: Any = None, algorithm: str | None = None,
              **arguments: Any) -> Request:
        """Any described collective, started: its arguments are checked now (errors are
        raised here, as the blocking call raises them); it runs on the progress thread
        (rxelab.requests) and the Request says when it is done."""
        return self._submit(f"i{name}", lambda: self._prepare(name, sendbuf, recvbuf, algorithm,
                                                                arguments))

    def _submit(self, what: str, prepare: Callable[[], Plan]) -> Request:
        """Prepare a plan and hand it to the progress thread, as one step of this thread's."""
        self._check_open()
        with self._exclusive(what):
            plan = prepare()
            return self._progress.submit(plan.name, lambda: self._run(plan, in_worker=True))

    def alltoall(self, sendbuf: Any, recvbuf: Any, algorithm: str | None = None,
                 pairs: int = 1, compression: str | None = None) -> Stats:
        """MPI_Alltoall: block j of sendbuf goes to rank j; block i of recvbuf comes from rank i.
        (algorithm=None, here and below: the default its description names.)
        With algorithm="sequential", `pairs` pairs at most exchange at once (1: strictly
        sequential; p(p-1)/2: all at once), in the same fixed order.
        compression, here and below: how this call's rendezvous blocks travel (rxelab.codecs;
        None: the communicator's choice)."""
        return self._run(self._prepare("alltoall", sendbuf, recvbuf, algorithm,
                                       {"pairs": pairs, "compression": compression}))

    def allgather(self, sendbuf: Any, recvbuf: Any, algorithm: str | None = None,
                  pairs: int = 1, compression: str | None = None) -> Stats:
        """MPI_Allgather: every rank's sendbuf lands at block `rank` of every recvbuf (pairs:
        as in alltoall, for algorithm="sequential")."""
        return self._run(self._prepare("allgather", sendbuf, recvbuf, algorithm,
                                       {"pairs": pairs, "compression": compression}))

    def allreduce(self, sendbuf: Any, recvbuf: Any, op: str = "sum",
                  algorithm: str | None = None, compression: str | None = None) -> Stats:
        """MPI_Allreduce: recvbuf = op over every rank's sendbuf, element by element (sum, prod,
        min, max on numpy integer and float arrays). allreduce(x, x) works in place."""
        return self._run(self._prepare("allreduce", sendbuf, recvbuf, algorithm,
                                       {"op": op, "compression": compression}))

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, op: str = "sum",
                       algorithm: str | None = None, compression: str | None = None) -> Stats:
        """MPI_Reduce_scatter_block: block r (len(recvbuf) elements) of op over every rank's
        sendbuf (size * len(recvbuf) elements) lands at rank r."""
        return self._run(self._prepare("reduce_scatter", sendbuf, recvbuf, algorithm,
                                       {"op": op, "compression": compression}))

    def bcast(self, buf: Any, root: int = 0, algorithm: str | None = None,
              compression: str | None = None) -> Stats:
        """MPI_Bcast: root's buf lands in every rank's buf (same size everywhere)."""
        return self._run(self._prepare("bcast", buf, None, algorithm,
                                       {"root": root, "compression": compression}))

    def alltoallv(self, sendbuf: Any, send_counts: list[int], recvbuf: Any,
                  recv_counts: list[int], algorithm: str | None = None, pairs: int = 1,
                  compression: str | None = None) -> Stats:
        """MPI_Alltoallv with contiguous blocks: counts are in elements of the buffers; the
        algorithms are alltoall's."""
        return self._run(self._prepare_v(sendbuf, send_counts, recvbuf, recv_counts, algorithm,
                                         pairs, compression))

    def _prepare_v(self, sendbuf: Any, send_counts: Any, recvbuf: Any, recv_counts: Any,
                   algorithm: str | None, pairs: int, compression: str | None = None) -> Plan:
        c = ops.collective("alltoall")
        codec = self._codec(compression)
        algorithm = c.default if algorithm is None else algorithm
        names(algorithm=algorithm)
        window = self._window(algorithm, pairs)
        sc, rc = (whole_numbers(x, self.size, name) for x, name in
                  ((send_counts, "send_counts"), (recv_counts, "recv_counts")))
        given_buffers = (sendbuf, recvbuf)
        sendbuf, recvbuf = seen_buffers(sendbuf, recvbuf)
        key = ("alltoallv", algorithm, window, *map(id, given_buffers),
               *map(_memory, given_buffers, (sendbuf, recvbuf)), tuple(sc), tuple(rc),
               (type(compression), compression))

        def make() -> Plan:
            run = self._algorithm(c, algorithm)
            layout = layouts.varying(sendbuf, recvbuf, self.size, self.rank, sc, rc, window)
            mine = codec if compression is not None or codecs.fits(codec, False, None, "") else None
            codecs.check_use(mine, "alltoallv", False, None, layout.recv.dtype, self.size)
            return Plan("alltoallv", algorithm, run, layout, (*given_buffers, sendbuf, recvbuf),
                        mine)
        return self._plan(key, make)

    # ---- nonblocking --------------------------------------------------------------------
    def ialltoall(self, sendbuf: Any, recvbuf: Any, algorithm: str | None = None,
                  pairs: int = 1, compression: str | None = None) -> Request:
        """alltoall, started: returns a Request at once (req.test(), req.wait())."""
        return self.start("alltoall", sendbuf, recvbuf, algorithm, pairs=pairs,
                          compression=compression)

    def ialltoallv(self, sendbuf: Any, send_counts: list[int], recvbuf: Any,
                   recv_counts: list[int], algorithm: str | None = None, pairs: int = 1,
                   compression: str | None = None) -> Request:
        return self._submit("ialltoallv", lambda: self._prepare_v(
            sendbuf, send_counts, recvbuf, recv_counts, algorithm, pairs, compression))

    def iallgather(self, sendbuf: Any, recvbuf: Any, algorithm: str | None = None,
                   pairs: int = 1, compression: str | None = None) -> Request:
        return self.start("allgather", sendbuf, recvbuf, algorithm, pairs=pairs,
                          compression=compression)

    def iallreduce(self, sendbuf: Any, recvbuf: Any, op: str = "sum",
                   algorithm: str | None = None, compression: str | None = None) -> Request:
        return self.start("allreduce", sendbuf, recvbuf, algorithm, op=op, compression=compression)

    def ireduce_scatter(self, sendbuf: Any, recvbuf: Any, op: str = "sum",
                        algorithm: str | None = None, compression: str | None = None) -> Request:
        return self.start("reduce_scatter", sendbuf, recvbuf, algorithm, op=op,
                          compression=compression)

    def ibcast(self, buf: Any, root: int = 0, algorithm: str | None = None,
               compression: str | None = None) -> Request:
        return self.start("bcast", buf, None, algorithm, root=root, compression=compression)

    def barrier(self) -> None:
        """Every rank has reached it. Failures are handled as a collective's are: a peer gone
        or an abort ends it at once on every rank, naming who; anything else inside it (Ctrl-C)
        fails the communicator and the peers are told."""
        self._check_open()
        with self._exclusive("barrier"):
            self._progress.quiesce()
            try:
                self.control.barrier()
            except BaseException as err:
                self._fail("barrier", 0, err)
                raise

    # ---- membership (elastic jobs) --------------------------------------------------
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
        seat = self._leave("shrink", farewell=False)
        try:
            return membership.shrink(seat, self._builder(seat), deadline, quorum)
        except BaseException:
            seat.porter.close(listener=True)
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
        self._check_open()
        if not self.control.elastic:
            raise ConfigError("admit: this communicator is not elastic",
                              hint="rxelab.init(elastic=True) on every rank")
        wanted = whole(wanted, "wanted")
        if not 0 <= wanted <= newcomers.MAX_NEWCOMERS:
            raise ConfigError(f"wanted={wanted} must be 0..{newcomers.MAX_NEWCOMERS}")
        membership.deadline_of(timeout, 0.0)  # checked
        quorum = membership.check_quorum(quorum, self.size)
        seat = self._seat()
        wait = min(float(timeout), self.timeout * newcomers.ADMIT_SHARE)
        mine = shared_settings(self.options, self.compression)

        def fits(theirs: dict[str, Any]) -> str | None:
            return settings.disagreement(mine, theirs, "the newcomer", codecs.NAMES_BY_ID)
        arrived = (newcomers.hear_newcomers(seat, wait, wanted,
                                            self.timeout * newcomers.OFFER_SHARE, fits,
                                            self.control.watch)
                   if self.rank == 0 else [])
        count = np.array([len(arrived)], dtype=np.int64)
        try:
            self.bcast(count)
            if count[0]:  # every rank has the count before anyone acts on it
                self.barrier()
        except BaseException:
            newcomers.turn_away(arrived, "a rank of the job failed while admitting")
            raise
        if not count[0]:
            return self
        generation, size = seat.generation, self.size
        newcomers.welcome(arrived, size, generation + 1, seat.job.job_id)
        seat = self._leave("admit", farewell=True)
        started = time.monotonic()
        host, port = seat.directory[0]
        job = dataclasses.replace(seat.job, world_size=size + int(count[0]), master_addr=host,
                                  master_port=port, source="admit")
        build = self._builder(seat)
        try:
            try:
                comm = build(job, generation + 1, None)
            except PeerError:  # the old members go on among themselves, leaving this one
                return membership.shrink(seat, build, time.monotonic() + self.timeout, quorum)
        except BaseException:
            seat.porter.close(listener=True)
            raise
        comm.formed = {"how": "admit", "members": list(range(size)), "lost": [],
                       "admitted": list(range(size, comm.size)), "build_s": time.monotonic() - started,
                       "generation": generation + 1}
        return comm

    def _seat(self) -> membership.Seat:
        assert self.control.porter is not None, "an elastic communicator has a listener"
        return membership.Seat(dataclasses.replace(self.job, job_id=self.control.job_id),
                               self.control.porter, dict(self.control.directory),
                               self.control.generation, {**self.opened, **self.options})

    def _leave(self, what: str, farewell: bool) -> membership.Seat:
        """Close this communicator for a change of membership, keeping the listener. A shrink
        waits for no rank (some are dead), but what this rank sent last still arrives first:
        a peer may yet need our last block to finish the collective it is in."""
        if not self.control.elastic:
            raise ConfigError(f"{what}: this communicator is not elastic",
                              hint="rxelab.init(elastic=True) on every rank")
        if self.closed:
            raise ClosedError(f"{what}: the communicator is closed")
        seat = self._seat()
        self._keep_porter = True
        if not farewell and self.failed is None:  # the survivors do not wait for the dead
            with self._exclusive(what):
                self._progress.quiesce()
                try:
                    self.engine.drain(min(self.timeout, 10.0))
                except RdmaError:  # a peer is gone: what went to it does not matter now
                    pass
            self.failed = f"left for {what}"
        self.close()
        return seat

    @staticmethod
    def _builder(seat: membership.Seat) -> membership.Build:
        def build(job: bootstrap.JobInfo, generation: int,
                  look: Callable[[int], str] | None = None) -> Communicator:
            return Communicator(job, elastic=True, _porter=seat.porter,
                                _generation=generation, _look=look, **seat.opened)
        return build

    # ---- point to point -------------------------------------------------------------
    def send(self, buf: Any, peer: int) -> None:
        """Two-sided send: waits until `peer` posted the matching recv, then writes into it."""
        self._check_open()
        peer = self._peer(peer)
        b = as_buffer(buf, "send buffer")
        n = self.p2p_sent.get(peer, 0)
        tag = P2P_BIT | (n & 0x3FFFFFFF)
        with self._communicating(f"send #{n} to rank {peer}", tag):
            self.p2p_sent[peer] = n + 1
            addr, rkey, room = self.engine.wait_rtr(peer, tag, f"send #{n}")
            if room != b.nbytes:
                raise ConfigError(f"rank {peer} receives {room} bytes, this send has {b.nbytes}")
            mr = self._mr(b, remote=False)
            op = self.engine.write(peer, b.address, mr.lkey if mr else 0, b.nbytes, addr, rkey,
                                   tag)
            self.engine.wait_ops([op], f"send #{n}")

    def recv(self, buf: Any, peer: int) -> None:
        """Two-sided receive of exactly len(buf) bytes from `peer`, into buf in place."""
        self._check_open()
        peer = self._peer(peer)
        b = as_buffer(buf, "receive buffer", writable=True)
        n = self.p2p_recv.get(peer, 0)
        tag = P2P_BIT | (n & 0x3FFFFFFF)
        with self._communicating(f"recv #{n} from rank {peer}", tag):
            self.p2p_recv[peer] = n + 1
            mr = self._mr(b, remote=True)
            self.engine.send_ctrl(peer, RTR, tag, mr.rkey if mr else 0, b.address, b.nbytes)
            self.engine.wait_data(peer, tag, b.nbytes, f"recv #{n}")

    # ---- one-sided ------------------------------------------------------------------
    def expose(self, buf: Any, peer: int) -> None:
        """Let `peer` write into buf (it gets it with remote())."""
        self._check_open()
        peer = self._peer(peer)
        b = as_buffer(buf, "exposed buffer", writable=True)
        n = self.exposed.get(peer, 0)
        tag = USER_BIT | (n & 0xFFFFFF)
        with self._communicating(f"expose #{n} to rank {peer}", tag):
            self.exposed[peer] = n + 1
            mr = self._mr(b, remote=True, hold=True)  # the peer may write until we close
            self.engine.send_ctrl(peer, RTR, tag, mr.rkey if mr else 0, b.address, b.nbytes)

    def remote(self, peer: int) -> RemoteBuffer:
        """The next buffer `peer` exposed to us."""
        self._check_open()
        peer = self._peer(peer)
        n = self.remotes.get(peer, 0)
        tag = USER_BIT | (n & 0xFFFFFF)
        with self._communicating(f"remote #{n} of rank {peer}", tag):
            self.remotes[peer] = n + 1
            addr, rkey, length = self.engine.wait_rtr(peer, tag, "remote()")
        return RemoteBuffer(peer, addr, rkey, length)

    def write(self, buf: Any, target: RemoteBuffer, offset: int = 0, imm: int | None = None) -> None:
        """RDMA write of buf into target at offset; with imm, the target is notified
        (wait_imm) and imm (0..2^24-1) is the notice's value. Returns when acknowledged."""
        self._check_open()
        b = as_buffer(buf, "write buffer")
        offset = whole(offset, "offset")
        if offset < 0 or offset + b.nbytes > target.length:
            raise ConfigError(f"{b.nbytes} bytes at offset {offset} do not fit the remote "
                              f"buffer of {target.length} bytes")
        tag = USER_BIT | (1 << 29) | (0 if imm is None else immediate(imm))
        with self._communicating(f"write to rank {target.peer}", tag):
            mr = self._mr(b, remote=False)
            # no progress notices: the target may not be waiting (it polls in wait_imm only)
            op = self.engine.write(target.peer, b.address, mr.lkey if mr else 0, b.nbytes,
                                   target.addr + offset, target.rkey, tag, imm=imm is not None,
                                   notify=False)
            self.engine.wait_ops([op], "write")

    def wait_imm(self, peer: int, imm: int, nbytes: int) -> None:
        """Wait for a write-with-immediate of nbytes from peer carrying imm."""
        self._check_open()
        peer = self._peer(peer)
        tag = USER_BIT | (1 << 29) | immediate(imm)
        nbytes = whole(nbytes, "nbytes")
        if nbytes < 0:
            raise ConfigError(f"nbytes={nbytes} must be 0 or more")
        with self._communicating(f"wait_imm from rank {peer}", tag):
            self.engine.wait_data(peer, tag, nbytes, "write_imm")


def seen_buffers(sendbuf: Any, recvbuf: Any) -> tuple[Any, Any]:
    """The buffers as the library works on them (tensors as arrays, host_array); one object
    given twice stays one (in place)."""
    send = host_array(sendbuf, "send buffer")
    return send, (send if recvbuf is sendbuf else host_array(recvbuf, "receive buffer"))


def _memory(given: Any, seen: Any) -> tuple[Any, ...] | None:
    """Where and as what a buffer the library saw through (a tensor, host_array) has its
    memory now: part of a plan's key, since the same tensor may be given other memory, or
    another dtype or shape over the same memory (`t.data = t.data.view(torch.int32)`),
    between calls."""
    if given is seen or not isinstance(seen, np.ndarray):
        return None
    return int(seen.ctypes.data), int(seen.nbytes), seen.dtype.str, seen.shape, seen.strides


def whole(value: Any, what: str) -> int:
    """An integer argument (numpy's too), or a ConfigError naming it."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}={value!r} must be a whole number")
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"{what}={value!r} must be a whole number") from None


def immediate(value: Any) -> int:
    """A write's immediate value: a whole number of 24 bits (the rest of the tag is ours)."""
    value = whole(value, "imm")
    if not 0 <= value < 1 << 24:
        raise ConfigError(f"imm={value} is outside 0..2^24-1")
    return value


def names(**given: Any) -> None:
    """Names (algorithm=, op=) are strings: anything else is said before it reaches a plan's
    key (where a list would be a TypeError: unhashable)."""
    for what, value in given.items():
        if not isinstance(value, str):
            raise ConfigError(f"{what}={value!r} must be a name (a string)")


def whole_numbers(counts: Any, size: int, name: str) -> list[int]:
    """Counts as Python ints: lists, tuples or numpy arrays of integers (np.bincount's too)."""
    try:
        values = [operator.index(c) for c in counts]
    except TypeError:
        values = []
    if len(values) != size or any(c < 0 for c in values):
        raise ConfigError(f"{name} must hold {size} whole numbers >= 0")
    return values


OPENING = ("device", "port", "gid_index", "elastic", "compression")  # init()'s, not settings'


def shared_settings(options: dict[str, Any], codec: codecs.Codec | None) -> dict[str, Any]:
    """What every rank (and a newcomer) must agree on, as the hello and the join carry it."""
    return {**{k: options[k] for k in settings.SHARED}, settings.CODEC: codecs.id_of(codec)}


def init(rank: int | None = None, world_size: int | None = None, master_addr: str | None = None,
         master_port: int | None = None, **options: Any) -> Communicator:
    """Start a communicator as torchrun, mpirun, srun or our launcher describe the job.
    options: device=, port=, gid_index= (the RDMA port to use), elastic= and those of
    rxelab.settings."""
    job = bootstrap.discover(rank, world_size, master_addr, master_port)
    return Communicator(job, **options)


def join(master_addr: str | None = None, master_port: int | None = None,
         wait: float = 600.0, **options: Any) -> Communicator:
    """A newcomer to a running elastic job: knock at its rendezvous (MASTER_ADDR/MASTER_PORT
    as for init, with the job's secret) until the job admits it (comm.admit() on its ranks),
    then take the rank it is given in the job's new communicator. Bounded by `wait` seconds;
    options are init()'s (timeout= is the communicator's, as there)."""
    if master_addr is None and not (os.environ.get("MASTER_ADDR")
                                    or os.environ.get("RXELAB_MASTER_ADDR")):
        raise ConfigError("join: no rendezvous address", hint="set MASTER_ADDR (the job's rank "
                                                                "0 host) or pass master_addr=")
    deadline = membership.deadline_of(wait, 600.0, "wait")
    job = bootstrap.discover(0, 1, master_addr, master_port)
    if not job.secured:
        raise ConfigError("join: an elastic job has a secret, and this process has none",
                          hint="export the job's RXELAB_JOB_TOKEN (or RXELAB_JOB_TOKEN_FILE)")
    # checked first, and shown to rank 0: a newcomer with other settings is refused
    resolved = settings.resolve({k: v for k, v in options.items() if k not in OPENING})
    mine = shared_settings(resolved, codecs.lookup(options.get("compression")))
    started = time.monotonic()
    welcome = newcomers.knock(job, mine, deadline, float(resolved["timeout"]) + 10.0)
    job = dataclasses.replace(job, rank=welcome["rank"], world_size=welcome["world_size"],
                              source="join", job_id=welcome["job"])
    options["elastic"] = True
    comm = Communicator(job, _generation=welcome["generation"], **options)
    comm.formed = {"how": "join", "generation": welcome["generation"],
                   "wait_s": time.monotonic() - started}
    return comm

"""A collective call made ready (a Plan: its checked layout, its algorithm, its codec) and
the cache that keeps plans for the next call with the same buffers: a training loop calls
the same collective on the same buffers thousands of times, and checking them again each
time costs more than a small collective.

A plan holds the caller's buffers (and an export of any that is not a numpy array) so they
cannot move or resize while it is kept; plans whose buffers only the cache still refers to
are let go, so a loop that makes fresh buffers every call does not keep them alive.
"""

from __future__ import annotations

import operator
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rxelab import checks, codecs, ops
from rxelab.buffers import data_pointer, host_array, kept_for
from rxelab.collectives.common import Call, Staging
from rxelab.layouts import Layout
from rxelab.registry import Registry

MAX_PLANS = 8


class Plan:
    """A collective call made ready: its checked layout and the algorithm that runs it."""

    __slots__ = ("operation", "algorithm", "name", "run", "layout", "exports", "held_version",
                 "given", "codec", "staging", "pointers")

    def __init__(self, operation: str, algorithm: str, run: Callable[[Call], None],
                 layout: Layout, given: tuple[Any, ...] = (),
                 codec: codecs.Codec | None = None) -> None:
        self.operation, self.algorithm, self.run, self.layout = operation, algorithm, run, layout
        self.codec = codec  # how its rendezvous blocks travel (rxelab.codecs; None: as they are)
        # where its coded blocks pass through, and an algorithm's workspace (Bruck packs
        # blocks there): the plan's own, so each area fits what it carries at every call
        # (what pin_limit was checked against), and goes with it
        self.staging = Staging()
        # the caller's own objects, which the plan is found by (their ids): held, so no other
        # object can take an id while the plan is kept, even if a layout copied them
        self.given = given
        self.name = f"{operation}/{algorithm}"
        # numpy arrays cannot be resized while referenced; anything else is held by an export
        self.exports = [memoryview(b.owner) for b in (layout.send, layout.recv)
                        if not isinstance(b.owner, np.ndarray) and b.nbytes]
        self.held_version = -1  # what the registry held for peers when pin_limit was checked
        # where the caller's own numpy arrays have their data (their key has what else they
        # are): an array can be given other memory under the same object and layout
        half = len(given) // 2
        arrays = {id(g): g for g, seen in zip(given[:half], given[half:], strict=True)
                  if g is seen and isinstance(g, np.ndarray)}
        self.pointers = [(field, field.value) for field in map(data_pointer, arrays.values())]

    def usable(self) -> bool:
        """Whether the plan can run as it is: its receive buffer still writable and the
        caller's arrays where they were (else a new plan is made in its place)."""
        recv = self.layout.recv.owner
        if isinstance(recv, np.ndarray) and not recv.flags.writeable:
            return False
        for field, at in self.pointers:
            if field.value != at:
                return False
        return True

    def release(self) -> None:
        for view in self.exports:
            view.release()


def seen_buffers(sendbuf: Any, recvbuf: Any) -> tuple[Any, Any]:
    """The buffers as the library works on them (tensors as arrays, host_array); one object
    given twice stays one (in place)."""
    send = host_array(sendbuf, "send buffer")
    return send, (send if recvbuf is sendbuf else host_array(recvbuf, "receive buffer"))


def memory_of(given: Any, seen: Any) -> Any:
    """What a buffer means now, as part of a plan's key: a plan's checks (contiguity, equal
    dtypes) and the typed views it made hold only for the buffer as it was. A numpy array
    may be given another dtype, shape or strides in place (`a.dtype = np.int32`): those three
    (and Plan.usable, where its data is). A tensor may be given other memory, dtype or shape
    (`t.data = ...`, `t.resize_()`, `t.set_()`) or come to need a gradient: host_array hands
    out the array it keeps of a tensor only while the tensor is as it was, and a plan holds
    that array, so the array's id says it all (kept_for). Measured (median of alternated
    rounds, 1 KiB allreduce, torch 2.13): ~0.5 us a numpy array, ~0.7 us a tensor (~5 us
    when its array's memory was read again here); a kept plan's whole lookup in place takes
    ~5.5 us with a numpy array (with usable's ~0.15 us an array), ~7.5 us with a tensor."""
    if given is seen:
        return (seen.dtype, seen.shape, seen.strides) if isinstance(seen, np.ndarray) else None
    if not isinstance(seen, np.ndarray):
        return None
    if kept_for(given, seen):
        return id(seen)
    # an export host_array makes anew each call (not a tensor): by what it is
    return int(seen.ctypes.data), seen.dtype, seen.shape, seen.strides


class PlanCache:
    """The plans of one communicator, at most MAX_PLANS, oldest dropped first. Only the
    caller's thread changes them (an i-collective builds its plan there too); the lock is
    the communicator's, shared with registrations, which the progress thread makes too."""

    def __init__(self, registry: Registry, lock: threading.RLock, size: int) -> None:
        self.registry, self.lock, self.size = registry, lock, size
        self.kept: dict[tuple[Any, ...], Plan] = {}

    def __len__(self) -> int:
        return len(self.kept)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.kept)

    def values(self) -> list[Plan]:
        return list(self.kept.values())

    def ready(self, key: tuple[Any, ...]) -> Plan | None:
        """The plan of a call just like an earlier one, found before anything else is looked
        at (the hot path: no lock), if it can run as it is."""
        try:
            plan = self.kept.get(key)
        except TypeError:  # an argument that cannot be hashed: the checks say which
            return None
        if plan is not None and plan.usable() and plan.held_version == self.registry.held_version:
            return plan
        return None

    def get(self, key: tuple[Any, ...], make: Callable[[], Plan]) -> Plan:
        """The kept plan of the key, checked again if expose() pinned more since; else a new
        one, made and checked under the lock. A kept plan that can no longer run goes first:
        the new one takes its place, not the oldest plan's, which may still be of use."""
        plan = self.kept.get(key)
        if plan is not None and plan.usable():
            if plan.held_version != self.registry.held_version:
                with self.lock:
                    self.check_fits(plan)
            return plan
        with self.lock:
            self.let_go_of_dropped()
            self.drop(key)
            plan = make()
            self.check_fits(plan)
            if len(self.kept) >= MAX_PLANS:
                self.drop(next(iter(self.kept)))
            self.kept[key] = plan
            return plan

    def drop(self, key: tuple[Any, ...]) -> None:
        """The plan of the key, if kept, goes, and lets go of what it held (its exports: a
        caller's bytearray can be resized again once no plan or registration holds it)."""
        plan = self.kept.pop(key, None)
        if plan is not None:
            plan.release()

    def check_fits(self, plan: Plan) -> None:
        """Every buffer the call may register, each once, within pin_limit beside what is
        held for peers: refused here, before anything is posted."""
        lay = plan.layout
        workspace = lay.workspace(self.size, plan.algorithm)
        why = [f"compression={plan.codec.name}"] if plan.codec else []
        why += [f"{plan.algorithm}'s workspace"] if workspace else []
        self.registry.check_fits(*{id(b): b for b in (lay.send, lay.recv, *lay.scratch_buffers())
                                   }.values(),
                                 staging=codecs.staging_bound(plan.codec, lay, self.size,
                                                              plan.algorithm) + workspace,
                                 why=", ".join(why))
        plan.held_version = self.registry.held_version

    def clear(self) -> None:
        for plan in self.kept.values():
            plan.release()
        self.kept.clear()

    def let_go_of_dropped(self) -> None:
        """Plans whose buffers only we still refer to (the application dropped them) go."""
        holders: dict[int, int] = {}  # id(object) -> references we hold to it
        objects: dict[int, Any] = {}
        for plan in self.kept.values():
            lay = plan.layout  # a Buffer refers to its owner once, even when send is recv
            for b in {id(lay.send): lay.send, id(lay.recv): lay.recv}.values():
                holders[id(b.owner)] = holders.get(id(b.owner), 0) + 1
                objects[id(b.owner)] = b.owner
        for plan in self.kept.values():
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
        for plan in self.kept.values():
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
        for key, plan in list(self.kept.items()):
            if {id(plan.layout.send.owner), id(plan.layout.recv.owner)} <= dropped:
                self.drop(key)


class Planner:
    """Makes a communicator's plans: one path for every described collective and its
    i-variant."""

    def __init__(self, cache: PlanCache, rank: int, size: int,
                 compression: codecs.Codec | None) -> None:
        self.cache, self.rank, self.size, self.compression = cache, rank, size, compression

    def codec(self, compression: Any) -> codecs.Codec | None:
        """A call's codec: its own compression=, else the communicator's."""
        return self.compression if compression is None else codecs.lookup(compression)

    def described(self, name: str, sendbuf: Any, recvbuf: Any, algorithm: str | None,
                  given: dict[str, Any], check_open: Callable[[], None]) -> Plan:
        """A described collective's call, checked and made ready - or, for a call just like
        an earlier one (same collective, algorithm, buffers and arguments, as the caller gave
        them), that call's plan."""
        given_buffers = (sendbuf, recvbuf)
        sendbuf, recvbuf = seen_buffers(sendbuf, recvbuf)
        # names and types too: pairs=2.0 or root=True must not find the plan of pairs=2, root=1;
        # a buffer by what it is now as well (memory_of: `a.dtype = ...`, `tensor.data = ...`
        # change it under the same object), read once for a call in place
        sent = memory_of(given_buffers[0], sendbuf)
        key = (name, algorithm, *map(id, given_buffers), sent,
               sent if recvbuf is sendbuf else memory_of(given_buffers[1], recvbuf),
               *[(k, type(v), v) for k, v in given.items()])
        # per-peer counts (lists, unhashable) are looked up by their values below
        plan = None if COUNTED[0] in given else self.cache.ready(key)
        if plan is not None:
            return plan
        check_open()
        c = ops.collective(name)
        counted = None
        if c.counts is not None:  # the plan is kept by the counts' values
            given = {k: _once(v) if k in COUNTED else v for k, v in given.items()}
            counted = counted_key(key[:6], given)
            plan = None if counted is None else self.cache.ready(counted)
            if plan is not None:
                return plan
        chosen = checks.algorithm(c, algorithm)
        given = dict(given)
        asked = given.pop("compression", None)
        codec = self.codec(asked)
        args = checks.arguments(c, chosen, given, self.rank, self.size)
        key = counted or key  # the counts are checked whole numbers by now

        def make() -> Plan:
            run = ops.runner(c, chosen)
            layout = c.layout(sendbuf, recvbuf, self.size, self.rank, **args)
            mine = codec
            if asked is None and not codecs.fits(codec, c.reduces, args.get("op"), layout.recv.dtype):
                mine = None  # the communicator's lossy codec codes its float sums only
            codecs.check_use(mine, name, c.reduces, args.get("op"), layout.recv.dtype, self.size)
            return Plan(name, chosen, run, layout, (*given_buffers, sendbuf, recvbuf), mine)
        return self.cache.get(key, make)


CHECKED = "checked"  # in a plan's key: counts by value (never a caller's type)
COUNTED = ("send_counts", "recv_counts")


def _once(counts: Any) -> Any:
    """Counts as given, but an iterator read once into a tuple (the key and the checks both
    read them)."""
    if isinstance(counts, list | tuple | np.ndarray):
        return counts
    try:
        return tuple(counts)
    except TypeError:  # not iterable: the checks say so
        return counts


def counted_key(head: tuple[Any, ...], given: dict[str, Any]) -> tuple[Any, ...] | None:
    """A call's key with its per-peer counts as tuples of their whole numbers (a list, a
    tuple or a numpy array of the same numbers find the same plan); None if they are not
    all whole numbers (the checks say what is wrong)."""
    try:
        return (*head, *[(k, CHECKED, tuple(map(operator.index, v))) if k in COUNTED
                         else (k, type(v), v) for k, v in given.items()])
    except TypeError:
        return None

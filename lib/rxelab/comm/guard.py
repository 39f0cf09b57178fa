"""Who may be inside a communicator, and what happens when a call fails part-way.

One application thread at a time (MPI_THREAD_SERIALIZED): a second one is refused before
anything is posted, rather than interleaving its work with the first's (wrong data, or a
stall). A call that fails part-way leaves peers mid-operation and work queued, so the
communicator is marked failed and every peer is told to stop waiting, with the reason the
error carries (rxelab.errors.Reason), never one read out of its text.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from rxelab.errors import ConfigError, MismatchError, PeerError, ProtocolError, Reason
from rxelab.messages import MISMATCH, AbortReason
from rxelab.transports.base import ACCESS_REMOTE_WRITE

if TYPE_CHECKING:
    from rxelab.control.plane import ControlPlane
    from rxelab.engine import Engine
    from rxelab.registry import Registry
    from rxelab.requests import ProgressThread


class CallerGuard:
    """The application thread inside the library, if any. Taken first, before anything else
    is looked at; the progress thread never takes it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def claim(self, what: str) -> None:
        if not self.lock.acquire(blocking=False):
            raise ConfigError(f"{what}: this communicator is in use by another thread",
                              hint="rxelab serves one thread at a time per communicator: "
                                   "serialize the calls, or give each thread a communicator")

    def release(self) -> None:
        self.lock.release()

    @contextmanager
    def exclusive(self, what: str) -> Iterator[None]:
        self.claim(what)
        try:
            yield
        finally:
            self.lock.release()


class Guarded(Protocol):
    """What failing a communicator touches (rxelab.comm.core.Core has it all)."""

    rank: int
    failed: str | None
    engine: Engine
    registry: Registry | None
    control: ControlPlane
    lock: threading.RLock
    guard: CallerGuard
    progress: ProgressThread


def abort_reason(err: BaseException) -> AbortReason:
    """What the RDMA abort notice tells the peers of why this rank stopped: a peer lost
    (died, or silent) as DIED, an abort this rank was told of as its own failure."""
    if isinstance(err, ProtocolError | MismatchError):
        return MISMATCH
    if isinstance(err, PeerError):
        if err.lost:
            return Reason.DIED
        if err.reason == Reason.STALLED:
            return Reason.STALLED
    return Reason.FAILED


def fail(comm: Guarded, what: str, tag: int, err: BaseException) -> None:
    """The communicator is failed: the peers are told to stop waiting (RDMA notices posted
    first, before anything they would queue behind could fail, and delivered before this
    rank's memory closes: a peer's write that meets it closed breaks that peer's connection,
    and a notice still on its way there would be lost with its first cause), no peer may
    write into this rank's memory any more (a late writer fails at its end; the call has not
    returned, so nothing lands in a buffer the application reuses), and the control plane
    says why."""
    comm.failed = f"{what}: {type(err).__name__}: {err}"
    blamed = getattr(err, "peer", None)
    # a mismatch that started it (found here, or told by a peer) goes along: every rank says it
    cause = getattr(err, "mismatch", None)
    notices: list[Any] = []
    try:  # the notices go out first: a work request that still reads our memory would
        notices = comm.engine.post_aborts(tag, abort_reason(err), blamed,  # fail, and take
                                          cause)  # them along
        comm.engine.await_notices(notices)
    except BaseException:  # telling peers is best effort
        pass
    if comm.registry is not None:
        try:
            with comm.lock:  # the progress thread may fail while the caller plans
                comm.registry.revoke(ACCESS_REMOTE_WRITE)
        except BaseException:  # the rest must still happen
            pass
    try:
        said = err if cause is None else cause.words()  # words every rank can read as is
        comm.control.abort(f"rank {comm.rank} failed in {what}: {said}",
                           comm.rank if blamed is None else blamed,
                           why=err.reason if isinstance(err, PeerError) else Reason.FAILED)
    except BaseException:  # telling peers is best effort
        pass


@contextmanager
def communicating(comm: Guarded, what: str, tag: int) -> Iterator[None]:
    """Around everything that talks to peers: any exception on the way (a peer's error, a
    pyverbs error, KeyboardInterrupt, MemoryError) fails the communicator (fail()).
    Point-to-point calls do not wait for started nonblocking requests: MPI lets them run
    side by side, which this engine cannot (it serves one caller at a time), and waiting
    would deadlock where a peer's request waits for this call; so they are refused."""
    assert comm.registry is not None
    with comm.guard.exclusive(what):
        if comm.progress.pending:
            raise ConfigError(f"{what}: nonblocking collectives of this rank are still pending",
                              hint="wait() for them first (point-to-point calls do not overlap "
                                   "with them here)")
        try:
            yield
        except BaseException as err:
            fail(comm, what, tag, err)
            raise
        finally:
            comm.registry.end_call()

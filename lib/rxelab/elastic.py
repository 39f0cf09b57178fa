"""The elastic training loop: steps that survive a lost rank and take in new ones.

Shrinking alone is not enough for a loop. When a rank dies in step k, a survivor may already
have finished step k (its allreduce returned) while another's failed in it: a rank can finish
a collective before its peers do, never before they entered it. So after a shrink the ranks
are at most one step apart, and some have applied step k's update (with the dead rank's
gradient in it) and some have not. The loop keeps the state as it was at the start of the
last two steps, agrees on the lowest step any survivor has finished, rolls the ranks that are
ahead back to it, and redoes from there: every rank's state stays the same, as if the dead
rank had left at that step's start. A newcomer gets the step and the state from rank 0.

    comm = rxelab.init(elastic=True)
    comm = elastic.run(comm, train_step, steps=1000, state=[params], admit_every=10)
    comm.close()

train_step(comm, step) must do the same collectives on every rank and change only `state`
(numpy arrays, updated in place) and what it computes from them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rxelab.comm import Communicator
from rxelab.errors import ConfigError, PeerError, RdmaError

Step = Callable[[Communicator, int], Any]
Report = Callable[[dict[str, Any]], None]


def run(comm: Communicator, step: Step, steps: int, state: Sequence[np.ndarray] = (), *,
        admit_every: int = 0, admit_timeout: float = 0.0, shrink_timeout: float | None = None,
        quorum: str | int = "majority", report: Report | None = None,
        expect: int = 0) -> Communicator:
    """Run step(comm, k) for k up to `steps` on every rank, shrinking after a death and
    admitting newcomers every `admit_every` steps (0: never). Returns the communicator the
    loop ended with (open: the caller closes it). report(event) hears each finished step
    ({"event": "step", "step", "size", "seconds"}) and each change of members.

    An admit point waits up to admit_timeout for a newcomer. expect: newcomers the job knows
    are on their way (a scheduler started them, and a start-up can take longer than the
    job): while fewer came, each admit point waits up to admit_timeout for the rest, so a
    short job does not end without them; once they came, admit points take only those
    already waiting. Counted by the rank that admits (rank 0), as it saw them come."""
    arrays = _state(state)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ConfigError(f"steps={steps!r} must be a whole number >= 0")
    if isinstance(admit_every, bool) or not isinstance(admit_every, int) or admit_every < 0:
        raise ConfigError(f"admit_every={admit_every!r} must be a whole number >= 0")
    if isinstance(expect, bool) or not isinstance(expect, int) or not 0 <= expect <= 64:
        raise ConfigError(f"expect={expect!r} must be a whole number 0..64")
    came = 0  # newcomers admitted so far, as this rank saw
    say = report or (lambda event: None)

    def shrink(c: Communicator) -> Communicator:
        return c.shrink(timeout=shrink_timeout, quorum=quorum)

    done = 0
    if comm.formed.get("how") == "join":  # a newcomer: where the job is, and its state
        joined = comm.formed
        comm, done = _shared(comm, done, arrays, shrink)
        say({"event": "joined", "rank": comm.rank, "size": comm.size, "step": done,
             **_times(joined)})
    before = [a.copy() for a in arrays]  # the state at the start of the step before this one
    current = [a.copy() for a in arrays]  # and at the start of this one
    while done < steps:
        for keep, a in zip(current, arrays, strict=True):
            np.copyto(keep, a)
        started = time.monotonic()
        try:
            step(comm, done)
        except PeerError as err:
            noticed = time.monotonic()
            # this rank did not finish `done`: back to its start (the step may have changed
            # the state before it failed), and one step further if another did not finish
            # the one before (never more: nobody finishes a step others have not entered)
            _restore(arrays, current)
            comm, done = _recover(shrink(comm), done, arrays, before, shrink)
            say({"event": "shrink", "step": done, "size": comm.size, "failed": str(err)[:300],
                 "detect_s": noticed - started, **_times(comm.formed)})
            continue
        done += 1
        say({"event": "step", "step": done - 1, "size": comm.size,
             "seconds": time.monotonic() - started})
        before, current = current, before  # `current` is refilled at the next step's start
        if admit_every and done % admit_every == 0 and done < steps:
            try:
                awaited = expect - came
                grown = comm.admit(timeout=admit_timeout if not expect or awaited > 0 else 0.0,
                                   wanted=max(1, awaited), quorum=quorum)
            except PeerError as err:  # a death found while admitting: shrink, and go back
                comm, done = _recover(shrink(comm), done, arrays, before, shrink)
                say({"event": "shrink", "step": done, "size": comm.size, "failed": str(err)[:300],
                     **_times(comm.formed)})
                continue
            if grown is not comm:
                formed = grown.formed
                came += len(formed.get("admitted", []))
                comm, done = _shared(grown, done, arrays, shrink)
                say({"event": "admit" if formed.get("how") == "admit" else "shrink", "step": done,
                     "size": comm.size, "admitted": formed.get("admitted", []), **_times(formed)})
    return comm


def _recover(comm: Communicator, done: int, arrays: list[np.ndarray], before: list[np.ndarray],
             shrink: Callable[[Communicator], Communicator]) -> tuple[Communicator, int]:
    """After a shrink: the step to go on from, agreed - again after each further death."""
    while True:
        try:
            return comm, _agree_step(comm, done, arrays, before)
        except PeerError:
            comm = shrink(comm)


def _agree_step(comm: Communicator, done: int, arrays: list[np.ndarray],
                before: list[np.ndarray]) -> int:
    """The lowest step any rank finished, this rank rolled back to it."""
    steps = np.array([done, -done], np.int64)
    comm.allreduce(steps.copy(), steps, op="min")
    low, high = int(steps[0]), -int(steps[1])
    if high - low > 1:
        raise RdmaError(f"ranks are {high - low} steps apart after a shrink (steps {low} to "
                        f"{high}): a step must hold a collective that every rank waits in "
                        "(an allreduce does; a bcast root's sends do not)")
    if low < done:
        _restore(arrays, before)
    return low


def _shared(comm: Communicator, done: int, arrays: list[np.ndarray],
            shrink: Callable[[Communicator], Communicator]) -> tuple[Communicator, int]:
    """Rank 0's step and state, on every rank (newcomers start from them); after a death
    meanwhile, from the shrunk communicator's rank 0 (an old member, or one that has them)."""
    while True:
        try:
            at = np.array([done], np.int64)
            comm.bcast(at)
            for a in arrays:
                comm.bcast(a)
            return comm, int(at[0])
        except PeerError:
            comm = shrink(comm)


def _restore(arrays: list[np.ndarray], saved: list[np.ndarray]) -> None:
    for a, s in zip(arrays, saved, strict=True):
        np.copyto(a, s)


def _state(state: Sequence[np.ndarray]) -> list[np.ndarray]:
    arrays = list(state)
    for a in arrays:
        if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or not a.flags.writeable:
            raise ConfigError("state must be writable, contiguous numpy arrays (updated in place)")
    return arrays


def _times(formed: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in formed.items() if k in ("agree_s", "build_s", "lost", "members",
                                                      "generation", "wait_s")}

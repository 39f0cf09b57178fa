"""The fake job's settle gate: keyed by a job's port, which the system picks and may give a
later job of the same test process again."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from tests.unit.fakejob import in_threads, settle


def comms(port: int, size: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(barrier=lambda: None, size=size,
                            job=SimpleNamespace(master_port=port)) for _ in range(size)]


def test_a_later_job_on_the_same_port_gets_a_gate_of_its_own():
    """A job of 3 ranks, then one of 5 given the same port: every rank of both passes (an old
    gate of 3 kept under the port would let 3 of the 5 through and hold 2 for 30 s)."""
    for job in (comms(40000, 3), comms(40000, 5), comms(40000, 5)):
        done = in_threads(len(job), lambda r, job=job: settle(job[r]) or r, deadline=10,
                          keep_errors=False)
        assert done == list(range(len(job)))


def test_a_gate_broken_by_a_dead_job_is_not_handed_to_the_next():
    """A job whose ranks never all came (one died first): its gate breaks after the wait; the
    next job on that port passes."""
    from tests.unit import fakejob

    gate = threading.Barrier(2)
    fakejob._GATES[(40001, 2)] = gate
    gate.abort()  # as a timed-out wait leaves it
    job = comms(40001, 2)
    assert in_threads(2, lambda r: settle(job[r]) or r, deadline=10, keep_errors=False) == [0, 1]

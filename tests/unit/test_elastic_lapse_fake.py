"""Heartbeats vouch for a rank only so long (rxelab.control.liveness, SILENT_S after it was last
heard), on the in-memory fabric with the real control plane: a rank that stops just as a shrink
begins (its process stopped, SIGSTOP: its sockets open, its beats gone, its listener taking
connections and answering none) is dropped once its heartbeats lapse, and the shrink
completes without it. Before, the survivors' control planes had heard it within LIVELY_S, so
they vouched for it for as long as the shrink ran: the others asked it (the coordinator
candidate) until their deadline and the shrink failed ("rank 0 did not answer in time")."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from rxelab.control.liveness import NO_PROOF_S, PROBE_S, SILENT_S, STRIKES

from tests.unit.elastic_helpers import (
    checked_allreduce,
    members_of,
    secret,  # noqa: F401 (autouse: jobs need the secret)
    until_failure,
)
from tests.unit.fakejob import die, settle
from tests.unit.heldjob import run_held

pytestmark = pytest.mark.slow  # waits for a stopped rank's heartbeats to lapse

# the stopped rank is dropped once its heartbeats lapse (SILENT_S) and STRIKES tries of
# PROBE_S each went unanswered over NO_PROOF_S; the shrink's deadline, three times that, is
# what a loaded host may take (it is the deadline the survivors waited out before)
DROPPED_S = SILENT_S + STRIKES * PROBE_S + NO_PROOF_S
SHRINK_S = 3 * DROPPED_S


def test_a_coordinator_that_stops_as_the_shrink_begins_is_dropped_once_its_beats_lapse():
    """Rank 3 dies; every other rank sees it; then rank 0 (which would coordinate) stops:
    no beats, nothing read, its control connections open, and its listener, as the others
    reach it, takes connections and answers none. Ranks 1 and 2 shrink at once (rank 0 was
    heard moments ago) and go on as a pair."""
    stopped = threading.Event()
    finished = threading.Barrier(3)  # rank 0 stays stopped (its sockets open) until then
    # rank 0's listener as a stopped process's: the kernel takes connections, nobody answers
    hole = socket.create_server(("127.0.0.1", 0), backlog=64)

    def job(comm):
        me = comm.rank
        settle(comm)
        if me == 3:
            die(comm)
            return None
        until_failure(comm)
        try:
            if me == 0:
                comm.control.quiet.set()  # no beats
                comm.control.stopping = True  # nothing read
                stopped.set()
                return "stopped"
            assert stopped.wait(30), "rank 0 never stopped"
            comm.control.directory[0] = hole.getsockname()
            started = time.monotonic()
            with comm.shrink(timeout=SHRINK_S, quorum="any") as new:
                took = time.monotonic() - started
                ids = members_of(new, me)
                return new.formed["lost"], ids, checked_allreduce(new, ids, me), took
        finally:
            finished.wait(SHRINK_S + 30)
            if me == 0:
                die(comm)
    try:
        out = run_held(4, job, deadline=SHRINK_S + 60)
    finally:
        hole.close()
    assert out[0] == "stopped", out
    for r in (1, 2):
        assert isinstance(out[r], tuple) and out[r][:3] == ([0, 3], [1, 2], 5.0), out

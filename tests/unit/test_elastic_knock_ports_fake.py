"""A newcomer knocks at each of the rendezvous ports it was given (master_port, then srun's
further candidates, rxelab.bootstrap.slurm_ports), each knock bound to its port: under srun
rank 0 listens on the first of them free on its node, so the first may be another process's.
Before, a newcomer knocked only at the first (scope `join <first port>`) and was never let in.
The welcome says which port rank 0 answered at: rxelab.join() forms the communicator there.

The job is one elastic rank on the in-memory fabric (its rendezvous bound, port 0, before it
starts), the squatter a socket of the test that takes connections and answers none."""

from __future__ import annotations

import dataclasses
import socket
import threading
import types
from unittest import mock

import numpy as np
import pytest
from rxelab import bootstrap
from rxelab.comm import starting
from rxelab.control.liveness import CONNECT_S, PROBE_S

from tests.unit.elastic_helpers import secret  # noqa: F401 (autouse: jobs need the secret)
from tests.unit.heldjob import run_held

pytestmark = pytest.mark.slow  # knocks past a squatter that answers nothing

TIMEOUT_S = 60  # the communicators' (admit listens for up to half of it)
# the squatter costs a knock PROBE_S a round, the next port CONNECT_S; a loaded host 3 rounds
ADMIT_S = 3 * (PROBE_S + CONNECT_S) + 5
KNOCK_S = ADMIT_S + 10  # the newcomer's wait: past the admit, so the job's side says first


def newcomer(job: bootstrap.JobInfo, out: dict[str, object]) -> None:
    """rxelab.join() for a job of these ports (as a newcomer's srun job would find them):
    knock until welcomed, then the new communicator where rank 0 answered; its allreduce's
    sum."""
    try:
        found = types.SimpleNamespace(discover=lambda *_: job)
        with mock.patch.object(starting, "bootstrap", found):
            comm = starting.join("127.0.0.1", job.master_port, wait=KNOCK_S, device="fake0",
                                 timeout=TIMEOUT_S)
        with comm:
            out["port"] = (comm.job.master_port, comm.job.more_ports)
            y = np.empty(8)
            comm.allreduce(np.full(8, comm.rank + 1.0), y)
            out["newcomer"] = (comm.rank, comm.size, float(y[0]))
    except BaseException as err:  # reported to the test
        out["newcomer"] = err


def test_a_newcomer_finds_rank_0_on_a_later_candidate_port_past_a_squatter_on_the_first() -> None:
    squatter = socket.create_server(("127.0.0.1", 0), backlog=16)  # takes, never answers
    out: dict[str, object] = {}
    knocking: list[threading.Thread] = []

    def job(comm):
        held = comm.control.server.port
        ports = (squatter.getsockname()[1], held)
        them = dataclasses.replace(bootstrap.discover(0, 1, "127.0.0.1", ports[0]),
                                   more_ports=ports[1:])
        knocking.append(threading.Thread(target=newcomer, args=(them, out), daemon=True,
                                         name="newcomer"))
        knocking[0].start()
        grown = comm.admit(timeout=ADMIT_S, wanted=1)
        if grown is comm:
            return "nobody was admitted"
        with grown:
            y = np.empty(8)
            grown.allreduce(np.full(8, grown.rank + 1.0), y)
            return grown.rank, grown.size, float(y[0]), held
    try:
        got = run_held(1, job, deadline=KNOCK_S + TIMEOUT_S, timeout=TIMEOUT_S)
        for t in knocking:
            t.join(KNOCK_S + TIMEOUT_S)
            assert not t.is_alive(), "the newcomer still knocking or forming after its deadlines"
    finally:
        squatter.close()
    assert isinstance(got[0], tuple), (got, out)
    assert got[0][:3] == (0, 2, 3.0) and out["newcomer"] == (1, 2, 3.0), (got, out)
    assert out["port"] == (got[0][3], ()), "join() formed where rank 0 answered, only there"


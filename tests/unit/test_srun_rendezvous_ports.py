"""Under srun the rendezvous is a port drawn from the job and step ids (issue 56, item 7), so
another local user can compute it and bind it first, and two unrelated jobs can draw the same
one. Neither keeps a job from forming: rank 0 listens on the first of the step's candidate
ports that is free on its node, and the other ranks dial the candidates in order, talking only
to a listener that proves the job's credential. The squatter is a process of another user
(`nobody`, tests/unit/strangers.py); the ranks are threads on the in-memory fabric, their job
read from srun's variables as rxelab.init() reads them."""

from __future__ import annotations

import time

import numpy as np
import pytest
from pyverbs import _fabric
from rxelab import bootstrap
from rxelab.comm import Communicator
from rxelab.control.liveness import CONNECT_S, PROBE_S

from tests.unit.fakejob import in_threads
from tests.unit.strangers import stranger_process, wait_for_word

SECRET = "9d4b7e1a3c5f8b2d6e0a4c8f1b3d5e7a9c2e4b6d8f0a1c3e5b7d9f2a4c6e8b0d"

# binds 127.0.0.1:port and listens, never accepting: a connection there is taken by the
# kernel and then hears nothing (the slowest kind of squatter for a rank that dials it)
SQUATTER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(64)
print("bound", flush=True)
time.sleep(600)
"""
FORM_S = 60  # the communicator's own timeout: forming that waited it out fails
# a rank pays the squatter at most PROBE_S a round (it takes the connection, says nothing),
# and tries the next port within CONNECT_S: two rounds, three times over for a loaded host
AROUND_S = 3 * 2 * (PROBE_S + CONNECT_S)
assert AROUND_S < FORM_S


def srun_env(job_id: int, rank: int, size: int, step: int = 0) -> dict[str, str]:
    """What srun gives a task, and the job's secret: no MASTER_ADDR, no MASTER_PORT."""
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(size), "SLURM_JOB_ID": str(job_id),
            "SLURM_STEP_ID": str(step), "SLURM_STEP_NODELIST": "127.0.0.1",
            "SLURM_JOB_NODELIST": "127.0.0.1", "RXELAB_JOB_TOKEN": SECRET}


def form(job_id: int, rank: int, size: int) -> float:
    """One rank of an srun job: init as under srun, an allreduce of (rank + 1), its sum."""
    job = bootstrap.discover(env=srun_env(job_id, rank, size))
    with Communicator(job, device="fake0", timeout=FORM_S) as comm:
        y = np.empty(8)
        comm.allreduce(np.full(8, rank + 1.0), y)
        return float(y[0])


def test_every_rank_draws_the_same_short_list_of_ports_and_colliding_jobs_part_after_the_first():
    env = srun_env(4711, 0, 4)
    ports = bootstrap.slurm_ports(env)
    assert len(ports) == len(set(ports)) == bootstrap.SLURM_CANDIDATES
    assert ports[0] == bootstrap.slurm_port(env)
    assert all(bootstrap.SLURM_PORT_BASE <= p < bootstrap.SLURM_PORT_BASE + bootstrap.SLURM_PORTS
               for p in ports)
    assert {bootstrap.slurm_ports(srun_env(4711, r, 4)) for r in range(4)} == {ports}
    job = bootstrap.discover(env=env)
    assert (job.master_port, *job.more_ports) == ports
    # job ids 1,250 apart draw the same first port: the next ones differ
    other = bootstrap.slurm_ports(srun_env(4711 + 1250, 0, 4))
    assert other[0] == ports[0] and not set(other[1:]) & set(ports[1:])
    # a port given by hand is the only one tried
    assert bootstrap.discover(env={**env, "MASTER_PORT": "4000"}).more_ports == ()


@pytest.mark.slow
def test_a_squatter_on_the_first_port_does_not_keep_an_srun_job_from_forming():
    job_id = 7919
    first = bootstrap.slurm_port(srun_env(job_id, 0, 3))
    _fabric.FABRIC.reset(seed=0, max_delay=0.0002)
    with stranger_process(SQUATTER, str(first)) as squatter:
        wait_for_word(squatter, "bound", 60, "the squatter to bind the first port")
        started = time.monotonic()
        out = in_threads(3, lambda r: form(job_id, r, 3), FORM_S + 30, keep_errors=True)
        took = time.monotonic() - started
        assert squatter.poll() is None, "the squatter held the port throughout"
    assert out == [6.0, 6.0, 6.0], out
    assert took < AROUND_S, (f"forming around the squatter took {took:.1f} s, more than "
                             f"{AROUND_S:g} s (3 x 2 rounds of PROBE_S + CONNECT_S)")


def test_two_jobs_whose_first_ports_collide_both_form():
    a, b = 9101, 9101 + 1250
    assert bootstrap.slurm_port(srun_env(a, 0, 2)) == bootstrap.slurm_port(srun_env(b, 0, 2))
    _fabric.FABRIC.reset(seed=0, max_delay=0.0002)
    jobs = [(a, 0), (a, 1), (a, 2), (b, 0), (b, 1), (b, 2)]
    out = in_threads(len(jobs), lambda i: form(jobs[i][0], jobs[i][1], 3), FORM_S + 30,
                     keep_errors=True)
    assert out == [6.0] * 6, out

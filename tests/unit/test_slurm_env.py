"""Under srun, with nothing exported by hand (issue 28, item 2): the rendezvous comes from
Slurm's own variables - rank 0's host from the step's hostlist, the port from the job and step
ids - and a malformed hostlist is said, never guessed."""

from __future__ import annotations

import pytest
from rxelab import hostlist
from rxelab.bootstrap import SLURM_PORT_BASE, SLURM_PORTS, discover
from rxelab.errors import ConfigError


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
    ("gpu[01-03]-ib", ["gpu01-ib", "gpu02-ib", "gpu03-ib"]),
    ("n[008-010]", ["n008", "n009", "n010"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("a,b[2-3],c", ["a", "b2", "b3", "c"]),
    ("node[9-10]", ["node9", "node10"]),
    ("login.example-1", ["login.example-1"]),
])
def test_hostlists_expand_as_scontrol_show_hostnames_does(text, hosts):
    assert hostlist.expand(text) == hosts
    assert hostlist.first(text) == hosts[0]


@pytest.mark.parametrize("text, problem", [
    ("", "an empty name"),
    ("node[1-3", r"without its '\]'"),
    ("node1-3]", r"without its '\['"),
    ("node[[1]]", "brackets inside brackets"),
    ("node[3-1]", "backwards"),
    ("node[a-b]", "not a list of numbers"),
    ("node[1-3],,x", "an empty name"),
    ("no de1", "not a host name"),
    ("x;rm -rf /", "not a host name"),
    ("n[0-99999]", "too long"),
    ("a[0-999]-b[0-999]", "more than"),
])
def test_a_malformed_hostlist_is_refused_naming_it(text, problem):
    with pytest.raises(ConfigError, match=problem):
        hostlist.expand(text)


def slurm(**over: str) -> dict[str, str]:
    env = {"SLURM_PROCID": "2", "SLURM_NTASKS": "6", "SLURM_JOB_ID": "4711",
           "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "node[1-3]",
           "SLURM_STEP_NODELIST": "node[2-3]",
           "RXELAB_JOB_TOKEN": "mcrqjUkFUobGISH4H_HDn02d-ptZ9HkU7YvtviMaslg"}
    env.update(over)
    return env


def test_srun_alone_gives_the_rank_the_size_and_a_rendezvous():
    job = discover(env=slurm())
    assert (job.rank, job.world_size, job.source) == (2, 6, "Slurm")
    assert job.master_addr == "node2", "the step's first node, not the allocation's"
    assert SLURM_PORT_BASE <= job.master_port < SLURM_PORT_BASE + SLURM_PORTS
    assert discover(env=slurm(SLURM_STEP_NODELIST="")).master_addr == "node1"
    assert discover(env=slurm(MASTER_ADDR="head", MASTER_PORT="4000")).master_addr == "head"
    assert discover(env=slurm(MASTER_PORT="4000")).master_port == 4000


def test_jobs_and_steps_that_share_a_first_node_get_ports_of_their_own():
    ports = {discover(env=slurm(SLURM_JOB_ID=str(j), SLURM_STEP_ID=str(s))).master_port
             for j in range(4700, 4800) for s in range(4)}
    assert len(ports) == 400, "two concurrent jobs (or steps) met at one port"
    every_rank = {discover(env=slurm(SLURM_PROCID=str(r))).master_port for r in range(6)}
    assert len(every_rank) == 1


def test_a_bad_slurm_variable_is_named():
    with pytest.raises(ConfigError, match="SLURM_JOB_ID"):
        discover(env=slurm(SLURM_JOB_ID="12x"))
    with pytest.raises(ConfigError, match="hostlist"):
        discover(env=slurm(SLURM_STEP_NODELIST="node[1-"))

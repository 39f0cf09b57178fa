import pytest
from rxelab.bootstrap import discover
from rxelab.errors import ConfigError


def test_torchrun_variables():
    job = discover(env={"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "node1", "MASTER_PORT": "1234"})
    assert (job.rank, job.world_size, job.master_addr, job.master_port, job.source) == \
        (2, 4, "node1", 1234, "torchrun")


def test_open_mpi_and_slurm_variables():
    job = discover(env={"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3", "MASTER_ADDR": "n1"})
    assert (job.rank, job.world_size, job.source, job.master_port) == (1, 3, "Open MPI", 29500)
    job = discover(env={"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "RXELAB_MASTER_ADDR": "n1"})
    assert (job.rank, job.world_size, job.source, job.master_addr) == (0, 2, "Slurm", "n1")


def test_arguments_win_over_the_environment():
    job = discover(rank=0, world_size=2, master_addr="a", master_port=5,
                   env={"RANK": "1", "WORLD_SIZE": "9", "MASTER_ADDR": "b"})
    assert (job.rank, job.world_size, job.master_addr, job.master_port, job.source) == \
        (0, 2, "a", 5, "arguments")


def test_nothing_set_means_a_single_process():
    job = discover(env={})
    assert (job.rank, job.world_size) == (0, 1)


@pytest.mark.parametrize(
    "kwargs, env, problem",
    [
        ({}, {"RANK": "3", "WORLD_SIZE": "3", "MASTER_ADDR": "x"}, "rank 3 is outside 0..2"),
        ({}, {"RANK": "x", "WORLD_SIZE": "3"}, "RANK='x' is not a whole number"),
        ({}, {"RANK": "0", "WORLD_SIZE": "0"}, "world size 0"),
        ({}, {"RANK": "0", "WORLD_SIZE": "2"}, "no rendezvous address"),
        ({"rank": 1}, {}, "must be given together"),
        ({}, {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "70000"},
         "outside 1..65535"),
    ],
)
def test_bad_settings_are_clear_errors(kwargs, env, problem):
    with pytest.raises(ConfigError, match=problem):
        discover(env=env, **kwargs)

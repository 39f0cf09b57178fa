"""How a process gets a communicator: init() as torchrun, mpirun, srun or our launcher
describe the job, or join() as a newcomer to a running elastic job."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from rxelab import bootstrap, codecs, logs, membership, settings, transports
from rxelab.comm.communicator import Communicator, shared_settings
from rxelab.errors import ConfigError

OPENING = ("device", "port", "gid_index", "elastic", "compression", "transport")  # init()'s, not settings'


def init(rank: int | None = None, world_size: int | None = None, master_addr: str | None = None,
         master_port: int | None = None, **options: Any) -> Communicator:
    """Start a communicator as torchrun, mpirun, srun or our launcher describe the job.
    options: transport= (rxelab.transports), device=, port=, gid_index= (the RDMA port to
    use), elastic=, compression= and those of rxelab.settings."""
    job = bootstrap.discover(rank, world_size, master_addr, master_port)
    return Communicator(job, **options)


def join(master_addr: str | None = None, master_port: int | None = None,
         wait: float = 600.0, **options: Any) -> Communicator:
    """A newcomer to a running elastic job: knock at its rendezvous (MASTER_ADDR/MASTER_PORT
    as for init, with the job's secret) until the job admits it (comm.admit() on its ranks),
    then take the rank it is given in the job's new communicator. Bounded by `wait` seconds;
    options are init()'s (timeout= is the communicator's, as there)."""
    logs.configure()  # the knocking is logged too
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
    options["transport"] = transports.choose(options.get("transport"))
    transports.load(options["transport"])  # what this host lacks, said before the knock
    mine = shared_settings(resolved, codecs.lookup(options.get("compression")),
                           options["transport"])
    started = time.monotonic()
    welcome = membership.knock(job, mine, deadline, float(resolved["timeout"]) + 10.0)
    # the new generation forms at the listener that answered the knock (one of the ports
    # tried, rxelab.membership.knock), and only there
    job = dataclasses.replace(job, rank=welcome["rank"], world_size=welcome["world_size"],
                              source="join", job_id=welcome["job"], master_port=welcome["port"],
                              more_ports=())
    options["elastic"] = True
    comm = Communicator(job, _generation=welcome["generation"], **options)
    comm.formed = {"how": "join", "generation": welcome["generation"],
                   "wait_s": time.monotonic() - started}
    return comm

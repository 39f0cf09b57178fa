"""The same demo with Gloo, torch.distributed's CPU backend (what a PyTorch user would pick on
CPUs): S stages of the collective (--op) of M bytes, verified every stage, reported in the
same JSON lines as apps/server_client.py and apps/mpi_compare.py. Gloo runs over TCP on the
network of MASTER_ADDR (the interface is found from that address, never assumed). Started by
torchrun or by our launcher, which both set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT,
or by srun, whose variables give the same through rxelab's own discovery (the step's first
node, a port drawn from the job and step ids):

    python3 -m rxelab.launch --hosts node1,node2,node3 -- python3 apps/gloo_compare.py
    srun -N3 python3 apps/gloo_compare.py

Gloo's calls differ from MPI's in ways the timings include (each description's Gloo adapter
in rxelab.ops makes its call: all_reduce works in place, the input copied into the result
buffer first, as a training loop keeps its gradient; all_gather fills a list of tensors,
views of the one result buffer here). Not every collective has a Gloo counterpart in torch
1.13: its description says which, and why not.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rxelab.errors import ConfigError

if TYPE_CHECKING:  # the same module as mypy reaches it from the tree (the node runs this file)
    from apps import stages
else:
    import stages

INIT_TIMEOUT_S = 120


def interface_towards(address: str) -> str | None:
    """The interface holding an IPv4 address in the same network as `address` (Gloo's
    GLOO_SOCKET_IFNAME); None if no interface is on that network."""
    import psutil  # a dependency of Debian's python3-torch

    target = ipaddress.ip_address(socket.gethostbyname(address))
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family == socket.AF_INET and a.netmask:
                net = ipaddress.ip_interface(f"{a.address}/{a.netmask}").network
                if target in net and not ipaddress.ip_address(a.address).is_loopback:
                    return name
    return None


def from_slurm(env: dict[str, str]) -> dict[str, str]:
    """torchrun's variables for a rank started by srun (none outside Slurm, or where they are
    set already)."""
    if all(env.get(k) for k in TORCHRUN) or not env.get("SLURM_PROCID"):
        return {}
    from rxelab import bootstrap  # the library's discovery: Slurm's hostlist and port rules

    job = bootstrap.discover(env={k: v for k, v in env.items() if k.startswith("SLURM_")})
    return {"RANK": str(job.rank), "WORLD_SIZE": str(job.world_size),
            "MASTER_ADDR": job.master_addr, "MASTER_PORT": str(job.master_port)}


TORCHRUN = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched(ap: argparse.ArgumentParser) -> None:
    """torchrun's variables in the environment, from Slurm's where srun started this rank; a
    usage error naming what is missing otherwise (the torch apps share it)."""
    try:
        os.environ.update(from_slurm(dict(os.environ)))
    except ConfigError as err:
        ap.error(f"cannot tell rank and rendezvous from Slurm's variables: {err}")
    missing = [k for k in TORCHRUN if not os.environ.get(k)]
    if missing:
        ap.error(f"{', '.join(missing)} not set: start it with torchrun, srun or "
                 "python3 -m rxelab.launch")


def no_torch(err: ImportError) -> str:
    return f"error: torch is not installed here ({err}); a lab built with EXTRAS=torch has it"


def gloo_interface() -> str | None:
    """Gloo's interface (GLOO_SOCKET_IFNAME), unless set: the one on MASTER_ADDR's network.
    The error to print where no interface is on it, else None."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return None
    iface = interface_towards(os.environ["MASTER_ADDR"])
    if iface is None:
        return (f"error: no interface here is on the network of MASTER_ADDR="
                f"{os.environ['MASTER_ADDR']}; set GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = iface
    return None


def main(argv: list[str] | None = None) -> int:
    ap = stages.arguments(__doc__.split("\n\n")[0], ["gloo-default"], "gloo-default")
    args = ap.parse_args(argv)
    stages.check_args(ap, args)
    described = stages.ops.COLLECTIVES[args.op]
    if described.gloo is None:
        ap.error(f"{args.op} has no Gloo counterpart {described.no_gloo}")
    launched(ap)
    try:
        import torch
        import torch.distributed as dist
    except ImportError as err:
        print(no_torch(err), file=sys.stderr)
        return 2
    if (wrong := gloo_interface()) is not None:
        print(wrong, file=sys.stderr)
        return 2
    # torch's own switch for env://'s store: Debian 13's 2.6 has no libuv, and the contender
    # must not lean on the library it is measured against for its rendezvous
    os.environ.setdefault("USE_LIBUV", "0")  # a user's own choice stands
    try:
        dist.init_process_group("gloo", init_method="env://",
                                timeout=datetime.timedelta(seconds=INIT_TIMEOUT_S))
    except (RuntimeError, ValueError) as err:  # the store unreachable, a rank that never came
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: Gloo's rendezvous at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
              f"failed: {first}", file=sys.stderr)
        return 2
    r, p = dist.get_rank(), dist.get_world_size()
    call = described.gloo_call(dist, r, p)  # the description's torch.distributed call

    def collective(send: np.ndarray, recv: np.ndarray) -> None:
        call(torch.from_numpy(send), torch.from_numpy(recv))  # zero copy, both ways

    dist.barrier()  # the "start signal"
    cpu: list[float] = []
    mine = stages.run(args, r, p, collective, dist.barrier, "gloo", cpu=cpu)
    table = torch.zeros(p * mine.size, dtype=torch.float64)
    dist.all_gather(list(table.chunk(p)), torch.from_numpy(mine))
    if r == 0:
        extra = {"gloo": f"torch {torch.__version__}",
                 "interface": os.environ["GLOO_SOCKET_IFNAME"],
                 **stages.cpu_per_call(cpu, args.stages)}  # rank 0's
        for line in stages.report("gloo", args, p, table.numpy(), extra):
            print(line, flush=True)
    ok = table.numpy().reshape(p, args.stages, 2)[:, :, 1].sum() == 0
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

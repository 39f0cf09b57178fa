"""The same demo with MPI (mpi4py): S stages of MPI_Allgather (or --op another collective:
its description's MPI counterpart, rxelab.ops) of M bytes, verified every stage, reported in
the same JSON lines as apps/server_client.py. Which MPI algorithm runs is the MPI's business (force one with
Open MPI's coll_tuned MCA parameters); --algorithm only labels the output.

    mpirun -np 3 --host node1,node2,node3 --mca pml ob1 --mca btl tcp,self \\
        --mca btl_tcp_if_include data0 --mca oob_tcp_if_include data0 python3 apps/mpi_compare.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
if TYPE_CHECKING:  # the same module as mypy reaches it from the tree (the node runs this file)
    from apps import stages
else:
    import stages


def main(argv: list[str] | None = None) -> int:
    labels = sorted({a for c in stages.ops.COLLECTIVES.values() if c.mpi for a in c.mpi.tuned})
    ap = stages.arguments(__doc__.split("\n\n")[0], labels, "mpi-default")
    args = ap.parse_args(argv)
    stages.check_args(ap, args)
    described = stages.ops.COLLECTIVES[args.op]
    if described.mpi is None:
        ap.error(f"{args.op} has no MPI counterpart")
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    r, p = comm.Get_rank(), comm.Get_size()
    collective = described.mpi_call(comm, MPI)  # the description's mpi4py call
    comm.Barrier()  # the "start signal"
    cpu: list[float] = []
    mine = stages.run(args, r, p, collective, comm.Barrier, "mpi", cpu=cpu)
    table = np.zeros(p * mine.size, np.float64)
    comm.Allgather(mine, table)
    if r == 0:
        extra = {"mpi": MPI.Get_library_version().splitlines()[0].strip("\x00 \t"),
                 **stages.cpu_per_call(cpu, args.stages)}  # rank 0's
        for line in stages.report("mpi", args, p, table, extra):
            print(line, flush=True)
    return 0 if table.reshape(p, args.stages, 2)[:, :, 1].sum() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

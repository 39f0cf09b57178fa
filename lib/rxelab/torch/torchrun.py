"""torchrun where torch was built without libuv (Debian 13's python3-torch 2.6):

    python3 -m rxelab.torch.torchrun --nnodes 3 --nproc_per_node 1 --node_rank I \\
        --master_addr node1 --master_port 29500 train.py

torchrun's agents meet in a TCPStore that their rendezvous makes with TCPStore's own default,
the libuv server, whatever USE_LIBUV says; such a torch then stops every multi-node torchrun
at "use_libuv was requested but PyTorch was build without libuv support". This is torchrun
with its stores falling back to the server the torch has. The workers reach the agent's store
the same way: a worker script must `import rxelab.torch` before init_process_group (which it
does to use the backend; a Gloo-only script too). With a torch that has libuv it is torchrun,
unchanged.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, static_tcp_rendezvous
    from torch.distributed.run import main as torchrun

    from rxelab.torch.rendezvous import stores_without_libuv

    # the agents' rendezvous (a worker's own stores: its `import rxelab.torch`)
    stores_without_libuv([dist, static_tcp_rendezvous, c10d_rendezvous_backend])

    sys.argv[0] = "torchrun"
    torchrun(argv)


if __name__ == "__main__":
    main()

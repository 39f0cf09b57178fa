"""torchrun where torch was built without libuv (Debian 13's python3-torch 2.6):

    python3 -m rxelab.torch.torchrun --nnodes 3 --nproc_per_node 1 --node_rank I \\
        --master_addr node1 --master_port 29500 train.py

torchrun's agents meet in a TCPStore that their rendezvous makes with TCPStore's own default,
the libuv server, whatever USE_LIBUV says; such a torch then stops every multi-node torchrun
at "use_libuv was requested but PyTorch was build without libuv support". This is torchrun
with that default turned to the server the torch has (and USE_LIBUV=0 for the workers' own
env:// store). With a torch that has libuv it is torchrun, unchanged.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def legacy_store_by_default(modules: list[Any]) -> None:
    """Each module's TCPStore made without libuv unless its caller asks otherwise."""
    import torch.distributed as dist

    made = dist.TCPStore

    def tcp_store(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("use_libuv", False)
        return made(*args, **kwargs)

    for module in modules:
        if getattr(module, "TCPStore", None) is made:
            module.TCPStore = tcp_store


def main(argv: list[str] | None = None) -> None:
    from rxelab.torch.rendezvous import libuv_missing

    if libuv_missing():
        os.environ.setdefault("USE_LIBUV", "0")  # the workers inherit it: their env:// store
        import torch.distributed as dist
        from torch.distributed.elastic.rendezvous import (
            c10d_rendezvous_backend,
            static_tcp_rendezvous,
        )

        legacy_store_by_default([dist, static_tcp_rendezvous, c10d_rendezvous_backend])
    from torch.distributed.run import main as torchrun

    sys.argv[0] = "torchrun"
    torchrun(argv)


if __name__ == "__main__":
    main()

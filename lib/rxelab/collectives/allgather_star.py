"""Server-centric allgather (the seed's design): every rank sends its block to the root
(rank 0), which then sends the whole gathered buffer to every rank."""

from __future__ import annotations

from rxelab.collectives.common import BCAST, DATA, Call
from rxelab.schedules import STAR_ROOT


def run(c: Call) -> None:
    lay, root = c.layout, STAR_ROOT
    m = lay.send.nbytes
    total = lay.recv.nbytes
    c.copy_own_block(0, c.rank * m, m)
    if c.rank == root:
        others = [p for p in range(c.size) if p != root]
        for peer in others:  # gather: each rank's block lands at its place
            c.advertise(peer, DATA, peer * m, m)
        for peer in others:
            c.receive(peer, DATA, m)
        ops = [c.write_to(peer, BCAST, 0, total, from_recv=True) for peer in others]
        c.finish(ops)
    else:
        c.advertise(root, BCAST, 0, total)
        op = c.write_to(root, DATA, 0, m)
        c.receive(root, BCAST, total)
        c.finish([op])

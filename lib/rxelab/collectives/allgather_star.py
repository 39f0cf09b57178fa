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
            c.expect(peer, DATA, peer * m, m)
        for peer in others:
            c.recv_block(peer, DATA, peer * m, m)
        ops = [c.send_block(peer, BCAST, 0, total, from_recv=True, shared=True) for peer in others]
        c.finish(ops)
    else:
        c.expect(root, BCAST, 0, total)
        op = c.send_block(root, DATA, 0, m)
        c.recv_block(root, BCAST, 0, total)
        c.finish([op])

"""Fully parallel allgather: every rank sends its block to every other rank at once, then
awaits theirs. One step where star and Bruck take two at p = 3 (star's root waits for every
block before it sends any) and the ring p - 1: the fewest waits for small blocks on few ranks,
which is where a call is a few wake-ups and rxe's packets cost the same whatever they carry.
Each rank sends p - 1 copies of its block at once, so at many ranks or large blocks a link
carries more at a time than the ring's one block a step.

The order is the all-to-all's (alltoall_parallel): rank r sends to r+1, r+2, ... and waits for
r-1, r-2, ... (mod p), so no receiver gets every rank's first block."""

from __future__ import annotations

from rxelab.collectives.common import DATA, Call


def run(c: Call) -> None:
    m = c.layout.send.nbytes
    to = [(c.rank + i) % c.size for i in range(1, c.size)]
    froms = [(c.rank - i) % c.size for i in range(1, c.size)]
    for peer in froms:
        c.expect(peer, DATA, peer * m, m)
    c.copy_own_block(0, c.rank * m, m)
    ops = [c.send_block(peer, DATA, 0, m, shared=True) for peer in to]
    for peer in froms:
        c.recv_block(peer, DATA, peer * m, m)
    c.finish(ops)

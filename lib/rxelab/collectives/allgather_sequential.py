"""Strictly sequential allgather: the pairs of the sequential all-to-all, in the same order
and with the same turn-passing; a pair exchanges their own blocks."""

from __future__ import annotations

from rxelab.collectives.common import DATA, Call, sequential_walk


def run(c: Call) -> None:
    m = c.layout.send.nbytes
    for peer in range(c.size):
        if peer != c.rank:
            c.expect(peer, DATA, peer * m, m)  # where `peer`'s block lands here
    c.copy_own_block(0, c.rank * m, m)

    sequential_walk(c, lambda peer: c.send_block(peer, DATA, 0, m, acked=True),
                    lambda peer, patience: c.recv_block(peer, DATA, peer * m, m, patience=patience))

"""Fully parallel all-to-all (the seed's first draft): every block posted at once, then all
arrivals awaited. Most bytes in flight, least waiting on any one peer.

Rank r posts to r+1, r+2, ... and waits for r-1, r-2, ... (mod p): shifted by rank, as Open
MPI's linear all-to-all is (it sends to r-1, r-2, ...). Posted in rank order, every rank's
first block went to rank 0 (its second to rank 1, ...), so p - 1 blocks met at one receiver
at a time. SimGrid, running the library's own schedule on a full-bisection cluster, put the
shifted order 12 % ahead at p = 128 with 1 MiB blocks (1.7 % at p = 512 with 1 KiB); on the
lab (p = 4 and 8 under TCG, where the VMs' CPU is what ranks wait for) the two orders were
within each other's spread."""

from __future__ import annotations

from rxelab.collectives.common import DATA, Call


def run(c: Call) -> None:
    lay = c.blocks
    to = [(c.rank + i) % c.size for i in range(1, c.size)]  # in the order they are sent
    froms = [(c.rank - i) % c.size for i in range(1, c.size)]  # in the order they come
    for peer in froms:
        c.expect(peer, DATA, lay.recv_off[peer], lay.recv_len[peer])
    c.copy_own_block(lay.send_off[c.rank], lay.recv_off[c.rank], lay.send_len[c.rank])
    ops = [c.send_block(peer, DATA, lay.send_off[peer], lay.send_len[peer]) for peer in to]
    for peer in froms:
        c.recv_block(peer, DATA, lay.recv_off[peer], lay.recv_len[peer])
    c.finish(ops)

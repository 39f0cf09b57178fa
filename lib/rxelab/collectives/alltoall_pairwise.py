"""Pairwise exchange all-to-all: p-1 steps; in step s each rank sends to (r+s) mod p and
receives from (r-s) mod p, one message out and one in at a time."""

from __future__ import annotations

from rxelab import schedules
from rxelab.collectives.common import DATA, Call


def run(c: Call) -> None:
    lay = c.blocks
    for peer in range(c.size):
        if peer != c.rank:
            c.expect(peer, DATA, lay.recv_off[peer], lay.recv_len[peer])
    c.copy_own_block(lay.send_off[c.rank], lay.recv_off[c.rank], lay.send_len[c.rank])
    for dst, src in schedules.pairwise(c.size, c.rank):
        op = c.send_block(dst, DATA, lay.send_off[dst], lay.send_len[dst])
        c.recv_block(src, DATA, lay.recv_off[src], lay.recv_len[src])
        c.finish([op])  # a written block is acknowledged before the next step's goes out

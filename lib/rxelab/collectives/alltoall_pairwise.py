"""Pairwise exchange all-to-all: p-1 steps; in step s each rank sends to (r+s) mod p and
receives from (r-s) mod p, one message out and one in at a time."""

from __future__ import annotations

from rxelab import schedules
from rxelab.collectives.common import DATA, Call


def run(c: Call) -> None:
    lay = c.blocks
    steps = schedules.pairwise(c.size, c.rank)
    # advertised in the order the steps take them: step s's sender first learns where to
    # write (in rank order, rank p-1's first sender heard last, after p-2 others)
    for _, src in steps:
        c.expect(src, DATA, lay.recv_off[src], lay.recv_len[src])
    c.copy_own_block(lay.send_off[c.rank], lay.recv_off[c.rank], lay.send_len[c.rank])
    for dst, src in steps:
        op = c.send_block(dst, DATA, lay.send_off[dst], lay.send_len[dst])
        c.recv_block(src, DATA, lay.recv_off[src], lay.recv_len[src])
        c.finish([op])  # a written block is acknowledged before the next step's goes out

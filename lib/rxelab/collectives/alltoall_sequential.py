"""Strictly sequential all-to-all: within a call, one pair of ranks exchanging at a time in
the whole job, in the fixed lexicographic order of schedules.sequential_steps (see there for
the rules). Calls back to back may overlap: the first pair of the next call can start while
the last pair of this one still moves data (as an MPI collective's next call may)."""

from __future__ import annotations

from rxelab.collectives.common import DATA, Call, sequential_walk


def run(c: Call) -> None:
    lay = c.blocks
    for peer in range(c.size):  # control only: where each peer may write, sent up front
        if peer != c.rank:
            c.expect(peer, DATA, lay.recv_off[peer], lay.recv_len[peer])
    c.copy_own_block(lay.send_off[c.rank], lay.recv_off[c.rank], lay.send_len[c.rank])

    sequential_walk(
        c, lambda peer: c.send_block(peer, DATA, lay.send_off[peer], lay.send_len[peer], acked=True),
        lambda peer, patience: c.recv_block(peer, DATA, lay.recv_off[peer], lay.recv_len[peer],
                                            patience=patience))

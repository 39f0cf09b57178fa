"""Strictly sequential all-to-all: one pair of ranks exchanging at a time in the whole job,
in the fixed lexicographic order of schedules.sequential_steps (see there for the rules)."""

from __future__ import annotations

from rxelab import schedules
from rxelab.collectives.common import DATA, Call


def run(c: Call) -> None:
    lay = c.layout
    for peer in range(c.size):  # control only: where each peer may write, sent up front
        if peer != c.rank:
            c.advertise(peer, DATA, lay.recv_off[peer], lay.recv_len[peer])
    c.copy_own_block(lay.send_off[c.rank], lay.recv_off[c.rank], lay.send_len[c.rank])
    steps = schedules.sequential_steps(c.size)
    for k, step in enumerate(steps):
        if c.rank not in step.pair:
            continue
        partner = step.pair[1] if step.pair[0] == c.rank else step.pair[0]
        if schedules.needs_token(steps, k, c.rank):
            c.await_turn(steps[k - 1].leader, k)
        op = c.write_to(partner, DATA, lay.send_off[partner], lay.send_len[partner])
        c.receive(partner, DATA, lay.recv_len[partner])
        c.finish([op])  # acknowledged: the partner has our block, we have theirs
        if c.rank == step.leader:
            for r in schedules.token_receivers(steps, k):
                c.pass_turn(r, k + 1)

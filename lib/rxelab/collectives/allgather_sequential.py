"""Strictly sequential allgather: the pairs of the sequential all-to-all, in the same order
and with the same turn-passing; a pair exchanges their own blocks."""

from __future__ import annotations

from rxelab import schedules
from rxelab.collectives.common import DATA, Call


def run(c: Call) -> None:
    m = c.layout.send.nbytes
    for peer in range(c.size):
        if peer != c.rank:
            c.advertise(peer, DATA, peer * m, m)  # where `peer`'s block lands here
    c.copy_own_block(0, c.rank * m, m)
    steps = schedules.sequential_steps(c.size)
    for k, step in enumerate(steps):
        if c.rank not in step.pair:
            continue
        partner = step.pair[1] if step.pair[0] == c.rank else step.pair[0]
        if schedules.needs_token(steps, k, c.rank):
            c.await_turn(steps[k - 1].leader, k)
        op = c.write_to(partner, DATA, 0, m)
        c.receive(partner, DATA, m)
        c.finish([op])
        if c.rank == step.leader:
            for r in schedules.token_receivers(steps, k):
                c.pass_turn(r, k + 1)

"""Ring allgather: p-1 steps; each rank forwards to its right neighbour the block it got
from its left one in the step before (its own block first)."""

from __future__ import annotations

from rxelab import schedules
from rxelab.collectives.common import DATA, RTR, STEP0, Call, SendOp, WriteOp
from rxelab.errors import MismatchError


def run(c: Call) -> None:
    m = c.layout.send.nbytes
    left, right = (c.rank - 1) % c.size, (c.rank + 1) % c.size
    c.copy_own_block(0, c.rank * m, m)
    if c.size == 1:
        return
    steps = schedules.ring_allgather(c.size, c.rank)
    if c.eager(m):  # each step's block travels on its own, tagged with the step
        for s, (send_block, recv_block) in enumerate(steps):
            c.send_block(right, STEP0 + s, send_block * m, m, from_recv=True)
            c.recv_block(left, STEP0 + s, recv_block * m, m)
        return
    # the left neighbour may write everything here; the advertisement names our codec, so
    # neighbours that code differently fail at once, naming it, not in a wait for a block
    codec = c.codec.id if c.codec is not None else 0
    if codec:  # only the handshake: coded blocks land in staging, not here
        c.engine.send_ctrl(left, RTR, c.tag(DATA), 0, 0, c.layout.recv.nbytes, codec=codec)
    else:
        c.advertise(left, DATA, 0, c.layout.recv.nbytes)
    addr, rkey, room = c.engine.wait_rtr(right, c.tag(DATA), c.name, codec)
    if room != c.layout.recv.nbytes:
        raise MismatchError(f"{c.name}: rank {right} has a {room}-byte receive buffer, "
                            f"this rank {c.layout.recv.nbytes}", peer=right)
    ops: list[WriteOp | SendOp] = []
    if c.codec is not None:  # coded blocks go one by one, each through staging
        for s, (send_block, recv_block) in enumerate(steps):
            c.expect(left, STEP0 + s, recv_block * m, m)
            ops.append(c.send_block(right, STEP0 + s, send_block * m, m, from_recv=True))
            c.recv_block(left, STEP0 + s, recv_block * m, m)
        c.finish(ops)
        return
    for s, (send_block, _) in enumerate(steps):
        ops.append(c.engine.write(right, c.layout.recv.address + send_block * m,
                                  c.recv_mr.lkey if c.recv_mr else 0, m,
                                  addr + send_block * m, rkey, c.tag(STEP0 + s)))
        c.receive(left, STEP0 + s, m)
    c.finish(ops)

"""Broadcast from a root, in place: the binomial tree (log2(p) rounds; rank r receives once,
from r minus its lowest set bit (counted from the root), then sends to r + 2^k for the
smaller k), and the seed's star (the root sends to every rank itself)."""

from __future__ import annotations

from rxelab.collectives.common import DATA, Call, SendOp, WriteOp


def binomial(c: Call) -> None:
    p, n, root = c.size, c.layout.recv.nbytes, c.rooted.root
    vr = (c.rank - root) % p
    mask = 1
    while mask < p:
        if vr & mask:
            parent = (vr - mask + root) % p
            c.expect(parent, DATA, 0, n)
            c.recv_block(parent, DATA, 0, n)
            break
        mask <<= 1
    ops: list[WriteOp | SendOp] = []
    mask >>= 1
    while mask > 0:
        if vr + mask < p:
            ops.append(c.send_block((vr + mask + root) % p, DATA, 0, n, from_recv=True,
                                    shared=True))
        mask >>= 1
    c.finish(ops)


def star(c: Call) -> None:
    p, n, root = c.size, c.layout.recv.nbytes, c.rooted.root
    if c.rank == root:
        c.finish([c.send_block(peer, DATA, 0, n, from_recv=True, shared=True)
                  for peer in range(p) if peer != root])
    else:
        c.expect(root, DATA, 0, n)
        c.recv_block(root, DATA, 0, n)

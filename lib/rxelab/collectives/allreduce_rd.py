"""Recursive-doubling allreduce: log2(p) steps; in step k each rank swaps its whole partial
result with rank r XOR 2^k and reduces - few steps, the choice for small vectors. A world
that is not a power of two folds first: ranks p2.. (p2 the largest power of two <= p) hand
their vector to rank r - p2 and get the result back at the end. With a lossy codec each rank
rounds the final sum as the wire would (the last step's sum was never sent), so every rank
ends with the same bits."""

from __future__ import annotations

from rxelab.collectives.common import DATA, STEP0, Call

FOLD, UNFOLD = DATA + 2, DATA + 3


def run(c: Call) -> None:
    lay = c.reduction
    nbytes = lay.recv.nbytes
    if lay.send is not lay.recv:
        c.copy_own_block(0, 0, nbytes)
    p, r = c.size, c.rank
    if p == 1 or nbytes == 0:
        return
    p2 = 1 << (p.bit_length() - 1)
    if r >= p2:  # folded: give our vector to r - p2, take the result back
        c.expect(r - p2, UNFOLD, 0, nbytes)
        c.finish([c.send_block(r - p2, FOLD, 0, nbytes, from_recv=True)])
        c.recv_block(r - p2, UNFOLD, 0, nbytes)
        return
    if r + p2 < p:
        c.expect(r + p2, FOLD, 0, nbytes, into=lay.scratch)
        c.recv_block(r + p2, FOLD, 0, nbytes, into=lay.scratch)
        lay.reduce(lay.acc, lay.tmp, out=lay.acc)  # the lower rank's operand first, as below
    mask, k = 1, 0
    while mask < p2:
        partner = r ^ mask
        c.expect(partner, STEP0 + k, 0, nbytes, into=lay.scratch)
        op = c.send_block(partner, STEP0 + k, 0, nbytes, from_recv=True)
        c.recv_block(partner, STEP0 + k, 0, nbytes, into=lay.scratch)
        c.finish([op])  # the partner has read our vector: now it may change
        # Both partners compute the same expression: the lower rank's partial result first
        # (a*b and b*a differ in the last bit for complex numbers, and ranks must agree).
        if r < partner:
            lay.reduce(lay.acc, lay.tmp, out=lay.acc)
        else:
            lay.reduce(lay.tmp, lay.acc, out=lay.acc)
        mask, k = mask << 1, k + 1
    c.settle(lay.acc)  # a lossy codec: the last step's sum rounded alike on every rank
    if r + p2 < p:
        c.finish([c.send_block(r + p2, UNFOLD, 0, nbytes, from_recv=True)])

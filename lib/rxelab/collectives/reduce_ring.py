"""Ring reductions: reduce-scatter (p-1 steps; in step s each rank sends its partial result
for chunk (r-s-1) mod p to the right and adds the left's partial result for chunk (r-s-2)
mod p, so rank r ends with chunk r reduced over all ranks), and allreduce = that
reduce-scatter followed by a ring allgather of the reduced chunks (the bandwidth-optimal ring:
each rank sends 2(p-1)/p of the vector).

A peer's contribution lands in scratch and is reduced into the accumulator from there; a
chunk is never changed after it was sent in the same phase. Each rank advertises its landing
area one step ahead: the left neighbour, done with a step, finds the next advertisement
waiting instead of waiting a control message's trip for it (on tcp that trip was a quarter of
a 1 MiB ring's time). Every step lands in its own chunk, so an early advertisement never
exposes bytes still in use; one step ahead, not all, keeps a long ring's control messages
within the slots' credits.
"""

from __future__ import annotations

from typing import Any

from rxelab.buffers import Buffer
from rxelab.collectives.common import STEP0, Call, SendOp, WriteOp


def chunks(n: int, p: int) -> list[tuple[int, int]]:
    """Element ranges of p nearly equal chunks of n elements."""
    return [(i * n // p, (i + 1) * n // p) for i in range(p)]


def reduce_scatter(c: Call, acc: Any, acc_buf: Buffer, land: Any, land_buf: Buffer) -> None:
    """Leave chunk `rank` of acc (a typed view of acc_buf) reduced over all ranks; the peers'
    partial results land in land (a typed view of land_buf, as long as acc)."""
    p, r = c.size, c.rank
    left, right = (r - 1) % p, (r + 1) % p
    item, bounds, reduce = acc.itemsize, chunks(acc.size, p), c.reduction.reduce

    def expect(s: int) -> None:
        if s < p - 1:
            ra, rb = bounds[(r - s - 2) % p]
            c.expect(left, STEP0 + s, ra * item, (rb - ra) * item, into=land_buf)

    expect(0)
    for s in range(p - 1):
        sa, sb = bounds[(r - s - 1) % p]
        ra, rb = bounds[(r - s - 2) % p]
        expect(s + 1)
        op = c.send_block(right, STEP0 + s, sa * item, (sb - sa) * item, source=acc_buf)
        c.recv_block(left, STEP0 + s, ra * item, (rb - ra) * item, into=land_buf)
        reduce(acc[ra:rb], land[ra:rb], out=acc[ra:rb])
        c.finish([op])  # the next step sends the chunk just reduced


def allgather_chunks(c: Call) -> None:
    """Ring allgather of the chunks of the receive buffer, rank r holding chunk r."""
    lay = c.reduction
    p, r = c.size, c.rank
    left, right = (r - 1) % p, (r + 1) % p
    item, bounds, base = lay.acc.itemsize, chunks(lay.acc.size, p), STEP0 + p
    ops: list[WriteOp | SendOp] = []

    def expect(s: int) -> None:
        if s < p - 1:
            ra, rb = bounds[(r - s - 1) % p]
            c.expect(left, base + s, ra * item, (rb - ra) * item)

    expect(0)
    for s in range(p - 1):
        sa, sb = bounds[(r - s) % p]
        ra, rb = bounds[(r - s - 1) % p]
        expect(s + 1)
        ops.append(c.send_block(right, base + s, sa * item, (sb - sa) * item, from_recv=True))
        c.recv_block(left, base + s, ra * item, (rb - ra) * item)
    c.finish(ops)


def allreduce(c: Call) -> None:
    lay = c.reduction
    if lay.send is not lay.recv:
        c.copy_own_block(0, 0, lay.recv.nbytes)
    if c.size == 1 or lay.acc.size == 0:
        return
    reduce_scatter(c, lay.acc, lay.recv, lay.tmp, lay.scratch)
    allgather_chunks(c)


def reduce_scatter_block(c: Call) -> None:
    """MPI_Reduce_scatter_block: block r of the reduction of every rank's send buffer lands
    at rank r. Scratch holds two send-sized halves: the accumulator and the landing area."""
    lay = c.reduction
    n = lay.tmp.size // 2
    acc, land = lay.tmp[:n], lay.tmp[n:]
    acc[:] = lay.send_view
    if c.size > 1 and n:
        scratch = lay.scratch
        half = n * acc.itemsize
        acc_buf = Buffer(scratch.owner, scratch.address, half, scratch.itemsize, scratch.dtype, True)
        land_buf = Buffer(scratch.owner, scratch.address + half, half, scratch.itemsize,
                          scratch.dtype, True)
        reduce_scatter(c, acc, acc_buf, land, land_buf)
    a, b = chunks(n, c.size)[c.rank]
    lay.acc[:] = acc[a:b]

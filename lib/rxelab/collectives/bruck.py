"""Bruck's algorithms: ceil(log2 p) steps, each one message out and one in, whatever p - the
small-message algorithms at scale, where p - 1 messages per rank cost more than the bytes.

All-to-all (Bruck et al. 1997, as MPI libraries run it): the blocks are rotated so that
position i holds the block for rank r + i; in step k every block whose position has bit k set
travels 2^k ranks on, packed into one message to rank r + 2^k, and what comes from rank
r - 2^k lands at the same positions. After the last step position i holds the block rank
r - i sent to r. Each block travels as many times as its position has bits set: about
(p/2) log2 p blocks per rank instead of p - 1, in log2 p messages instead of p - 1.

Allgather (the concatenation): step k sends the first min(2^k, p - 2^k) gathered blocks to
rank r - 2^k and receives as many from rank r + 2^k behind them; position i ends with rank
r + i's block, and a rotation puts every block in its place.

Blocks pass through the plan's workspace (rotated blocks, one packed message each way), so
the caller's buffers are read once and written once.
"""

from __future__ import annotations

from functools import lru_cache, partial

import numpy as np

from rxelab.buffers import Buffer, byte_view
from rxelab.collectives.common import RECEIVING, SENDING, STEP0, Call


def steps(p: int) -> int:
    return (p - 1).bit_length()


def alltoall(c: Call) -> None:
    lay = c.blocks
    p, r, m = c.size, c.rank, lay.send_len[0]
    if p == 1 or m == 0:
        c.copy_own_block(lay.send_off[r], lay.recv_off[r], lay.send_len[r])
        return
    send = _blocks(lay.send, p, m)
    recv = _blocks(lay.recv, p, m)
    _, rot_arr = c.workspace(SENDING, p * m)
    rotated = rot_arr[:p * m].reshape(p, m)
    movings = _movings(p)
    most = max(count for _, count in movings)
    out_buf, out_arr = c.workspace(SENDING, most * m)
    in_buf, in_arr = c.workspace(RECEIVING, most * m)
    c.local(p * m, partial(_rotate, rotated, send, r))  # position i: the block for r + i
    for k, (moving, count) in enumerate(movings):
        n = count * m
        right, left = (r + (1 << k)) % p, (r - (1 << k)) % p
        c.expect(left, STEP0 + k, 0, n, into=in_buf)
        c.local(n, partial(_gather, out_arr[:n].reshape(count, m), rotated, moving))
        op = c.send_block(right, STEP0 + k, 0, n, source=out_buf)
        c.recv_block(left, STEP0 + k, 0, n, into=in_buf)
        c.local(n, partial(rotated.__setitem__, moving, in_arr[:n].reshape(count, m)))
        c.finish([op])  # the packed area is written again next step
    # position i holds what rank r - i sent to r
    c.local(p * m, partial(_unrotate, recv, rotated, r))


def allgather(c: Call) -> None:
    lay = c.blocks
    p, r, m = c.size, c.rank, lay.send.nbytes
    if p == 1 or m == 0:
        c.copy_own_block(0, r * m, m)
        return
    recv = _blocks(lay.recv, p, m)
    gathered_buf, gathered_arr = c.workspace(RECEIVING, p * m)
    gathered = gathered_arr[:p * m].reshape(p, m)
    c.local(m, lambda: gathered.__setitem__(0, byte_view(lay.send)))
    ops = []
    for k in range(steps(p)):
        have, n = 1 << k, min(1 << k, p - (1 << k))
        to, frm = (r - have) % p, (r + have) % p
        c.expect(frm, STEP0 + k, have * m, n * m, into=gathered_buf)
        ops.append(c.send_block(to, STEP0 + k, 0, n * m, source=gathered_buf))
        c.recv_block(frm, STEP0 + k, have * m, n * m, into=gathered_buf)
    # position i holds rank r + i's block; earlier steps' sends read positions never
    # written again, so they are only waited for at the end
    c.finish(ops)
    c.local(p * m, lambda: _rotate(recv, gathered, -r))


@lru_cache(maxsize=64)
def _movings(p: int) -> tuple[tuple[slice | np.ndarray, int], ...]:
    """Each step's positions (1..p-1) whose bit k is set, and how many: a slice where they
    are one run (every step of p <= 3, the last of any p), else an index array. Worked out
    once per p: numpy's small calls cost tens of microseconds each on an emulated CPU, which
    a per-call schedule paid in every step of a small-message call (2026-11-28: a 1 KiB
    all-to-all of 3 ranks 1.8x pairwise's, with as many messages)."""
    out = []
    positions = np.arange(1, p)
    for k in range(steps(p)):
        moving = positions[(positions >> k) & 1 == 1]
        if moving[-1] - moving[0] + 1 == moving.size:
            out.append((slice(int(moving[0]), int(moving[-1]) + 1), int(moving.size)))
        else:
            moving.flags.writeable = False
            out.append((moving, int(moving.size)))
    return tuple(out)


def _gather(out: np.ndarray, rotated: np.ndarray, moving: slice | np.ndarray) -> None:
    if isinstance(moving, slice):
        out[:] = rotated[moving]
    else:
        np.take(rotated, moving, 0, out)


def _unrotate(dst: np.ndarray, src: np.ndarray, r: int) -> None:
    """dst[j] = src[(r - j) mod p], in two reversed slices."""
    p = src.shape[0]
    dst[:r + 1] = src[r::-1]
    if r + 1 < p:
        dst[r + 1:] = src[p - 1:r:-1]


def _rotate(dst: np.ndarray, src: np.ndarray, r: int) -> None:
    """dst[i] = src[(i + r) mod p], in two slices."""
    p = src.shape[0]
    r %= p
    dst[:p - r] = src[r:]
    dst[p - r:] = src[:r]


def _blocks(buf: Buffer, p: int, m: int) -> np.ndarray:
    return byte_view(buf)[:p * m].reshape(p, m)

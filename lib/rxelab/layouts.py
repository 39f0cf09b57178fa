"""Where each rank's data lies in a collective call's buffers, checked before anything is posted:
one pure function per kind of collective (blocks per peer, a reduction, a rooted broadcast;
RootedBlocks for a rooted collective of blocks)
that takes the caller's objects and returns the call's Layout or raises a ConfigError naming
what is wrong. Collective descriptions (rxelab.ops) name their builder; the algorithms read
the layout.

Pure Python and numpy: no RDMA here.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rxelab.buffers import MIN_AREA, Buffer, as_buffer, check_pair, split_even
from rxelab.errors import ConfigError


@dataclass
class Layout:
    """Every call has a send and a receive buffer (the same one for in-place calls)."""

    send: Buffer
    recv: Buffer
    vector = False  # (not a field) block sizes chosen per pair by the caller: may disagree

    def held_arrays(self) -> tuple[Any, ...]:
        """numpy views of the caller's buffers the layout keeps (they refer to them too)."""
        return ()

    def scratch_buffers(self) -> tuple[Buffer, ...]:
        return ()

    def moves(self, p: int, algorithm: str) -> tuple[int, int]:
        """At most how many blocks, of how many bytes in all, a call sends (and as many it
        receives): what coded blocks may need in staging (rxelab.codecs.staging_bound). A
        broadcast's rank receives the buffer once and sends it once (coded once for all)."""
        return 1, self.recv.nbytes

    def workspace(self, p: int, algorithm: str) -> int:
        """Bytes of workspace an algorithm keeps in the plan's areas beside the buffers (Bruck
        rotates all blocks through one, and packs what each step sends into others): counted
        against pin_limit before anything is posted."""
        if algorithm != "bruck":
            return 0
        # three areas (rotated blocks, one packed message each way), each pinned in whole
        # pages and possibly twice (with and without remote access)
        return 2 * (2 * self.recv.nbytes + 3 * (MIN_AREA + 2 * mmap.PAGESIZE))


@dataclass
class Blocks(Layout):
    """A block per peer: byte offsets and lengths in the send and receive buffers."""

    send_off: list[int]
    send_len: list[int]
    recv_off: list[int]
    recv_len: list[int]
    window: int = 1  # sequential: pairs active at once

    def moves(self, p: int, algorithm: str) -> tuple[int, int]:
        """A block per peer either way, or the whole receive buffer once (a star's root
        sends it, coded once, and the others receive it); Bruck's all-to-all sends a block
        once per bit set in its rotated position, in ceil(log2 p) messages."""
        if algorithm == "bruck":
            m = max(self.send_len, default=0)
            return (p - 1).bit_length(), m * sum(bin(i).count("1") for i in range(1, p))
        per_peer = sum(max(s, r) for s, r in zip(self.send_len, self.recv_len, strict=True))
        return p + 1, per_peer + self.recv.nbytes


@dataclass
class RootedBlocks(Blocks):
    """Blocks of a rooted collective (gather, scatter): a block per peer, at the root only
    (the others' blocks are to or from the root, the rest empty)."""

    root: int = 0


@dataclass
class Reduction(Layout):
    """An element-wise reduction: the ufunc, typed views, and where peers' parts land."""

    reduce: Any
    acc: Any  # the receive buffer as numpy elements
    scratch: Buffer  # where peers' contributions land before they are reduced
    tmp: Any  # scratch as numpy elements
    send_view: Any = None  # reduce_scatter: the send buffer as numpy elements

    def held_arrays(self) -> tuple[Any, ...]:
        return (self.acc, self.send_view)

    def moves(self, p: int, algorithm: str) -> tuple[int, int]:
        """Recursive doubling: the vector once per round (and the fold and unfold); the
        rings: 2(p-1) chunks, the vector twice (reduce-scatter: its send buffer's once)."""
        n = max(self.send.nbytes, self.recv.nbytes)
        if algorithm == "recursive-doubling":
            rounds = p.bit_length() + 1
            return rounds, rounds * n
        return 2 * p, 2 * n

    def scratch_buffers(self) -> tuple[Buffer, ...]:
        return (self.scratch,)


@dataclass
class Rooted(Layout):
    """One buffer, sent from the root and received everywhere else, in place."""

    root: int = 0


Builder = Callable[..., Layout]  # (send, recv, size, rank, **arguments) -> Layout

REDUCTIONS: dict[str, Any] = {"sum": np.add, "prod": np.multiply, "min": np.minimum,
                              "max": np.maximum}


def _pair(sendbuf: Any, recvbuf: Any) -> tuple[Buffer, Buffer]:
    return as_buffer(sendbuf, "send buffer"), as_buffer(recvbuf, "receive buffer", writable=True)


def personalized(sendbuf: Any, recvbuf: Any, p: int, rank: int, window: int = 1) -> Blocks:
    """alltoall: block j of the send buffer goes to rank j, block i of the receive buffer
    comes from rank i; equal blocks of whole elements."""
    send, recv = _pair(sendbuf, recvbuf)
    check_pair(send, recv, send.nbytes, send.nbytes)
    m = split_even(send.nbytes, p, send.itemsize, "send buffer")
    offs, lens = [i * m for i in range(p)], [m] * p
    return Blocks(send, recv, offs, lens, offs, lens, window=window)


def gathered(sendbuf: Any, recvbuf: Any, p: int, rank: int, window: int = 1) -> Blocks:
    """allgather: every rank's send buffer lands at block `rank` of every receive buffer."""
    send, recv = _pair(sendbuf, recvbuf)
    check_pair(send, recv, send.nbytes, send.nbytes * p)
    m = send.nbytes
    return Blocks(send, recv, [0] * p, [m] * p, [i * m for i in range(p)], [m] * p, window=window)


def varying(sendbuf: Any, recvbuf: Any, p: int, rank: int, send_counts: list[int],
            recv_counts: list[int], window: int = 1) -> Blocks:
    """alltoallv with contiguous blocks: counts in elements of the buffers, per peer."""
    send, recv = _pair(sendbuf, recvbuf)
    item = send.itemsize
    check_pair(send, recv, sum(send_counts) * item, sum(recv_counts) * item)
    if send_counts[rank] != recv_counts[rank]:
        raise ConfigError("send_counts and recv_counts disagree on this rank's own block")

    def place(counts: list[int]) -> tuple[list[int], list[int]]:
        offs, pos = [], 0
        for c in counts:
            offs.append(pos)
            pos += c * item
        return offs, [c * item for c in counts]

    so, sl = place(send_counts)
    ro, rl = place(recv_counts)
    layout = Blocks(send, recv, so, sl, ro, rl, window=window)
    layout.vector = True
    return layout


def _reduction_buffers(sendbuf: Any, recvbuf: Any, op: str, in_place: bool) -> tuple[Buffer, Buffer]:
    if op not in REDUCTIONS:
        raise ConfigError(f"unknown reduction {op!r}", hint=f"use one of {', '.join(REDUCTIONS)}")
    for name, arr in (("send buffer", sendbuf), ("receive buffer", recvbuf)):
        if not isinstance(arr, np.ndarray):
            raise ConfigError(f"{name} of a reduction must be a numpy array, not {type(arr).__name__}")
    kind = recvbuf.dtype.kind
    if kind not in "iufc" or (kind == "c" and op in ("min", "max")):
        raise ConfigError(f"{op} is not defined on {recvbuf.dtype}",
                          hint="use integer or float arrays (complex: sum and prod only)")
    recv = as_buffer(recvbuf, "receive buffer", writable=True)
    send = recv if (in_place and sendbuf is recvbuf) else as_buffer(sendbuf, "send buffer")
    return send, recv


def reduced(sendbuf: Any, recvbuf: Any, p: int, rank: int, op: str) -> Reduction:
    """allreduce: recvbuf = op over every rank's sendbuf; allreduce(x, x) works in place."""
    send, recv = _reduction_buffers(sendbuf, recvbuf, op, in_place=True)
    check_pair(send, recv, recv.nbytes, recv.nbytes, in_place=send is recv)
    tmp = np.empty_like(recvbuf)
    return Reduction(send, recv, REDUCTIONS[op], recvbuf.reshape(-1),
                     as_buffer(tmp, "scratch", writable=True), tmp.reshape(-1))


def scattered(sendbuf: Any, recvbuf: Any, p: int, rank: int, op: str) -> Reduction:
    """reduce_scatter (MPI_Reduce_scatter_block): block r of op over every rank's sendbuf
    (p * len(recvbuf) elements) lands at rank r."""
    send, recv = _reduction_buffers(sendbuf, recvbuf, op, in_place=False)
    check_pair(send, recv, recv.nbytes * p, recv.nbytes)
    tmp = np.empty(2 * sendbuf.size, sendbuf.dtype)
    return Reduction(send, recv, REDUCTIONS[op], recvbuf.reshape(-1),
                     as_buffer(tmp, "scratch", writable=True), tmp, send_view=sendbuf.reshape(-1))


def broadcast(buf: Any, unused: Any, p: int, rank: int, root: int = 0) -> Rooted:
    """bcast: the root's buffer lands in every rank's buffer (the same size everywhere)."""
    b = as_buffer(buf, "buffer", writable=True)
    return Rooted(b, b, root=root)

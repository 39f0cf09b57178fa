"""The test data every harness moves (the self-test, the benchmark, the apps, the MPI and
Gloo comparisons): what each rank sends each other rank, a reduction's inputs, and the exact
result a rank must end up with, for each kind of collective; and the one count of wrong
elements. Exactly reproducible on every rank, in every pattern a codec is studied on.

Pure Python and numpy. The descriptions (rxelab.ops) name which function is whose.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rxelab.layouts import REDUCTIONS

# What the test data looks like, for the compression study (rxelab.codecs): a short repeated
# pattern (the default), all zeros, sparse (1 in 100 elements set, as a sparse gradient), and
# random (as little as a codec can squeeze). Every kind is exactly reproducible on every rank.
PATTERNS = ("pattern", "zeros", "sparse", "random")
SPARSE_EVERY = 100
FINE = 2.0 ** -20  # random reduction inputs are whole multiples of it below 1: sums stay exact


def _rng(*seed: int) -> np.random.Generator:
    return np.random.default_rng([*seed, 0x5EED])


def _sparse(values: np.ndarray, n: int, rng: np.random.Generator, dtype: Any) -> np.ndarray:
    """About one element in SPARSE_EVERY set, at random places (drawn with repeats: a
    permutation of n, as choice() without them makes, costs seconds under emulation)."""
    x = np.zeros(n, dtype)
    if n:
        where = rng.integers(0, n, max(1, n // SPARSE_EVERY))
        x[where] = values[:where.size]
    return x


def block(src: int, dst: int, n: int, dtype: Any = np.uint8, salt: int = 0,
          pattern: str = "pattern") -> np.ndarray:
    """What rank src sends rank dst: distinct for every (src, dst, index, salt) (but zeros)."""
    if pattern == "zeros":
        return np.zeros(n, dtype)
    if pattern in ("random", "sparse"):
        rng = _rng(src, dst, salt)
        values = rng.integers(1, 256, n if pattern == "random" else max(1, n // SPARSE_EVERY),
                              dtype=np.uint8).astype(dtype, copy=False)
        return values if pattern == "random" else _sparse(values, n, rng, dtype)
    x = (np.arange(n, dtype=np.int64) * 7 + src * 31 + dst * 17 + salt * 13) % 251
    return x.astype(dtype)


def contribution(rank: int, n: int, dtype: np.dtype | str, salt: int = 0,
                 pattern: str = "pattern") -> np.ndarray:
    """A rank's input to a reduction: small whole numbers (1..7), so sums and products of up to
    8 ranks are exact in every float type and wrap the same way in every integer type.
    random (and sparse's values): floats are whole multiples of 2^-20 in (-1, 1) - random
    bits in most of the significand, yet sums of up to 16 ranks stay exact."""
    if pattern == "zeros":
        return np.zeros(n, dtype)
    if pattern in ("random", "sparse"):
        rng = _rng(rank, salt)
        k = n if pattern == "random" else max(1, n // SPARSE_EVERY)
        if np.dtype(dtype).kind in "fc":
            values = rng.integers(-(1 << 20) + 1, 1 << 20, k, dtype=np.int32).astype(dtype)
            values *= FINE
        else:
            values = rng.integers(1, 8, k, dtype=np.int8).astype(dtype)
        return values if pattern == "random" else _sparse(values, n, rng, dtype)
    x = (np.arange(n, dtype=np.int64) * 3 + rank * 5 + salt) % 7 + 1
    return x.astype(dtype)


def reference(op: str, parts: list[np.ndarray]) -> np.ndarray:
    out = parts[0].copy()
    for x in parts[1:]:
        REDUCTIONS[op](out, x, out=out)
    return out


Data = tuple[np.ndarray, np.ndarray]  # (what this rank sends, what it must end up with)


ROOT = 0  # the root of the test data's calls (a rooted collective's)


def vector_inputs(rank: int, p: int, count: int, dtype: str, salt: int = 0,
                   pattern: str = "pattern") -> list[np.ndarray]:
    """Every rank's whole input vector (allreduce: each element's result is over all)."""
    return [contribution(s, count, dtype, salt, pattern) for s in range(p)]


def block_inputs(rank: int, p: int, count: int, dtype: str, salt: int = 0,
                  pattern: str = "pattern") -> list[np.ndarray]:
    """Every rank's input to block `rank` (reduce_scatter's result block there)."""
    return [contribution(s, p * count, dtype, salt, pattern)[rank * count:(rank + 1) * count]
            for s in range(p)]


def alltoall(rank: int, p: int, count: int, dtype: str, salt: int, op: str,
              pattern: str = "pattern") -> Data:
    send = np.concatenate([block(rank, d, count, dtype, salt, pattern) for d in range(p)])
    return send, np.concatenate([block(s, rank, count, dtype, salt, pattern) for s in range(p)])


def allgather(rank: int, p: int, count: int, dtype: str, salt: int, op: str,
               pattern: str = "pattern") -> Data:
    return block(rank, rank, count, dtype, salt, pattern), \
        np.concatenate([block(s, s, count, dtype, salt, pattern) for s in range(p)])


def allreduce(rank: int, p: int, count: int, dtype: str, salt: int, op: str,
               pattern: str = "pattern") -> Data:
    return contribution(rank, count, dtype, salt, pattern), \
        reference(op, [contribution(s, count, dtype, salt, pattern) for s in range(p)])


def reduce_scatter(rank: int, p: int, count: int, dtype: str, salt: int, op: str,
                    pattern: str = "pattern") -> Data:
    total = reference(op, [contribution(s, p * count, dtype, salt, pattern) for s in range(p)])
    return contribution(rank, p * count, dtype, salt, pattern), \
        total[rank * count:(rank + 1) * count]


def bcast(rank: int, p: int, count: int, dtype: str, salt: int, op: str,
           pattern: str = "pattern") -> Data:
    """The root is ROOT here; the buffer is both sent (at the root) and received."""
    want = block(ROOT, ROOT, count, dtype, salt, pattern)
    return (want.copy() if rank == ROOT else np.zeros(count, dtype)), want


def uneven(src: int, dst: int, count: int) -> int:
    """What src sends dst in the per-peer counts' test data: count, plus 0..2 by the pair
    (src sends dst and dst receives from src the same; a rank's own block is count)."""
    return count + (2 * src + dst) % 3


def varying_counts(rank: int, p: int, sent: int) -> tuple[list[int], list[int]]:
    """The test data's send and receive counts of a rank whose send buffer holds `sent`
    elements (its count is found from that: the extras are known)."""
    count = max(0, (sent - sum(uneven(rank, d, 0) for d in range(p))) // max(p, 1))
    return ([uneven(rank, d, count) for d in range(p)],
            [uneven(s, rank, count) for s in range(p)])


def alltoallv(rank: int, p: int, count: int, dtype: str, salt: int, op: str,
               pattern: str = "pattern") -> Data:
    """alltoall's blocks, of uneven sizes (about count per peer, some more)."""
    send = [block(rank, d, uneven(rank, d, count), dtype, salt, pattern) for d in range(p)]
    want = [block(s, rank, uneven(s, rank, count), dtype, salt, pattern) for s in range(p)]
    return np.concatenate(send), np.concatenate(want)


def count_wrong(got: np.ndarray, want: np.ndarray, bound: Any = None) -> int:
    """Elements not as they must be: exactly, or within `bound` (per element: a lossy codec's
    error bound; NaN is never within it)."""
    if bound is None:
        return int(np.count_nonzero(got != want))
    return int(np.count_nonzero(~(np.abs(got.astype(np.float64) - want) <= bound)))

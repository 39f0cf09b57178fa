"""Bruck's schedule, worked out once per p: each step's positions (a slice where they are one
run) and the last rotation (two reversed slices) against the formulas they replace, the
positions whose bit k is set and dst[(r - i) mod p] = src[i], for every p to 40 and rank."""

from __future__ import annotations

import numpy as np
import pytest
from rxelab.collectives import bruck


@pytest.mark.parametrize("p", range(2, 41))
def test_each_steps_positions_are_those_whose_bit_is_set(p):
    positions = np.arange(1, p)
    got = bruck._movings(p)
    assert len(got) == bruck.steps(p)
    for k, (moving, count) in enumerate(got):
        expected = positions[(positions >> k) & 1 == 1]
        assert count == expected.size
        assert np.array_equal(np.arange(p)[moving], expected)
        if not isinstance(moving, slice):
            assert not moving.flags.writeable  # shared by every call of this p
    assert all(isinstance(moving, slice) for moving, _ in bruck._movings(3))
    assert bruck._movings(p) is got  # once per p


@pytest.mark.parametrize("p", range(2, 41))
def test_the_last_rotation_puts_each_block_where_rank_r_minus_i_sent_it(p):
    src = np.arange(p * 3).reshape(p, 3)
    for r in range(p):
        expected = np.zeros_like(src)
        expected[(r - np.arange(p)) % p] = src
        got = np.zeros_like(src)
        bruck._unrotate(got, src, r)
        assert np.array_equal(got, expected), r


def test_gather_takes_a_slice_or_an_index_array_alike():
    rotated = np.arange(7 * 2).reshape(7, 2)
    for moving in (slice(2, 4), np.array([1, 3, 5])):
        out = np.zeros((len(np.arange(7)[moving]), 2), rotated.dtype)
        bruck._gather(out, rotated, moving)
        assert np.array_equal(out, rotated[moving])

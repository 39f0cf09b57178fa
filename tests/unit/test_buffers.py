"""Argument checks on caller buffers happen on any host, before anything is posted."""

import numpy as np
import pytest
from rxelab.buffers import as_buffer, check_pair, split_even
from rxelab.errors import ConfigError


@pytest.mark.parametrize(
    "obj, nbytes, itemsize, writable",
    [
        (bytearray(8), 8, 1, True),
        (bytes(8), 8, 1, False),
        (memoryview(bytearray(6)), 6, 1, True),
        (np.zeros(4, np.int32), 16, 4, True),
        (np.zeros((3, 4), np.float64), 96, 8, True),
    ],
)
def test_buffers_are_taken_in_place(obj, nbytes, itemsize, writable):
    b = as_buffer(obj, "x")
    assert (b.nbytes, b.itemsize, b.writable) == (nbytes, itemsize, writable)
    assert b.owner is obj, "the caller's object is kept alive, never copied"
    if isinstance(obj, np.ndarray):
        assert b.address == obj.ctypes.data


def test_zero_length_buffers_are_fine():
    assert as_buffer(bytearray(), "x").nbytes == 0
    assert as_buffer(np.zeros(0, np.uint8), "x").nbytes == 0


@pytest.mark.parametrize(
    "obj, writable, problem",
    [
        ([1, 2, 3], False, "must be a numpy array, torch tensor, bytearray or memoryview, not list"),
        ("text", False, "not str"),
        (np.zeros((4, 4))[:, 1], False, "not contiguous"),
        (memoryview(bytearray(8))[::2], False, "not contiguous"),
        (bytes(4), True, "read-only"),
    ],
)
def test_unusable_buffers_are_refused(obj, writable, problem):
    with pytest.raises(ConfigError, match=problem):
        as_buffer(obj, "buffer", writable=writable)


def test_pair_checks_dtype_and_sizes():
    a, b = as_buffer(np.zeros(4, np.int32), "s"), as_buffer(np.zeros(4, np.float32), "r")
    with pytest.raises(ConfigError, match="int32 but receive buffer is float32"):
        check_pair(a, b, 16, 16)
    c = as_buffer(np.zeros(8, np.int32), "r")
    with pytest.raises(ConfigError, match="receive buffer has 32 bytes, the call needs 16"):
        check_pair(a, c, 16, 16)


def test_even_split_in_whole_elements():
    assert split_even(24, 3, 4, "send buffer") == 8
    with pytest.raises(ConfigError, match="do not split into 3"):
        split_even(25, 3, 1, "send buffer")
    with pytest.raises(ConfigError, match="whole elements"):
        split_even(24, 4, 4, "send buffer")  # 6 bytes per rank is 1.5 int32

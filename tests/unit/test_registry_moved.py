"""A registration is reused only while the memory it was made for is where, and as long as,
it was. The registry's export keeps a bytearray from being resized, but not a numpy array:
`a.resize(n, refcheck=False)` frees a's memory under its registration, and a new array may
take the same address and length - before, it was handed the old registration (pages of freed
memory, or of a length that is no longer the array's). Now such an entry is stale: closed, and
made anew for what is there now (as a tensor's, tests/unit/test_tensors_fake.py)."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import numpy as np
import pytest
from rxelab.buffers import Buffer, Placement, as_buffer
from rxelab.registry import Registry, pinned_size

N = 1 << 18  # float32s: 1 MiB, memory of its own (mmap), returned at once when freed


class MR:
    def __init__(self, made: list[MR], address: int, nbytes: int) -> None:
        self.address, self.nbytes, self.closed = address, nbytes, False
        made.append(self)

    def close(self) -> None:
        self.closed = True


def _registry() -> tuple[Registry, list[MR]]:
    made: list[MR] = []
    return Registry(lambda addr, n, access: MR(made, addr, n), limit=1 << 30), made


def _at(address: int, shape: int, pad: int = 0) -> tuple[Buffer, list[np.ndarray]]:
    """A new array at `address` (what malloc hands out after a free, tried a few times; past
    `pad` elements of its own, as a view), or, if malloc will not, a buffer that says it is
    there (the registry looks at no more)."""
    tries: list[np.ndarray] = []
    for _ in range(8):
        b = np.zeros(shape + pad, np.float32)[pad:]
        if b.ctypes.data == address:
            return as_buffer(b, "x"), tries
        tries.append(b)
    return dataclasses.replace(as_buffer(tries[0], "x"), address=address), tries


def _moved_away(a: np.ndarray) -> None:
    before = a.ctypes.data
    for out in (1 << 20, 1 << 22, 1 << 24):
        a.resize(out, refcheck=False)  # the registry's export does not stop numpy
        if a.ctypes.data != before:
            return
    raise AssertionError("the allocator kept a where it was")


def test_an_unchanged_array_keeps_its_registration():
    reg, made = _registry()
    a = np.zeros(N, np.float32)
    for _ in range(3):
        reg.register(as_buffer(a, "x"), 0)
        reg.end_call()
    assert len(made) == 1 and not made[0].closed


@pytest.mark.parametrize("view", ["array", "view of it", "memoryview of it"])
def test_a_new_array_where_a_moved_array_was_gets_a_registration_of_its_own(view):
    reg, made = _registry()
    base = np.zeros(N + 16 if view == "view of it" else N, np.float32)
    a = base[16:] if view == "view of it" else base  # N float32s either way
    address = a.ctypes.data
    reg.register(as_buffer(memoryview(a) if view == "memoryview of it" else a, "x"), 0)
    reg.end_call()
    _moved_away(base)  # a view's memory is its base's: it went too
    buf, _kept = _at(address, N, 16 if view == "view of it" else 0)
    mr = reg.register(buf, 0)
    assert len(made) == 2, "the stale registration is not reused"
    assert made[0].closed and mr is made[1] and (mr.address, mr.nbytes) == (address, 4 * N)
    assert reg.pinned == pinned_size(address, 4 * N), "the stale one's pages are not counted"


def test_an_entry_whose_array_is_no_longer_as_long_is_stale():
    reg, made = _registry()
    a = np.zeros(N, np.float32)
    whole = as_buffer(a, "x")
    reg.register(whole, 0)
    reg.end_call()
    a.resize(N // 2, refcheck=False)  # shrunk where it is: its tail is freed
    assert a.ctypes.data == whole.address, "realloc kept a where it was"
    reg.register(whole, 0)  # anything that says it is the whole of a's old memory
    assert len(made) == 2 and made[0].closed


def test_a_placement_holds_nothing_and_follows_the_memory():
    import sys

    a = np.zeros(8, np.float32)
    refs = sys.getrefcount(a)
    placed: Any = Placement(a)
    assert sys.getrefcount(a) == refs, "registrations the application dropped are let go"
    assert not placed.moved(a)
    a.resize(1 << 22, refcheck=False)
    assert placed.moved(a)
    assert not Placement(bytearray(8)).moved(bytearray(8)), "no array: its export holds it"


def test_a_view_whose_base_was_cleared_leaves_its_placement_reading_the_array_it_held():
    """The pointer reads the base array's own field: the placement holds that array, so a
    view's base cleared (`__setstate__`) frees nothing it reads."""
    base = np.zeros(N + 16, np.float32)
    v = base[16:]
    placed = Placement(v)
    at, alive = base.ctypes.data, weakref.ref(base)
    del base
    v.__setstate__((1, (4,), np.dtype(np.float32), False, b"\0" * 16))  # v's base is gone
    assert alive() is not None, "the array whose field the pointer reads is held"
    assert placed.pointer.value == at and placed.moved(v), "v's memory is elsewhere now"

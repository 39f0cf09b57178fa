"""A kept plan never outlives what its buffers mean (issue 56, items 9 and 10): the same
numpy array given another dtype, shape or strides in place, or the same tensor made to need a
gradient, is planned and checked again, as a fresh one would be - never run by the plan (and
the typed views) made for what it was."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from rxelab.errors import ConfigError

from tests.unit.fakejob import run_ranks
from tests.unit.test_tensors_fake import Export, FakeTensor


def test_an_array_given_another_dtype_in_place_is_reduced_as_its_new_dtype():
    def job(comm):
        a = np.ones(8, np.float32)
        comm.allreduce(a, a)
        a.dtype = np.int32  # the same object and memory, now int32
        a[:] = 10**9
        comm.allreduce(a, a)
        fresh = np.full(8, 10**9, np.int32)
        comm.allreduce(fresh, fresh)
        return a.copy(), fresh

    for changed, fresh in run_ranks(2, job):
        assert fresh.dtype == np.int32 and (fresh == 2 * 10**9).all()
        assert changed.dtype == np.int32 and (changed == 2 * 10**9).all(), \
            f"summed as int32, as a fresh array is, not as float32 bits: {changed}"


def test_an_array_given_another_shape_in_place_is_planned_for_it():
    def job(comm):
        a = np.arange(8, dtype=np.float64) + comm.rank
        comm.allreduce(a, a)
        a.shape = (2, 4)  # the same memory, another shape: sums the same
        a[:] = comm.rank + 1
        comm.allreduce(a, a)
        return a.copy()

    for got in run_ranks(2, job):
        assert got.shape == (2, 4) and (got == 3).all()


@pytest.mark.parametrize("algorithm", ["pairwise", "parallel"])
def test_an_array_given_strides_in_place_is_refused_as_a_fresh_one_is(algorithm):
    def job(comm):
        a = np.arange(16, dtype=np.int64).reshape(4, 4)
        b = np.zeros_like(a)
        comm.alltoall(a, b, algorithm=algorithm)
        with pytest.raises(ConfigError, match="^send buffer is not contiguous") as fresh:
            comm.alltoall(np.lib.stride_tricks.as_strided(a.copy(), strides=(8, 32)), b,
                          algorithm=algorithm)
        with warnings.catch_warnings():  # numpy 2.4 deprecates it; programs still do it
            warnings.simplefilter("ignore", DeprecationWarning)
            a.strides = (8, 32)  # the same object and memory, now in Fortran order
        with pytest.raises(ConfigError) as changed:
            comm.alltoall(a, b, algorithm=algorithm)
        return str(fresh.value), str(changed.value)

    for fresh, changed in run_ranks(2, job):
        assert changed == fresh, "refused as the fresh array with those strides is"


def test_a_tensor_made_to_need_a_gradient_is_refused_as_a_fresh_one_is():
    """The layout cache and the plan both know the tensor as it is now: one that needs a
    gradient is refused by name after the library has seen it without (torch's own check runs
    in tests/torch/test_torch_plan_keys.py)."""
    def job(comm):
        t = FakeTensor(np.ones(8, np.float32))
        comm.allreduce(t, t)
        with pytest.raises(ConfigError) as fresh:
            comm.allreduce(*[FakeTensor(np.ones(8, np.float32), requires_grad=True)] * 2)
        t.requires_grad = True
        with pytest.raises(ConfigError) as changed:
            comm.allreduce(t, t)
        t.requires_grad = False  # and usable again once it needs none
        comm.allreduce(t, t)
        return str(fresh.value), str(changed.value), t.data.copy()

    for fresh, changed, summed in run_ranks(2, job):
        assert "Can't export tensors that require gradient" in fresh
        assert changed == fresh
        assert (summed == 4).all()


def move_in_place(a: np.ndarray) -> list[np.ndarray]:
    """a's memory reallocated under the same object, dtype, shape and strides (numpy's
    resize without its reference check, out and back: far enough out, malloc maps it on its
    own); what took its old memory (the returned arrays, to keep) must not be written by a
    call on a."""
    shape, before, holders = a.shape, a.ctypes.data, []
    for out in (1 << 16, 1 << 20, (33 << 20) // a.itemsize):
        a.resize(out, refcheck=False)  # a plan refers to a: numpy's check would refuse
        holders.append(np.empty(shape, a.dtype))  # malloc may hand it a's old block
        holders[-1][...] = 0
        a.resize(shape, refcheck=False)
        if a.ctypes.data != before:
            return holders
    raise AssertionError("the allocator kept a where it was")


@pytest.mark.parametrize("in_place", [True, False])
def test_an_array_given_other_memory_in_place_is_planned_for_it(in_place):
    def job(comm):
        a = np.ones(8, np.float32)
        b = a if in_place else np.zeros_like(a)
        comm.allreduce(a, b)
        holders = move_in_place(b)
        if not in_place:
            holders += move_in_place(a)
        a[:] = comm.rank + 1
        comm.allreduce(a, b)
        return b.copy(), [h.copy() for h in holders]

    for got, holders in run_ranks(2, job):
        assert (got == 3).all(), f"the sum lands in the array's new memory: {got}"
        assert all((h == 0).all() for h in holders), "nothing lands in its old memory"


def test_a_view_and_its_base_have_plans_of_their_own():
    def job(comm):
        a = np.zeros(8, np.float32)
        whole, half = a[:], a[:4]  # the same memory as a, other objects
        for buf, value in [(a, 1), (whole, 2), (half, 3), (a, 4), (half, 5)]:
            buf[:] = value * (comm.rank + 1)
            comm.allreduce(buf, buf)
            assert (buf == 3 * value).all() and buf.shape == (4 if buf is half else 8,)
        return len(comm.plans)

    assert run_ranks(2, job) == [3, 3]


def test_an_export_made_anew_each_call_keeps_its_plan_and_follows_its_memory():
    """Not a tensor (no torch accessors, tests/unit/test_tensors_fake.py's Export): host_array
    converts it every call, so its key is what the fresh array is, not its identity."""
    def job(comm):
        e, out = Export(np.ones(8, np.float32)), np.zeros(8, np.float32)
        for _ in range(3):
            comm.allreduce(e, out)
        kept = len(comm.plans)
        e.arr = np.full(8, 5, np.float32)  # other memory, the same object
        comm.allreduce(e, out)
        moved = out.copy()
        e.arr = e.arr.view(np.int32)  # the same memory as another dtype: checked again
        with pytest.raises(ConfigError, match="^send buffer is int32 but receive buffer is "
                                              "float32$"):
            comm.allreduce(e, out)
        return kept, moved

    for kept, moved in run_ranks(2, job):
        assert kept == 1, "one plan for the same export, called again"
        assert (moved == 10).all(), "read from its new memory"


@pytest.mark.parametrize("field_found", [True, False])
def test_an_arrays_data_is_read_where_it_is_now(monkeypatch, field_found):
    from rxelab import buffers

    if not field_found:  # not CPython, or numpy's array object laid out otherwise
        monkeypatch.setattr(buffers, "_POINTER_AT", None)
    a, b = np.zeros(8, np.float32), np.arange(8, dtype=np.int16)[2:]
    readers = [buffers.data_pointer(x) for x in (a, b)]
    assert [r.value for r in readers] == [a.ctypes.data, b.ctypes.data]
    if field_found:
        assert move_in_place(a) and readers[0].value == a.ctypes.data
    else:  # ctypes.data through a weak reference: numpy resizes no array referred so
        with pytest.raises(ValueError, match="cannot resize"):
            a.resize(1 << 16, refcheck=False)

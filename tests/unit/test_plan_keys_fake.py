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
from tests.unit.test_tensors_fake import FakeTensor


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

"""A torch tensor the library has seen is refused once it needs a gradient, as a fresh one is
(issue 56, item 10): torch's own tensors, its own requires_grad_() and DLPack export, on the
in-memory fabric (tests/unit/test_plan_keys_fake.py holds the same with a stand-in tensor)."""

from __future__ import annotations

import pytest
from rxelab.errors import ConfigError

from tests.unit.fakejob import run_ranks

torch = pytest.importorskip("torch", reason="torch's own tensors: run under .venv-torch")


def test_a_tensor_made_to_need_a_gradient_after_a_call_is_refused_as_a_fresh_one_is():
    def job(comm):
        t = torch.ones(8)
        comm.allreduce(t, t)
        with pytest.raises(ConfigError) as fresh:
            comm.allreduce(*[torch.ones(8, requires_grad=True)] * 2)
        t.requires_grad_(True)
        with pytest.raises(ConfigError) as changed:
            comm.allreduce(t, t)
        version = t._version
        t.requires_grad_(False)
        comm.allreduce(t, t)  # usable again once it needs none
        return str(fresh.value), str(changed.value), version, t.clone()

    for fresh, changed, version, summed in run_ranks(2, job):
        assert "cannot be used in place" in fresh and "gradient" in fresh, fresh
        assert changed == fresh
        assert version == 0, "nothing was written behind autograd's version counter"
        assert torch.equal(summed, torch.full((8,), 4.0))


def _resized_out_and_back(t):
    t.resize_(1 << 16)
    t.resize_(8)  # the same shape, its memory reallocated


def _set_to_other_memory(t):
    t.set_(torch.zeros(8))


def _storage_freed_and_made_again(t):  # FSDP's way of freeing a parameter's memory
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    size = storage.nbytes() if hasattr(t, "untyped_storage") else storage.size()
    storage.resize_(0)
    storage.resize_(size)


@pytest.mark.parametrize("move", [_resized_out_and_back, _set_to_other_memory,
                                  _storage_freed_and_made_again])
@pytest.mark.parametrize("in_place", [True, False])
def test_a_tensor_given_other_memory_in_place_is_planned_for_it(move, in_place):
    """The same tensor object, shape, strides and dtype, its memory elsewhere: the call lands
    there, never in the memory its plan was made for (the plan keeps that alive, as a
    registration would)."""
    def job(comm):
        t = torch.ones(8)
        out = t if in_place else torch.zeros(8)
        comm.allreduce(t, out)
        before = out.data_ptr()
        move(out)
        moved = out.data_ptr() != before
        t.fill_(comm.rank + 1)
        if not in_place:
            out.zero_()
        comm.allreduce(t, out)
        return moved, out.clone()

    for moved, got in run_ranks(2, job):
        assert moved, "the tensor's memory moved"
        assert torch.equal(got, torch.full((8,), 3.0)), got


def test_a_tensor_given_another_dtype_or_shape_in_place_is_planned_for_it():
    def job(comm):
        t = torch.ones(8)
        comm.allreduce(t, t)
        t.data = t.data.view(torch.int32)  # the same memory as int32
        t.fill_(10**9)
        comm.allreduce(t, t)
        as_int = t.clone()
        t.resize_(4)  # fewer elements, the same memory
        t.fill_(comm.rank + 1)
        comm.allreduce(t, t)
        return as_int, t.clone()

    for as_int, shrunk in run_ranks(2, job):
        assert as_int.dtype == torch.int32 and torch.equal(as_int, torch.full((8,), 2 * 10**9,
                                                                              dtype=torch.int32))
        assert torch.equal(shrunk, torch.full((4,), 3, dtype=torch.int32))


def test_a_view_and_its_base_have_plans_of_their_own_and_one_each_in_a_loop():
    def job(comm):
        t = torch.zeros(8)
        whole, half = t.view(8), t[:4]  # the same memory as t, other tensors
        for buf, value in [(t, 1), (whole, 2), (half, 3), (t, 4), (half, 5)] * 2:
            buf.fill_(value * (comm.rank + 1))
            comm.allreduce(buf, buf)
            assert torch.equal(buf, torch.full(buf.shape, 3.0 * value))
        return len(comm.plans), t.shape, half.shape

    assert run_ranks(2, job) == [(3, (8,), (4,))] * 2

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

"""What a user of torch 2.x reaches for, on the rxelab backend (issue 54): functional
collectives and named groups, DDP communication hooks whose callbacks start further calls
(PowerSGD), torch.compile(DDP(model)), and in a job of its own (a process, one rank: the
in-memory fabric lives in one process) init_device_mesh, DTensor, a subgroup destroyed, FSDP
and FSDP2's fully_shard. Skipped under torch 1.13, which has none of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from apps import sharded
from tests.torch.groups import run_groups

if int(torch.__version__.split(".")[0]) < 2:
    pytest.skip("torch 2's own APIs", allow_module_level=True)

import torch.distributed._functional_collectives as funcol
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

ROOT = Path(__file__).resolve().parents[2]
P = 3


def test_functional_collectives_find_each_group_by_its_name():
    """funcol resolves a group through its name in C++: "ProcessGroup name not set" before."""
    def job(pg):
        name = f"rxelab-funcol-{pg.rank()}"  # one registry for every thread-rank
        pg._set_group_name(name)
        dist.distributed_c10d._register_process_group(name, pg)
        try:
            assert pg.group_name == name
            t = torch.arange(4.0) + pg.rank()
            summed = funcol.wait_tensor(funcol.all_reduce(t, "sum", pg))
            whole = funcol.wait_tensor(funcol.all_gather_tensor(t, 0, pg))
            part = funcol.wait_tensor(funcol.reduce_scatter_tensor(torch.arange(6.0), "sum", 0, pg))
            return pg.rank(), summed, whole, part
        finally:
            dist.distributed_c10d._unregister_process_group(name)
    for r, summed, whole, part in run_groups(P, job):
        assert torch.equal(summed, sum(torch.arange(4.0) + q for q in range(P)))
        assert torch.equal(whole, torch.cat([torch.arange(4.0) + q for q in range(P)]))
        assert torch.equal(part, (torch.arange(6.0) * P)[2 * r:2 * r + 2])


def ddp_steps(pg, hook_state=None, compiled: bool = False, bucket_mb: float | None = 0.002) -> torch.Tensor:
    from torch.nn.parallel import DistributedDataParallel

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    init = torch.Generator().manual_seed(0)  # ranks are threads: torch's global RNG is shared
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=init) * 0.2)
    ddp = DistributedDataParallel(model, process_group=pg, bucket_cap_mb=bucket_mb)
    if hook_state is not None:
        ddp.register_comm_hook(hook_state, powerSGD_hook.powerSGD_hook)
    step = torch.compile(ddp, backend="aot_eager") if compiled else ddp
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1 + pg.rank())
    for _ in range(4):
        opt.zero_grad()
        step(torch.randn(4, 32, generator=data)).square().mean().backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def powersgd(pg):
    return powerSGD_hook.PowerSGDState(process_group=pg, matrix_approximation_rank=1,
                                       start_powerSGD_iter=2, warm_start=False)


def test_powersgd_over_several_buckets_trains_alike_on_every_rank_without_overlap():
    """PowerSGD's callback starts two more all_reduces and waits for them: one completion
    thread used to wait for ever; with overlapping calls they may also start in another
    order on each rank. Options(overlap=False) completes each call before it returns."""
    params = run_groups(P, lambda pg: ddp_steps(pg, powersgd(pg)), overlap=False, deadline=120)
    assert all(torch.equal(p, params[0]) for p in params), "every rank the same"
    assert params[0].numel() == 32 * 32 + 32 + 32 * 8 + 8
    plain = run_groups(P, lambda pg: ddp_steps(pg), deadline=120)
    assert not torch.equal(params[0], plain[0]) and torch.allclose(params[0], plain[0], atol=0.05), \
        "compressed: near the uncompressed training, not bit for bit"


def test_powersgd_with_overlapping_calls_is_refused_naming_what_to_set():
    errors = run_groups(P, lambda pg: ddp_steps(pg, powersgd(pg)), keep_errors=True, deadline=120)
    assert all(isinstance(e, BaseException) for e in errors), errors
    text = " ".join(str(e) for e in errors)
    assert "overlap=False" in text and "RXELAB_TORCH_OVERLAP=0" in text, text


def test_compiled_ddp_runs_without_tracing_into_the_backend():
    """torch.compile(DDP(model)): Dynamo traced DDP's own broadcast into the backend before."""
    from torch.nn.parallel import DistributedDataParallel

    # Dynamo sizes its DDP optimizer by DDP's class-wide "active module", which each forward
    # saves and restores: ranks that are threads interleave those, so an earlier test's DDP
    # (2 KB buckets, under DDP's 1 MB first bucket) could be left there, and Dynamo refused it.
    DistributedDataParallel._active_ddp_module = None
    # DDP's default buckets: Dynamo's DDP optimizer wants the first no larger than the rest
    plain = run_groups(2, lambda pg: ddp_steps(pg, bucket_mb=None), deadline=120)
    compiled = run_groups(2, lambda pg: ddp_steps(pg, compiled=True, bucket_mb=None), deadline=240)
    assert torch.equal(compiled[0], compiled[1])
    assert torch.allclose(compiled[0], plain[0], atol=1e-5), "the same training"


def test_a_call_started_in_a_callback_is_refused_while_calls_overlap():
    def job(pg):
        first = dist.all_reduce(torch.ones(2), group=pg, async_op=True)
        chained = first.get_future().then(lambda f: dist.all_reduce(torch.ones(2), group=pg))
        with pytest.raises(RuntimeError, match="overlap=False"):
            chained.wait()
        return True
    assert run_groups(2, job) == [True, True]


JOB = """
import datetime, os, torch, torch.distributed as dist, rxelab.torch
from torch.distributed.device_mesh import init_device_mesh
store = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=30))
dist.init_process_group("rxelab", store=store, rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
x = distribute_tensor(torch.arange(8.0).view(4, 2), mesh, [Shard(0)])
y = x.redistribute(mesh, [Replicate()])
print("DTENSOR", y.full_tensor().sum().item(), (x @ x.T).full_tensor().trace().item(), flush=True)
import torch.distributed._functional_collectives as funcol
print("FUNCOL", funcol.wait_tensor(funcol.all_reduce(torch.ones(3), "sum", mesh)).tolist())
sub = dist.new_group([0], backend="rxelab")
dist.all_reduce(torch.ones(1), group=sub)
dist.destroy_process_group(sub)
print("SUBGROUP destroyed", flush=True)
from apps import sharded  # the demo's wrapping: FSDP per linear layer, FSDP2 on a mesh of the group
def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
def train(m):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        m(torch.ones(4, 8)).sum().backward()
        opt.step()
plain = model()
train(plain)
want = torch.cat([p.detach().reshape(-1) for p in plain.parameters()])
for wrap in ("fsdp", "fsdp2"):
    if (why := sharded.unsupported(wrap)) is not None:
        print(wrap.upper(), "unsupported:", why, flush=True)
        continue
    m = model()
    wrapped = sharded.shard(m, None, wrap)
    train(wrapped)
    got = sharded.whole_parameters(m, wrapped, wrap)
    print(wrap.upper(), "trained", got.shape == want.shape and torch.allclose(got, want), flush=True)
dist.destroy_process_group()
print("DONE")
"""


def test_a_job_of_one_runs_device_mesh_dtensor_subgroups_and_fsdp(tmp_path):
    env = {"PATH": "/usr/bin:/bin",
           "PYTHONPATH": f"{ROOT / 'tests' / 'fakeverbs'}:{ROOT / 'lib'}:{ROOT}",
           "MASTER_ADDR": "127.0.0.1"}
    r = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, env=env,
                       timeout=300, cwd=tmp_path)
    out = r.stdout + r.stderr[-3000:]
    assert r.returncode == 0 and "DONE" in r.stdout, out
    assert "DTENSOR 28.0 140.0" in r.stdout, out
    assert "FUNCOL [1.0, 1.0, 1.0]" in r.stdout and "SUBGROUP destroyed" in r.stdout, out
    # one rank: sharded or not, the same training, gathered whole (2.6's FSDP2 says why not)
    assert "FSDP trained True" in r.stdout, out
    if sharded.torch_major_minor() > (2, 6):  # 2.6's CPU streams cannot; later ones must
        assert "FSDP2 trained True" in r.stdout, out
    else:
        assert "FSDP2 unsupported: FSDP2" in r.stdout, out

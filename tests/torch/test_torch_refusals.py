"""What the rxelab backend refuses, and how: a call it does not support names itself and
says it never falls back to Gloo; a tensor it cannot work on in place is named with why;
and dist.init_process_group("rxelab") itself (a job of one, in a process of its own: the
default group is the process's) with env:// and with a store given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from rxelab.errors import ConfigError, PeerError, ProtocolError

from tests.torch.groups import run_groups

ROOT = Path(__file__).resolve().parents[2]


def refused(job, p: int = 2) -> list[BaseException]:
    errors = run_groups(p, job, keep_errors=True)
    assert all(isinstance(e, BaseException) for e in errors), errors
    return errors


@pytest.mark.parametrize("call,name", [
    (lambda pg: pg.recv_anysource([torch.ones(3)], 0), "recv from any source"),
    (lambda pg: pg.allgather_coalesced([[torch.ones(3)] * 2], [torch.ones(3)]),
     "all_gather_coalesced"),
])
def test_an_unsupported_call_is_named_and_never_falls_back_to_gloo(call, name):
    for err in refused(call):
        assert isinstance(err, ConfigError) and f"does not support {name}" in str(err)
        assert "never falls back to Gloo" in str(err) and "all_reduce" in str(err)


@pytest.mark.parametrize("make,match", [
    (lambda: torch.ones(4, 4).t(), "not contiguous"),
    (lambda: torch.ones(8)[::2], "not contiguous"),
    (lambda: torch.ones(3, dtype=torch.bool), "bool is not supported for reductions"),
    (lambda: torch.ones(3).to_sparse(), "sparse"),
])
def test_a_tensor_that_cannot_be_reduced_in_place_is_refused_with_why(make, match):
    for err in refused(lambda pg: dist.all_reduce(make(), group=pg)):
        assert isinstance(err, ConfigError) and "all_reduce" in str(err), err
        assert match in str(err), err


def test_avg_of_integers_and_bfloat16_reduce_scatter_are_refused():
    errs = refused(lambda pg: dist.all_reduce(torch.ones(3, dtype=torch.int64),
                                              dist.ReduceOp.AVG, group=pg))
    assert all("AVG of torch.int64 is not supported" in str(e) for e in errs)
    errs = refused(lambda pg: dist.reduce_scatter_tensor(
        torch.zeros(2, dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16), group=pg))
    assert all("bfloat16 is not supported for reductions" in str(e) for e in errs)
    errs = refused(lambda pg: dist.all_reduce(torch.ones(3), dist.ReduceOp.BAND, group=pg))
    assert all("is not supported" in str(e) and "SUM, PRODUCT" in str(e) for e in errs)


def test_tags_and_mismatched_lists_are_refused():
    errs = refused(lambda pg: pg.send([torch.ones(2)], 1 - pg.rank(), 5))
    assert all("tag 5" in str(e) for e in errs)
    errs = refused(lambda pg: dist.all_gather([torch.zeros(3)], torch.ones(3), group=pg))
    assert all("a list of 2 tensors" in str(e) for e in errs)
    errs = refused(lambda pg: dist.all_to_all_single(torch.zeros(4), torch.ones(4), [1, 1],
                                                     [3, 2], group=pg))
    assert all("split sizes [3, 2]" in str(e) for e in errs)


def test_a_closed_group_refuses_calls():
    def job(pg):
        pg.close()
        dist.all_reduce(torch.ones(2), group=pg)
    assert all("closed" in str(e) for e in refused(job))


JOB = """
import os, sys, datetime, torch, torch.distributed as dist, rxelab.torch
how = sys.argv[1]
if how == "env":
    dist.init_process_group("rxelab", init_method="env://", rank=0, world_size=1)
else:
    store = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=30))
    dist.init_process_group("rxelab", store=store, rank=0, world_size=1,
                            pg_options=rxelab.torch.Options(algorithms={"allreduce": "ring"}))
t = torch.arange(4.)
dist.all_reduce(t)
w = dist.broadcast(t, 0, async_op=True)
w.wait()
import gc, threading
print("RESULT", dist.get_backend(), t.tolist(), w.is_completed(), flush=True)
dist.destroy_process_group()
gc.collect()
print("THREADS", sorted(t.name for t in threading.enumerate() if t.name.startswith("rxelab")))
"""


@pytest.mark.parametrize("how", ["env", "store"])
def test_init_process_group_rxelab_starts_a_job(how, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0",
           "PYTHONPATH": f"{ROOT / 'tests' / 'fakeverbs'}:{ROOT / 'lib'}"}
    r = subprocess.run([sys.executable, "-c", JOB, how], capture_output=True, text=True,
                       env=env, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RESULT rxelab [0.0, 1.0, 2.0, 3.0] True" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "THREADS []" in r.stdout, "destroy_process_group() closed the group: " + r.stdout


def test_a_call_that_fails_raises_from_its_own_wait_and_fails_its_future():
    def blocking(pg):
        dist.all_reduce(torch.ones(4 + pg.rank()), group=pg)
    for err in refused(blocking):
        assert isinstance(err, (PeerError, ProtocolError)), err
    def started(pg):
        w = dist.all_reduce(torch.ones(4 + pg.rank()), group=pg, async_op=True)
        with pytest.raises(RuntimeError):
            w.get_future().wait()  # torch's own future is failed, for DDP's reducer too
        assert w.is_completed() and not w.is_success() and w.exception() is not None
        w.wait()
    for err in refused(started):
        assert isinstance(err, (PeerError, ProtocolError)), err


def test_a_subgroups_rank_0_publishes_its_own_address():
    from rxelab.torch.rendezvous import where
    env = {"MASTER_ADDR": "127.0.0.1"}
    assert where(env) == "127.0.0.1"
    assert where(env, first_of_job=False) == "127.0.0.1", "the address towards MASTER_ADDR"
    assert where({"MASTER_ADDR": "127.0.0.1", "RXELAB_MASTER_ADDR": "10.1.1.1"}) == "10.1.1.1"


def test_the_transport_comes_from_the_options_then_the_environment_and_is_checked():
    from rxelab.torch.options import Options, resolve
    assert resolve(None, {}).opening()["transport"] is None  # init() then decides
    assert resolve(None, {"RXELAB_TRANSPORT": "tcp"}).opening()["transport"] == "tcp"
    assert resolve(Options(transport="verbs"), {"RXELAB_TRANSPORT": "tcp"}).transport == "verbs"
    with pytest.raises(ConfigError, match="the environment: transport='x': no such transport"):
        resolve(None, {"RXELAB_TRANSPORT": "x"})
    with pytest.raises(ConfigError, match="transport='x'"):
        Options(transport="x").checked()


NO_PYVERBS = """
import sys
sys.modules["pyverbs"] = None  # as where rdma-core's bindings are not installed
import rxelab.torch
class Untouchable:
    def __getattr__(self, name):
        raise AssertionError(f"the store was used ({name}) before the refusal")
try:
    rxelab.torch.new_group(Untouchable(), 0, 2)
except rxelab.ConfigError as err:
    print(err)
"""


def test_without_pyverbs_the_backend_refuses_in_one_line_before_it_meets_the_job(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "lib")}
    r = subprocess.run([sys.executable, "-c", NO_PYVERBS], capture_output=True, text=True,
                       env=env, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = r.stdout.strip().splitlines()
    assert line.startswith("transport verbs needs pyverbs") and "python3-pyverbs" in line, line
    assert 'transport="tcp"' in line, line

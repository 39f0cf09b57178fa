"""The torch backend on the lab (issue 30), where the image has torch (EXTRAS=torch; CI's lab
has none, and CI runs the backend's host tests, tests/torch, instead):
- dist.init_process_group("rxelab") under our launcher: apps/ddp_train.py trains the same
  model under rxelab and Gloo, every rank ends with the same parameters, rxelab's match
  Gloo's, and the rxe port counters say rxelab's traffic went over RDMA;
- the same under torchrun (static rendezvous, one agent per node), with all_to_all_single's
  split sizes and the store's rendezvous (no port of rxelab's own)."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from experiments.running import fleet
from infra.ssh import ssh_argv
from tests.e2e.test_gloo import has_torch  # noqa: F401  (the fixture)

pytestmark = pytest.mark.vm

PORT = 29931  # the lab's own nodes: nothing else listens there


def sent_packets(lab) -> dict[str, int]:
    out = {}
    for h in lab.hosts:
        path = f"/sys/class/infiniband/{h.rdma.device}/ports/{h.rdma.port}/hw_counters/sent_pkts"
        r = lab.ssh(h, f"cat {shlex.quote(path)}")
        assert r.returncode == 0, r.stderr
        out[h.name] = int(r.stdout)
    return out


def node_torch(lab) -> tuple[int, int]:
    r = lab.ssh("node1", "python3 -c 'import torch; print(torch.__version__)'")
    assert r.returncode == 0, r.stderr
    major, minor = r.stdout.strip().split(".")[:2]
    return int(major), int(minor)


def sharded_skips(version: tuple[int, int]) -> set[str]:
    """What the lab's torch cannot run: Debian 12's 1.13 on Python 3.11 no FSDP at all (it does
    not import), Debian 13's 2.6 no FSDP2 on CPU (its streams have no record_event)."""
    wraps = ("fsdp", "fsdp2") if version < (2, 0) else ("fsdp2",) if version <= (2, 6) else ()
    return {f"{b}+{w}" for b in ("rxelab", "gloo") for w in wraps}


@pytest.fixture(scope="module")
def ddp_lines(lab, has_torch):  # noqa: F811
    if not has_torch:
        pytest.skip("this lab's image has no torch (make provision EXTRAS=torch builds one)")
    p = fleet.remote_paths()
    hosts = ",".join(h.data_ip for h in lab.hosts)
    before = sent_packets(lab)
    cmd = (f"timeout 500 {p['python']} -m rxelab.launch --hosts {hosts} --port {PORT} "
           f"--timeout 450 -- {p['python']} {p['apps']}/ddp_train.py --width 256 --steps 2 "
           "--rounds 1 --hooks none,fp16 --wraps fsdp,fsdp2")
    r = lab.ssh("node1", cmd, timeout=560)
    after = sent_packets(lab)
    lines = [json.loads(line.split("] ", 1)[1]) for line in r.stdout.splitlines()
             if '{"app": "ddp"' in line]
    return r, lines, {n: after[n] - before[n] for n in after}


def test_ddp_under_rxelab_ends_with_glooss_parameters_on_every_rank(lab, ddp_lines):
    r, lines, _ = ddp_lines
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    by = {x["variant"]: x for x in lines}
    sharded = {f"{b}+{w}" for b in ("rxelab", "gloo") for w in ("fsdp", "fsdp2")}
    assert set(by) == {"rxelab", "gloo", "rxelab+fp16", "gloo+fp16"} | sharded, r.stdout[-2000:]
    ran = [v for v in by.values() if "skipped" not in v]
    for v in ran:
        assert v["same_on_every_rank"] and v["ranks"] == 3 and v["step_ms"] > 0
    for v in ("rxelab", "rxelab+fp16", "rxelab+fsdp", "rxelab+fsdp2"):
        assert "skipped" in by[v] or by[v]["matches"], by[v]
    skipped = {v["variant"] for v in by.values() if "skipped" in v}
    assert skipped == sharded_skips(node_torch(lab)), skipped
    assert by["rxelab"]["params"] > 200_000


def test_rxelabs_gradients_went_over_rdma(ddp_lines):
    _, lines, sent = ddp_lines
    params = next(x["params"] for x in lines if x["variant"] == "rxelab")
    # 2 timed + 2 warm-up steps of a ring allreduce of the float32 gradients, at most 4 KiB a
    # packet (MTU 9000): thousands of packets from every node, none of which Gloo's TCP sends
    for node, n in sent.items():
        assert n > 4 * params * 4 * 2 / 3 / 4096, (node, n)


TORCHRUN_JOB = """
import os, torch, torch.distributed as dist, rxelab.torch
dist.init_process_group("rxelab")
r, p = dist.get_rank(), dist.get_world_size()
t = torch.full((1000,), float(r + 1))
dist.all_reduce(t)
splits = [(r + d) % 3 + 1 for d in range(p)]
x = torch.arange(sum(splits) * 2, dtype=torch.float64).view(-1, 2) + 100 * r
got = [(s + r) % 3 + 1 for s in range(p)]
y = torch.zeros(sum(got), 2, dtype=torch.float64)
dist.all_to_all_single(y, x, got, splits)
start = [sum((s + d) % 3 + 1 for d in range(r)) for s in range(p)]
want = torch.cat([(torch.arange(sum((s + d) % 3 + 1 for d in range(p)) * 2, dtype=torch.float64)
                   .view(-1, 2) + 100 * s)[start[s]:start[s] + got[s]] for s in range(p)])
ok = bool((t == 6).all()) and torch.equal(y, want) and dist.get_backend() == "rxelab"
print("RESULT", r, ok, os.environ["MASTER_PORT"], flush=True)
dist.destroy_process_group()
"""


def test_init_process_group_rxelab_under_torchrun(lab, has_torch):  # noqa: F811
    if not has_torch:
        pytest.skip("this lab's image has no torch (make provision EXTRAS=torch builds one)")
    p = fleet.remote_paths()
    procs = []
    for i, h in enumerate(lab.hosts):
        # torchrun runs a script: the job goes in a file of its own (torch 1.13's flags; on
        # Python 3.11 its default "0" for --redirects/--tee is lost: Flag no longer lists 0);
        # rxelab's torchrun: Debian 13's torch 2.6 has no libuv, and torchrun's own rendezvous
        # asks for it (docs/pytorch.md says so)
        cmd = (f"f=$(mktemp --suffix .py) && printf %s {shlex.quote(TORCHRUN_JOB)} > $f && "
               f"timeout 300 {p['python']} -m rxelab.torch.torchrun --nnodes {len(lab.hosts)} "
               f"--nproc_per_node 1 --node_rank {i} --master_addr {lab.hosts[0].data_ip} "
               f"--master_port {PORT + 1} --redirects 1 --tee 1 $f; rc=$?; rm -f $f; exit $rc")
        procs.append(subprocess.Popen(ssh_argv(h, cmd), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      stdin=subprocess.DEVNULL))
    outs = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=360)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = sorted(tuple(line.split("RESULT", 1)[1].split()) for out in outs
                     for line in out.splitlines() if "RESULT" in line)
    assert [x[:2] for x in results] == [(str(i), "True") for i in range(3)], "\n".join(outs)[-4000:]
    assert all(proc.returncode == 0 for proc in procs), "\n".join(outs)[-4000:]


DDP_SPEC = """name = "ddp-small"
[ddp]
nodes = 3
width = 128
depth = 3
batch = 8
steps = 2
warmup = 1
rounds = 1
bucket_mb = [4]
hooks = ["none"]
wraps = ["fsdp", "fsdp2"]
timeout_s = 600
"""


def test_the_ddp_spec_runs_through_fab_and_its_report_says_where_it_stands(lab, has_torch,  # noqa: F811
                                                                           tmp_path):
    from tests.e2e.test_experiments import run_spec

    _, md, _ = run_spec(lab, tmp_path, DDP_SPEC)
    assert "## DDP against Gloo" in md
    if not has_torch:  # CI's lab: nothing runs, and the report says why
        assert "| 4 MB | - | - | skipped | - | - | no torch on node1, node2, node3" in md, md
        return
    assert "| 4 MB | rxelab | 1 |" in md and "matches gloo (max diff" in md, md
    assert "buckets of 4 MB: rxelab " in md and "PROBLEMS" not in md
    skips = sharded_skips(node_torch(lab))
    for wrap, why in (("fsdp", "FSDP does not import"), ("fsdp2", "record_event")):
        if f"rxelab+{wrap}" in skips:
            assert f"| rxelab+{wrap} | - | skipped |" in md and why in md, md
        else:
            assert f"| rxelab+{wrap} | - |" in md and f"matches gloo+{wrap} (max diff" in md, md


SRUN_JOB = """
import torch, torch.distributed as dist, rxelab.torch
dist.init_process_group("rxelab")  # nothing exported: srun's own variables
r = dist.get_rank()
t = torch.full((4096,), float(r + 1))
dist.all_reduce(t)
print("RESULT", r, bool((t == 6).all()), dist.get_backend(), flush=True)
dist.destroy_process_group()
"""


def test_init_process_group_rxelab_under_srun_with_nothing_exported(lab, has_torch):  # noqa: F811
    if not has_torch:
        pytest.skip("this lab's image has no torch (make provision EXTRAS=torch builds one)")
    p = fleet.remote_paths()
    cmd = f"cd ~ && timeout 300 srun -N3 {p['python']} -c {shlex.quote(SRUN_JOB)}"
    r = lab.ssh("node1", cmd, timeout=360)
    results = sorted(line.split("RESULT", 1)[1].split() for line in r.stdout.splitlines()
                     if "RESULT" in line)
    assert r.returncode == 0 and results == [[str(i), "True", "rxelab"] for i in range(3)], \
        (r.stdout + r.stderr)[-3000:]

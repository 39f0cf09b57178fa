"""Gloo beside rxelab on the lab (issue 19), small: one spec with a gloo allreduce stage by
stage, a gloo alltoall back to back and rxelab's allreduce. On a lab built with EXTRAS=torch
the gloo cases run and verify their data over the data network; on one without (CI's), they
are not run and the report says why. Then rxelab's collectives on torch tensors, in place."""

from __future__ import annotations

import shlex

import pytest

from experiments.running import fleet
from tests.e2e.test_experiments import run_spec

pytestmark = pytest.mark.vm

SPEC = """name = "gloo-small"
[[runs]]
app = "gloo"
op = "allreduce"
nodes = [3]
sizes = [4096]
stages = 3

[[runs]]
app = "gloo"
op = "alltoall"
nodes = [3]
sizes = [1024]
stages = 5
tight = true

[[runs]]
app = "rxelab"
op = "allreduce"
algorithms = ["ring"]
nodes = [3]
sizes = [4096]
stages = 3
"""


@pytest.fixture(scope="module")
def has_torch(lab) -> bool:
    out = lab.ssh("node1", "python3 -c 'import importlib.util as u; print(bool(u.find_spec(\"torch\")))'")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "True"


@pytest.fixture(scope="module")
def gloo_run(lab, tmp_path_factory):
    return run_spec(lab, tmp_path_factory.mktemp("gloo"), SPEC)


def test_gloo_runs_and_verifies_its_data_where_the_image_has_torch(lab, has_torch, gloo_run):
    if not has_torch:
        pytest.skip("this lab's image has no torch (make provision EXTRAS=torch builds one)")
    records, md, env = gloo_run
    out = lab.ssh("node1", "python3 -c 'import torch; print(torch.__version__)'")
    torch_version = out.stdout.strip()  # the image's: 1.13.1 on Debian 12, 2.6.0 on Debian 13
    gloo = [r for r in records if r["app"] == "gloo"]
    assert [r["status"] for r in gloo] == ["ok", "ok"], [r.get("error") for r in gloo]
    for r in gloo:
        s = r["summary"]
        assert s["app"] == "gloo" and s["ok"] and s["wrong"] == 0 and s["ranks"] == 3
        assert s["gloo"] == f"torch {torch_version}", s
    assert gloo[1]["summary"]["tight"] is True
    # Gloo took the data network: the NIC under the RDMA device, found from MASTER_ADDR
    assert gloo[0]["summary"]["interface"] == env["netdevs"]["node1"]
    assert f"Gloo (torch.distributed): torch {torch_version}" in md and "on every node" in md
    assert "| gloo |" in md


def test_without_torch_the_gloo_cases_are_not_run_and_the_report_says_why(has_torch, gloo_run):
    if has_torch:
        pytest.skip("this lab's image has torch: its gloo cases run (the test above)")
    records, md, _ = gloo_run
    assert [(r["app"], r["status"]) for r in records] == \
        [("gloo", "skipped"), ("gloo", "skipped"), ("rxelab", "ok")]
    assert all("no torch on these nodes" in r["error"] for r in records[:2])
    assert "2 gloo cases were not run: not run: no torch on these nodes" in md
    assert "Gloo (torch.distributed): no torch on node1, node2, node3" in md


TENSORS = """
import numpy as np, torch, rxelab
with rxelab.init() as comm:
    g = torch.full((1000,), float(comm.rank + 1))
    comm.allreduce(g, g)
    out = torch.zeros(3 * 16, dtype=torch.uint8)
    comm.allgather(torch.full((16,), comm.rank, dtype=torch.uint8), out)
    w = torch.zeros(1000, requires_grad=True)
    try:
        comm.allreduce(w, w)
        refused = ""
    except rxelab.ConfigError as err:
        refused = str(err)
    ok = bool((g == 6).all()) and bool((out == torch.arange(3).repeat_interleave(16)).all())
    print("RESULT", comm.rank, ok, "detach" in refused, flush=True)
"""


def test_rxelab_runs_on_torch_tensors_in_place(lab, has_torch, gloo_run):
    if not has_torch:
        pytest.skip("this lab's image has no torch (make provision EXTRAS=torch builds one)")
    p = fleet.remote_paths()
    hosts = ",".join(h.data_ip for h in lab.hosts)
    cmd = (f"timeout 300 {p['python']} -m rxelab.launch --hosts {hosts} "
           f"--port 29911 --timeout 240 -- {p['python']} -c {shlex.quote(TENSORS)}")
    r = lab.ssh("node1", cmd, timeout=360)
    results = sorted(line.split("RESULT", 1)[1].split() for line in r.stdout.splitlines()
                     if "RESULT" in line)
    assert r.returncode == 0 and results == [[str(i), "True", "True"] for i in range(3)], \
        (r.stdout + r.stderr)[-3000:]

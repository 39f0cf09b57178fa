"""torchrun and Gloo's contender on a torch built without libuv (Debian 13's 2.6), on the host:
a torch 2 from pip has libuv, so the processes are given a TCPStore that refuses it as Debian's
does. Plain torchrun then stops in its rendezvous; `python -m rxelab.torch.torchrun` runs the
job, and apps/gloo_compare.py its one-rank job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if int(torch.__version__.split(".")[0]) < 2:
    pytest.skip("torch 1.13's store has no libuv to go without", allow_module_level=True)

LIB = Path(__file__).resolve().parents[2] / "lib"

# a torch without libuv, as Debian's: these modules' TCPStore refuses it unless told not to
NO_LIBUV = """
import importlib, os, sys, torch, torch.distributed as dist
real = dist.TCPStore
def no_libuv(*args, use_libuv=True, **kwargs):
    if use_libuv:
        raise RuntimeError("use_libuv was requested but PyTorch was build without libuv support")
    return real(*args, use_libuv=False, **kwargs)
def refuse_libuv(*names):
    for name in names:
        importlib.import_module(name).TCPStore = no_libuv
"""

# torchrun's agent: torch's own, or rxelab's
WITHOUT_LIBUV = NO_LIBUV + """
refuse_libuv("torch.distributed", "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
             "torch.distributed.elastic.rendezvous.static_tcp_rendezvous")
sys.argv = ["torchrun", *sys.argv[2:]]
if sys.argv_which == "ours":
    from rxelab.torch.torchrun import main
    main(sys.argv[1:])
else:
    from torch.distributed.run import main
    main(sys.argv[1:])
"""

# the worker, on the same torch: it makes its store through torch's rendezvous module, which
# `import rxelab.torch` must mend (without that import this test fails)
JOB = NO_LIBUV + """
refuse_libuv("torch.distributed", "torch.distributed.rendezvous")
import rxelab.torch
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
with open(f"rank{dist.get_rank()}", "w") as f:  # the workers' stdout runs together
    print(int(t.item()), os.environ.get("USE_LIBUV"), file=f)
dist.destroy_process_group()
"""


def torchrun(which: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    code = WITHOUT_LIBUV.replace("sys.argv_which", repr(which))
    fakeverbs = LIB.parent / "tests" / "fakeverbs"  # rxelab.torch imports the library's verbs
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{LIB}:{fakeverbs}", "GLOO_SOCKET_IFNAME": "lo",
           "HOME": str(tmp_path)}
    agent = subprocess.Popen([sys.executable, "-c", code, "--", "--standalone", "--nnodes", "1",
                              "--nproc_per_node", "2", str(job)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                             start_new_session=True)  # the agent and its workers, one group
    try:
        out, err = agent.communicate(timeout=240)
    finally:  # the workers too, should the agent hang or the test stop
        try:
            os.killpg(agent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        agent.wait()
    return subprocess.CompletedProcess(agent.args, agent.returncode, out, err)


def test_plain_torchrun_stops_in_its_rendezvous_without_libuv(tmp_path):
    r = torchrun("torch's", tmp_path)
    assert r.returncode != 0 and "build without libuv" in r.stdout + r.stderr, \
        (r.stdout + r.stderr)[-2000:]


def test_rxelabs_torchrun_runs_the_job_with_the_store_the_torch_has(tmp_path):
    r = torchrun("ours", tmp_path)
    sums = [(tmp_path / f"rank{i}").read_text().split() if (tmp_path / f"rank{i}").exists()
            else None for i in range(2)]
    # (nothing set in their environment: the stores fall back by themselves)
    assert r.returncode == 0 and sums == [["3", "None"], ["3", "None"]], \
        (r.stdout + r.stderr)[-2000:]


# apps/gloo_compare.py as the runner starts it, one rank, on the same torch
GLOO_APP = NO_LIBUV + """
import runpy
refuse_libuv("torch.distributed", "torch.distributed.rendezvous")
sys.argv = [sys.argv[1], "--op", "allreduce", "--size", "1024", "--stages", "3",
            "--algorithm", "gloo-default"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_gloos_contender_makes_its_store_without_libuv(tmp_path):
    app = LIB.parent / "apps" / "gloo_compare.py"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{LIB}:{LIB.parent}", "HOME": str(tmp_path),
           "GLOO_SOCKET_IFNAME": "lo", "RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}  # one rank: its store on any port
    r = subprocess.run([sys.executable, "-c", GLOO_APP, str(app)], capture_output=True,
                       text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0 and "all data verified" in r.stdout, (r.stdout + r.stderr)[-2000:]

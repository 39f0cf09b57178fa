"""Slurm in the lab (issue 28): srun starts the library with nothing exported by hand (the
rendezvous from Slurm's own variables, the job's credential from MUNGE, the library from the
wheel fab deploy installed), two jobs that share a node meet at ports of their own, scancel
leaves no rank behind, and Open MPI starts under srun --mpi=pmix."""

from __future__ import annotations

import json
import shlex
import time

import pytest
from rxelab import ops

from tests.e2e.test_lib import deployed  # noqa: F401 (the fixture)

pytestmark = pytest.mark.vm
BIN = "$HOME/rxelab/venv/bin"


def srun(lab, args: str, timeout: float = 300):
    return lab.ssh("node1", f"cd ~ && timeout {timeout:.0f} srun {args}", timeout=timeout + 60)


def summaries(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.startswith("{") and '"summary"' in x]


def test_srun_runs_the_selftest_and_the_bench_with_nothing_exported(deployed):  # noqa: F811
    r = srun(deployed, f"-N3 {BIN}/rxelab-selftest --sizes 0,7,4096")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    done = summaries(r.stdout)
    assert len(done) == 3 and all(s["failed"] == 0 and s["checks"] > 0 for s in done), r.stdout[-2000:]
    assert "no secret" not in r.stderr, "the job's credential is MUNGE's, not none"
    r = srun(deployed, f"-N3 {BIN}/rxelab-bench --op alltoall --sizes 1024 --iterations 2 --warmup 0")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    rows = [x.split() for x in r.stdout.splitlines() if x.startswith("1024 ")]
    assert len(rows) == len(ops.COLLECTIVES["alltoall"].algorithms), r.stdout  # one size each
    assert all(f[-1] == "0" for f in rows), r.stdout


def test_two_jobs_sharing_a_node_both_finish(deployed):  # noqa: F811
    """Both jobs' first node is node1: before, both would have met at port 29500."""
    run = f"{BIN}/rxelab-selftest --sizes 0,4096"
    r = deployed.ssh("node1", "cd ~ && "
                     f"(timeout 300 srun -N2 -w node1,node2 {run} > a.out 2>&1 & "
                     f"timeout 300 srun -N2 -w node1,node3 {run} > b.out 2>&1 & wait); "
                     "cat a.out; echo ====; cat b.out; rm -f a.out b.out", timeout=420)
    a, _, b = r.stdout.partition("====")
    for text in (a, b):
        done = summaries(text)
        assert len(done) == 2 and all(s["failed"] == 0 for s in done), r.stdout[-3000:]


def test_scancel_leaves_no_rank_behind(deployed):  # noqa: F811
    marker = "rxelab_scancel_probe"
    pattern = "'[r]xelab_scancel_probe'"  # matches the ranks, not the shell that runs pgrep
    program = f"import time, rxelab; c = rxelab.init(); time.sleep(600)  # {marker}"
    deployed.ssh("node1", f"cd ~ && setsid -f srun -N3 --job-name={marker} {BIN}/python3 -c "
                 f"{shlex.quote(program)} >/dev/null 2>&1 </dev/null &")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        running = [h.name for h in deployed.hosts if deployed.try_ssh(h, f"pgrep -f {pattern}")]
        if len(running) == 3:
            break
        time.sleep(2)
    assert len(running) == 3, "the job's ranks did not start"
    deployed.ssh("node1", f"scancel --user=$USER --name={marker}")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        left = [h.name for h in deployed.hosts if deployed.try_ssh(h, f"pgrep -f {pattern}")]
        if not left:
            break
        time.sleep(2)
    assert not left, f"ranks left running on {left}"


def test_open_mpi_starts_under_srun_with_pmix(deployed):  # noqa: F811
    """Open MPI over TCP on the data network (UCX under srun is the open point of docs/cluster.md)."""
    program = ("from mpi4py import MPI; import numpy as np; c = MPI.COMM_WORLD; "
               "a = np.full(c.size * 1024, c.rank, np.uint8); b = np.empty_like(a); "
               "c.Alltoall(a, b); print('ok', c.rank, int(b.sum()))")
    env = ("OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=10.10.0.0/24 "
           "OMPI_MCA_oob_tcp_if_include=10.10.0.0/24")
    r = deployed.ssh("node1", f"cd ~ && {env} timeout 120 srun --mpi=pmix -N3 {BIN}/python3 -c "
                     f"{shlex.quote(program)}", timeout=180)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert sorted(x for x in r.stdout.splitlines() if x.startswith("ok")) == \
        [f"ok {i} 3072" for i in range(3)]


SRUN_SPEC = """name = "srun-smoke"
launcher = "srun"

[[runs]]
app = "rxelab"
op = "alltoall"
algorithms = ["pairwise"]
nodes = [3]
sizes = [4096]
stages = 3

[[runs]]
app = "mpi"
op = "alltoall"
nodes = [3]
sizes = [4096]
stages = 3
transport = ["ucx", "tcp"]
"""


def test_the_runner_launches_rxelab_and_open_mpi_through_slurm(deployed, tmp_path):  # noqa: F811
    """`launcher = "srun"`: rxelab by srun, Open MPI by srun --mpi=pmix over UCX (proven by rxe's
    counters) and over TCP; the report says so; no job and no rank of the run is left."""
    from tests.e2e.test_experiments import run_spec

    records, report, env = run_spec(deployed, tmp_path, SRUN_SPEC)
    assert [(r["app"], r.get("transport"), r["status"], r["launcher"]) for r in records] == [
        ("rxelab", None, "ok", "srun"), ("mpi", "ucx", "ok", "srun"), ("mpi", "tcp", "ok", "srun")]
    for r in records:  # RDMA proven by the device's own counters, TCP moved none over it
        sent = sum(d.get("sent_pkts", 0) for d in r["rxe"].values())
        assert (sent == 0) == (r.get("transport") == "tcp"), (r["app"], r.get("transport"), sent)
        assert r["summary"]["wrong"] == 0 and r["summary"]["ranks"] == 3
    assert env["launcher"] == "srun" and sorted(env["slurm_nodes"]) == ["node1", "node2", "node3"]
    assert "launcher: srun (Slurm started every rank" in report
    left = deployed.ssh("node1", f"squeue --noheader --name=rxelab-{env['run_id']}").stdout
    assert not left.strip(), f"jobs of the run left in Slurm: {left}"
    for h in deployed.hosts:
        assert not deployed.try_ssh(h, f"grep -lsxzF RXELAB_RUN_ID={env['run_id']} /proc/[0-9]*/environ")

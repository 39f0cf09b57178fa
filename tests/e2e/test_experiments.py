"""Experiments end to end on the lab: `fab deploy`, `fab run-experiment` with the smoke spec
(every algorithm verified, the MPI app on the same nodes, perftest), and `fab report`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from infra.config import REPO

pytestmark = pytest.mark.vm
FAB = str(REPO / ".venv" / "bin" / "fab")


def fab(lab, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([FAB, *args], cwd=REPO, env=lab.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"fab {' '.join(args)} did not finish within {timeout} s")


@pytest.fixture(scope="module")
def smoke(lab, tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("results")
    r = fab(lab, "run-experiment", "--spec", "smoke", "--results", str(results))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    (run,) = list(results.iterdir())
    return run


def test_deploy_is_idempotent_and_checks_the_nodes(lab):
    first = fab(lab, "deploy", timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    again = fab(lab, "deploy", timeout=300)
    assert again.returncode == 0 and again.stdout.count("up to date, ready") == len(lab.hosts)


def test_smoke_verifies_every_algorithm_and_runs_mpi_on_the_same_nodes(smoke):
    records = [json.loads(x) for x in (smoke / "records.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok"] * len(records)
    ran = {(r["app"], r["op"], r["algorithm"]) for r in records}
    for op, algos in (("allgather", ("star", "ring", "sequential")),
                      ("alltoall", ("sequential", "pairwise", "parallel"))):
        assert {("rxelab", op, a) for a in algos} <= ran
        assert ("mpi", op, "mpi-default") in ran
    assert any(r["app"] == "perftest" and r["summary"]["bw_MBps"] > 0 for r in records)
    rx = next(r["summary"] for r in records if r["app"] == "rxelab")
    mpi = next(r["summary"] for r in records if r["app"] == "mpi")
    shared = {"record", "app", "op", "algorithm", "ranks", "size", "stages", "total_seconds",
              "avg_stage_us", "wrong", "ok"}
    assert shared <= rx.keys() and shared <= mpi.keys(), "one parser reads both apps"
    assert rx["wrong"] == 0 and mpi["wrong"] == 0
    env = json.loads((smoke / "environment.json").read_text())
    assert env["complete"] is True and env["kernel"] and env["accel"] in ("tcg", "kvm")
    assert "rdma-core" in env["packages"] and "openmpi-bin" in env["packages"]
    assert (smoke / "spec.toml").read_text().startswith('name = "smoke"')


def test_report_renders_tables_and_plots(lab, smoke):
    r = fab(lab, "report", "--results", str(smoke), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    page = (smoke / "report.html").read_text()
    assert "not hardware numbers" in page and "data:image/png;base64," in page
    for algo in ("star", "ring", "sequential", "pairwise", "parallel", "mpi-default"):
        assert f"<td>{algo}</td>" in page, algo
    md = (smoke / "report.md").read_text()
    assert "| app | op | algorithm |" in md and (smoke / "memory.png").exists()


def test_a_node_without_the_rdma_device_is_named_before_anything_runs(lab, tmp_path):
    doc = json.loads(lab.state.inventory_file.read_text())
    doc["nodes"][1]["rdma"]["device"] = "mlx5_7"
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps(doc))
    r = fab(lab, "run-experiment", "--inventory", str(inv), "--results", str(tmp_path / "res"),
            timeout=300)
    assert r.returncode == 1
    assert "node2: no RDMA device mlx5_7" in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "res").exists()

"""Experiments end to end on the lab: `fab deploy`, `fab run-experiment` with the smoke spec
(every algorithm verified, the MPI app on the same nodes, perftest), and `fab report`."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from infra.config import REPO

pytestmark = pytest.mark.vm
FAB = str(REPO / ".venv" / "bin" / "fab")
LONGEST = 3  # a fab task's whole run, in its timeouts (each a silence at most)


def fab(lab, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    """A fab task on the lab. timeout: how long it may go without printing a line (a node
    deployed, a case begun): a busy host slows every step, and a total would fail a run that
    is only slow; in all, never more than LONGEST times that. Stopped by its pid (SIGTERM:
    fab cleans up the nodes; then SIGKILL) when either runs out."""
    proc = subprocess.Popen([FAB, *args], cwd=REPO, env={**lab.env, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    said: dict[str, list[str]] = {"out": [], "err": []}
    heard = [time.monotonic()]

    def read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)
            heard[0] = time.monotonic()
    readers = [threading.Thread(target=read, args=(s, said[k]), daemon=True)
               for s, k in ((proc.stdout, "out"), (proc.stderr, "err"))]
    for t in readers:
        t.start()
    began, why = time.monotonic(), ""
    try:
        while proc.poll() is None and not why:
            time.sleep(1)
            now = time.monotonic()
            if now - heard[0] > timeout:
                last = "".join(said["out"][-1:]).strip() or "nothing"
                why = f"printed nothing for {timeout:g} s (its last line: {last[:200]!r})"
            elif now - began > LONGEST * timeout:
                why = f"did not finish within {LONGEST * timeout:g} s"
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for t in readers:
            t.join(10)
    if why:
        pytest.fail(f"fab {' '.join(args)} {why}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(said["out"]),
                                       "".join(said["err"]))


def run_spec(lab, tmp: Path, text: str) -> tuple[list[dict], str, dict]:
    """A spec of the test's own through `fab run-experiment` and `fab report`: the records,
    the report's Markdown and the run's environment."""
    (tmp / "spec.toml").write_text(text)
    r = fab(lab, "run-experiment", "--spec", str(tmp / "spec.toml"), "--results", str(tmp / "res"),
            timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    (run,) = list((tmp / "res").iterdir())
    records = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
    r = fab(lab, "report", "--run", str(run), timeout=300)
    assert r.returncode == 0, r.stderr
    env = json.loads((run / "environment.json").read_text())
    return records, (run / "report.md").read_text(), env


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
    ran = {(r["app"], r["op"], r["algorithm"], r["transport"]) for r in records}
    for op, algos in (("allgather", ("star", "ring", "sequential", "parallel", "bruck")),
                      ("alltoall", ("sequential", "pairwise", "parallel", "bruck"))):
        assert {("rxelab", op, a, None) for a in algos} <= ran
        assert {("mpi", op, "mpi-default", t) for t in ("ucx", "tcp")} <= ran
    for r in records:  # proven by rxe's own counters on every node, not claimed
        sent = sum(d.get("sent_pkts", 0) for d in r["rxe"].values())
        assert (sent == 0) == (r.get("transport") == "tcp"), (r["app"], r.get("transport"), sent)
        assert r["active_mtu"] == 4096
    assert any(r["app"] == "perftest" and r["summary"]["bw_MBps"] > 0 for r in records)
    rx = next(r["summary"] for r in records if r["app"] == "rxelab")
    mpi = next(r["summary"] for r in records if r["app"] == "mpi")
    shared = {"record", "app", "op", "algorithm", "ranks", "size", "stages", "total_seconds",
              "avg_stage_us", "wrong", "ok"}
    assert shared <= rx.keys() and shared <= mpi.keys(), "one parser reads both apps"
    assert rx["wrong"] == 0 and mpi["wrong"] == 0
    tight = [r for r in records if r.get("tight")]
    assert {(r["app"], r["size"]) for r in tight} == {("rxelab", 65536), ("mpi", 65536)}
    assert all(r["summary"]["tight"] is True and r["summary"]["stages"] == 20 for r in tight)
    assert not any(r["summary"].get("tight") for r in records if r["app"] != "perftest"
                   and not r.get("tight")), "stage by stage unless the spec says back to back"
    env = json.loads((smoke / "environment.json").read_text())
    assert env["complete"] is True and env["kernel"] and env["accel"] in ("tcg", "kvm")
    assert "rdma-core" in env["packages"] and "openmpi-bin" in env["packages"]
    assert "libucx0" in env["packages"] and env["ucx_settings"]["UCX_UD_ETH_DGID_CHECK"] == "n"
    assert env["active_mtu"] == 4096 and env["netdev_mtu"] == 9000
    assert (smoke / "spec.toml").read_text().startswith('name = "smoke"')


def test_report_renders_tables_and_plots(lab, smoke):
    r = fab(lab, "report", "--run", str(smoke), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    page = (smoke / "report.html").read_text()
    assert "not hardware numbers" in page and "data:image/png;base64," in page
    for algo in ("star", "ring", "sequential", "pairwise", "parallel", "bruck", "mpi-default"):
        assert f"<td>{algo}</td>" in page, algo
    assert "<td>mpi-ucx</td>" in page and "<td>mpi-tcp</td>" in page
    assert "UCX_UD_ETH_DGID_CHECK=n" in page
    md = (smoke / "report.md").read_text()
    assert "| contender | op | algorithm |" in md and (smoke / "memory.png").exists()


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


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_ctrl_c_during_a_run_keeps_results_and_leaves_nothing_running_or_impaired(lab, tmp_path, sig):
    """A real SIGINT (Ctrl-C) or SIGTERM (kill) to `fab run-experiment` while a case runs
    under netem on every node."""
    import os
    import signal
    import time

    spec = tmp_path / "long.toml"
    spec.write_text('name = "long"\n[[runs]]\napp = "rxelab"\nop = "alltoall"\n'
                    'algorithms = ["pairwise"]\nnodes = [3]\nsizes = [1024]\nstages = 100000\n'
                    'netem = [{delay_ms = 1}]\n')
    results = tmp_path / "res"
    proc = subprocess.Popen([FAB, "run-experiment", "--spec", str(spec), "--results", str(results)],
                            cwd=REPO, env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while "server_client" not in (lab.try_ssh(lab.hosts[2], "pgrep -af '[s]erver_client'") or ""):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the case never started"
            time.sleep(1)
        time.sleep(3)
        os.killpg(proc.pid, getattr(signal, f"SIG{sig}"))
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out[-2000:]
    assert "interrupted: partial results kept" in out and "Traceback" not in out, out[-2000:]
    (run,) = list(results.iterdir())
    assert json.loads((run / "environment.json").read_text())["complete"] is False
    for h in lab.hosts:
        left = lab.ssh(h, "pgrep -af '[s]erver_client|[r]xelab.launch' || true; /sbin/tc qdisc show "
                          "dev data0 | grep netem || true").stdout.strip()
        assert left == "", f"{h.name}: {left}"

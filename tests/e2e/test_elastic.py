"""Elastic training on the lab (issue 18), small: 3 ranks, one killed (SIGKILL) at step 3, a
newcomer starting at step 4 (admitted at an admit point once it knocks: its start-up under
emulation spans a few steps of 0.3 s, and under load a dozen or more: 40 steps leave it room);
the survivors finish with the same parameters, every step's allreduce checked; then Open
MPI's job with the same kill ends. The report says so."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_experiments import fab

pytestmark = pytest.mark.vm

SPEC = """name = "elastic-small"
[elastic]
nodes = 3
ranks_per_node = 1
steps = 40
size = 4096
admit_every = 3
pause = 0.3
timeout_s = 300
mpi = true
events = [{step = 3, kill = 2}, {step = 4, join = 2}]
"""


def test_a_kill_and_a_join_on_the_lab(lab, tmp_path):
    spec = tmp_path / "elastic-small.toml"
    spec.write_text(SPEC)
    r = fab(lab, "run-experiment", "--spec", str(spec), "--results", str(tmp_path / "res"),
            timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    (run,) = list((tmp_path / "res").iterdir())
    rx, mpi = [json.loads(x) for x in (run / "elastic.jsonl").read_text().splitlines()]
    done = [e for e in rx["events"] if e["event"] == "done"]
    assert rx["exit"] == 0 and len(done) == 3, out[-3000:]
    assert len({e["params"] for e in done}) == 1, "the survivors and the newcomer agree"
    assert {e["id"] for e in done} >= {0, 1}, "ranks 0 and 1 survived"
    shrink = [e for e in rx["events"] if e["event"] == "shrink"]
    assert shrink and all(e["lost"] == [2] and e["size"] == 2 for e in shrink)
    admit = [e for e in rx["events"] if e["event"] == "admit"]
    assert admit and admit[0]["size"] == 3
    assert [e["step"] for e in rx["events"] if e["event"] == "step"][-1] == 39
    assert mpi["exit"] != 0 and any(e["event"] == "dying" for e in mpi["events"])
    assert not any(e["event"] == "done" for e in mpi["events"]), "Open MPI's job ended"
    r = fab(lab, "report", "--run", str(run), timeout=300)
    assert r.returncode == 0, r.stderr
    md = (run / "report.md").read_text()
    assert "| rxelab | kill rank 2 | 3 | shrink to 2 ranks |" in md
    assert "mpi-ucx: the job ended" in md and (run / "elastic.png").exists()

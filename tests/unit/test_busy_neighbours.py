"""busy_neighbours: CPU loops on the nodes after a case's while it runs (the calibration's busy
machine). The spec counts those nodes and refuses them where they would be other jobs'; the
runner starts each loop checked, tagged with the run's id, and stops it by that id after the
case; a loop it cannot stop ends the run."""

from __future__ import annotations

import copy
import json
import re
import secrets
import shutil
import subprocess
import time

import pytest

from experiments import spec
from experiments.running import beside, commands, fleet, runner
from experiments.running.records import Environment
from infra.inventory import Inventory
from tests.unit.test_runner_flow import HOSTS, cmds, make_runner, records, stops, summary
from tests.unit.test_spec import GOOD


def test_busy_neighbours_are_counted_in_the_nodes_a_spec_takes():
    """A case's busy neighbours are nodes of the lab too: the spec takes them (the runner
    touches no node beyond), and the case says how many it loads; none said, none loaded."""
    doc = copy.deepcopy(GOOD)
    doc["runs"][0]["busy_neighbours"] = 2
    got = spec.parse(doc)
    assert got.max_nodes == 3 + 2
    assert {c.busy_neighbours for c in got.cases() if c.app == "rxelab"} == {2}
    assert not any("busy_neighbours" in json.loads(c.to_json()) for c in got.cases() if c.app != "rxelab")
    assert spec.parse(GOOD).max_nodes == 3
    assert spec.load("calibrate").max_nodes == 3  # the exchange's two and a busy third


RUN: dict[str, object] = {"app": "rxelab", "op": "alltoall", "algorithms": ["pairwise"],
                          "nodes": [2], "sizes": [8], "stages": 2}


@pytest.mark.parametrize(("doc", "said"), [
    ({"name": "s", "launcher": "srun", "runs": [{**RUN, "busy_neighbours": 1}]},
     "under launcher = \"srun\" those are other jobs'"),
    ({"name": "v", "launcher": "srun", "include": ["calibrate"], "runs": [RUN]},
     "busy_neighbours (its own or an included spec's)"),
    ({"name": "n", "runs": [{**RUN, "nodes": [60], "busy_neighbours": 5}]},
     "nodes 60 and busy_neighbours 5: at most 64 nodes in all"),
])
def test_busy_neighbours_never_load_other_jobs_nodes_or_more_than_the_lab(doc, said):
    with pytest.raises(spec.SpecError, match=re.escape(said)):
        spec.parse(doc, "my.toml")


BESIDE = ('[[runs]]\napp = "rxelab"\nop = "alltoall"\nalgorithms = ["pairwise"]\nnodes = [2]\n'
          'sizes = [8]\nbusy_neighbours = 1\n')


def test_busy_neighbours_run_a_loop_beside_the_case_only_while_it_runs(tmp_path, monkeypatch):
    """busy_neighbours = 1 on a 2-node case: the third node runs a CPU loop that carries the
    run's id (suffixed, so stopping it stops nothing else), from before the case starts until
    after it ends, when it is stopped by that id; the case's own nodes run none; the record
    names the loaded node; the run's clean-up stops loops too."""
    r, fake = make_runner(tmp_path, monkeypatch, BESIDE)
    fake.outputs.append(summary(True))
    (rec,) = records(r.run(Environment.model_validate({})))
    assert rec["status"] == "ok" and rec["busy_hosts"] == ["node3"] and rec["busy_neighbours"] == 1
    log = fake.log
    [started] = [i for i, (h, c) in enumerate(log) if "while :" in c]
    assert log[started][0] == "node3" and f"RXELAB_RUN_ID={r.run_id}-busy " in log[started][1]
    assert "timeout " in log[started][1], "a loop ends by itself should the runner die"
    [case] = [i for i, (h, c) in enumerate(log) if "rxelab.launch --hosts" in c]
    stopped = [i for i, (h, c) in enumerate(log) if h == "node3" and "/environ" in c
               and f"RXELAB_RUN_ID={r.run_id}-busy" in c]
    assert started < case < stopped[0], "loaded before the case, stopped after it"
    assert any("-busy" in c and "-load" in c for h, c in stops(fake, r.run_id)), \
        "the run's clean-up stops loops with the rest"


def test_a_neighbour_that_cannot_be_loaded_fails_the_case_and_runs_nothing(tmp_path, monkeypatch):
    """A case measured beside busy nodes is not measured on an idle one: the loop that did not
    start is named, the case not run, and whatever did start stopped."""
    r, fake = make_runner(tmp_path, monkeypatch, BESIDE)
    fake.loop_fails.add("node3")
    (rec,) = records(r.run(Environment.model_validate({})))
    assert rec["status"] == "failed" and "could not load the nodes beside it: node3" in rec["error"]
    assert "the loop ended at once" in rec["error"]
    assert not cmds(fake, "rxelab.launch --hosts")
    assert any(h == "node3" and f"RXELAB_RUN_ID={r.run_id}-busy" in c for h, c in cmds(fake, "/environ"))


def test_a_loop_that_outlives_its_stop_ends_the_run_with_its_record_kept(tmp_path, monkeypatch):
    """A loop still there after its stop would load the next cases' nodes unasked: the case's
    record is kept and says so, and the run stops, saying when the loop ends by itself."""
    r, fake = make_runner(tmp_path, monkeypatch, BESIDE.replace("sizes = [8]", "sizes = [8, 16]"))
    fake.loop_stuck.add("node3")
    fake.outputs += [summary(True), summary(True)]
    with pytest.raises(fleet.FleetError, match=r"may still run \(node3: left 4242\): the run stops"):
        r.run(Environment.model_validate({}))
    (rec,) = records(r.dir)
    assert rec["busy_left"] == ["node3: left 4242"] and len(cmds(fake, "rxelab.launch")) == 1


def test_a_case_that_fails_after_its_loops_started_stops_them(tmp_path, monkeypatch):
    """The loop ends by itself at the case's deadline and a grace period, and is stopped when
    the case ends, however it ended."""
    r, fake = make_runner(tmp_path, monkeypatch, BESIDE)
    fake.outputs.append("no summary here")
    (rec,) = records(r.run(Environment.model_validate({})))
    assert rec["status"] == "failed"
    [(_, loop)] = cmds(fake, "while :")
    case = spec.load(str(tmp_path / "t.toml")).cases()[0]
    assert f"timeout {int(commands.case_timeout(case) + beside.GRACE_S)} " in loop
    [case_at] = [i for i, (h, c) in enumerate(fake.log) if "rxelab.launch" in c]
    assert any(i > case_at and h == "node3" and f"{r.run_id}-busy" in c and "/environ" in c
               for i, (h, c) in enumerate(fake.log))


def test_srun_on_the_command_line_is_refused_like_srun_in_the_spec(tmp_path):
    """`fab run-experiment --launcher srun` on a spec with busy neighbours (the validation
    specs include the calibration's) is refused before anything runs, as the spec's own
    launcher = "srun" is."""
    for name in ("validation", "calibrate"):
        chosen = spec.load(name)
        assert "other jobs'" in (spec.launcher_problem(chosen, "srun") or "")
        assert spec.launcher_problem(chosen, "ssh") is None
        with pytest.raises(fleet.FleetError, match="other jobs'"):
            runner.Runner(chosen, Inventory("t", HOSTS * 2), tmp_path, say=lambda s: None,
                          launcher="srun")


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):  # ended, not yet reaped
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_the_real_loop_starts_checked_and_its_stop_leaves_nothing(tmp_path):
    """The commands themselves, in a local shell: the loop says its pid once it runs, the stop
    ends it (by the run's tag) and says nothing is left; a loop that cannot start (no
    `timeout` on the PATH) fails its command, saying so, as does one with no `sleep` to wait
    before it looks (that shell would look at once, before a loop that cannot start had ended)."""
    run_id = "test-" + secrets.token_hex(4)
    stop = commands.stop_command(beside.loop_id(run_id), say_left=True)
    try:
        started = subprocess.run(["bash", "-c", beside.loop_command(run_id, 30)],
                                 capture_output=True, text=True, timeout=30)
        assert started.returncode == 0 and started.stdout.startswith("loop "), started.stderr
        pid = int(started.stdout.split()[1])
        assert not _gone(pid, 0.2), "the loop runs"
        stopped = subprocess.run(["bash", "-c", stop], capture_output=True, text=True, timeout=60)
        assert "left" not in stopped.stdout and _gone(pid)
    finally:
        subprocess.run(["bash", "-c", stop], capture_output=True, timeout=60)
    bare = subprocess.run(["/bin/bash", "-c", beside.loop_command(run_id, 30)], capture_output=True,
                          text=True, timeout=30, env={"PATH": str(tmp_path)})
    assert bare.returncode != 0 and "loop " not in bare.stdout
    assert "cannot wait" in bare.stderr, bare.stderr
    (tmp_path / "sleep").symlink_to(shutil.which("sleep"))  # a wait, but no `nohup` or `timeout`
    no_timeout = subprocess.run(["/bin/bash", "-c", beside.loop_command(run_id, 30)],
                                capture_output=True, text=True, timeout=30, env={"PATH": str(tmp_path)})
    assert no_timeout.returncode != 0 and "loop " not in no_timeout.stdout
    assert "ended at once" in no_timeout.stderr, no_timeout.stderr
    assert "left" not in subprocess.run(["bash", "-c", stop], capture_output=True, text=True,
                                        timeout=60).stdout

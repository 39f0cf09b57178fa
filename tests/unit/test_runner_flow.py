"""The runner's bookkeeping with fake connections: every case recorded as it ends, a failed
verification marked, an interrupted run kept and marked incomplete, the nodes cleaned up."""

import json
from types import SimpleNamespace

import pytest

from experiments import fleet, runner, spec
from infra.inventory import Host, Inventory, RdmaEndpoint, SSHEndpoint

HOSTS = tuple(Host(f"node{i}", SSHEndpoint("127.0.0.1", 2220 + i), f"10.10.0.{10 + i}",
                   RdmaEndpoint()) for i in (1, 2, 3))


def summary(ok: bool) -> str:
    return "[0] " + json.dumps({"record": "summary", "app": "rxelab", "op": "alltoall",
                                "algorithm": "x", "ranks": 3, "size": 8, "stages": 1,
                                "total_seconds": 0.1, "avg_stage_us": 1e5, "min_stage_us": 1e5,
                                "max_stage_us": 1e5, "wrong": 0 if ok else 3, "ok": ok})


class FakeConnection:
    def __init__(self, log, outputs):
        self.log, self.outputs = log, outputs

    def run(self, cmd, **kwargs):
        self.log.append(cmd)
        if "server_client.py" in cmd:
            out = self.outputs.pop(0)
            if isinstance(out, BaseException):
                raise out
            return SimpleNamespace(stdout=out, stderr="", exited=0)
        return SimpleNamespace(stdout="", stderr="", exited=0)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.fixture
def setup(tmp_path, monkeypatch):
    toml = tmp_path / "t.toml"
    toml.write_text('name = "t"\n[[runs]]\napp = "rxelab"\nop = "alltoall"\n'
                    'algorithms = ["sequential", "pairwise", "parallel"]\nnodes = [3]\nsizes = [8]\n')
    log, outputs = [], []
    monkeypatch.setattr(fleet, "connect", lambda host: FakeConnection(log, outputs))
    r = runner.Runner(spec.load(str(toml)), Inventory("t", HOSTS), tmp_path / "results",
                      say=lambda s: None)
    return r, log, outputs


def records(run_dir):
    return [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]


def test_wrong_data_and_missing_output_are_recorded_as_such(setup):
    r, log, outputs = setup
    outputs += [summary(True), summary(False), "Traceback: boom"]
    out = r.run({"nodes": 3})
    assert [x["status"] for x in records(out)] == ["ok", "wrong", "failed"]
    assert "boom" in records(out)[2]["error"]
    assert json.loads((out / "environment.json").read_text())["complete"] is True
    assert sum("pkill" in c for c in log) == 3, "every node cleaned up afterwards"


def test_an_interrupted_run_keeps_its_records_and_says_incomplete(setup):
    r, log, outputs = setup
    outputs += [summary(True), KeyboardInterrupt()]
    with pytest.raises(KeyboardInterrupt):
        r.run({"nodes": 3})
    assert [x["status"] for x in records(r.dir)] == ["ok"]
    env = json.loads((r.dir / "environment.json").read_text())
    assert env["complete"] is False and "finished" in env
    assert sum("pkill" in c for c in log) == 3, "nothing left running on the nodes"
    assert (r.dir / "spec.toml").exists()


def test_a_spec_larger_than_the_inventory_is_refused(tmp_path):
    big = spec.parse({"name": "b", "runs": [{"app": "rxelab", "op": "alltoall", "nodes": [5],
                                             "sizes": [1]}]})
    with pytest.raises(fleet.FleetError, match="needs 5 nodes, the inventory has 3"):
        runner.Runner(big, Inventory("t", HOSTS), tmp_path)

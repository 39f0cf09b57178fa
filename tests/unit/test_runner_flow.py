"""The runner's bookkeeping with fake connections: every case recorded as it ends, a failed
verification marked, an interrupted run kept and marked incomplete, the nodes cleaned up and
their impairments removed, an MPI-over-UCX case that moved no RDMA packets refused, a case past
its deadline recorded as timed out with its partial figures."""

import json
from types import SimpleNamespace

import pytest
from invoke.exceptions import CommandTimedOut

from experiments import fleet, runner, spec
from infra.inventory import Host, Inventory, RdmaEndpoint, SSHEndpoint

HOSTS = tuple(Host(f"node{i}", SSHEndpoint("127.0.0.1", 2220 + i), f"10.10.0.{10 + i}",
                   RdmaEndpoint()) for i in (1, 2, 3))


def summary(ok: bool, app: str = "rxelab") -> str:
    return "[0] " + json.dumps({"record": "summary", "app": app, "op": "alltoall",
                                "algorithm": "x", "ranks": 3, "size": 8, "stages": 1,
                                "total_seconds": 0.1, "avg_stage_us": 1e5, "min_stage_us": 1e5,
                                "max_stage_us": 1e5, "wrong": 0 if ok else 3, "ok": ok})


class FakeNodes:
    """Every node's shell: the case commands answer from `outputs`; reading the counters
    returns sent_pkts that grows by `per_case` packets per reading."""

    def __init__(self):
        self.log, self.outputs, self.per_case, self.sent = [], [], 100, 0

    def connect(self, host):
        return FakeConnection(self, host)


class FakeConnection:
    def __init__(self, nodes, host):
        self.nodes, self.host = nodes, host

    def run(self, cmd, **kwargs):
        self.nodes.log.append((self.host.name, cmd))
        if "rxelab.launch --hosts" in cmd or "mpirun -np" in cmd:
            assert kwargs.get("asynchronous"), "a case command must be interruptible"
            return FakePromise(self.nodes, self.nodes.outputs.pop(0))
        if "hw_counters" in cmd:
            self.nodes.sent += self.nodes.per_case
            return SimpleNamespace(stdout=f"netdev_mtu 9000\nactive_mtu 4096\n"
                                          f"sent_pkts:{self.nodes.sent}\n", stderr="", exited=0)
        return SimpleNamespace(stdout="", stderr="", exited=0)

    def close(self):
        self.nodes.log.append((self.host.name, "close"))

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class FakePromise:
    """Fabric's asynchronous run: `out` is the output, an exception join() raises, or a
    KeyboardInterrupt that arrives while the runner waits (Ctrl-C during the case)."""

    def __init__(self, nodes, out):
        self.nodes, self.out, self.runner = nodes, out, self
        self.has_dead_threads = False

    @property
    def process_is_finished(self):
        if isinstance(self.out, KeyboardInterrupt):
            raise self.out
        return True

    def stop(self):
        self.nodes.log.append(("-", "channel stopped"))

    def join(self):
        if isinstance(self.out, BaseException):
            raise self.out
        return SimpleNamespace(stdout=self.out, stderr="", exited=0)


def make_runner(tmp_path, monkeypatch, toml_runs: str):
    toml = tmp_path / "t.toml"
    toml.write_text('name = "t"\n' + toml_runs)
    nodes = FakeNodes()
    monkeypatch.setattr(fleet, "connect", nodes.connect)
    r = runner.Runner(spec.load(str(toml)), Inventory("t", HOSTS), tmp_path / "results",
                      say=lambda s: None)
    return r, nodes


RXELAB = ('[[runs]]\napp = "rxelab"\nop = "alltoall"\n'
          'algorithms = ["sequential", "pairwise", "parallel"]\nnodes = [3]\nsizes = [8]\n')


def records(run_dir):
    return [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]


def cmds(nodes, needle):
    return [(h, c) for h, c in nodes.log if needle in c]


def test_wrong_data_and_missing_output_are_recorded_as_such(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, RXELAB)
    nodes.outputs += [summary(True), summary(False), "Traceback: boom"]
    out = r.run({"nodes": 3})
    recs = records(out)
    assert [x["status"] for x in recs] == ["ok", "wrong", "failed"]
    assert "boom" in recs[2]["error"]
    assert recs[0]["rxe"]["node1"] == {"sent_pkts": 300}, "counters read before and after"
    assert json.loads((out / "environment.json").read_text())["complete"] is True
    killed = {h for h, _ in cmds(nodes, "pkill")}
    assert killed == {"node1", "node2", "node3"}, "every node cleaned up afterwards"


def test_an_interrupted_run_keeps_its_records_and_removes_impairments(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, RXELAB + "netem = [{loss = 1.0}]\n")
    nodes.outputs += [summary(True), KeyboardInterrupt()]
    with pytest.raises(KeyboardInterrupt):
        r.run({"nodes": 3})
    assert [x["status"] for x in records(r.dir)] == ["ok"]
    env = json.loads((r.dir / "environment.json").read_text())
    assert env["complete"] is False and "finished" in env
    applied = cmds(nodes, "netem loss 1%")
    assert len(applied) == 2 * 3, "the impairment is set on every node of both cases"
    last_apply = max(i for i, (_, c) in enumerate(nodes.log) if "netem loss" in c)
    cleared = {h for h, c in nodes.log[last_apply:] if "tc qdisc del" in c}
    assert cleared == {"node1", "node2", "node3"}, "and removed from every node after the interrupt"
    assert (r.dir / "spec.toml").exists()
    stopped = [i for i, (_, c) in enumerate(nodes.log) if c == "channel stopped"]
    first_clear = min(i for i, (_, c) in enumerate(nodes.log) if i > last_apply and "tc qdisc del" in c)
    assert len(stopped) == 1 and last_apply < stopped[0] < first_clear, \
        "the running case's channel is closed at once, before the clean-up"


def test_mpi_over_ucx_that_moved_no_rdma_packets_is_a_failed_case(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, '[[runs]]\napp = "mpi"\nop = "alltoall"\n'
                           'nodes = [3]\nsizes = [8]\ntransport = ["ucx", "tcp"]\n')
    nodes.per_case = 0  # the RDMA device is idle: both cases went over TCP
    nodes.outputs += [summary(True, "mpi"), summary(True, "mpi")]
    recs = records(r.run({"nodes": 3}))
    assert [(x["transport"], x["status"]) for x in recs] == [("ucx", "failed"), ("tcp", "ok")]
    assert recs[0]["error"] == runner.NOT_RDMA
    ucx_cmd = cmds(nodes, "mpirun -np")[0][1]
    assert "--mca pml ucx" in ucx_cmd and "UCX_UD_ETH_DGID_CHECK=n" in ucx_cmd


def test_a_case_past_its_deadline_is_timed_out_with_partial_figures(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, RXELAB.replace('"sequential", "pairwise", ', "")
                           + "timeout_s = 30\n")
    progress = '[0] {"record": "progress", "app": "rxelab", "stages_done": 4, "seconds": 2.5}\n'
    nodes.outputs.append(CommandTimedOut(SimpleNamespace(stdout=progress, stderr=""), 90))
    (rec,) = records(r.run({"nodes": 3}))
    assert rec["status"] == "timeout" and "deadline of 30 s" in rec["error"]
    assert rec["partial"]["stages_done"] == 4
    assert {h for h, _ in cmds(nodes, "pkill")} == {"node1", "node2", "node3"}


def test_a_spec_larger_than_the_inventory_or_its_mtu_is_refused(tmp_path):
    big = spec.parse({"name": "b", "runs": [{"app": "rxelab", "op": "alltoall", "nodes": [5],
                                             "sizes": [1]}]})
    with pytest.raises(fleet.FleetError, match="needs 5 nodes, the inventory has 3"):
        runner.Runner(big, Inventory("t", HOSTS), tmp_path)
    jumbo = spec.parse({"name": "j", "runs": [{"app": "rxelab", "op": "alltoall", "nodes": [2],
                                               "sizes": [1], "mtu": [9000]}]})
    with pytest.raises(fleet.FleetError, match="MTU 9000, the lab's data network carries 1500"):
        runner.Runner(jumbo, Inventory("t", HOSTS), tmp_path, lab_mtu=1500)

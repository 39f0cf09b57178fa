"""The runner's bookkeeping with fake connections: every case recorded as it ends, a failed
verification marked, an interrupted run kept and marked incomplete, the nodes cleaned up and
their impairments removed, an MPI-over-UCX case that moved no RDMA packets refused, a case past
its deadline recorded as timed out with its partial figures."""

import json
from types import SimpleNamespace

import pytest
from invoke.exceptions import CommandTimedOut

from experiments import spec
from experiments.running import fleet, runner
from experiments.running.records import Environment
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
        self.mtu_unreadable: set[str] = set()
        self.loop_fails: set[str] = set()  # nodes where a busy neighbour's loop does not start
        self.loop_stuck: set[str] = set()  # nodes where one outlives its stop
        self.slurm = {h.name: ("slurm-" + h.name, "IDLE") for h in HOSTS}  # node -> name, state
        self.unreachable: set[str] = set()  # nodes no ping over the data network reaches

    def connect(self, host):
        return FakeConnection(self, host)


class FakeConnection:
    def __init__(self, nodes, host):
        self.nodes, self.host = nodes, host

    def run(self, cmd, **kwargs):
        self.nodes.log.append((self.host.name, cmd))
        if "rxelab.launch --hosts" in cmd or "mpirun -np" in cmd or "srun --job-name" in cmd \
                or ("ib_write_bw" in cmd and kwargs.get("asynchronous")):  # a perftest client
            assert kwargs.get("asynchronous"), "a case command must be interruptible"
            return FakePromise(self.nodes, self.nodes.outputs.pop(0))
        if "echo left" in cmd and self.host.name in self.nodes.loop_stuck:
            return SimpleNamespace(stdout="left 4242\n", stderr="", exited=0)
        if "while :; do :; done" in cmd:  # a busy neighbour's CPU loop: says its pid
            if self.host.name in self.nodes.loop_fails:
                return SimpleNamespace(stdout="", stderr="the loop ended at once", exited=1)
            return SimpleNamespace(stdout="loop 4242\n", stderr="", exited=0)
        if "ping -c" in cmd:  # experiments.running.datapath's probe, run on the case's first node
            out = "".join(f"unreachable {h.name}\n" for h in HOSTS
                          if h.name in self.nodes.unreachable and f" {h.data_ip} " in cmd)
            return SimpleNamespace(stdout=out, stderr="", exited=0)
        if "hw_counters" in cmd:
            self.nodes.sent += self.nodes.per_case
            mtu = "" if self.host.name in self.nodes.mtu_unreadable else "9000"
            return SimpleNamespace(stdout=f"netdev ens7\nnetdev_mtu {mtu}\nactive_mtu 4096\n"
                                          f"inet {self.host.data_ip}/24\n"
                                          f"sent_pkts:{self.nodes.sent}\n", stderr="", exited=0)
        if "hostname -s" in cmd:  # the srun launcher's probe: the node as Slurm knows it
            name, state = self.nodes.slurm[self.host.name]
            return SimpleNamespace(stdout=f"slurm_node {name}\nslurm_srun /usr/bin/srun\n"
                                          f"slurm_State {state}\nslurm_CPUTot 4\n",
                                   stderr="", exited=0)
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
        if isinstance(self.out, tuple):  # (output, exit code)
            return SimpleNamespace(stdout=self.out[0], stderr="", exited=self.out[1])
        return SimpleNamespace(stdout=self.out, stderr="", exited=0)


def make_runner(tmp_path, monkeypatch, toml_runs: str, launcher: str | None = None):
    toml = tmp_path / "t.toml"
    toml.write_text('name = "t"\n' + toml_runs)
    nodes = FakeNodes()
    monkeypatch.setattr(fleet, "connect", nodes.connect)
    r = runner.Runner(spec.load(str(toml)), Inventory("t", HOSTS), tmp_path / "results",
                      say=lambda s: None, launcher=launcher)
    return r, nodes


RXELAB = ('[[runs]]\napp = "rxelab"\nop = "alltoall"\n'
          'algorithms = ["sequential", "pairwise", "parallel"]\nnodes = [3]\nsizes = [8]\n')


def records(run_dir):
    return [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines()]


def cmds(nodes, needle):
    return [(h, c) for h, c in nodes.log if needle in c]


def stops(nodes, run_id):
    """Where the run's clean-up stopped its own processes (and only those: by its id)."""
    return [(h, c) for h, c in nodes.log if "/environ" in c and f"RXELAB_RUN_ID={run_id}" in c]


BW = (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
      " 1048576    200              0.53               0.528                0.000063\n")


@pytest.mark.slow
@pytest.mark.parametrize(("nodes", "server"), [(2, "node2"), (1, "node1")])
def test_a_perftest_pair_on_one_node_runs_over_its_loopback(tmp_path, monkeypatch, nodes, server):
    """perftest on 2 nodes: server on the second, client on the first; on 1 node, both on it
    (rxe's loopback, which `fab calibrate` measures)."""
    r, fake = make_runner(tmp_path, monkeypatch, '[[runs]]\napp = "perftest"\ntools = ["ib_write_bw"]\n'
                          f'nodes = [{nodes}]\nsizes = [1048576]\nstages = 200\n')
    fake.outputs.append(BW)
    (rec,) = records(r.run(Environment.model_validate({"nodes": nodes})))
    assert rec["status"] == "ok" and rec["summary"]["bw_MBps"] == pytest.approx(66.0)
    started = [(h, c) for h, c in fake.log if "ib_write_bw" in c]
    assert [h for h, _ in started] == [server, "node1"]
    assert started[0][1].endswith("&") and started[1][1].endswith(HOSTS[int(server[-1]) - 1].data_ip)


def test_wrong_data_and_missing_output_are_recorded_as_such(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, RXELAB)
    nodes.outputs += [summary(True), summary(False), "Traceback: boom"]
    out = r.run(Environment.model_validate({"nodes": 3}))
    recs = records(out)
    assert [x["status"] for x in recs] == ["ok", "wrong", "failed"]
    assert "boom" in recs[2]["error"]
    assert recs[0]["rxe"]["node1"] == {"sent_pkts": 300}, "counters read before and after"
    assert json.loads((out / "environment.json").read_text())["complete"] is True
    killed = {h for h, _ in stops(nodes, r.run_id)}
    assert killed == {"node1", "node2", "node3"}, "every node cleaned up afterwards"
    assert not cmds(nodes, "pkill") and not cmds(nodes, "tc qdisc"), "nothing else touched"
    env = json.loads((out / "environment.json").read_text())
    assert env["netdevs"] == {"node1": "ens7", "node2": "ens7", "node3": "ens7"}
    assert env["data_network"] == "10.10.0.0/24"


def test_an_interrupted_run_keeps_its_records_and_removes_impairments(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, RXELAB + "netem = [{loss = 1.0}]\n")
    nodes.outputs += [summary(True), KeyboardInterrupt()]
    with pytest.raises(KeyboardInterrupt):
        r.run(Environment.model_validate({"nodes": 3}))
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
    recs = records(r.run(Environment.model_validate({"nodes": 3})))
    assert [(x["transport"], x["status"]) for x in recs] == [("ucx", "failed"), ("tcp", "ok")]
    assert recs[0]["error"] == runner.NOT_RDMA
    ucx_cmd = cmds(nodes, "mpirun -np")[0][1]
    assert "--mca pml ucx" in ucx_cmd and "UCX_UD_ETH_DGID_CHECK=n" in ucx_cmd
    assert "oob_tcp_if_include 10.10.0.0/24" in ucx_cmd, "the network found on the nodes"


def test_a_case_past_its_deadline_is_timed_out_with_partial_figures(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, RXELAB.replace('"sequential", "pairwise", ', "")
                           + "timeout_s = 30\n")
    progress = '[0] {"record": "progress", "app": "rxelab", "stages_done": 4, "seconds": 2.5}\n'
    nodes.outputs.append(CommandTimedOut(SimpleNamespace(stdout=progress, stderr=""), 90))
    (rec,) = records(r.run(Environment.model_validate({"nodes": 3})))
    assert rec["status"] == "timeout" and "deadline of 30 s" in rec["error"]
    assert rec["partial"]["stages_done"] == 4
    assert {h for h, _ in stops(nodes, r.run_id)} == {"node1", "node2", "node3"}


def test_a_spec_larger_than_the_inventory_or_its_mtu_is_refused(tmp_path):
    big = spec.parse({"name": "b", "runs": [{"app": "rxelab", "op": "alltoall", "nodes": [5],
                                             "sizes": [1]}]})
    with pytest.raises(fleet.FleetError, match="needs 5 nodes, the inventory has 3"):
        runner.Runner(big, Inventory("t", HOSTS), tmp_path)
    jumbo = spec.parse({"name": "j", "runs": [{"app": "rxelab", "op": "alltoall", "nodes": [2],
                                               "sizes": [1], "mtu": [9000]}]})
    with pytest.raises(fleet.FleetError, match="MTU 9000, the lab's data network carries 1500"):
        runner.Runner(jumbo, Inventory("t", HOSTS), tmp_path, lab_mtu=1500)


def test_a_full_disk_at_the_end_still_cleans_the_nodes_up(tmp_path, monkeypatch):
    """Before, environment.json was written before the clean-up: a full disk left netem and
    MTU changes on every node."""
    r, nodes = make_runner(tmp_path, monkeypatch, RXELAB.replace('"sequential", "pairwise", ', "")
                           + "netem = [{loss = 1.0}]\nmtu = [1500]\n")
    nodes.outputs.append(summary(True))
    writes = []

    def write_env(state):
        writes.append(state)
        if len(writes) > 1:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(r, "_write_env", write_env)
    with pytest.raises(OSError, match="No space left"):
        r.run(Environment.model_validate({"nodes": 3}))
    undone = {h for h, c in nodes.log if "/environ" in c and "mtu 9000" in c}
    assert undone == {"node1", "node2", "node3"}, "the run's clean-up reached every node"


def test_only_what_a_case_changed_is_undone_and_only_where(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, RXELAB.replace('"sequential", "pairwise", ', "")
                           .replace("nodes = [3]", "nodes = [2]") + "netem = [{}, {loss = 1.0}]\n")
    nodes.outputs += [summary(True), summary(True)]
    r.run(Environment.model_validate({"nodes": 3}))
    touched = {h for h, c in nodes.log if "tc qdisc" in c or "$tc" in c}
    assert touched == {"node1", "node2"}, "node3 took no part: its qdisc is never looked at"
    first_case = [c for h, c in nodes.log if "rxelab.launch" in c][0]
    before_first = nodes.log[:[c for _, c in nodes.log].index(first_case)]
    assert not any("tc qdisc" in c for _, c in before_first), "the unimpaired case touched no qdisc"
    assert not any("ip link set" in c for _, c in nodes.log), "no MTU was changed, none is set"


@pytest.mark.slow
def test_the_load_sampler_understands_what_the_runner_tells_it(tmp_path, monkeypatch):
    import shlex

    from apps import load_sampler

    r, nodes = make_runner(tmp_path, monkeypatch, RXELAB.replace('"sequential", "pairwise", ', "")
                           + "sample_load = true\n")
    nodes.outputs.append(summary(True))
    r.run(Environment.model_validate({"nodes": 3}))
    (_, cmd), *_ = cmds(nodes, "load_sampler.py")
    assert f"RXELAB_RUN_ID={r.run_id}-load" in cmd and '"$HOME"/rxelab/runs/' in cmd
    argv = shlex.split(cmd.split("load_sampler.py", 1)[1].split(">/dev/null")[0])
    assert "--netdev=ens7" in argv, "the NIC found on the node, not data0"
    argv = [a for a in argv if not a.startswith(("--netdev", "--duration"))]
    argv[argv.index("--out") + 1] = str(tmp_path / "load.jsonl")
    argv += ["--netdev=lo", "--duration=0.3"]  # what this host has
    assert load_sampler.main(argv) == 0
    assert json.loads((tmp_path / "load.jsonl").read_text().splitlines()[0])["tx_bytes"] >= 0


def test_an_mtu_that_cannot_be_read_is_not_changed(tmp_path, monkeypatch):
    """Before, the original MTU was recorded as 0 and the new one set anyway: never put back."""
    r, nodes = make_runner(tmp_path, monkeypatch, RXELAB.replace('"sequential", "pairwise", ', "")
                           + "mtu = [1500]\n")
    nodes.mtu_unreadable.add("node2")
    (rec,) = records(r.run(Environment.model_validate({"nodes": 3})))
    assert rec["status"] == "failed" and "cannot read node2's data NIC MTU" in rec["error"]
    assert not cmds(nodes, "mtu 1500"), "no MTU was changed anywhere"


def test_rounds_alternate_the_cases_and_back_to_back_reaches_the_apps(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, "rounds = 3\n" + RXELAB + "tight = true\n"
                           '[[runs]]\napp = "mpi"\nop = "alltoall"\nnodes = [3]\nsizes = [8]\n'
                           'transport = "ucx"\ntight = true\n')
    nodes.outputs = [summary(True, "rxelab")] * 3 + [summary(True, "mpi")]
    nodes.outputs = nodes.outputs * 3
    got = records(r.run(Environment.model_validate({})))
    assert [(x["round"], x["case"]) for x in got] == \
        [(rnd, i) for rnd in range(3) for i in range(4)], "A, B, A, B: every case once per round"
    launched = cmds(nodes, "rxelab.launch --hosts") + cmds(nodes, "mpirun -np")
    assert len(launched) == 12 and all(" --tight" in c for _, c in launched)


GLOO = ('[[runs]]\napp = "gloo"\nop = "allreduce"\nnodes = [3]\nsizes = [8]\n'
        '[[runs]]\napp = "rxelab"\nop = "allreduce"\nalgorithms = ["ring"]\nnodes = [3]\nsizes = [8]\n')


def test_gloo_runs_under_our_launcher_where_every_node_has_torch(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, GLOO)
    nodes.outputs += [summary(True, "gloo"), summary(True)]
    torch = {h.name: {"torch": "1.13.1"} for h in HOSTS}
    recs = records(r.run(Environment.model_validate({"nodes": 3, "hosts": torch})))
    assert [(x["app"], x["status"]) for x in recs] == [("gloo", "ok"), ("rxelab", "ok")]
    (host, cmd), _ = cmds(nodes, "rxelab.launch --hosts")
    assert host == "node1" and "apps/gloo_compare.py --op allreduce --algorithm gloo-default" in cmd
    assert f"RXELAB_RUN_ID={r.run_id}" in cmd, "its ranks carry the run's id: the clean-up finds them"


def test_gloo_cases_are_not_run_and_say_why_where_a_node_has_no_torch(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, GLOO)
    nodes.outputs += [summary(True)]  # only the rxelab case runs
    hosts = {"node1": {"torch": "1.13.1"}, "node2": {"torch": None}}  # node3 said nothing
    recs = records(r.run(Environment.model_validate({"nodes": 3, "hosts": hosts})))
    assert [(x["app"], x["status"]) for x in recs] == [("gloo", "skipped"), ("rxelab", "ok")]
    assert recs[0]["error"] == f"{runner.NO_TORCH} (node2, node3)"
    assert not cmds(nodes, "gloo_compare"), "nothing was started for it"
    assert not cmds(nodes, "sudo -n"), "nothing was changed for it"


def test_a_run_says_what_its_spec_included_and_keeps_a_copy(tmp_path, monkeypatch):
    """include = ["calibrate"]: the run's environment says so (fab calibrate and fab validate
    read it), its copy of the included spec is kept beside spec.toml, and the included runs
    come first."""
    r, nodes = make_runner(tmp_path, monkeypatch, 'include = ["calibrate"]\n' + RXELAB)
    nodes.outputs += [summary(True), KeyboardInterrupt()]
    with pytest.raises(KeyboardInterrupt):
        r.run(Environment.model_validate({"nodes": 3}))
    assert json.loads((r.dir / "environment.json").read_text())["includes"] == ["calibrate"]
    assert (r.dir / "include-calibrate.toml").read_text() == \
        (spec.SPECS / "calibrate.toml").read_text()
    first = records(r.dir)[0]
    assert (first["algorithm"], first["nodes"], first["size"], first["included"]) == \
        ("pairwise", 1, 0, "calibrate"), "the record says which include brought the case in"



def test_a_failed_case_after_which_a_node_is_unreachable_stops_the_run(tmp_path, monkeypatch):
    """A node whose data NIC stopped sending would fail every later case after the join
    timeout: the data path is looked at after each failed case (not after an ok one), and the
    run stops at the first that finds a node gone, naming it, its records kept."""
    r, nodes = make_runner(tmp_path, monkeypatch, RXELAB)
    nodes.outputs += [summary(True), "ranks [2] did not join within 60 s", "Traceback: boom"]
    out = r.run(Environment(nodes=3))  # every node still reachable: the run goes on to its end
    assert [x["status"] for x in records(out)] == ["ok", "failed", "failed"]
    assert len(cmds(nodes, "ping -c")) == 2, "looked at after the failed cases only"
    assert all(h == "node1" for h, _ in cmds(nodes, "ping -c"))

    (tmp_path / "b").mkdir()
    r, nodes = make_runner(tmp_path / "b", monkeypatch, RXELAB)
    nodes.unreachable.add("node3")
    nodes.outputs += [summary(True), "ranks [2] did not join within 60 s", summary(True)]
    with pytest.raises(fleet.FleetError, match="node1 no longer reaches node3 over the data"):
        r.run(Environment.model_validate({"nodes": 3}))
    assert [x["status"] for x in records(r.dir)] == ["ok", "failed"]
    assert json.loads((r.dir / "environment.json").read_text())["complete"] is False
    assert {h for h, _ in stops(nodes, r.run_id)} == {"node1", "node2", "node3"}

"""A spec's `launcher = "srun"` (issue 28): the commands Slurm starts, run through a real shell
against fake srun, squeue and scancel that record what reached them; the nodes named as Slurm
knows them; the runner's cases, records and clean-up under srun; the spec key and the CLI's
override; Gloo's app finding torchrun's variables in Slurm's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import spec
from experiments.running import commands, fleet, runner, srun
from experiments.running.records import Environment
from infra.inventory import Host, Inventory, RdmaEndpoint, SSHEndpoint
from tests.unit.test_runner_flow import HOSTS, cmds, make_runner, records, summary

RUN = "0123456789ab"
NODES = ["c-01", "c-02", "c-03"]
CASE = {"app": "rxelab", "op": "alltoall", "algorithm": "sequential", "nodes": 3, "size": 4096,
        "stages": 5, "warmup": 1, "transport": None, "sample_load": False, "netem": {},
        "mtu": None, "timeout_s": None}
MPI = {**CASE, "app": "mpi", "algorithm": "mpi-pairwise", "transport": "ucx"}

# A fake srun: its argv and the environment it was started with, as one JSON line.
FAKE_SRUN = """#!/usr/bin/env python3
import json, os, sys
keep = {k: v for k, v in os.environ.items()
        if k.startswith(("OMPI_MCA_", "UCX_", "RXELAB_", "MASTER_", "RANK", "WORLD_SIZE", "GLOO_"))}
print(json.dumps({"argv": sys.argv[1:], "env": keep}))
"""


def fake_bin(tmp_path: Path, **scripts: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    # a minimal environment: none of the developer's own UCX_*, OMPI_MCA_* or SLURM_* settings
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path / "a b"), "LANG": "C.UTF-8"}


def started(tmp_path: Path, command: str) -> dict:
    """What srun received when a remote shell ran `command`."""
    env = fake_bin(tmp_path, srun=FAKE_SRUN)
    r = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_srun_starts_the_demo_app_on_slurms_nodes_with_nothing_exported(tmp_path):
    got = started(tmp_path, srun.rxelab_command(spec.Case(**CASE, ranks_per_node=2), NODES, RUN))
    argv, app = got["argv"], got["argv"][got["argv"].index("--quiet") + 1:]
    assert f"--job-name=rxelab-{RUN}" in argv and "--nodelist=c-01,c-02,c-03" in argv
    assert "--nodes=3" in argv and "--ntasks-per-node=2" in argv
    assert "--input=none" in argv, "srun would give the SSH session's input to task 0"
    assert "--kill-on-bad-exit=1" in argv and any(a.startswith("--time=") for a in argv)
    assert {"--export=ALL", "--distribution=block", f"--immediate={srun.ALLOCATE_S}"} <= set(argv), \
        "the caller's SLURM_EXPORT_ENV or SLURM_DISTRIBUTION cannot change the ranks' settings " \
        "or rank 0's node"
    home = str(tmp_path / "a b")
    assert app[:2] == [f"{home}/rxelab/venv/bin/python3", f"{home}/rxelab/apps/server_client.py"], \
        "the venv's python, in a home with a space, one word each"
    assert app[2:6] == ["--op", "alltoall", "--algorithm", "sequential"]
    assert "rxelab.launch" not in argv and "--port" not in app and "--secret" not in " ".join(app)
    assert got["env"] == {"RXELAB_RUN_ID": RUN}, "the ranks carry the run's id, nothing else set"


def test_srun_starts_open_mpi_with_the_same_settings_as_mpirun(tmp_path):
    """One place says how Open MPI runs: what mpirun passes as --mca and -x reaches srun's
    ranks as OMPI_MCA_* and UCX_* variables."""
    for case in map(spec.Case.model_validate,
                    (MPI, {**MPI, "transport": "tcp"}, {**MPI, "algorithm": "mpi-default"})):
        got = started(tmp_path, srun.mpi_command(case, HOSTS, NODES, "10.10.0.0/24", RUN))
        argv = got["argv"]
        app = next(i for i, a in enumerate(argv) if a.endswith("apps/mpi_compare.py"))
        assert "--mpi=pmix" in argv[:app] and argv[app - 1].endswith("/venv/bin/python3")
        mca, env = commands.mpi_settings(case, HOSTS, "10.10.0.0/24")
        expected = {**{f"OMPI_MCA_{k}": v for k, v in mca.items()}, **env, "RXELAB_RUN_ID": RUN}
        assert got["env"] == expected
        mpirun = commands.mpi_command(case, HOSTS, "10.10.0.0/24", RUN)
        for k, v in mca.items():
            assert f"--mca {k} {commands.shlex.quote(v)}" in mpirun
    assert f"--wait={srun.MPI_WAIT_S}" in got["argv"], "a rank stuck in finalize is ended"
    ucx = started(tmp_path, srun.mpi_command(spec.Case(**MPI), HOSTS, NODES, "10.10.0.0/24", RUN))["env"]
    assert ucx["OMPI_MCA_pml"] == "ucx" and ucx["OMPI_MCA_btl"] == "^openib,uct"
    assert ucx["UCX_UD_ETH_DGID_CHECK"] == "n" and ucx["UCX_NET_DEVICES"] == "rxe0:1"
    assert ucx["OMPI_MCA_coll_tuned_alltoall_algorithm"] == "2"
    tcp = started(tmp_path, srun.mpi_command(spec.Case(**{**MPI, "transport": "tcp"}), HOSTS, NODES,
                                             "10.10.0.0/24", RUN))["env"]
    assert tcp["OMPI_MCA_btl"] == "tcp,self" and tcp["OMPI_MCA_btl_tcp_if_include"] == "10.10.0.0/24"
    assert not any(k.startswith("UCX_") for k in tcp)


FAKE_SQUEUE = """#!/bin/sh
echo "$@" >> "$LOG"
case "$*" in *"--user=$(id -un)"*"--name=rxelab-0123456789ab"*) printf '41\\n43\\n';; esac
"""
FAKE_SCANCEL = """#!/bin/sh
echo "scancel $@" >> "$LOG"
"""


@pytest.mark.parametrize("run_id, cancelled", [(RUN, "scancel 41 43"), ("ffffffffffff", None)])
def test_the_clean_up_cancels_this_runs_jobs_of_this_user_by_their_ids(tmp_path, run_id, cancelled):
    env = {**fake_bin(tmp_path, squeue=FAKE_SQUEUE, scancel=FAKE_SCANCEL),
           "LOG": str(tmp_path / "log")}
    r = subprocess.run(["sh", "-c", srun.cancel_command(run_id) + "; echo survived"],
                       capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and "survived" in r.stdout
    log = (tmp_path / "log").read_text().splitlines()
    assert f"--name=rxelab-{run_id}" in log[0] and "--noheader" in log[0]
    assert [x for x in log if x.startswith("scancel")] == ([cancelled] if cancelled else [])


@pytest.mark.parametrize("found, why", [
    ({"node": "node1", "srun": "", "state": "IDLE"}, "no srun on this node"),
    ({"node": "node1", "srun": "/usr/bin/srun", "state": ""}, "Slurm knows no node 'node1'"),
    ({"node": "node1", "srun": "/usr/bin/srun", "state": "IDLE+DRAIN"}, "is IDLE+DRAIN: it takes no job"),
    ({"node": "node1", "srun": "/usr/bin/srun", "state": "IDLE*"}, "is IDLE*"),  # not responding
    ({"node": "node1", "srun": "/usr/bin/srun", "state": "MIXED+MAINTENANCE"}, "it takes no job"),
    ({"node": "node1", "srun": "/usr/bin/srun", "state": "IDLE+POWERED_DOWN"}, None),  # resumed
    ({"node": "a;rm -rf ~", "srun": "/usr/bin/srun", "state": "IDLE"}, "is not a Slurm node name"),
    ({"node": "node1", "srun": "/usr/bin/srun", "state": "MIXED"}, None),
])
def test_a_node_slurm_cannot_use_is_named_with_the_reason(found, why):
    host = HOSTS[0]
    got = srun.node_problem(host, found)
    if why is None:
        assert got is None
    else:
        assert got is not None and got.startswith("node1: ") and why in got


FAKE_SCONTROL = """#!/bin/sh
[ "$*" = "show node -o $(hostname -s)" ] || exit 1
echo "NodeName=$(hostname -s) Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=4 CPUTot=4 \
State=IDLE+DRAIN ThreadsPerCore=1 Partitions=lab Reason=was State=IDLE CPUTot=64 [root@x]"
"""


def test_the_probe_reads_a_nodes_slurm_name_state_and_cpus_through_a_shell(tmp_path):
    """The first State= and CPUTot= of scontrol's line: an admin's Reason may say anything."""
    env = fake_bin(tmp_path, scontrol=FAKE_SCONTROL, srun="#!/bin/sh\n")
    r = subprocess.run(["sh", "-c", srun.PROBE], capture_output=True, text=True, env=env, timeout=30)
    got = srun.parse_probe(r.stdout)
    name = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert got == {"node": name, "srun": str(tmp_path / "bin" / "srun"), "state": "IDLE+DRAIN",
                   "cputot": "4"}
    assert "it takes no job" in srun.node_problem(HOSTS[0], got)


def test_two_hosts_that_are_one_slurm_node_or_too_few_cpus_are_refused():
    nodes = {"node1": "c1", "node2": "c1", "node3": "c3"}
    assert srun.placement_problems(nodes, {"node1": 4, "node2": 4, "node3": 2}, 3) == [
        "node1, node2 are one Slurm node, c1",
        "node3 (c3) has 2 CPUs in Slurm, the spec asks for 3 ranks per node"]
    assert srun.placement_problems({"node1": "c1", "node2": "c2"}, {"node1": 4}, 4) == []


RUNS = ('[[runs]]\napp = "rxelab"\nop = "alltoall"\nalgorithms = ["pairwise"]\nnodes = [3]\nsizes = [8]\n'
        '[[runs]]\napp = "mpi"\nop = "alltoall"\nnodes = [2]\nsizes = [8]\ntransport = ["ucx"]\n'
        '[[runs]]\napp = "perftest"\nnodes = [2]\nsizes = [8]\n')


def test_the_runner_starts_every_job_through_srun_and_cancels_its_own(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, RUNS, launcher="srun")
    nodes.outputs += [summary(True), summary(True, "mpi")]
    monkeypatch.setattr(r, "_perftest", lambda case, hosts: " 8 200 1.0 1.0 0.1\n")
    out = r.run(Environment.model_validate({"nodes": 3}))
    recs = records(out)
    assert [(x["app"], x["launcher"]) for x in recs] == [
        ("rxelab", "srun"), ("mpi", "srun"), ("perftest", "ssh")]
    launched = cmds(nodes, "srun --job-name")
    assert [h for h, _ in launched] == ["node1", "node1"]
    assert "--nodelist=slurm-node1,slurm-node2,slurm-node3" in launched[0][1]
    assert "--nodelist=slurm-node1,slurm-node2 " in launched[1][1] and "--mpi=pmix" in launched[1][1]
    assert not cmds(nodes, "rxelab.launch") and not cmds(nodes, "mpirun")
    cancels = cmds(nodes, "scancel")
    assert [h for h, _ in cancels] == ["node1"], "cancelled once, from where the jobs started"
    assert f"--name=rxelab-{r.run_id}" in cancels[0][1]
    env = json.loads((out / "environment.json").read_text())
    assert env["launcher"] == "srun" and env["slurm_nodes"]["node2"] == "slurm-node2"


def test_a_failed_case_under_srun_is_cancelled_at_once(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, RUNS.split("[[runs]]\napp = \"mpi\"")[0],
                           launcher="srun")
    nodes.outputs += ["srun: error: node2: task 1: Exited with exit code 1"]
    recs = records(r.run(Environment.model_validate({"nodes": 3})))
    assert recs[0]["status"] == "failed" and "task 1: Exited" in recs[0]["error"]
    assert len(cmds(nodes, "scancel")) == 2, "after the case, and in the run's clean-up"


def test_figures_that_came_before_a_bad_end_are_kept_and_the_end_is_said(tmp_path, monkeypatch):
    """Open MPI under srun may hang in finalize after its figures: srun --wait ends it, the
    case keeps its verified figures and says how the job ended."""
    r, nodes = make_runner(tmp_path, monkeypatch, RUNS.split("[[runs]]\napp = \"perftest\"")[0],
                           launcher="srun")
    hung = summary(True, "mpi") + "\nsrun: error: node1: task 0: Killed\n"
    nodes.outputs += [summary(True), (hung, 137)]
    recs = records(r.run(Environment.model_validate({"nodes": 3})))
    assert [x["status"] for x in recs] == ["ok", "ok"]
    assert "after_summary" not in recs[0]
    assert len(cmds(nodes, "scancel")) == 2, "the stuck job is cancelled after its case, then at the end"
    assert recs[1]["after_summary"].startswith("exit 137: ") and "task 0: Killed" in recs[1]["after_summary"]


def test_a_spec_that_srun_cannot_place_stops_the_run_before_any_case(tmp_path, monkeypatch):
    per_node = RUNS.replace('nodes = [3]\nsizes = [8]\n', 'nodes = [3]\nsizes = [8]\nranks_per_node = 8\n', 1)
    r, nodes = make_runner(tmp_path, monkeypatch, per_node, launcher="srun")
    nodes.slurm["node2"] = nodes.slurm["node1"]
    with pytest.raises(fleet.FleetError) as e:
        r.run(Environment.model_validate({"nodes": 3}))
    assert "node1, node2 are one Slurm node, slurm-node1" in str(e.value)
    assert "has 4 CPUs in Slurm, the spec asks for 8 ranks per node" in str(e.value)
    assert not cmds(nodes, "srun --job-name")


def test_gloo_under_srun_is_told_the_data_nic(tmp_path, monkeypatch):
    """A node's name may resolve to another network (on the lab, node1 to 127.0.1.1 on node1):
    Gloo is given the NIC behind the RDMA device, found on the nodes."""
    gloo = '[[runs]]\napp = "gloo"\nop = "allreduce"\nnodes = [3]\nsizes = [8]\n'
    r, nodes = make_runner(tmp_path, monkeypatch, gloo, launcher="srun")
    nodes.outputs += [summary(True, "gloo")]
    recs = records(r.run(Environment.model_validate(
        {"nodes": 3, "hosts": {h.name: {"torch": "1.13.1"} for h in HOSTS}})))
    assert recs[0]["status"] == "ok" and recs[0]["launcher"] == "srun"
    (_, cmd), = cmds(nodes, "srun --job-name")
    assert "GLOO_SOCKET_IFNAME=ens7 " in cmd and "gloo_compare.py" in cmd
    got = started(tmp_path, srun.gloo_command(spec.Case(**CASE), NODES, RUN, "data 0"))
    assert got["env"] == {"RXELAB_RUN_ID": RUN, "GLOO_SOCKET_IFNAME": "data 0"}, "quoted, one word"
    assert "--mpi=pmix" not in got["argv"]
    assert any(a.endswith("apps/gloo_compare.py") for a in got["argv"])


def test_the_cli_launcher_overrides_the_specs(tmp_path, monkeypatch):
    only_rxelab = RUNS.split("[[runs]]\napp = \"mpi\"")[0]
    r, nodes = make_runner(tmp_path, monkeypatch, 'launcher = "srun"\n' + only_rxelab, launcher="ssh")
    nodes.outputs += [summary(True)]
    assert [x["launcher"] for x in records(r.run(Environment.model_validate({"nodes": 3})))] == ["ssh"]
    assert cmds(nodes, "rxelab.launch --hosts") and not cmds(nodes, "srun") and not cmds(nodes, "scancel")


def test_a_node_slurm_does_not_know_stops_the_run_before_any_case(tmp_path, monkeypatch):
    r, nodes = make_runner(tmp_path, monkeypatch, RUNS, launcher="srun")
    nodes.slurm["node3"] = ("node3", "")
    nodes.slurm["node2"] = ("node2", "DOWN+NOT_RESPONDING")
    with pytest.raises(fleet.FleetError) as e:
        r.run(Environment.model_validate({"nodes": 3}))
    assert "node3: Slurm knows no node 'node3'" in str(e.value)
    assert "node2: Slurm node node2 is DOWN+NOT_RESPONDING" in str(e.value)
    assert not cmds(nodes, "srun --job-name")


def test_the_spec_chooses_the_launcher_and_an_elastic_scenario_keeps_its_own(tmp_path):
    doc = {"name": "s", "launcher": "srun", "runs": [{"app": "rxelab", "op": "alltoall",
                                                       "sizes": [8]}]}
    assert spec.parse(doc).launcher == "srun"
    assert spec.parse({**doc, "launcher": "ssh"}).launcher == "ssh"
    assert spec.parse({k: v for k, v in doc.items() if k != "launcher"}).launcher == "ssh"
    with pytest.raises(spec.SpecError, match="launcher: must be one of ssh, srun, not 'mpirun'"):
        spec.parse({**doc, "launcher": "mpirun"})
    elastic = {"name": "e", "launcher": "srun", "elastic": {"events": [{"step": 3, "kill": 1}]}}
    with pytest.raises(spec.SpecError, match="elastic scenario starts its own ranks"):
        spec.parse(elastic)
    plain = spec.parse({**elastic, "launcher": "ssh"})
    with pytest.raises(fleet.FleetError, match=r"is a scenario \(\[elastic\] or \[ddp\]\)"):
        runner.Runner(plain, Inventory("t", HOSTS), tmp_path, launcher="srun")
    with pytest.raises(fleet.FleetError, match="launcher 'pbs'"):
        runner.Runner(spec.parse(doc), Inventory("t", HOSTS), tmp_path, launcher="pbs")


@pytest.mark.slow
def test_the_cli_refuses_an_unknown_launcher_before_touching_a_node(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fabric", "run-experiment", "--spec", "smoke",
                        "--launcher", "pbs", "--inventory", str(tmp_path / "none.json")],
                       capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 1 and "--launcher 'pbs': must be one of ssh, srun" in r.stderr
    assert "Traceback" not in r.stderr


def test_gloos_app_takes_torchruns_variables_from_slurms():
    from apps import gloo_compare

    slurm = {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_JOB_ID": "77",
             "SLURM_STEP_ID": "1", "SLURM_STEP_NODELIST": "c-[01-03]", "SLURM_JOB_NODELIST": "c-[01-04]"}
    got = gloo_compare.from_slurm(slurm)
    assert got == {"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "c-01",
                   "MASTER_PORT": str(12000 + (77 * 16 + 1) % 20000)}
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert gloo_compare.from_slurm({**slurm, **torchrun}) == {}, "torchrun's own win"
    assert gloo_compare.from_slurm({"PATH": "/bin"}) == {}


def test_a_host_of_another_cluster_keeps_its_own_rdma_device_under_srun(tmp_path):
    roce = [Host(f"h{i}", SSHEndpoint("h"), f"10.0.0.{i}", RdmaEndpoint("mlx5_1", 2, 3))
            for i in (1, 2)]
    got = started(tmp_path, srun.mpi_command(spec.Case(**{**MPI, "nodes": 2}), roce, ["h1", "h2"],
                                             "10.0.0.0/24", RUN))
    assert got["env"]["UCX_NET_DEVICES"] == "mlx5_1:2" and got["env"]["UCX_IB_GID_INDEX"] == "3"


def test_the_report_states_the_launcher(tmp_path):
    from experiments.report import run_facts

    assert any(x.startswith("launcher: srun (Slurm started every rank")
               for x in run_facts.facts(Environment.model_validate({"launcher": "srun"}), tmp_path))
    assert any(x.startswith("launcher: ssh (our launcher")
               for x in run_facts.facts(Environment.model_validate({"launcher": "ssh"}), tmp_path))
    assert any(x.startswith("launcher: ssh (our launcher") and "before launchers were recorded" in x
               for x in run_facts.facts(Environment(), tmp_path)), "runs before the key were all over SSH"


def test_the_report_says_which_cases_ended_badly_after_their_figures():
    from experiments import report

    base = {"case": 0, "app": "mpi", "transport": "ucx", "op": "alltoall",
            "algorithm": "mpi-default", "status": "ok"}
    lines = report.summary_lines([], [report.Record(**base, after_summary="exit 137: task 1: Killed"),
                                      report.Record(**{**base, "transport": "tcp"})], [])
    said = [x for x in lines if "did not end well" in x]
    assert said == ["1 mpi-ucx cases printed verified figures, then their job did not end well "
                    "(kept; records' after_summary): exit 137: task 1: Killed"]

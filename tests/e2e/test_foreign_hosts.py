"""Someone else's machines, as the tools meet them (issue 15): the lab's own VMs disguised - the
data NIC renamed ens7, the RDMA device renamed roce0, node names (alpha, beta, gamma) that
resolve nowhere, a hand-written inventory - with a user's own things on them: an MPI job of
theirs, a qdisc of their own on the data NIC, a ~/rxelab that is not ours. `make status`,
`fab deploy`, a run with every kind of case (MPI over UCX and TCP included) and `fab report` must all work,
and everything of the user's must be as it was. The disguise is undone afterwards, also when
a test fails."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.config import REPO

from .test_experiments import fab

pytestmark = pytest.mark.vm

NAMES = ("alpha", "beta", "gamma")
# Renaming a link needs it down; networkd then drops its address (it matched the old name),
# so it is put back by hand. rxe follows its netdev; `rdma dev set` renames the device live.
DISGUISE = (
    'set -e; ip=$(ip -4 -o addr show dev data0 | awk \'{print $4}\'); '
    "sudo rdma dev set rxe0 name roce0; sudo ip link set data0 down; "
    "sudo ip link set data0 name ens7; sudo ip link set ens7 up; sudo ip addr replace \"$ip\" dev ens7; "
    # a user's own: an MPI job, a qdisc on the data NIC
    "(exec -a mpirun sleep 3600 </dev/null >/dev/null 2>&1 &); "
    "sudo tc qdisc replace dev ens7 root handle 1: pfifo limit 777"
)
UNDISGUISE = (
    "pkill -u \"$(id -un)\" -x -f 'mpirun 3600'; "
    "if ip link show ens7 >/dev/null 2>&1; then ip=$(ip -4 -o addr show dev ens7 | awk '{print $4}'); "
    "sudo tc qdisc del dev ens7 root 2>/dev/null; sudo ip link set ens7 down; "
    "sudo ip link set ens7 name data0; sudo ip link set data0 up; "
    "[ -z \"$ip\" ] || sudo ip addr replace \"$ip\" dev data0; fi; "
    "rdma dev show roce0 >/dev/null 2>&1 && sudo rdma dev set roce0 name rxe0; "
    "sudo systemctl restart rxe0.service; "
    "for i in $(seq 60); do "
    "[ \"$(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null)\" = '4: ACTIVE' ] && break; "
    "sleep 1; done; rdma link show rxe0/1"
)


@pytest.fixture(scope="module")
def foreign(lab, tmp_path_factory) -> Iterator[Path]:
    """The hand-written inventory of the disguised nodes."""
    if lab.borrowed:
        pytest.skip("RXELAB_TEST_STATE names a developer's lab, which the tests do not rename")
    doc = {"version": 1, "lab": "theirs", "nodes": [
        {"name": name, "ssh": {"host": h.ssh.host, "port": h.ssh.port, "user": h.ssh.user,
                               "key": h.ssh.key, "known_hosts": h.ssh.known_hosts},
         "data_ip": h.data_ip, "rdma": {"device": "roce0", "port": 1, "gid_index": h.rdma.gid_index}}
        for name, h in zip(NAMES, lab.hosts, strict=True)]}
    path = tmp_path_factory.mktemp("foreign") / "inventory.json"
    path.write_text(json.dumps(doc, indent=1))
    try:
        for h in lab.hosts:
            r = lab.ssh(h, DISGUISE)
            assert r.returncode == 0, f"{h.name}: {r.stdout}{r.stderr}"
        yield path
    finally:
        for h in lab.hosts:
            r = lab.ssh(h, UNDISGUISE, timeout=180)
            assert "state ACTIVE" in r.stdout, f"{h.name} not restored: {r.stdout}{r.stderr}"


def test_make_status_finds_the_renamed_devices(lab, foreign):
    r = subprocess.run(["make", "status", f"INVENTORY={foreign}"], cwd=REPO, env=lab.env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith(("│ alpha", "│ beta", "│ gamma"))]
    assert len(rows) == 3 and all("ACTIVE" in x and "ens7 9000 / rdma 4096" in x for x in rows), r.stdout


def test_deploy_refuses_a_home_directory_that_is_not_ours(lab, foreign):
    node = lab.hosts[1]
    assert lab.ssh(node, "mv rxelab rxelab.ours 2>/dev/null; mkdir rxelab && echo thesis > rxelab/mine"
                   ).returncode == 0
    try:
        r = fab(lab, "deploy", "--inventory", str(foreign), timeout=300)
        assert r.returncode == 1 and "beta: ~/rxelab exists and was not made by rxelab" in r.stderr, \
            r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        assert lab.ssh(node, "cat rxelab/mine").stdout.strip() == "thesis", "a user's file was touched"
    finally:
        lab.ssh(node, "rm -rf rxelab && (mv rxelab.ours rxelab 2>/dev/null || true)")


# Every way a run meets a host's names, once: our app (the RDMA device and its GID), MPI over
# UCX (UCX_NET_DEVICES) and over TCP (the data network's CIDR), perftest, the rxe counters
# and the report. The smoke spec's other cases differ only in algorithm, which no name
# touches: test_experiments runs them all.
FOREIGN_SPEC = """name = "foreign"
[[runs]]
app = "rxelab"
op = "alltoall"
algorithms = ["parallel"]
nodes = [3]
sizes = [4096]
stages = 5

[[runs]]
app = "mpi"
op = "alltoall"
algorithms = ["mpi-default"]
nodes = [3]
sizes = [4096]
stages = 5
transport = ["ucx", "tcp"]

[[runs]]
app = "perftest"
tools = ["ib_write_bw"]
nodes = [2]
sizes = [65536]
stages = 200
"""


@pytest.fixture(scope="module")
def smoke_run(lab, foreign, tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("foreign-results")
    spec = results.parent / "foreign.toml"
    spec.write_text(FOREIGN_SPEC)
    r = fab(lab, "run-experiment", "--spec", str(spec), "--inventory", str(foreign), "--results",
            str(results))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    (run,) = list(results.iterdir())
    return run


def test_every_kind_of_case_passes_mpi_included(smoke_run):
    records = [json.loads(x) for x in (smoke_run / "records.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok"] * len(records), [r.get("error") for r in records]
    assert {r["app"] for r in records} == {"rxelab", "mpi", "perftest"}
    assert {r["transport"] for r in records if r["app"] == "mpi"} == {"ucx", "tcp"}
    for r in records:
        assert r["hosts"][0] in NAMES
        sent = sum(d.get("sent_pkts", 0) for d in r["rxe"].values())
        assert (sent == 0) == (r.get("transport") == "tcp"), (r["app"], r.get("transport"), sent)
    env = json.loads((smoke_run / "environment.json").read_text())
    assert env["netdevs"] == dict.fromkeys(NAMES, "ens7") and env["data_network"] == "10.10.0.0/24"
    assert env["ucx_settings"]["UCX_NET_DEVICES"] == "roce0:1"
    assert env["virtualization"] in ("qemu", "kvm") and env["versions"]["open_mpi"]


def test_the_users_own_job_and_qdisc_are_untouched(lab, smoke_run):
    for h in lab.hosts:
        out = lab.ssh(h, "pgrep -x -f 'mpirun 3600' >/dev/null && echo job-alive; "
                         "/sbin/tc qdisc show dev ens7 root").stdout
        assert "job-alive" in out, f"{h.name}: the user's mpirun was killed"
        assert "pfifo 1: root" in out and "limit 777" in out, f"{h.name}: the user's qdisc: {out}"


def test_netem_does_not_replace_a_qdisc_of_the_users(lab, foreign, smoke_run, tmp_path):
    """netem replaces the root qdisc, so it goes only where the kernel's default is: on these
    hosts the case is refused, and the user's qdisc stays."""
    spec = tmp_path / "impaired.toml"
    spec.write_text('name = "impaired"\n[[runs]]\napp = "rxelab"\nop = "alltoall"\n'
                    'algorithms = ["parallel"]\nnodes = [2]\nsizes = [8]\nstages = 2\n'
                    'netem = [{delay_ms = 1}]\n')
    results = tmp_path / "res"
    r = fab(lab, "run-experiment", "--spec", str(spec), "--inventory", str(foreign),
            "--results", str(results), timeout=600)
    assert "Traceback" not in r.stderr, r.stderr
    (run,) = list(results.iterdir())
    (rec,) = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
    assert rec["status"] == "failed" and "has a root qdisc of its own" in rec["error"], rec
    for h in lab.hosts:
        out = lab.ssh(h, "/sbin/tc qdisc show dev ens7 root").stdout
        assert "pfifo 1: root" in out and "netem" not in out, f"{h.name}: {out}"


def test_the_report_states_what_the_hosts_said(lab, smoke_run):
    r = fab(lab, "report", "--run", str(smoke_run), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    md = (smoke_run / "report.md").read_text()
    env = json.loads((smoke_run / "environment.json").read_text())
    assert "roce0" in md and "ens7" in md and "rxe0" not in md and "data0" not in md
    assert f"Open MPI ({env['versions']['open_mpi']})" in md
    expected = "emulation (TCG)" if env["accel"] == "tcg" else "(KVM)"
    assert expected in md

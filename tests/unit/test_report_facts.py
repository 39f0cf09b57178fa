"""The report states the run's own facts, as its environment.json recorded them: how the nodes
ran (KVM, TCG, bare metal), the versions, device and settings it used, "unknown" for what was
not recorded, whether the nodes had torch; nothing from a default, and nothing that injects
HTML."""

import json
import re

import pytest

from experiments import report
from experiments.report import run_facts
from tests.unit.report_helpers import results_fixture  # noqa: F401 (the fixture: results)

pytestmark = pytest.mark.slow  # each test renders a whole report, figures and all


def with_env(results, **env):
    """The fixture's run with environment.json replaced by env (plus spec and complete); the
    HTML without its inlined images, whose base64 may spell any short word ("TCG")."""
    (results / "environment.json").write_text(json.dumps({"spec": "mini", "complete": True, **env}))
    html_path, md_path = report.write(results)
    page = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]*", "data:image/png", html_path.read_text())
    return page, md_path.read_text()


def test_the_mtus_are_named_for_what_they_are_and_old_runs_still_say_theirs(results):
    """environment.json says active_mtu (the RoCE path MTU) and netdev_mtu (the data NIC's, a
    spec's `mtu`); a run recorded before says the port's as `mtu` (the fixture's)."""
    assert "RoCE path MTU: 1024 (3) (data NIC MTU unknown)" in report.write(results)[1].read_text()
    for page in with_env(results, active_mtu=4096, netdev_mtu=9000):
        assert "RoCE path MTU: 4096 (data NIC MTU 9000)" in page
    for page in with_env(results, active_mtu="?", mtu=1024, netdev_mtu=1500):
        assert "RoCE path MTU: unknown (data NIC MTU 1500)" in page, "the new key, not the old"


UCX_RXE = {"UCX_NET_DEVICES": "rxe0:1", "UCX_TLS": "rc_v,self", "UCX_UD_ETH_DGID_CHECK": "n",
           "UCX_IB_GID_INDEX": "1"}


def test_a_kvm_run_is_not_called_emulation(results):
    page, md = with_env(results, accel="kvm", virtualization="kvm", nodes=3,
                        versions={"open_mpi": "4.1.4", "ucx": "1.13.1", "rdma_core": "44.0"},
                        ucx_settings=UCX_RXE)
    for text in (page, md):
        assert "emulation (TCG)" not in text and run_facts.EMULATION_NOTE not in text
        assert "hardware virtualization (KVM)" in text and "not hardware numbers" in text
        assert "UCX_UD_ETH_DGID_CHECK=n" in text


def test_a_bare_metal_run_states_its_own_versions_and_device(results):
    page, md = with_env(
        results, accel="none", virtualization="none", nodes=2, kernel="6.8.0-45-generic",
        versions={"open_mpi": "5.0.3", "ucx": "1.16.0", "rdma_core": "50.0",
                  "kernel": "6.8.0-45-generic"},
        ucx_settings={"UCX_NET_DEVICES": "mlx5_0:1", "UCX_TLS": "rc_v,self",
                      "UCX_UD_ETH_DGID_CHECK": "n", "UCX_IB_GID_INDEX": "3"},
        rdma_devices={"node1": "mlx5_0", "node2": "mlx5_0"}, netdevs={"node1": "ens1f0np0"})
    for text in (page, md):
        assert "Open MPI (5.0.3)" in text and "UCX (1.16.0)" in text and "rdma-core 50.0" in text
        assert "mlx5_0" in text and "UCX_NET_DEVICES=mlx5_0:1" in text
        assert "UCX_IB_GID_INDEX=3" in text and "ens1f0np0" in text
        assert "bare metal" in text
        for claim in ("4.1.4", "1.13.1", "TCG", "emulation", "rxe0", "UCX_IB_GID_INDEX=1"):
            assert claim not in text, claim
    assert "<p class='note'>" not in page, "no caveat about VMs on bare metal"


def test_a_tcg_run_carries_the_emulation_caveat_and_its_own_settings(results):
    page, md = with_env(results, accel="tcg", ucx_settings=UCX_RXE,
                        versions={"open_mpi": "4.1.4", "ucx": "1.13.1", "rdma_core": "44.0"})
    for text in (page, md):
        assert "nodes ran as: VMs under emulation (TCG); accel: tcg" in text
        assert "not hardware numbers" in text and "UCX_UD_ETH_DGID_CHECK=n" in text
        assert "Open MPI (4.1.4)" in text and "UCX (1.13.1)" in text
        assert "UCX_NET_DEVICES=rxe0:1" in text and "UCX_IB_GID_INDEX=1" in text
    assert run_facts.EMULATION_NOTE in page and f"> {run_facts.EMULATION_NOTE}" in md
    page, _ = with_env(results, accel="tcg", ucx_settings={**UCX_RXE, "UCX_NET_DEVICES": "rxe1:1",
                                                           "UCX_IB_GID_INDEX": "3"})
    assert run_facts.EMULATION_NOTE in page and "UCX_NET_DEVICES=rxe1:1" in page
    assert "rxe0" not in page and "UCX_IB_GID_INDEX=1" not in page, "the run's gid, not a default"
    page, _ = with_env(results, virtualization="qemu")
    assert run_facts.EMULATION_NOTE in page, "systemd-detect-virt's qemu is emulation too"


def test_an_old_run_takes_versions_from_its_debian_packages(results):
    page, md = with_env(results, accel="tcg", kernel="6.1.0-56-amd64",
                        packages={"openmpi-bin": "4.1.4-3+b1", "libucx0": "1:1.13.1+dfsg-1",
                                  "rdma-core": "44.0-2"})
    for text in (page, md):
        assert "Open MPI (4.1.4)" in text and "UCX (1.13.1)" in text
        assert ("versions: rxelab unknown, Open MPI 4.1.4, UCX 1.13.1, rdma-core 44.0, kernel "
                "6.1.0-56-amd64") in text
    assert run_facts.upstream_version("4.5+0.17-1") == "4.5+0.17"
    assert run_facts.upstream_version("44.0") == "44.0"


def test_the_report_states_the_rxelab_wheel_a_run_used(results):
    page, md = with_env(results, versions={"rxelab": "0.2.0", "open_mpi": "4.1.4"})
    for text in (page, md):
        assert "versions: rxelab 0.2.0, Open MPI 4.1.4" in text


def test_a_run_without_versions_or_settings_says_unknown(results):
    page, md = with_env(results, versions={"open_mpi": None, "ucx": None})
    for text in (page, md):
        assert "Open MPI (unknown)" in text and "UCX (unknown)" in text
        assert ("versions: rxelab unknown, Open MPI unknown, UCX unknown, rdma-core unknown, "
                "kernel unknown") in text
        assert "how the nodes ran" in text.lower() and "was not recorded" in text
        assert "UCX settings that were not recorded" in text
        for claim in ("4.1.4", "1.13.1", "TCG", "rxe0", "None"):
            assert claim not in text, claim


def test_env_values_cannot_inject_html(results):
    bad = "<script>x</script>"
    page, md = with_env(results, spec=bad, accel=bad, virtualization=bad, kernel=bad, image=bad,
                        mtu=bad, netdev_mtu=bad, nodes=bad,
                        versions={"open_mpi": bad, "ucx": bad, "rdma_core": bad, "kernel": bad},
                        packages={bad: bad}, ucx_settings={bad: bad, "UCX_NET_DEVICES": bad},
                        rdma_devices={bad: bad}, netdevs={"node1": bad})
    for text in (page, md):
        assert "<script" not in text and "&lt;script&gt;x&lt;/script&gt;" in text
    page, md = with_env(results, accel="kvm", versions={"open_mpi": "5.0.3\"><img src=x>"})
    assert "<img src=x>" not in page and "<img src=x>" not in md


@pytest.mark.parametrize("hosts, said", [
    ({"node1": {"torch": "1.13.1"}, "node2": {"torch": "1.13.1"}},
     "Gloo (torch.distributed): torch 1.13.1 on every node, over TCP"),
    ({"node1": {"torch": "1.13.1"}, "node2": {"torch": None}},
     "Gloo (torch.distributed): no torch on node2: gloo cases were not run (a lab built with "
     "EXTRAS=torch has it)"),
    ({"node1": {"kernel": "6.1"}}, "Gloo (torch.distributed): unknown"),
])
def test_the_facts_say_whether_the_nodes_had_torch(results, hosts, said):
    assert run_facts.gloo_fact(report.Environment.model_validate({"hosts": hosts})) == said
    env = json.loads((results / "environment.json").read_text())
    (results / "environment.json").write_text(json.dumps({**env, "hosts": hosts}))
    _, md = report.write(results)
    assert said in md.read_text()


@pytest.mark.parametrize("complete, statuses, said", [
    (True, ["ok"] * 3, "complete: all 3 cases ok"),
    (False, ["ok"] * 3, "INCOMPLETE: all 3 cases it recorded ok"),
    (False, ["ok", "failed", "failed", "timeout"],
     "INCOMPLETE: 1 of the 4 cases it recorded ok, 2 failed, 1 timeout"),
    (True, ["ok", "wrong", "skipped"], "complete: 1 of 3 cases ok, 1 wrong, 1 not run"),
    (None, ["ok", "ok"], "INCOMPLETE: all 2 cases it recorded ok"),  # a run that never said it completed
])
def test_the_runs_status_agrees_with_the_banner_and_counts_every_case(complete, statuses, said):
    env = report.Environment.read(json.dumps({"complete": complete}))
    records = [report.Record(app="rxelab", op="alltoall", algorithm="pairwise", nodes=3,
                             size=1024, case=i, status=s) for i, s in enumerate(statuses)]
    assert run_facts.run_status(env, records) == said

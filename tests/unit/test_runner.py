"""The commands the runner sends to the nodes, and the parsing of what comes back."""

import os
import signal
import subprocess
import time

import pytest

from experiments.report import bandwidth, peak_to_mean
from experiments.running import commands
from experiments.running.records import Sample
from experiments.spec import Case, netem
from infra.inventory import Host, RdmaEndpoint, SSHEndpoint

HOSTS = [Host(f"node{i}", SSHEndpoint("127.0.0.1", 2220 + i), f"10.10.0.{10 + i}", RdmaEndpoint())
         for i in (1, 2, 3)]
CASE = {"app": "rxelab", "op": "alltoall", "algorithm": "sequential", "nodes": 3, "size": 4096,
        "stages": 5, "warmup": 1, "transport": None, "sample_load": False, "netem": {},
        "mtu": None, "timeout_s": None}


RUN = "0123456789ab"


def test_rxelab_case_runs_our_launcher_on_the_data_network():
    cmd = commands.rxelab_command(Case(**CASE), HOSTS, 29701, RUN)
    assert '"$HOME"/rxelab/venv/bin/python3 -m rxelab.launch --hosts 10.10.0.11,10.10.0.12,' \
        '10.10.0.13 --per-host 1 --port 29701' in cmd
    assert "server_client.py --op alltoall --algorithm sequential --size 4096 --stages 5" in cmd
    assert cmd.startswith(f'RXELAB_RUN_ID={RUN} "$HOME"/rxelab/venv/bin/python3 ')
    assert '"$HOME"/rxelab/venv/bin/python3 "$HOME"/rxelab/apps/server_client.py ' in cmd
    assert "'$HOME" not in cmd and "PYTHONPATH" not in cmd, "the venv's python, the wheel's rxelab"


def test_rxelab_case_passes_the_rc_retry_settings():
    cmd = commands.rxelab_command(Case(**CASE, qp_timeout=12, retry_cnt=3), HOSTS, 29701, RUN)
    assert "--qp-timeout 12 --retry-cnt 3" in cmd


def test_mpi_case_uses_tcp_on_the_data_network_and_forces_coll_tuned_algorithms():
    case = {**CASE, "app": "mpi", "algorithm": "mpi-pairwise", "transport": "tcp"}
    cmd = commands.mpi_command(Case(**case), HOSTS, "10.10.0.0/24", RUN)
    # the node mpirun runs on by its own name (Open MPI 5 knows itself by no address)
    assert "mpirun -np 3 --host \"$(hostname)\":1,10.10.0.12:1,10.10.0.13:1" in cmd
    assert "--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include 10.10.0.0/24" in cmd
    assert "--mca oob_tcp_if_include 10.10.0.0/24" in cmd and "data0" not in cmd
    assert "--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_alltoall_algorithm 2" in cmd
    assert ' "$HOME"/rxelab/venv/bin/python3 "$HOME"/rxelab/apps/mpi_compare.py ' in cmd
    assert "PYTHONPATH" not in cmd
    assert "'$HOME" not in cmd, "$HOME must reach the remote shell to expand"
    assert cmd.startswith(f"RXELAB_RUN_ID={RUN} timeout ") and "-x RXELAB_RUN_ID " in cmd
    default = commands.mpi_command(Case(**{**case, "algorithm": "mpi-default"}), HOSTS, "10.10.0.0/24", RUN)
    assert "coll_tuned" not in default
    assert "--mca pml ucx" not in cmd and "UCX" not in cmd


def test_the_data_network_is_found_from_the_hosts_own_addresses():
    host = HOSTS[0]
    assert commands.data_network(host, ["fe80::1/64", "10.10.0.11/24"]) == "10.10.0.0/24"
    assert commands.data_network(host, ["10.10.0.12/24"]) is None
    out = "netdev ens7\nnetdev_mtu 9000\ninet 10.10.0.11/24\nactive_mtu 4096\n"
    got = commands.parse_readings(out)
    assert got["netdev"] == "ens7" and got["inet"] == ["10.10.0.11/24"]
    for told in ("ens7; reboot", "$(id)", "a" * 16, "../x"):  # not a NIC name: no netdev found
        assert "netdev" not in commands.parse_readings(f"netdev {told}\n"), told


def test_mpi_over_ucx_is_the_recipe_that_runs_on_rxe():
    case = {**CASE, "app": "mpi", "algorithm": "mpi-pairwise", "transport": "ucx"}
    ucx = commands.mpi_command(Case(**case), HOSTS, "10.10.0.0/24", RUN)
    assert "--mca pml ucx --mca btl '^openib,uct'" in ucx
    for setting in ("UCX_NET_DEVICES=rxe0:1", "UCX_TLS=rc_v,self", "UCX_UD_ETH_DGID_CHECK=n",
                    "UCX_IB_GID_INDEX=1"):
        assert f"-x {setting}" in ucx, setting
    assert "--mca coll_tuned_alltoall_algorithm 2" in ucx, "forced algorithms work with pml ucx"
    assert "--mca oob_tcp_if_include 10.10.0.0/24" in ucx
    assert commands.ucx_settings(HOSTS[0], ranks_per_host=2)["UCX_TLS"] == "rc_v,self,sm"
    roce = Host("a", SSHEndpoint("h"), "10.0.0.1", RdmaEndpoint("roce0", 2, 3))
    assert commands.ucx_settings(roce) ["UCX_NET_DEVICES"] == "roce0:2"


def test_node_set_up_applies_mtu_and_netem_then_reads_counters():
    case = {**CASE, "mtu": 1500, "netem": {"loss": 1}}
    cmd = commands.prepare_command(HOSTS[0], Case(**case), RUN)
    assert "nd=$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/ndevs/1)" in cmd
    assert 'sudo -n ip link set dev "$nd" mtu 1500' in cmd
    handle = commands.netem_handle(RUN)
    assert f'sudo -n tc qdisc replace dev "$nd" root handle {handle}: netem loss 1%' in cmd
    assert cmd.index("mtu 1500") < cmd.index(" 0: root") < cmd.index("netem") \
        < cmd.index("|| exit 3") < cmd.index("hw_counters")
    restore = commands.restore_command(HOSTS[0], 9000, RUN, netem_applied=True)
    assert "tc qdisc del" in restore and 'mtu 9000' in restore and "hw_counters" in restore
    assert restore.index(f'*"qdisc netem {handle}: root"*)') < restore.index("tc qdisc del")


def test_a_case_without_netem_leaves_every_qdisc_alone():
    """Before, every case ran `tc qdisc del dev <nic> root`: a user's own qdisc was wiped."""
    for cmd in (commands.prepare_command(HOSTS[0], Case(**{**CASE, "mtu": 1500}), RUN),
                commands.restore_command(HOSTS[0], 9000, RUN),
                commands.restore_command(HOSTS[0], None, RUN)):
        assert "tc qdisc" not in cmd and "$tc" not in cmd, cmd
    assert "ip link set" not in commands.restore_command(HOSTS[0], None, RUN), "no MTU changed"
    out = "netdev_mtu 1500\nactive_mtu 1024\nsent_pkts:10\nrcvd_pkts:7\n"
    assert commands.parse_readings(out) == {"netdev_mtu": 1500, "active_mtu": 1024, "inet": [],
                                             "counters": {"sent_pkts": 10, "rcvd_pkts": 7}}


def test_perftest_argv_and_parsing():
    case = {**CASE, "app": "perftest", "algorithm": "ib_write_bw", "size": 65536, "stages": 200}
    argv = commands.perftest_argv(Case(**case), HOSTS[1])
    assert argv[:7] == ["ib_write_bw", "-d", "rxe0", "-i", "1", "-x", "1"]
    assert "--report_gbits" in argv and argv[argv.index("-s") + 1] == "65536"
    from rxelab import settings  # the library's own ack timeout: crowded VMs answer late
    timeout = settings.BY_NAME["qp_timeout"].default
    assert argv[argv.index("-u") + 1] == str(timeout) and timeout > 14
    bw = """ #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      200              0.08               0.07                 0.000138
"""
    rec = commands.parse_perftest("ib_write_bw", bw, 65536)
    assert rec.bw_MBps == pytest.approx(0.07e9 / 8 / 1e6) and rec.iterations == 200
    lat = """ #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]
 2       1000          180.51         6500.10      310.20             350.00
"""
    assert commands.parse_perftest("ib_send_lat", lat, 2).lat_us == pytest.approx(310.2)
    assert commands.parse_perftest("ib_write_bw", "Couldn't connect", 1) is None
    both = commands.perftest_argv(Case(**{**case, "algorithm": "ib_write_bw_bidir"}), HOSTS[1])
    assert both[:2] == ["ib_write_bw", "-b"] and both[2:] == argv[1:], "the same run, both ways"


def test_the_benchmark_runs_perftest_as_the_specs_do_under_the_same_names():
    from rxelab import bench, perftest

    from experiments import spec
    assert set(bench.PERFTEST_TOOLS) <= set(spec.TOOLS) and perftest.BIDIR in bench.PERFTEST_TOOLS
    assert perftest.command(perftest.BIDIR) == "ib_write_bw -b"
    bw = " 65536      200              0.08               0.07                 0.000138\n"
    assert perftest.parse(perftest.BIDIR, bw) == {"iterations": 200,
                                                  "bw_MBps": pytest.approx(0.07e9 / 8 / 1e6)}


def test_timeouts_grow_with_the_work_and_a_spec_can_set_them():
    small = commands.case_timeout(Case(**CASE))
    big = commands.case_timeout(Case(**{**CASE, "size": 4 << 20, "stages": 1000}))
    lossy = commands.case_timeout(Case(**{**CASE, "size": 4 << 20, "stages": 1000, "netem": {"loss": 5}}))
    assert 180 < small < big < lossy
    assert commands.case_timeout(Case(**{**CASE, "timeout_s": 42})) == 42


def test_bus_bandwidth_model():
    algbw, busbw = bandwidth(size=1_000_000, ranks=4, seconds=2.0)
    assert algbw == pytest.approx(2.0) and busbw == pytest.approx(1.5)
    assert bandwidth(10, 1, 1.0)[1] == 0.0 and bandwidth(10, 3, 0) == (0.0, 0.0)


def test_peak_to_mean_of_load_samples():
    samples = [Sample(t=t, tx_bytes=b, rx_bytes=0) for t, b in
               [(0, 0), (1, 1_000_000), (2, 2_000_000), (3, 6_000_000), (4, 6_000_000)]]
    ts, rates, ratio = peak_to_mean(samples)
    assert ts == [1, 2, 3, 4] and rates == [1.0, 1.0, 4.0, 0.0]
    assert ratio == pytest.approx(4.0 / 2.0), "idle samples do not count in the mean"


@pytest.mark.slow
def test_unreachable_hosts_are_named_not_a_traceback():
    from experiments.running import deploy, fleet
    from infra.inventory import Inventory

    dead = Host("ghost", SSHEndpoint("127.0.0.1", 1, "lab"), "10.10.0.99", RdmaEndpoint())
    with pytest.raises(fleet.FleetError) as e:
        deploy.deploy(Inventory("t", (dead,)))
    assert "ghost: unreachable over SSH" in str(e.value)


def test_the_clean_up_stops_exactly_the_processes_of_its_run(tmp_path):
    """Before, every run did `pkill -u <user> -f '...orted|mpirun'` on every host: a user's
    own MPI jobs died with it. Now only processes that carry the run's id are stopped."""
    def start(argv0: str, run_id: str | None) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if k != "RXELAB_RUN_ID"}
        if run_id:
            env["RXELAB_RUN_ID"] = run_id
        return subprocess.Popen(["bash", "-c", f"exec -a {argv0} sleep 120"], env=env)

    ours = [start("python3", RUN), start("mpirun", RUN)]
    theirs = [start("mpirun", None), start("orted", None), start("sleep", RUN + "x"),
              start("python3", "other-run")]
    try:
        time.sleep(0.3)
        r = subprocess.run(["sh", "-c", commands.stop_command(RUN) + "; echo survived"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "survived" in r.stdout, "the clean-up shell itself lives on"
        for p in ours:
            assert p.wait(timeout=10) == -signal.SIGTERM
        assert all(p.poll() is None for p in theirs), "a process not of this run was stopped"
    finally:
        for p in ours + theirs:
            p.kill()
            p.wait()


def test_netem_goes_only_where_the_kernels_default_qdisc_is(tmp_path):
    """The guard before netem, run against a real NIC (a veth in a namespace of this test)."""
    if os.geteuid() != 0:
        pytest.skip("a network namespace needs root")
    ns = f"zq{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                       check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "v0", "up"], check=True)
        guard = f'nd=v0; tc="tc -n {ns}"; {commands.DEFAULT_ROOT}; echo allowed'
        ok = subprocess.run(["sh", "-c", guard], capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0 and "allowed" in ok.stdout, ok.stderr
        subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "v0", "root", "handle", "1:", "pfifo"],
                       check=True)
        refused = subprocess.run(["sh", "-c", guard], capture_output=True, text=True, timeout=30)
        assert refused.returncode == 4 and "has a root qdisc of its own" in refused.stderr
        assert "pfifo 1:" in refused.stderr and "allowed" not in refused.stdout
        clear = f'nd=v0; tc="tc -n {ns}"; ' + netem.clear_command('"$nd"', "1a2b", "$tc")
        subprocess.run(["sh", "-c", clear], capture_output=True, text=True, timeout=30)
        left = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", "v0", "root"],
                              capture_output=True, text=True, timeout=30).stdout
        assert "pfifo 1:" in left, "the user's qdisc was removed"
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def test_a_home_with_a_space_stays_one_word(tmp_path):
    """$HOME reaches the remote shell as "$HOME": expanded there, and one word even when the
    home is /home/a b (unquoted, `rm -rf $HOME/...` would be `rm -rf /home/a b/...`)."""
    import json

    home = tmp_path / "a b"
    cmd = commands.mpi_command(Case(**{**CASE, "app": "mpi", "algorithm": "mpi-default", "transport": "tcp"}),
                               HOSTS, "10.10.0.0/24", RUN)
    words = cmd.split(" mpirun ", 1)[1]
    probe = f"printf '%s\\n' {words}"
    out = subprocess.run(["sh", "-c", probe], env={"HOME": str(home), "PATH": os.environ["PATH"]},
                         capture_output=True, text=True, timeout=30).stdout.splitlines()
    assert f"{home}/rxelab/apps/mpi_compare.py" in out and f"{home}/rxelab/venv/bin/python3" in out
    assert json.dumps(out).count(str(home)) == 2


def test_the_benchmarks_perftest_takes_the_jobs_own_ack_timeout(monkeypatch):
    """`rxelab-bench --perftest` with `--qp-timeout 20`: perftest gets -u 20, not the default."""
    import types

    from rxelab import bench
    ran = []
    monkeypatch.setattr(bench.subprocess, "run", lambda argv, **kw: ran.append(argv) or
                        types.SimpleNamespace(stdout="", returncode=1))
    monkeypatch.setattr(bench.time, "sleep", lambda s: None)
    peer = types.SimpleNamespace(remote=types.SimpleNamespace(gid="::ffff:10.0.0.2"))
    comm = types.SimpleNamespace(
        rank=0, options={"qp_timeout": 20}, conns={1: peer}, barrier=lambda: None,
        dev=types.SimpleNamespace(name="rxe0", port=1, gid_index=1))
    assert bench.perftest(comm, "ib_write_bw", 65536, 10) is None  # no result row: none parsed
    assert ran and ran[0][ran[0].index("-u") + 1] == "20" and ran[0][-1] == "10.0.0.2"


@pytest.mark.slow
def test_every_deadline_of_a_case_kills_what_ignores_its_term():
    """mpirun whose daemon sat on a node that died ignored timeout's TERM and held its case for
    ever (2026-12-02, a guest kernel's panic): every deadline wrapper of a case's command sends
    KILL after KILL_AFTER_S. The wrapper as built, tried on a command that ignores TERM, with
    its numbers shortened."""
    import re
    import subprocess
    import time

    from experiments.running import elastic_scenario
    from tests.unit.test_elastic_scenario import EL

    mpi = {**CASE, "app": "mpi", "algorithm": "mpi-default", "transport": "tcp"}
    perf = {**CASE, "app": "perftest", "algorithm": "ib_write_bw", "nodes": 2}
    built = [commands.mpi_command(Case(**mpi), HOSTS, "10.10.0.0/24", RUN),
             commands.perftest_command(Case(**perf), HOSTS[0], RUN),
             elastic_scenario.mpi_command(EL, HOSTS, "10.10.0.0/24", RUN)]
    for cmd in built:
        wrapper = re.search(r"\btimeout -k (\d+) (\d+) ", cmd)
        assert wrapper is not None and int(wrapper[1]) == commands.KILL_AFTER_S, cmd
        shortened = wrapper[0].replace(f"-k {wrapper[1]} {wrapper[2]}", "-k 1 1")
        t0 = time.monotonic()
        done = subprocess.run(["sh", "-c", shortened + "sh -c 'trap \"\" TERM; sleep 30'"],
                              timeout=20)
        assert done.returncode == 137 and time.monotonic() - t0 < 10, done

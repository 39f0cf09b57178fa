"""The library on rxe, inside the lab's VMs: every algorithm at world sizes 1-4 (across VMs
and several ranks per VM over rxe loopback), sizes 0, 1, odd, 4 KiB and 1 MiB with checked
data, bad input, dead and hung peers, the seed API and the benchmark."""

from __future__ import annotations

import json
import shlex
import time

import pytest
from rxelab import ops

pytestmark = pytest.mark.vm
REMOTE_HOME = "rxelab"  # where fab deploy puts things, under the VM user's home
PY = "$HOME/rxelab/venv/bin/python3"  # the venv fab deploy installed the rxelab wheel into
SIZES = "0,1,7,4096,1048576"


@pytest.fixture(scope="session")
def deployed(lab):
    """lib/ and apps/ on every node, the way `fab deploy` puts them; skips with the reason if a
    node lacks an RDMA device or pyverbs (an unreachable node is a failure)."""
    from experiments.running import deploy, fleet

    try:
        deploy.deploy(lab.inventory)
    except fleet.FleetError as err:
        if "unreachable" in str(err):
            raise
        pytest.skip(str(err))
    return lab


def launch(lab, hosts: list[str], command: str, per_host: int = 1, port: int = 29600,
           timeout: float = 600, flags: str = "") -> tuple[int, dict[int, list[dict]], str]:
    """Run a job with our launcher from the first host; JSON lines per rank, and the text."""
    line = (f"cd {REMOTE_HOME} && {PY} -m rxelab.launch "
            f"--hosts {','.join(hosts)} --per-host {per_host} --port {port} --timeout {timeout} "
            f"{flags} -- {command}")
    r = lab.ssh(hosts[0], line, timeout=timeout + 60)
    by_rank: dict[int, list[dict]] = {}
    for text in r.stdout.splitlines():
        if text.startswith("[") and "] {" in text:
            rank, payload = text[1:].split("] ", 1)
            by_rank.setdefault(int(rank), []).append(json.loads(payload))
    return r.returncode, by_rank, r.stdout + r.stderr


def assert_all_checks_pass(by_rank: dict[int, list[dict]], world: int, out: str) -> None:
    assert sorted(by_rank) == list(range(world)), out[-3000:]
    for rank, records in by_rank.items():
        failed = [r for r in records if r.get("ok") is False or "error" in r and "check" not in r]
        assert not failed, f"rank {rank}: {failed[:5]}"
        summary = [r for r in records if r.get("summary")]
        assert summary and summary[0]["failed"] == 0 and summary[0]["checks"] > 0, out[-2000:]


@pytest.mark.parametrize("world", [2, 3])
def test_every_algorithm_across_vms(deployed, world):
    hosts = [h.name for h in deployed.hosts[:world]]
    rc, by_rank, out = launch(deployed, hosts, f"{PY} -m rxelab.selftest --sizes {SIZES}",
                              port=29600 + world)
    assert rc == 0, out[-3000:]
    assert_all_checks_pass(by_rank, world, out)
    checks = {r["check"] for r in by_rank[0] if "check" in r}
    for algo in ("sequential", "pairwise", "parallel"):
        assert f"alltoall/{algo}/1048576" in checks and f"alltoallv/{algo}/7" in checks
    for algo in ("star", "ring", "sequential", "parallel"):
        assert f"allgather/{algo}/0" in checks and f"allgather/{algo}/1048576" in checks
    assert "sendrecv/4096" in checks and "write_imm/1" in checks


def test_world_size_one(deployed):
    host = deployed.hosts[0]
    r = deployed.ssh(host, f"cd {REMOTE_HOME} && $HOME/rxelab/venv/bin/rxelab-selftest "
                           f"--sizes {SIZES}", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    records = [json.loads(x) for x in r.stdout.splitlines()]
    assert_all_checks_pass({0: records}, 1, r.stdout)


@pytest.mark.parametrize("hosts, per_host", [(1, 3), (2, 2)], ids=["3-ranks-one-vm", "2x2"])
def test_several_ranks_per_vm_over_rxe_loopback(deployed, hosts, per_host):
    names = [h.name for h in deployed.hosts[:hosts]]
    rc, by_rank, out = launch(deployed, names, f"{PY} -m rxelab.selftest --sizes 0,1,7,4096,65536",
                              per_host=per_host, port=29610 + hosts)
    assert rc == 0, out[-3000:]
    assert_all_checks_pass(by_rank, hosts * per_host, out)


def test_bad_input_is_refused_before_anything_is_posted(deployed):
    names = [h.name for h in deployed.hosts]
    rc, by_rank, out = launch(deployed, names, f"{PY} -m rxelab.selftest --mode bad-input",
                              port=29620)
    assert rc == 0, out[-3000:]
    assert_all_checks_pass(by_rank, 3, out)
    checks = {r["check"] for r in by_rank[0] if "check" in r}
    assert {"bad-input/wrong dtype", "bad-input/non-contiguous", "bad-input/size not divisible",
            "bad-input/after-close", "bad-input/usable-after"} <= checks


@pytest.mark.parametrize("how", ["die", "hang"])
def test_a_dead_or_hung_peer_is_a_clear_error_within_the_timeout(deployed, how):
    names = [h.name for h in deployed.hosts]
    # The survivors name the victim at their own timeout, 10 s after the barrier; a hung victim
    # dies 60 s after it, so the job ends then however long the lab took to start (a launcher
    # timeout short enough to end a hang that never ends would have to guess that)
    rc, by_rank, out = launch(deployed, names,
                              f"{PY} -m rxelab.selftest --mode {how} --victim 2 --timeout 10 "
                              "--hang-for 60", port=29630 + len(how), timeout=300)
    assert rc != 0, "the job as a whole fails"
    assert "stopping the job after" not in out, "the victim's death ended the job, not a timeout"
    for rank in (0, 1):
        (fault,) = [r for r in by_rank.get(rank, []) if r.get("check") == f"fault/{how}"]
        assert fault["ok"], fault
        assert "rank 2" in fault["error"]
        assert fault["seconds"] < 30, "detected within the configured timeout (10 s) + slack"


def test_seed_api_ports_one_to_one(deployed):
    program = (
        "import numpy as np\n"
        "from rxelab.seed_api import *\n"
        "ctx = rdma_init()\n"
        "r, p = ctx.comm.rank, ctx.comm.size\n"
        "if r == 0:\n"
        "    rdma_accept_peer(ctx, 1)\n"
        "else:\n"
        "    rdma_connect_peer(ctx, 0)\n"
        "buf = np.full(16, r, np.uint8)\n"
        "if r == 0:\n"
        "    rdma_recv(ctx, 1, buf)\n"
        "    assert (buf == 1).all()\n"
        "else:\n"
        "    rdma_send(ctx, 0, buf)\n"
        "send = np.repeat(np.arange(p, dtype=np.uint8) + 10 * r, 4)\n"
        "recv = np.zeros_like(send)\n"
        "rdma_sequential_alltoall(ctx, send, recv)\n"
        "assert (recv == np.repeat(np.arange(p, dtype=np.uint8) * 10 + r, 4)).all(), recv\n"
        "rdma_disconnect_peer(ctx, 1 - r)\n"
        "rdma_cleanup(ctx)\n"
        "print('{\"seed-api\": \"ok\"}')\n"
    )
    names = [h.name for h in deployed.hosts[:2]]
    rc, by_rank, out = launch(deployed, names, f"{PY} -c {shlex.quote(program)}", port=29640)
    assert rc == 0, out[-3000:]
    assert by_rank[0] == [{"seed-api": "ok"}] and by_rank[1] == [{"seed-api": "ok"}]


def test_benchmark_prints_osu_rows_with_bandwidth_and_the_perftest_limit(deployed):
    names = [h.name for h in deployed.hosts]
    command = ("$HOME/rxelab/venv/bin/rxelab-bench --sizes 1,65536 --iterations 2 --warmup 1 "
               "--perftest")
    rc, _, out = launch(deployed, names, command, port=29650)
    assert rc == 0, out[-3000:]
    lines = [x.split("] ", 1)[1] for x in out.splitlines() if x.startswith("[0] ")]
    assert any("pyverbs" in x for x in lines if x.startswith("#")), "versions in the preamble"
    algorithms = [f"alltoall/{a}" for a in ops.COLLECTIVES["alltoall"].algorithms]
    for section in (*algorithms, "ib_write_bw", "ib_write_bw -b", "ib_send_bw"):
        assert any(section in x for x in lines), section
    rows = [x.split() for x in lines if x and not x.startswith("#")]
    assert len(rows) == (len(algorithms) + 3) * 2, lines  # every algorithm and tool, 2 sizes
    for fields in rows:
        assert fields[-1] in ("0", "-"), f"#wrong must be 0: {fields}"
    big = [f for f in rows if f[0] == "65536"]
    assert all(float(f[5]) > 0 for f in big), "bandwidth measured"


def pgrep_everywhere(lab, pattern: str) -> dict[str, str]:
    out = {}
    for h in lab.hosts:
        # anchored: the remote shell running pgrep has the pattern in its own command line
        r = lab.ssh(h, f"pgrep -u lab -f {shlex.quote('^' + pattern + '$')} || true", timeout=60)
        out[h.name] = r.stdout.strip()
    return out


@pytest.mark.parametrize("sig", ["TERM", "KILL"])
def test_no_rank_outlives_the_launcher_on_any_node(deployed, sig):
    """SIGTERM (or SIGKILL) to the launcher on node1: the ranks on node1, node2 and node3 end."""
    marker = f"sleep 7{len(sig)}7"
    names = ",".join(h.name for h in deployed.hosts)
    r = deployed.ssh(deployed.hosts[0], f"cd {REMOTE_HOME} || exit 1; nohup "
                     f"$HOME/rxelab/venv/bin/rxelab-launch --hosts {names} -- {marker} >/tmp/launch.out 2>&1 "
                     f"</dev/null & echo $!")
    launcher = int(r.stdout.strip())
    try:
        deadline = time.monotonic() + 60
        while not all(pgrep_everywhere(deployed, marker).values()):
            assert time.monotonic() < deadline, "the ranks did not start on every node"
            time.sleep(1)
        deployed.ssh(deployed.hosts[0], f"kill -{sig} {launcher}")
        deadline = time.monotonic() + 30
        while any((left := pgrep_everywhere(deployed, marker)).values()):
            assert time.monotonic() < deadline, f"ranks still running 30 s after {sig}: {left}"
            time.sleep(1)
    finally:
        deployed.ssh(deployed.hosts[0], f"kill -KILL {launcher} 2>/dev/null || true")
        for h in deployed.hosts:
            deployed.ssh(h, f"pkill -u lab -f {shlex.quote('^' + marker + '$')} || true")

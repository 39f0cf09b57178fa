"""The simulator's pieces on the host: SimGrid platforms from the template, cost profiles
checked as they are read, and replays of recordings whose simulated times are worked out by
hand here (CM02: a message of n bytes over one link takes latency + n / bandwidth)."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest
from rxelab import trace

from experiments.simulation import costs as costs_mod
from experiments.simulation import platforms, replayer
from experiments.simulation.costs import Costs, Segment
from tests.unit.simulator_helpers import needs_simgrid

FREE = Costs(send=(Segment(1 << 62, 0.0, 0.0),), recv=(Segment(1 << 62, 0.0, 0.0),))
CTRL = 32


@pytest.mark.parametrize("kind", platforms.KINDS)
@pytest.mark.parametrize("ranks", [1, 2, 7, 64, 1000])
def test_every_platform_is_xml_with_a_host_per_rank(kind, ranks):
    p = platforms.Platform(kind, ranks, 1e9, 1e-6, oversubscription=4)
    root = ET.fromstring(p.xml().split("\n", 2)[2])  # past the declaration and the doctype
    assert root.tag == "platform"
    assert "--cfg=network/model:CM02" in p.config()
    if kind == "lab":  # one machine and the VMs' data paths; the replayer makes the VMs
        machine, paths = root.iter("host")
        assert machine.get("id") == "machine" and int(machine.get("core")) == p.hosts * p.cores
        assert paths.get("id") == "paths" and int(paths.get("core")) == p.hosts
        assert "--cfg=network/loopback-lat:1e-06" in p.config() and p.byte_cpu == 1e-9
        return
    (cluster,) = root.iter("cluster")
    first, last = map(int, cluster.get("radical").split("-"))
    assert (first, last + 1) == (0, p.hosts) and p.hosts >= ranks
    assert cluster.get("sharing_policy") == "SPLITDUPLEX" and p.byte_cpu == 0


def test_a_fat_tree_has_fewer_uplinks_by_its_oversubscription():
    p = platforms.Platform("fat-tree", 1024, 1e9, 1e-6, oversubscription=4)
    assert p.topology() == ("FAT_TREE", "2;32,32;1,8;1,1")
    assert platforms.Platform("fat-tree", 1024, 1e9, 1e-6).topology()[1] == "2;32,32;1,32;1,1"
    assert platforms.Platform("fat-tree", 16, 1e9, 1e-6, oversubscription=4).topology() == ("", "")


@pytest.mark.parametrize("n", [1, 2, 8, 27, 100, 1000, 1024, 4096])
def test_a_torus_holds_every_rank_in_near_equal_sides(n):
    a, b, c = platforms.torus_dims(n)
    assert a * b * c >= n and a <= b <= c
    assert a * b * (c - 1) < n  # no layer more than needed
    assert c - a <= max(2, round(n ** (1 / 3)))


@pytest.mark.parametrize(("change", "said"), [
    ({"kind": "mesh"}, "one of lab"), ({"ranks": 0}, "0 ranks"), ({"bandwidth": 0}, "bandwidth"),
    ({"latency": float("nan")}, "latency"), ({"cores": 0}, "cores"),
    ({"kind": "fat-tree", "oversubscription": 0}, "oversubscription"),
    ({"wake": 1e-3}, "on the lab only"), ({"kind": "lab", "wake": -1.0}, "wake"),
])
def test_a_bad_platform_is_named(change, said):
    with pytest.raises(platforms.PlatformError, match=said):
        platforms.Platform(**{"kind": "cluster", "ranks": 4, "bandwidth": 1e9, "latency": 1e-6,
                              **change})


def test_costs_are_piecewise_linear_by_segment():
    c = Costs(send=(Segment(100, 1.0, 0.5), Segment(1000, 10.0, 0.1)), recv=FREE.recv)
    assert c.send_cpu(0) == 1.0 and c.send_cpu(100) == 51.0
    assert c.send_cpu(101) == pytest.approx(20.1) and c.send_cpu(5000) == pytest.approx(510.0)


def test_a_fitted_segment_may_start_below_zero_where_it_costs_nothing_less(tmp_path):
    """A line through (10 B, 1 s) and (100 B, 10 s) starts at 0 B below zero; from 10 B on,
    where it applies, it costs from 1 s up."""
    raw = json.loads(costs_mod.PLACEHOLDER.to_json())
    raw["costs"]["send"] = [[10, 1.0, 0.0], [100, -0.1, 0.101]]
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps(raw))
    got = costs_mod.load(path).costs
    assert got.send_cpu(10) == 1.0 and got.send_cpu(100) == pytest.approx(10.0)


def test_a_profile_is_read_back_as_written(tmp_path):
    path = tmp_path / "lab.json"
    path.write_text(costs_mod.PLACEHOLDER.to_json())
    assert costs_mod.load(path) == costs_mod.PLACEHOLDER
    woken = replace(costs_mod.PLACEHOLDER, wake=7e-4, host_cpus=2)
    path.write_text(woken.to_json())
    assert costs_mod.load(path) == woken and woken.lab(3).wake == 7e-4 and woken.lab(3).crowded
    assert not woken.lab(2).crowded  # two one-CPU VMs on two cores: nobody waits for one


@pytest.mark.parametrize(("edit", "said"), [
    (lambda d: d.pop("costs"), "costs"),
    (lambda d: d.update(bandwidth=-1), "bandwidth"),
    (lambda d: d["costs"].update(send=[]), "segments"),
    (lambda d: d["costs"].update(send=[[100, 1, 1], [10, 1, 1]]), "ascending"),
    (lambda d: d["costs"].update(recv=[[100, "x", 1]]), "recv fixed"),
    (lambda d: d["costs"].update(send=[[100, -1, 0]]), "less than nothing at 0 B"),
    (lambda d: d["costs"].update(send=[[10, 0, 0], [100, -1, 0.05]]), "less than nothing at 10 B"),
    (lambda d: d.update(node_cpus=0), "node_cpus"),
    *[(lambda d, v=v: d.update(wake=v), "wake") for v in (-1, "x", True, float("nan"))],
    (lambda d: d.update(node_cpus="two"), "node_cpus"),
    (lambda d: d.update(host_cpus=2.5), "host_cpus"),
    (lambda d: d.update(duplex_bandwidth=0), "duplex_bandwidth"),
    (lambda d: d.update(measured="ab"), "measured"),
    (lambda d: d["costs"].update(send=[[1.5, 1, 1]]), "whole number"),
    (lambda d: d.update(latency=float("inf")), "latency"),
    (lambda d: d.update(cpu_per_byte=1e-8), "both or neither"),
    (lambda d: d.update(path_bandwidth=4e7), "both or neither"),
    *[(lambda d, v=v, k=k: d.update({k: v, ("path_bandwidth" if k == "cpu_per_byte"
                                              else "cpu_per_byte"): 1.0}), k)
      for k in ("cpu_per_byte", "path_bandwidth") for v in (0, -1, "x", True, float("nan"))],
])
def test_a_bad_profile_is_named(tmp_path, edit, said):
    raw = json.loads(costs_mod.PLACEHOLDER.to_json())
    edit(raw)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(costs_mod.ProfileError, match=said):
        costs_mod.load(path)
    path.write_text("{not json")
    with pytest.raises(costs_mod.ProfileError, match="bad.json"):
        costs_mod.load(path)


@needs_simgrid
@pytest.mark.parametrize("m", [1 << 17, 1 << 20])
def test_a_pairwise_exchange_of_two_takes_a_handshake_and_a_write(m):
    """p = 2, rendezvous: each rank advertises (32 B), the other writes m bytes there."""
    lat, bw = 5e-6, 1e9
    t = trace.record("alltoall", "pairwise", 2, m)
    got = replayer.replay(t, platforms.Platform("cluster", 2, bw, lat), FREE)
    assert got.seconds == pytest.approx(2 * lat + (CTRL + m) / bw, rel=1e-6)


@needs_simgrid
def test_cpu_costs_add_on_the_critical_path():
    lat, bw, m = 5e-6, 1e9, 1 << 20
    os_, or_ = 3e-6, 7e-6
    c = Costs(send=(Segment(1 << 62, os_, 0.0),), recv=(Segment(1 << 62, or_, 0.0),))
    t = trace.record("alltoall", "pairwise", 2, m)
    got = replayer.replay(t, platforms.Platform("cluster", 2, bw, lat), c)
    # on the path: rank A's advertisement, rank B's write, each sent and received once
    assert got.seconds == pytest.approx(2 * lat + (CTRL + m) / bw + 2 * os_ + 2 * or_, rel=1e-6)


@needs_simgrid
def test_ranks_of_a_vm_compete_for_its_cpus():
    """Ranks on one VM of the lab platform share its CPUs: the same CPU work of 4 ranks takes
    twice as long on 2 CPUs as on 4, and as long again on a VM at half speed."""
    c = Costs(send=(Segment(1 << 62, 1e-3, 0.0),), recv=(Segment(1 << 62, 1e-3, 0.0),))
    t = trace.record("alltoall", "parallel", 4, 64)

    def took(cores, speed=platforms.FLOPS):
        lab = platforms.Platform("lab", 4, 1e12, 1e-9, cores=cores, speed=speed, per_node=4)
        return replayer.replay(t, lab, c).seconds
    two, four = took(2), took(4)
    assert two == pytest.approx(2 * four, rel=0.05)
    assert took(4, platforms.FLOPS / 2) == pytest.approx(two, rel=0.05)


@needs_simgrid
def test_cpu_loops_beside_a_trace_share_the_cores_and_are_not_its_time():
    """The calibration's busy neighbours: a loop on a third VM of 2 cores leaves the exchange
    2 cores for 3 claims (all CPU here: 1.5x as long), and the replay's time is the exchange's
    own, not the loops' (they run on long after it)."""
    c = Costs(send=(Segment(1 << 62, 1e-3, 0.0),), recv=(Segment(1 << 62, 1e-3, 0.0),))
    t = trace.record("alltoall", "pairwise", 2, 64, calls=4)
    lab = platforms.Platform("lab", 2, 1e12, 1e-9, machine_cores=2)
    alone = replayer.replay(t, lab, c).seconds
    beside = replayer.replay(t, replace(lab, ranks=3), c, busy=1)
    assert beside.seconds == pytest.approx(1.5 * alone, rel=0.02) and beside.seconds < 1
    assert beside.seconds == max(beside.rank_seconds) and len(beside.rank_seconds) == 2
    with pytest.raises(replayer.SimulationError, match="2 ranks and 1 loops on a platform for 2"):
        replayer.replay(t, lab, c, busy=1)


@pytest.mark.slow
@needs_simgrid
def test_an_oversubscribed_fat_tree_slows_an_all_to_all():
    t = trace.record("alltoall", "parallel", 64, 1 << 16, eager_limit=0)
    full, thin = (replayer.replay(t, platforms.Platform("fat-tree", 64, 1e9, 1e-6,
                                                        oversubscription=k), FREE).seconds
                  for k in (1, 4))
    assert thin > 2 * full


@needs_simgrid
def test_a_trace_that_does_not_pair_up_fails_and_never_hangs():
    t = trace.record("alltoall", "pairwise", 3, 64)
    t.ranks[1] = [m for m in t.ranks[1] if m.kind != trace.SEND]
    with pytest.raises(replayer.SimulationError, match="rank 0 never finished"):
        replayer.replay(t, platforms.Platform("cluster", 3, 1e9, 1e-6), FREE, timeout=60)
    with pytest.raises(replayer.SimulationError, match="3 ranks on a platform for 4"):
        replayer.replay(trace.record("alltoall", "pairwise", 3, 64),
                        platforms.Platform("cluster", 4, 1e9, 1e-6), FREE)


@needs_simgrid
@pytest.mark.skipif(not shutil.which("smpicc"), reason="SMPI's smpicc missing")
@pytest.mark.parametrize(("ours", "theirs"), [("pairwise", "mpi-pairwise"), ("parallel", "mpi-linear")])
def test_the_replay_agrees_with_smpi_on_the_same_schedule(ours, theirs):
    """Open MPI's pairwise exchange and linear all-to-all are rxelab's pairwise and parallel
    (less the advertisements, 32 B each): SMPI running them and the replay agree."""
    from experiments.simulation import smpi
    platform = platforms.Platform("cluster", 8, 1e9, 2e-6)
    mine = replayer.replay(trace.record("alltoall", ours, 8, 1 << 20), platform, FREE).seconds
    mpi = smpi.run("alltoall", theirs, platform, FREE, 1 << 20).seconds
    assert mine == pytest.approx(mpi, rel=1e-4)


@needs_simgrid
@pytest.mark.skipif(not shutil.which("smpicc"), reason="SMPI's smpicc missing")
@pytest.mark.parametrize("collective", ["alltoall", "allgather"])
@pytest.mark.parametrize("p", [5, 16])
def test_bruck_replayed_agrees_with_smpis_bruck(collective, p):
    """The library's Bruck and SMPI's (MPICH's) move the same packed messages in the same
    steps: within 1 % at 64 KiB blocks (SMPI's rows carry a latency of barrier skew more)."""
    from experiments.simulation import smpi
    platform = platforms.Platform("cluster", p, 1e9, 2e-6)
    mine = replayer.replay(trace.record(collective, "bruck", p, 1 << 16), platform, FREE).seconds
    mpi = smpi.run(collective, "mpi-bruck", platform, FREE, 1 << 16).seconds
    assert mine == pytest.approx(mpi, rel=0.01)


@needs_simgrid
def test_a_message_nobody_waits_for_fails_the_replay():
    t = trace.record("alltoall", "pairwise", 3, 64)
    t.ranks[0].append(trace.Move(trace.SEND, 1, 64, 0x7777, trace.EAGER, (999,)))
    with pytest.raises(replayer.SimulationError, match="rank 1 ended with messages it never waited"):
        replayer.replay(t, platforms.Platform("cluster", 3, 1e9, 1e-6), FREE, timeout=60)


def test_brucks_coded_blocks_are_bounded_for_pin_limit():
    """What a coded Bruck call may stage (Blocks.moves) covers what it sends (its recording)."""
    import numpy as np
    from rxelab import layouts
    for p in (3, 16, 33, 64):
        m = 4096
        lay = layouts.personalized(np.zeros(p * m, np.uint8), np.zeros(p * m, np.uint8), p, 0)
        messages, nbytes = lay.moves(p, "bruck")
        t = trace.record("alltoall", "bruck", p, m, eager_limit=0)
        sent = [x for x in t.ranks[0] if x.kind == trace.SEND and x.what == trace.WRITE]
        assert len(sent) <= messages and sum(x.nbytes for x in sent) <= nbytes


@needs_simgrid
def test_a_calls_own_cost_is_charged_where_each_call_starts():
    """Two calls cost twice one when each call's fixed cost is charged at its start (not all
    before the first call's moves, where the calls' overlap could hide them)."""
    c = replace(FREE, call=1e-3)
    one, two = (trace.record("alltoall", "pairwise", 2, 64, calls=n) for n in (1, 2))
    assert [sum(m.kind == trace.CALL for m in moves) for moves in two.ranks] == [2, 2]
    platform = platforms.Platform("cluster", 2, 1e9, 1e-6)
    first, both = (replayer.replay(t, platform, c).seconds for t in (one, two))
    assert first == pytest.approx(1e-3 + 2 * 1e-6 / 2 + 64 / 1e9, rel=1e-3)
    assert both == pytest.approx(2 * first, rel=1e-3)


@needs_simgrid
@pytest.mark.parametrize("p", [6, 8])
@pytest.mark.parametrize("size", [1024, 1 << 20], ids=["eager", "rendezvous"])
@pytest.mark.parametrize(("algorithm", "blocks"), [
    ("pairwise", lambda p: 1), ("sequential", lambda p: 1), ("parallel", lambda p: p - 1),
    ("bruck", lambda p: p // 2)])
def test_bytes_in_flight_per_rank_are_what_the_schedule_allows(p, size, algorithm, blocks):
    """As the library's Stats.peak_inflight counts them (blocks, not control messages): one
    block at a time for pairwise and sequential, every block at once for parallel, and Bruck's
    packed half."""
    t = trace.record("alltoall", algorithm, p, size, calls=2)
    got = replayer.replay(t, platforms.Platform("cluster", p, 1e9, 1e-6), FREE)
    assert max(got.peak_inflight) == blocks(p) * size


@needs_simgrid
def test_a_message_of_no_bytes_still_takes_the_latency():
    t = trace.record("alltoall", "pairwise", 2, 0)
    got = replayer.replay(t, platforms.Platform("cluster", 2, 1e9, 1e-3), FREE)
    assert got.seconds == pytest.approx(1e-3, rel=1e-3)


def test_a_simulator_process_gets_a_capped_private_memory():
    """A case too big for the machine fails alone instead of swapping the host, and a limit
    the caller already set is kept."""
    import resource
    import subprocess
    import sys
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    want = replayer.memory_limit() if hard == resource.RLIM_INFINITY else \
        min(replayer.memory_limit(), hard)
    done = subprocess.run([sys.executable, "-c", "import resource; "
                           "print(resource.getrlimit(resource.RLIMIT_DATA)[0])"],
                          capture_output=True, text=True, preexec_fn=replayer.limited, check=True)
    assert int(done.stdout) == want
    smaller = [sys.executable, "-c", "import resource, subprocess, sys; "
               "resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, resource.getrlimit("
               "resource.RLIMIT_DATA)[1])); "
               "from experiments.simulation import replayer; "
               "print(subprocess.run([sys.executable, '-c', 'import resource; "
               "print(resource.getrlimit(resource.RLIMIT_DATA)[0])'], capture_output=True, "
               "text=True, preexec_fn=replayer.limited).stdout)"]
    assert int(subprocess.run(smaller, capture_output=True, text=True, check=True).stdout) \
        == 1 << 30
    assert replayer.out_of_memory("sysdep.h:52: Memory allocation of 67108864 bytes failed", 134)
    assert replayer.out_of_memory("terminate called: std::bad_alloc", -6)
    assert not replayer.out_of_memory("", -11) and not replayer.out_of_memory("deadlock", 3)


def test_a_fitted_line_rounding_below_zero_at_its_start_is_not_refused(tmp_path):
    """Two sizes fitted to no cost at all: the next segment's line meets 0 B at -1e-22, a
    rounding, not a cost below nothing."""
    raw = json.loads(costs_mod.PLACEHOLDER.to_json())
    raw["costs"]["send"] = [[0, 0.0, 0.0], [1, 0.0, 0.0], [1024, -1e-22 * 1024, 1e-22]]
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps(raw))
    assert costs_mod.load(path).costs.send_cpu(1024) == pytest.approx(0.0)


# Simulated seconds from the replayer as it was before its porters (detached sends, 7c807db),
# on the placeholder costs: handing sends to porters (those nobody waits for, a crowded rank's
# writes) must not move any of them. (The lab's sends go by carriers on its VMs, a model of
# their own: test_idle_vms_leave_their_cores...) The parallel rows were replayed again by 7c807db's
# binary when the library's parallel all-to-all took the shifted order (8c270b6; in rank
# order they were 0.0002656544 and 0.0008494496).
BEFORE_PORTERS = [("alltoall", "parallel", 24, 1024, "cluster", 1, 0.0002448128),
                  ("alltoall", "parallel", 12, 65536, "fat-tree", 1, 0.000651860116),
                  ("alltoall", "pairwise", 16, 4096, "torus", 1, 0.0002709568),
                  ("alltoall", "bruck", 16, 1024, "cluster", 1, 0.0001005984),
                  ("allreduce", "recursive-doubling", 8, 1048576, "cluster", 1, 0.0049355456),
                  # a rank with 16 or more writes on the wire at once has its porters post them:
                  # these two from the replayer before (d3d69ed's; bb77914's, without jemalloc, gave the same)
                  ("alltoall", "parallel", 20, 1 << 20, "cluster", 1, 0.0169804206),
                  ("alltoall", "parallel", 24, 1 << 20, "fat-tree", 1, 0.0204927154),
]


@needs_simgrid
@pytest.mark.parametrize(("collective", "algorithm", "p", "size", "kind", "per", "seconds"),
                         BEFORE_PORTERS)
def test_the_porters_change_no_simulated_time(collective, algorithm, p, size, kind, per, seconds):
    t = trace.record(collective, algorithm, p, size)
    extra = {"oversubscription": 4} if kind == "fat-tree" else {}
    platform = platforms.Platform(kind, p, 1.25e9, 2e-6, per_node=per, **extra)
    every = replayer.replay(t, platform, costs_mod.PLACEHOLDER.costs, mirror=False).seconds
    assert every == pytest.approx(seconds, rel=1e-8, abs=0)
    # and rank 0 alone, where it stands for all (a cluster): test_replay_mirror
    assert replayer.replay(t, platform, costs_mod.PLACEHOLDER.costs).seconds == \
        pytest.approx(seconds, rel=1e-8, abs=0)

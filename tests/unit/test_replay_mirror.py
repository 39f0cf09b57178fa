"""Rank 0 replayed alone for all (experiments/simulator/mirror.hpp): which recordings and
platforms allow it, that it gives every rank's time, end and bytes in flight as the replay of
all p ranks does, to the last digit, and that it refuses what does not pair up."""

from __future__ import annotations

import subprocess

import pytest
from rxelab import trace

from experiments.simulation import costs as costs_mod
from experiments.simulation import platforms, replayer
from tests.unit.simulator_helpers import needs_simgrid

COSTS = costs_mod.PLACEHOLDER.costs
SLOW = (85e6, 168e-6)  # the lab's link (2026-11-28): a megabyte block takes 12 ms, all crowd


@pytest.mark.parametrize(("collective", "algorithm", "p", "size", "turns"), [
    ("alltoall", "parallel", 5, 1 << 20, True),
    ("alltoall", "parallel", 8, 1024, True),
    ("alltoall", "bruck", 6, 1024, True),
    ("allgather", "ring", 7, 1 << 20, True),
    ("allgather", "bruck", 8, 1 << 20, True),
    ("allreduce", "ring", 8, 1 << 20, True),
    ("allreduce", "ring", 5, 1 << 20, False),  # chunks of unequal size: rank 0's is not rank 1's
    ("alltoall", "sequential", 5, 1024, False),  # one pair at a time, in one fixed order
    ("alltoall", "pairwise", 4, 1 << 20, True),  # advertised in the order of its steps
    ("allgather", "star", 5, 1024, False),  # gathered to one root
    ("bcast", "binomial", 8, 1024, False),  # the root is not like the others
])
def test_a_recording_says_whether_every_rank_is_rank_0_turned(collective, algorithm, p, size,
                                                               turns):
    assert trace.record(collective, algorithm, p, size).turns_of_rank_0() is turns


def test_a_changed_peer_or_tag_of_one_rank_is_no_turn_of_rank_0():
    t = trace.record("alltoall", "parallel", 6, 1024)
    i = next(i for i, m in enumerate(t.ranks[3]) if m.kind == trace.SEND)
    good = t.ranks[3][i]
    for bad in (good._replace(peer=(good.peer + 1) % 6), good._replace(tag=good.tag + 1),
                good._replace(nbytes=good.nbytes + 1)):
        t.ranks[3][i] = bad
        assert not t.turns_of_rank_0()
    t.ranks[3][i] = good
    assert t.turns_of_rank_0()
    t.ranks[5] = t.ranks[5][:-1]
    assert not t.turns_of_rank_0()


def test_only_a_cluster_of_one_rank_a_host_replays_rank_0_alone():
    t = trace.record("alltoall", "parallel", 16, 1024)
    assert replayer.mirrored(t, platforms.Platform("cluster", 16, 1e9, 1e-6))
    assert not replayer.mirrored(t, platforms.Platform("fat-tree", 16, 1e9, 1e-6, oversubscription=4))
    assert not replayer.mirrored(t, platforms.Platform("torus", 16, 1e9, 1e-6))
    assert not replayer.mirrored(t, platforms.Platform("lab", 16, 1e9, 1e-6, per_node=2))
    assert not replayer.mirrored(t, platforms.Platform("cluster", 16, 1e9, 1e-6), busy=1)
    assert not replayer.mirrored(trace.record("alltoall", "sequential", 16, 1024),
                                 platforms.Platform("cluster", 16, 1e9, 1e-6))


def test_a_mirrored_input_holds_rank_0s_moves_alone(tmp_path):
    t = trace.record("alltoall", "parallel", 5, 1024)
    platform = platforms.Platform("cluster", 5, 1e9, 1e-6)
    replayer.write_moves(t, COSTS, platform, tmp_path / "m.txt", mirror=True)
    lines = (tmp_path / "m.txt").read_text().splitlines()
    assert lines[1] == "mirror"
    assert [line for line in lines if line.startswith("rank ")] == [f"rank 0 {len(t.ranks[0])}"]


@needs_simgrid
@pytest.mark.parametrize(("collective", "algorithm", "p", "size"), [
    ("alltoall", "parallel", 5, 1024),
    ("alltoall", "parallel", 12, 1 << 16),
    ("alltoall", "parallel", 40, 1 << 20),  # 39 writes on the wire from each rank, sharing
    ("alltoall", "bruck", 13, 1024),
    ("alltoall", "pairwise", 10, 1 << 20),
    ("alltoall", "bruck", 16, 1 << 20),
    ("allgather", "ring", 9, 1 << 20),
    ("allgather", "bruck", 11, 1 << 16),
    ("allreduce", "ring", 8, 1 << 20),
])
@pytest.mark.parametrize("link", [(1.25e9, 2e-6), SLOW])
def test_rank_0_alone_replays_as_all_ranks_do(collective, algorithm, p, size, link):
    t = trace.record(collective, algorithm, p, size)
    platform = platforms.Platform("cluster", p, *link)
    alone = replayer.replay(t, platform, COSTS)  # chosen by itself
    every = replayer.replay(t, platform, COSTS, mirror=False)
    assert alone.seconds == pytest.approx(every.seconds, rel=1e-12, abs=0)
    assert alone.rank_seconds == pytest.approx(every.rank_seconds, rel=1e-12, abs=0)
    assert alone.peak_inflight == every.peak_inflight
    assert every.seconds > 0 and max(every.peak_inflight) > 0


@needs_simgrid
def test_rank_0_alone_is_refused_where_it_does_not_stand_for_all():
    t = trace.record("alltoall", "sequential", 4, 1024)
    with pytest.raises(replayer.SimulationError, match="rank 0 does not stand for every rank"):
        replayer.replay(t, platforms.Platform("cluster", 4, 1e9, 1e-6), COSTS, mirror=True)


def _run(tmp_path, head: str, moves: str, platform: platforms.Platform | None = None,
         config: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    platform = platform or platforms.Platform("cluster", 4, 1e9, 1e-6)
    (tmp_path / "p.xml").write_text(platform.xml())
    (tmp_path / "m.txt").write_text(head + moves)
    return subprocess.run([str(replayer.binary()), str(tmp_path / "p.xml"), str(tmp_path / "m.txt"),
                           *platform.config(), *config], capture_output=True, text=True, timeout=60)


def _ends(done: subprocess.CompletedProcess[str]) -> list[float]:
    assert done.returncode == 0, done.stderr
    return [float(line.split()[2]) for line in done.stdout.splitlines() if line.startswith("rank")]


HEAD = "ranks 4 hosts 4 per 1 flops 1e9\n"


@needs_simgrid
@pytest.mark.parametrize(("moves", "status", "said"), [
    # rank 1's message to 0 stands on rank 0's to 3, of the same name: none
    (f"mirror\nrank 0 1\nR {1 << 48 | 7} 0\n", 3, "waits for a message nobody sends"),
    # rank 0's to 3 comes after its wait for rank 1's: every rank waits for the other
    (f"mirror\nrank 0 2\nR {1 << 48 | 7} 0\nS 3 10 7 0 1 0\n", 3, "nobody sends before it"),
    ("mirror\nrank 0 1\nS 3 10 7 0 1 0\n", 3, "never waited for"),
    ("mirror\nrank 0 0\nrank 1 0\n", 2, "'rank 0 N' alone"),
    ("mirror\nrank 1 0\n", 2, "'rank 0 N' alone"),
    ("mirrors\nrank 0 0\n", 2, "'mirror'"),
])
def test_a_mirrored_recording_that_does_not_pair_up_is_refused(tmp_path, moves, status, said):
    done = _run(tmp_path, HEAD, moves)
    assert done.returncode == status and said in done.stderr, done.stderr


@needs_simgrid
def test_a_mirrored_recording_on_hosts_of_two_ranks_is_refused(tmp_path):
    done = _run(tmp_path, "ranks 4 hosts 2 per 2 flops 1e9\n", "mirror\nrank 0 0\n")
    assert done.returncode == 2 and "hosts of one rank each" in done.stderr


@needs_simgrid
def test_a_mirrored_recording_that_pairs_up_takes_its_messages_time(tmp_path):
    """Rank 0 sends 1 MB to 3 and waits for rank 1's (its stand-in: that very message): 1 ms at
    1 GB/s plus the latency, for every rank."""
    done = _run(tmp_path, HEAD, f"mirror\nrank 0 2\nS 3 1000000 7 0 1 0\nR {1 << 48 | 7} 0\n")
    assert _ends(done) == pytest.approx([0.001001] * 4, rel=1e-4)


@needs_simgrid
def test_a_peers_messages_are_taken_in_the_order_it_sent_them_by_rank_0_alone_too(tmp_path):
    """Every rank sends its left neighbour a megabyte, then a byte, and waits for the byte from
    its right one first, then works 10 ms: RC delivers a pair's messages in order, so the byte
    is taken after the megabyte (1 ms at 1 GB/s), not at once: 11 ms. Rank 0 alone, waiting on
    its own byte's stand-in, must wait for its megabyte too (else 10 ms): the same ends as the
    replay of all four."""
    big, small = 5, 6

    def moves(r: int) -> str:
        right = (r + 1) % 4
        return (f"rank {r} 4\nS {(r + 3) % 4} 1000000 {r << 48 | big} 0 1 0\n"
                f"S {(r + 3) % 4} 1 {r << 48 | small} 0 0 0\n"
                f"R {right << 48 | small} 0.01\nR {right << 48 | big} 0\n")
    every = _ends(_run(tmp_path, HEAD, "".join(moves(r) for r in range(4))))
    alone = _ends(_run(tmp_path, HEAD, "mirror\n" + moves(0)))
    assert every == pytest.approx([0.011001] * 4, rel=1e-4)
    assert alone == pytest.approx(every, rel=1e-12, abs=0)


@needs_simgrid
@pytest.mark.parametrize(("platform", "config", "said"), [
    (platforms.Platform("fat-tree", 2 * platforms.LEAF, 1e9, 1e-6, oversubscription=4), (),
     "is not h0's link up"),
    (platforms.Platform("torus", 8, 1e9, 1e-6), (), "is not h0's link up"),
    (platforms.Platform("cluster", 4, 1e9, 1e-6), ("--cfg=network/crosstraffic:1",),
     "the other way"),
])
def test_rank_0_alone_on_a_platform_whose_hosts_differ_is_refused_by_the_replayer(
        tmp_path, platform, config, said):
    head = f"ranks {platform.ranks} hosts {platform.hosts} per 1 flops 1e9\n"
    done = _run(tmp_path, head, "mirror\nrank 0 1\nC 1\n", platform, config)
    assert done.returncode == 2 and said in done.stderr, done.stderr


@needs_simgrid
@pytest.mark.parametrize(("head", "moves", "said"), [
    ("ranks 70000 hosts 70000 per 1 flops 1e9\n", "mirror\nrank 0 0\n", "more than 65536"),
    (HEAD, "rank 0 2\nS 1 1 0 1 1 0\nW 2 0 0\nrank 1 1\nR 0 0\nrank 2 0\nrank 3 0\n",
     "waits for more sends than it made"),
    (HEAD, "rank 0 2\nS 1 1 0 0 1 0\nW 1 0\nrank 1 1\nR 0 0\nrank 2 0\nrank 3 0\n",
     "marked as never waited for"),
])
def test_the_replayers_reader_refuses_what_it_cannot_hold_to(tmp_path, head, moves, said):
    done = _run(tmp_path, head, moves)
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_rank_0_alone_is_not_written_for_a_recording_that_does_not_turn(tmp_path):
    t = trace.record("alltoall", "sequential", 4, 1024)
    with pytest.raises(replayer.SimulationError, match="does not stand for every rank"):
        replayer.write_moves(t, COSTS, platforms.Platform("cluster", 4, 1e9, 1e-6),
                             tmp_path / "m.txt", mirror=True)
    assert not (tmp_path / "m.txt").exists()

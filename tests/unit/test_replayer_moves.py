"""The replayer on moves written by hand, with times worked out by hand: the lab's VMs sharing
the machine's cores, the order a rank takes its peers' messages in, and the input it
refuses."""

from __future__ import annotations

import subprocess

import pytest

from experiments.simulation import platforms, replayer
from tests.unit.simulator_helpers import needs_simgrid, replay_moves


@needs_simgrid
def test_idle_vms_leave_their_cores_to_the_busy_ones(tmp_path):
    """The lab: 3 one-CPU VMs on 2 cores. A second of work on each of the three takes 1.5 s;
    on two of them, with the third idle, 1 s."""
    lab = platforms.Platform("lab", 3, 1e6, 1e-9, machine_cores=2)
    assert replay_moves(tmp_path, lab, "rank 0 1\nC 1\nrank 1 1\nC 1\nrank 2 1\nC 1\n") \
        == pytest.approx([1.5] * 3, rel=1e-6)
    assert replay_moves(tmp_path, lab, "rank 0 1\nC 1\nrank 1 1\nC 1\nrank 2 0\n") \
        == pytest.approx([1.0, 1.0, 0.0], rel=1e-6)


@needs_simgrid
def test_a_messages_bytes_cost_both_vms_cpu(tmp_path):
    """1 MB at 1 MB/s: a second of CPU on the sender's VM and on the receiver's at once, then
    the latency; the sender, which waits for it, learns of it a latency later, by the
    acknowledgement. With a third VM busy the machine's 2 cores have 3 claims: 1.5 s. Between
    two ranks of one VM, that VM pays what its loopback allows (2 MB/s here: half a
    second)."""
    message = "rank 0 2\nS 1 1000000 7 1 1 0\nW 1 0\nrank 1 1\nR 7 0\n"
    lab = platforms.Platform("lab", 3, 1e6, 1e-3, machine_cores=2)
    assert replay_moves(tmp_path, lab, message + "rank 2 0\n")[:2] \
        == pytest.approx([1.002, 1.001], rel=1e-6)
    assert replay_moves(tmp_path, lab, message + "rank 2 1\nC 10\n")[:2] \
        == pytest.approx([1.502, 1.501], rel=1e-6)
    one_vm = platforms.Platform("lab", 2, 1e6, 1e-3, machine_cores=2, per_node=2,
                                loop_bandwidth=2e6)
    assert replay_moves(tmp_path, one_vm, message) == pytest.approx([0.502, 0.501], rel=1e-6)


@needs_simgrid
def test_a_blocked_rank_spends_cpu_to_run_again_as_the_other_vms_want_the_cores(tmp_path):
    """wake = 5 ms, 3 one-CPU VMs on 2 cores, the third busy. Rank 1 blocks on rank 0's
    message (sent after 10 ms of work); rank 0 then blocks on its acknowledgement, which
    comes a latency (0.1 ms) after the message. When the message comes, rank 0 is blocked and
    only the busy VM wants a core, half the machine's: rank 1 spends 2.5 ms of CPU, 0.1 ms of
    it at full speed; then the acknowledgement wakes rank 0 beside rank 1 and the busy VM: 5
    ms, and the three VMs share the 2 cores (2/3 each) until rank 1 is done (3.6 ms), rank 0
    then alone beside the busy VM (2.6 ms). With the third VM idle, no other VM wants a core
    when either wakes: no cost; nor on 2 VMs for 2 cores, busy or not. A rank whose message
    came while it worked (20 ms, at 2/3 speed beside the two others) never blocked and pays
    no wake of its own, but loses to the sender's (woken beside it and the busy VM: 5 ms at
    2/3 speed, 7.5 ms) the third of a core that the sender's CPU took: 2.5 ms."""
    sends = "rank 0 3\nC 0.01\nS 1 1000 7 1 1 0\nW 1 0\n"

    def added(ranks, receiver, third=True):  # each rank's end, with the wake less without
        def ends(wake):
            lab = platforms.Platform("lab", ranks, 1e9, 1e-4, machine_cores=2, wake=wake)
            return replay_moves(tmp_path, lab, sends + receiver + ("rank 2 1\nC 10\n" if third else ""))[:2]
        return [b - a for a, b in zip(ends(0), ends(5e-3), strict=True)]
    blocked = "rank 1 1\nR 7 0\n"
    assert added(3, blocked) == pytest.approx([6.2e-3, 3.7e-3], abs=1e-5)
    assert added(3, blocked + "rank 2 0\n", third=False) == pytest.approx([0, 0], abs=1e-12)
    assert added(2, blocked, third=False) == pytest.approx([0, 0], abs=1e-12)
    assert added(3, "rank 1 2\nC 0.02\nR 7 0\n") == pytest.approx([7.5e-3, 2.5e-3], abs=1e-5)


@needs_simgrid
def test_ranks_woken_at_one_instant_want_their_cores_together(tmp_path):
    """Two ranks send each other a message at once and block on the other's, beside a busy
    third VM (3 one-CPU VMs on 2 cores, wake = 5 ms): both messages come at the same instant,
    so each rank sees the other's VM and the busy one wanting both cores, whichever SimGrid
    runs first: 5 ms of CPU each, with the three VMs on the 2 cores (2/3 each): 7.5 ms. The
    busy VM loses the third of a core they took: its 10 s end 2.5 ms later (a wait would
    not hold it up). With a fourth VM idle beside them, the same."""
    back = (1 << 48) | 8  # a key's top bits are its sender's rank
    pair = f"rank 0 2\nS 1 1000 7 0 1 0\nR {back} 0\nrank 1 2\nS 0 1000 {back} 0 1 0\nR 7 0\n"

    def added(hosts, rest):
        def ends(wake):
            lab = platforms.Platform("lab", hosts, 1e9, 1e-4, machine_cores=2, wake=wake)
            return replay_moves(tmp_path, lab, pair + rest)[:3]
        return [b - a for a, b in zip(ends(0), ends(5e-3), strict=True)]
    assert added(3, "rank 2 1\nC 10\n") == pytest.approx([7.5e-3, 7.5e-3, 2.5e-3], abs=1e-5)
    assert added(4, "rank 2 1\nC 10\nrank 3 0\n") \
        == pytest.approx([7.5e-3, 7.5e-3, 2.5e-3], abs=1e-5)


@needs_simgrid
def test_only_a_sender_that_waits_hears_the_acknowledgement(tmp_path):
    """A send nobody waits for does not hold its sender: rank 0 ends with its second of work
    and the message's millisecond on its one CPU (1.001 s), the receiver when the bytes,
    done at half speed beside that work, and the latency are (3 ms). Waited for: the bytes
    at full speed and the latency (2 ms), and the sender a latency later, by the
    acknowledgement."""
    lab = platforms.Platform("lab", 3, 1e6, 1e-3, machine_cores=2)
    unwaited = "rank 0 2\nS 1 1000 7 0 1 0\nC 1\nrank 1 1\nR 7 0\nrank 2 0\n"
    assert replay_moves(tmp_path, lab, unwaited)[:2] == pytest.approx([1.001, 0.003], rel=1e-6)
    waited = "rank 0 2\nS 1 1000 7 1 1 0\nW 1 0\nrank 1 1\nR 7 0\nrank 2 0\n"
    assert replay_moves(tmp_path, lab, waited)[:2] == pytest.approx([0.003, 0.002], rel=1e-6)


@needs_simgrid
def test_a_vms_data_path_bounds_its_bytes_beside_the_cpu(tmp_path):
    """1 MB, a quarter second of CPU on each side, through data paths of 1 MB/s: the path
    bounds it (1 s, and the latency). Sent both ways at once, each VM's path carries 2 MB:
    2 s. With a third VM busy the 2 cores have 3 claims, but the CPU's quarter second still
    ends first (3/8 s): the path's 1 s again. At 2 us of CPU a byte the CPU bounds: 2 s on
    2/3 of a core, 3 s."""
    lab = platforms.Platform("lab", 3, 1e6, 1e-3, machine_cores=2, cpu_per_byte=0.25e-6,
                             path_bandwidth=1e6)
    one = "rank 0 2\nS 1 1000000 7 1 1 0\nW 1 0\nrank 1 1\nR 7 0\n"
    assert replay_moves(tmp_path, lab, one + "rank 2 0\n")[:2] \
        == pytest.approx([1.002, 1.001], rel=1e-6)
    back = (1 << 48) | 8  # a key's top bits are its sender's rank
    both = (f"rank 0 3\nS 1 1000000 7 1 1 0\nR {back} 0\nW 1 0\n"
            f"rank 1 3\nS 0 1000000 {back} 1 1 0\nR 7 0\nW 1 0\nrank 2 0\n")
    assert replay_moves(tmp_path, lab, both)[:2] == pytest.approx([2.002] * 2, rel=1e-6)
    assert replay_moves(tmp_path, lab, one + "rank 2 1\nC 10\n")[:2] \
        == pytest.approx([1.002, 1.001], rel=1e-6)
    cpu_bound = platforms.Platform("lab", 3, 1e6, 1e-3, machine_cores=2, cpu_per_byte=2e-6,
                                   path_bandwidth=1e6)
    assert replay_moves(tmp_path, cpu_bound, one + "rank 2 1\nC 10\n")[:2] \
        == pytest.approx([3.002, 3.001], rel=1e-6)


@needs_simgrid
def test_a_vm_done_with_its_side_of_a_message_leaves_its_core(tmp_path):
    """The receiver's VM is idle once its half of the bytes is done, though the sender's is
    not (its rank works beside the message): 3 VMs busy on 2 cores until 1.5 s (the
    receiver's second of CPU at 2/3), then the sender's VM gets a whole core for the half
    second each of its two claims has left: 2.5 s, and the latency (the sender's: twice, the
    acknowledgement's way back)."""
    lab = platforms.Platform("lab", 3, 1e6, 1e-3, machine_cores=2)
    ends = replay_moves(tmp_path, lab, "rank 0 3\nS 1 1000000 7 1 1 0\nC 1\nW 1 0\n"
                                        "rank 1 1\nR 7 0\nrank 2 1\nC 10\n")
    assert ends[:2] == pytest.approx([2.502, 2.501], rel=1e-6)


@needs_simgrid
def test_a_rank_takes_each_peers_messages_in_order_not_everyones(tmp_path):
    """RC keeps order per queue pair, not across peers. Rank 17 waits for rank 16's byte, sent
    just after rank 0's megabyte, and has it at once; then a second of work, then rank 0's
    megabyte, long there: 1 s. Taking all its peers' messages in the order they were posted,
    it waited for the megabyte first (1 ms at 1 GB/s). Ranks 0 and 16 also share any split of
    the peers by rank mod 16."""
    cluster = platforms.Platform("cluster", 18, 1e9, 1e-6)
    byte = 16 << 48  # the key of rank 16's message: its rank in the top bits
    idle = "".join(f"rank {r} 0\n" for r in range(1, 16))
    ends = replay_moves(tmp_path, cluster, f"rank 0 1\nS 17 1000000 0 0 1 0\n{idle}"
                                           f"rank 16 2\nC 1e-6\nS 17 1 {byte} 0 1 0\n"
                                           f"rank 17 3\nR {byte} 0\nC 1\nR 0 0\n")
    assert ends[17] == pytest.approx(1.0, abs=1e-4)


@needs_simgrid
def test_a_rank_with_many_writes_on_the_wire_has_them_share_the_link(tmp_path):
    """20 writes of a megabyte from rank 0 to rank 1 at once (a crowded rank: its porters post
    them), the first waited for before its porter ran, while rank 1 waits for it too: they
    share the 1 GB/s link and all arrive after 20 ms. Nothing is left behind in SimGrid (it
    says so at exit: two waits on one comm by actors that are not its sender leaked one)."""
    cluster = platforms.Platform("cluster", 2, 1e9, 1e-6)
    sends = "".join(f"S 1 1000000 {i} 1 1 0\n" for i in range(20))
    waits = "".join(f"R {i} 0\n" for i in range(20))
    moves = f"rank 0 22\n{sends}W 1 0\nW 19 {' '.join(map(str, range(1, 20)))}\nrank 1 20\n{waits}"
    assert replay_moves(tmp_path, cluster, moves) == pytest.approx([0.020001] * 2, rel=1e-4)
    done = subprocess.run([str(replayer.binary()), str(tmp_path / "p.xml"), str(tmp_path / "m.txt"),
                           *cluster.config()], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Probable bug" not in done.stderr, done.stderr


@needs_simgrid
@pytest.mark.parametrize(("moves", "said"), [
    ("rank 0 1\nW 1 0\nrank 1 0\n", "waits for more sends than it made"),
    ("rank 0 2\nS 1 1 0 1 1 0\nW 1 5\nrank 1 1\nR 0 0\n", "waits for a send it has not made"),
    ("rank 0 1\nS 1 -5 1 0 1 0\nrank 1 0\n", "fewer than 0 bytes"),
    ("rank 0 0\nrank 0 0\n", "each rank once"),
    ("rank 0 1\nC -1\nrank 1 0\n", "below 0"),
    (f"rank 0 1\nR {2 << 48} 0\nrank 1 0\n", "waits for a rank that does not exist"),
    ("rank 0 0\nrank 1 1\nS 0 1 5 0 1 0\n", "keyed as another rank's"),
    ("rank 0 2\nC 0\n", "cut short"),
    ("rank 0 0\nrank 1 0\nrank 2 0\n", "more than the ranks' moves"),
    ("", "H x K >= P"),  # 2 ranks on 1 host of 1
    ("vms 0 1e-9 1e-9 0 0\nrank 0 0\nrank 1 0\n", "C >= 1 cores per VM"),
    ("vms 1 -1 0 0 0\nrank 0 0\nrank 1 0\n", "B, L and F >= 0"),
    ("vms 1 0 0 -1 0\nrank 0 0\nrank 1 0\n", "B, L and F >= 0"),
    ("vms 1 0 0 0 -1\nrank 0 0\nrank 1 0\n", "W >= 0 seconds"),
    ("vms 1 1e-9 1e-9 0\nrank 0 0\nrank 1 0\n", "'vms C B L F W'"),
])
def test_the_replayer_refuses_a_malformed_recording(tmp_path, moves, said):
    (tmp_path / "p.xml").write_text(platforms.Platform("cluster", 2, 1e9, 1e-6).xml())
    head = "ranks 2 hosts 2 per 1 flops 1e9\n" if moves else "ranks 2 hosts 1 per 1 flops 1e9\n"
    (tmp_path / "m.txt").write_text(head + moves)
    done = subprocess.run([str(replayer.binary()), str(tmp_path / "p.xml"), str(tmp_path / "m.txt")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and said in done.stderr


def test_the_replayer_without_its_allocator_says_what_to_install(tmp_path, monkeypatch):
    """jemalloc is part of the replayer's build (glibc's allocator took a quarter of its
    time): without it the build is refused naming the package, not left to g++'s error or
    to a slow binary."""
    monkeypatch.setenv("RXELAB_CACHE", str(tmp_path))
    monkeypatch.setattr(replayer.ctypes.util, "find_library",
                        lambda name: None if name == "jemalloc" else "lib" + name + ".so")
    with pytest.raises(replayer.SimulationError, match="needs .*jemalloc.*libjemalloc2.*install-deps"):
        replayer.binary()
    assert not (tmp_path / "simulator").exists() or not any((tmp_path / "simulator").iterdir())


def test_another_link_line_or_header_builds_another_binary(tmp_path, monkeypatch):
    """The cache is keyed by how a program is built and by the files it includes as well as
    by its source: a replayer built before the allocator was linked in, or before its input
    reader changed, is not taken for the new one."""
    monkeypatch.setenv("RXELAB_CACHE", str(tmp_path))
    source = tmp_path / "x.cpp"
    source.write_text("int main() { return 0; }\n")

    def compile_with(flag):
        def argv(out):
            return ["/bin/sh", "-c", f"echo {flag} > \"$0\"", out]
        return argv
    one = replayer.built(source, compile_with("-lone"), None, "x")
    two = replayer.built(source, compile_with("-ltwo"), None, "x")
    assert one != two and one.read_text() == "-lone\n" and two.read_text() == "-ltwo\n"
    assert replayer.built(source, compile_with("-lone"), None, "x") == one
    header = tmp_path / "x.hpp"  # and by what it includes (the replayer's input reader)
    header.write_text("// one\n")
    first = replayer.built(source, compile_with("-lone"), None, "x", (header,))
    header.write_text("// two\n")
    assert replayer.built(source, compile_with("-lone"), None, "x", (header,)) not in (one, first)

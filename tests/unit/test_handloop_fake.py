"""The hand-written pyverbs loop (rxelab.handloop), the floor rxelab-bench --hand-loop
measures the library's small calls against: on the in-memory fabric it must move every byte
where the collective's description puts it, call after call past its slot ring, and say in one
line what it cannot do."""

from __future__ import annotations

import numpy as np
import pytest
from rxelab import bench
from rxelab.errors import ConfigError

from tests.unit.fakejob import run_ranks


@pytest.mark.parametrize("p", [2, 3, 5])
@pytest.mark.parametrize("op", ["alltoall", "allgather"])
def test_the_hand_loop_moves_every_block_to_its_place(p, op):
    from rxelab.handloop import HandLoop

    def job(comm):
        hand = HandLoop(comm, 65536, timeout=20)
        try:
            # 40 calls: past the 16-slot send ring more than twice, so freed slots are reused
            return [bench.measure(comm, op, "hand-loop", size, 20, 1, hand=hand)
                    for size in (1, 1024, 65536)]
        finally:
            hand.close()
    for rows in run_ranks(p, job, deadline=120):
        for r in rows:
            assert r["wrong"] == 0 and r["avg_us"] > 0 and r["algorithm"] == "hand-loop", r
            assert r["sleeps"] >= 0


def test_the_hand_loops_check_sees_a_misplaced_block():
    """The rows' #wrong is what makes the floor a fair one: a loop that put a block in the
    wrong place would be counted (here one rank's arrivals are swapped by hand)."""
    from rxelab.handloop import HandLoop

    def job(comm):
        hand = HandLoop(comm, 1024, timeout=20)
        real = hand.run

        def swapped(op, send, recv):
            stats = real(op, send, recv)
            if comm.rank == 0:
                recv[1024:2048], recv[2048:3072] = recv[2048:3072].copy(), recv[1024:2048].copy()
            return stats
        hand.run = swapped
        try:
            return bench.measure(comm, "alltoall", "hand-loop", 1024, 2, 0, hand=hand)["wrong"]
        finally:
            hand.close()
    assert run_ranks(3, job)[0] > 0


def test_blocks_beyond_its_slots_or_another_collective_are_refused_in_one_line():
    from rxelab.handloop import HandLoop

    def job(comm):
        hand = HandLoop(comm, 1024, timeout=20)
        try:
            said = []
            for op, n in (("alltoall", 2048), ("allreduce", 16)):
                try:
                    hand.run(op, np.zeros(n * comm.size, np.uint8), np.zeros(n * comm.size, np.uint8))
                except ConfigError as err:
                    said.append(str(err))
            return said
        finally:
            hand.close()
    said = run_ranks(2, job)[0]
    assert "2048 bytes" in said[0] and "1024" in said[0], said
    assert "allreduce" in said[1], said


def test_a_peer_that_sends_another_size_is_refused_not_copied_past_its_place():
    from rxelab.handloop import HandLoop

    def job(comm):
        hand = HandLoop(comm, 4096, timeout=10)
        n = 4096 if comm.rank == 1 else 1024  # rank 1 sends blocks 4x the others' size
        recv = np.zeros(n * comm.size + 16, np.uint8)
        guard = recv[n * comm.size:]  # bytes past the receive buffer's end stay untouched
        try:
            hand.run("allgather", np.ones(n, np.uint8), recv[:n * comm.size])
        except ConfigError as err:
            return str(err), bool(guard.any())
        finally:
            hand.close()
        return None, bool(guard.any())
    said = run_ranks(2, job, deadline=60, keep_errors=True)
    assert said[0] == ("hand loop: rank 1 sent 4096 bytes, this rank expects 1024", False), said


def test_the_bench_refuses_a_hand_loop_of_a_collective_it_does_not_do(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--op", "allreduce", "--hand-loop"])
    assert exit_.value.code == 2
    assert "--hand-loop does alltoall and allgather, not allreduce" in capsys.readouterr().err


@pytest.mark.parametrize("op", ["alltoall", "allgather"])
def test_the_demo_app_runs_the_hand_loop_as_a_case_and_checks_every_stage(monkeypatch, capsys, op):
    """A spec's rxelab case with algorithm hand-loop runs apps/server_client.py as any other:
    its ranks as threads here; every stage's data checked, a summary naming the floor."""
    import json
    import threading

    import rxelab
    from pyverbs import _fabric

    from apps import server_client
    from tests.unit.fakejob import free_port

    _fabric.FABRIC.reset(seed=2, max_delay=0.0002)
    port, p = free_port(), 3
    real_init = rxelab.init
    monkeypatch.setattr(rxelab, "init", lambda **kw: real_init(
        int(threading.current_thread().name[4:]), p, "127.0.0.1", port, device="fake0", **kw))
    codes: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            codes[name] = server_client.main(["--op", op, "--algorithm", "hand-loop", "--size",
                                              "1024", "--stages", "20", "--tight", "--timeout", "20"])
        except BaseException as err:  # reported to the test
            codes[name] = err
    threads = [threading.Thread(target=run, args=(f"rank{r}",), name=f"rank{r}", daemon=True)
               for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert codes == {f"rank{r}": 0 for r in range(p)}, codes
    summary = next(json.loads(x) for x in capsys.readouterr().out.splitlines()
                   if x.startswith("{") and '"summary"' in x)
    assert summary["algorithm"] == "hand-loop" and summary["wrong"] == 0 and summary["ok"]


def test_the_demo_app_refuses_a_hand_loop_it_cannot_run_in_words(capsys):
    from apps import server_client
    for argv, said in ((["--op", "alltoall", "--size", "131072"], "blocks of 1 to 65536 bytes"),
                       (["--op", "allreduce", "--size", "1024"], "is not an allreduce algorithm")):
        with pytest.raises(SystemExit) as exit_:
            server_client.main([*argv, "--algorithm", "hand-loop"])
        assert exit_.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.slow
def test_a_peer_that_sends_no_endpoint_is_one_line_not_a_traceback(monkeypatch):
    import threading

    from rxelab import handloop, verbs
    from rxelab.errors import RdmaError

    real = verbs.Connection.endpoint

    class Garbled:
        def to_dict(self):
            return {"qpn": "x"}

    garbling: set[str] = set()  # the threads whose endpoints are garbled from now on

    def endpoint(conn):  # rank 1's hand loop sends garbage where its endpoint goes
        return Garbled() if threading.current_thread().name in garbling else real(conn)
    monkeypatch.setattr(verbs.Connection, "endpoint", endpoint)

    def job(comm):
        if comm.rank == 1:  # the communicator itself was formed with true endpoints
            garbling.add(threading.current_thread().name)
        try:
            handloop.HandLoop(comm, 1024, timeout=5).close()
        except RdmaError as err:
            return str(err)
        return None
    said = run_ranks(2, job, deadline=60, keep_errors=True)
    assert any(isinstance(s, str) and "rank 1 sent no endpoint" in s for s in said), said

"""The demo apps' shared parts: data, checks and the one output format both apps print."""

import argparse
import json
import time

import numpy as np
import pytest

from apps import stages


def simulate(op: str, sends: list[np.ndarray], r: int, m: int) -> np.ndarray:
    """What rank r receives, worked out from every rank's data by hand (not by rxelab.ops)."""
    p = len(sends)
    return {
        "alltoall": lambda: np.concatenate([sends[s][r * m:(r + 1) * m] for s in range(p)]),
        "allgather": lambda: np.concatenate(sends),
        "allreduce": lambda: sum(sends[1:], sends[0]),
        "reduce_scatter": lambda: sum(sends[1:], sends[0])[r * m:(r + 1) * m],
        "bcast": lambda: sends[0],
        # src sends dst m + (2 src + dst) % 3 elements, its blocks one after another
        "alltoallv": lambda: np.concatenate([
            sends[s][sum(m + (2 * s + d) % 3 for d in range(r)):][:m + (2 * s + r) % 3]
            for s in range(p)]),
    }[op]()


@pytest.mark.parametrize("op", stages.OPS)
def test_what_is_sent_is_what_is_expected(op):
    p, size, stage = 3, 20, 7
    m = size // np.dtype(stages.ops.COLLECTIVES[op].dtype).itemsize
    sends = [stages.buffers(op, stage, r, p, size)[0] for r in range(p)]
    for r in range(p):
        want = stages.buffers(op, stage, r, p, size)[1]
        assert want.size and (simulate(op, sends, r, m) == want).all()
    assert not (stages.buffers(op, 1, 0, p, size)[1] == stages.buffers(op, 2, 0, p, size)[1]).all(), \
        "every stage's data differs, so a stale buffer cannot pass the check"


def test_report_and_parse_round_trip():
    args = argparse.Namespace(op="alltoall", algorithm="pairwise", size=64, stages=3, warmup=1,
                              quiet=False)
    table = np.array([[0.1, 0, 0.2, 0, 0.3, 0], [0.2, 0, 0.1, 5, 0.3, 0]], np.float64).ravel()
    lines = stages.report("rxelab", args, 2, table, {"peak_pinned": 10})
    records = stages.parse_output("\n".join(f"[0] {x}" for x in lines) + "\nnoise\n[1] {bad json")
    assert [r["record"] for r in records] == ["stage", "stage", "stage", "summary"]
    assert [r["seconds"] for r in records[:3]] == [0.2, 0.2, 0.3], "the slowest rank counts"
    assert records[1]["wrong"] == 5
    summary = records[-1]
    assert summary["ok"] is False and summary["wrong"] == 5 and summary["peak_pinned"] == 10
    assert summary["total_seconds"] == pytest.approx(0.7)
    assert summary["avg_stage_us"] == pytest.approx(0.7 / 3 * 1e6)
    assert lines[-1].startswith("# rxelab alltoall/pairwise") and "WRONG" in lines[-1]
    assert json.loads(lines[-2])["ranks"] == 2


def test_back_to_back_total_is_the_slowest_ranks_span():
    """Back to back, ranks drift: rank 0 is slow on stage 0, rank 1 on stage 1. Summing each
    stage's slowest (0.3 + 0.3) overstates what the loop took; the slowest span is 0.4."""
    args = argparse.Namespace(op="alltoall", algorithm="parallel", size=64, stages=2, warmup=0,
                              quiet=True, tight=True)
    table = np.array([[0.3, 0, 0.1, 0], [0.1, 0, 0.3, 0]], np.float64).ravel()
    summary = stages.parse_output("\n".join(stages.report("mpi", args, 2, table, {})))[-1]
    assert summary["tight"] is True
    assert summary["total_seconds"] == pytest.approx(0.4)
    assert summary["avg_stage_us"] == pytest.approx(0.2e6)
    args.tight = False
    assert stages.parse_output("\n".join(stages.report("mpi", args, 2, table, {})))[-1][
        "total_seconds"] == pytest.approx(0.6)


def _one_rank_alltoall(corrupt_at: int | None = None):
    """A 1-rank all-to-all (recv = send) that records what it was given, and can spoil one call."""
    seen = []

    def collective(send, recv):
        seen.append(send.copy())
        np.copyto(recv, send)
        if len(seen) == corrupt_at:
            recv[0] ^= 0xFF
    return collective, seen


@pytest.mark.parametrize("tight", [False, True])
def test_stage_loop(tight):
    args = argparse.Namespace(op="alltoall", size=16, stages=4, warmup=1, tight=tight)
    collective, seen = _one_rank_alltoall()
    barriers = []
    mine = stages.run(args, 0, 1, collective, lambda: barriers.append(len(seen)), "rxelab")
    assert len(seen) == 5 and (mine[0::2] > 0).all() and not mine[1::2].any()
    same = all((s == seen[0]).all() for s in seen)
    assert same is tight, "stage by stage new data goes in; back to back the same data stays"
    assert barriers == ([1] if tight else []), "back to back starts together after the warm-up"


@pytest.mark.parametrize("tight,spoiled,caught", [(False, 3, True), (True, 5, True), (True, 3, False)])
def test_stage_loop_checks(tight, spoiled, caught):
    """Stage by stage every call is checked; back to back only the last (a spoiled earlier
    call is overwritten by the next one, as it would be in a training loop)."""
    args = argparse.Namespace(op="alltoall", size=16, stages=4, warmup=1, tight=tight)
    collective, _ = _one_rank_alltoall(corrupt_at=spoiled)
    mine = stages.run(args, 0, 1, collective, lambda: None, "rxelab")
    assert bool(mine[1::2].sum()) is caught


def test_the_gloo_app_refuses_what_it_cannot_run_in_words(monkeypatch, capsys):
    import importlib.util
    import sys as _sys

    from apps import gloo_compare
    with pytest.raises(SystemExit) as e:
        gloo_compare.main(["--op", "reduce_scatter"])
    assert e.value.code == 2 and "reduce_scatter has no Gloo counterpart" in capsys.readouterr().err
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(SystemExit):
        gloo_compare.main(["--op", "allreduce"])
    assert "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set" in capsys.readouterr().err
    if importlib.util.find_spec("torch") is None:  # the host: no torch, said so, no traceback
        for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": "29999"}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setitem(_sys.modules, "torch", None)
        assert gloo_compare.main(["--op", "allreduce"]) == 2
        assert "torch is not installed here" in capsys.readouterr().err



def test_the_demo_app_refuses_a_codec_it_cannot_use_in_words(capsys):
    from apps import server_client
    with pytest.raises(SystemExit) as e:
        server_client.main(["--op", "alltoall", "--algorithm", "parallel", "--compression", "fp16"])
    assert e.value.code == 2 and "fp16 rounds values" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        server_client.main(["--compression", "gzip"])
    assert e.value.code == 2 and "invalid choice: 'gzip'" in capsys.readouterr().err


@pytest.mark.parametrize("pattern", ["zeros", "sparse", "random"])
def test_every_data_kind_is_what_the_check_expects(pattern):
    """The apps' data kinds reach the test data, and each is what its name says."""
    args = argparse.Namespace(op="alltoall", size=4096, stages=2, warmup=0, tight=False,
                              data=pattern)
    collective, seen = _one_rank_alltoall()
    mine = stages.run(args, 0, 1, collective, lambda: None, "rxelab")
    assert not mine[1::2].any()
    set_ = np.count_nonzero(seen[0]) / seen[0].size
    assert {"zeros": set_ == 0, "sparse": 0 < set_ < 0.02, "random": set_ > 0.99}[pattern]


def test_a_lossy_result_is_checked_against_its_bound_not_exactly():
    want = np.array([1.0, 2.0, 3.0])
    got = want + np.array([0.0, 0.01, 0.5])
    assert stages.count_wrong(got, want) == 2
    assert stages.count_wrong(got, want, np.array([0.1, 0.1, 0.1])) == 1
    assert stages.count_wrong(np.array([np.nan]), np.array([1.0]), np.array([1e9])) == 1


def test_the_share_of_cpu_busy_is_counted_between_two_readings():
    assert stages.busy_between((10, 100), (40, 200)) == pytest.approx(0.3)
    for before, after in (((10, 100), None), (None, (10, 100)), ((10, 100), (10, 100))):
        assert np.isnan(stages.busy_between(before, after))


def test_the_stage_loop_reads_the_nodes_cpu_around_the_timed_calls_only(monkeypatch):
    """One reading at the first timed call (after the warm-up and the barrier), one right
    after the last call, before its check: the share busy in between."""
    args = argparse.Namespace(op="alltoall", size=16, stages=4, warmup=1, tight=True)
    events = []
    readings = iter([(100, 1000), (400, 1600)])

    def reading():
        events.append("read")
        return next(readings)
    monkeypatch.setattr(stages, "node_cpu", reading)

    def call(send, recv):
        events.append("call")
        recv[:] = send
    busy: list[float] = []
    stages.run(args, 0, 1, call, lambda: events.append("barrier"), "rxelab", busy=busy)
    assert events == ["call", "barrier", "read", "call", "call", "call", "call", "read"]
    assert busy == [pytest.approx(0.5)]


@pytest.mark.parametrize(("line", "want"), [
    ("cpu  100 5 50 800 40 3 2 7 0 0\n", (160, 1007)),  # steal (7) is neither busy nor idle's
    ("cpu  1 2 3\n", None), ("intr 5 6 7 8 9 10 11 12\n", None), ("", None),
    ("cpu  a b c d e f g h\n", None)])
def test_the_nodes_cpu_is_read_from_proc_stat(monkeypatch, tmp_path, line, want):
    fake = tmp_path / "stat"
    fake.write_text(line)
    monkeypatch.setattr(stages, "PROC_STAT", str(fake))
    assert stages.node_cpu() == want


def test_the_stage_loop_says_what_cpu_a_call_took():
    """getrusage over the timed calls: a call that burns 5 ms of CPU costs at least that."""
    def burning(send, recv):
        np.copyto(recv, send)
        start = time.process_time()
        while time.process_time() - start < 0.005:
            pass

    args = argparse.Namespace(op="alltoall", size=16, stages=4, warmup=2, tight=True)
    cpu: list[float] = []
    stages.run(args, 0, 1, burning, lambda: None, "rxelab", cpu=cpu)
    assert len(cpu) == 2 and min(cpu) >= 0
    per = stages.cpu_per_call(cpu, args.stages)
    assert per["cpu_user_us"] + per["cpu_sys_us"] >= 5000 * 0.99, per
    assert stages.cpu_per_call([], 4) == {}

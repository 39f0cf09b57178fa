"""What a reader sees first: per collective, the best rxelab algorithm against each contender
as a ratio, judged by the rounds' spread (a difference inside it is said to be none); compact
tables that mark the fastest and whatever is inside its spread; the run's constants said once."""

from dataclasses import replace

import pytest

from experiments.report import summary, view
from experiments.running.records import Record


def row(contender, algorithm, size, ms, lo=None, hi=None, rounds=3, **kw):
    r = {"contender": contender, "algorithm": algorithm, "op": "alltoall", "nodes": 3, "ranks": 3,
         "stages": 50, "mode": "back to back", "network": "none", "active_mtu": 4096,
         "data": "pattern", "compression": "none", "size": size, "avg_us": ms * 1e3,
         "round_min_us": (lo if lo is not None else ms) * 1e3,
         "round_max_us": (hi if hi is not None else ms) * 1e3, "rounds": rounds, "status": "ok",
         "pairs": None, "case": 0, "round": 0, "wrong": 0, "loss": 0.0, "loss_only": True, "app": contender}
    return view.Row(**{**r, **kw})


RUN = [row("rxelab", "pairwise", 1024, 10, 9, 11), row("rxelab", "parallel", 1024, 12, 11, 13),
       row("mpi-ucx", "mpi-default", 1024, 20, 18, 22),
       row("rxelab", "pairwise", 1 << 20, 100, 90, 130), row("rxelab", "parallel", 1 << 20, 80, 70, 95),
       row("mpi-ucx", "mpi-default", 1 << 20, 100, 85, 120)]


def test_the_headline_ratio_is_the_best_rxelab_over_each_rival_judged_by_the_spread():
    [h] = view.headlines(RUN, set())
    assert h.best == "pairwise at 1 KiB; parallel at 1 MiB"
    [ucx] = h.rivals
    assert ucx.name == "mpi-ucx" and ucx.sizes == 2
    assert ucx.ratio == pytest.approx((10 / 20 * 80 / 100) ** 0.5)
    assert ucx.low == pytest.approx((9 / 22 * 70 / 120) ** 0.5), "our fastest over their slowest"
    assert ucx.high == pytest.approx((11 / 18 * 95 / 85) ** 0.5), "our slowest over their fastest"
    assert (ucx.faster, ucx.slower) == (1, 0), "1 KiB wins outright; 1 MiB's rounds overlap"
    assert "faster beyond the rounds' spread at 1 of 2" in ucx.words
    assert "inside the rounds' spread (no real difference) at 1 of 2" in ucx.words


def test_a_loss_beyond_the_spread_is_called_slower():
    run = [row("rxelab", "pairwise", 1024, 30, 29, 31), row("mpi-tcp", "mpi-default", 1024, 10, 9, 11)]
    [h] = view.headlines(run, set())
    assert (h.rivals[0].faster, h.rivals[0].slower) == (0, 1)
    words = h.rivals[0].words
    assert "slower beyond the rounds' spread at 1 of 1" in words and "at 1 KiB" in words


def test_without_a_rival_the_headline_sets_the_algorithms_against_each_other():
    [h] = view.headlines([r for r in RUN if r.contender == "rxelab"], set())
    assert not h.rivals
    assert "1 KiB: pairwise 1.20x faster than parallel" in h.words
    assert "1 MiB: parallel 1.25x faster than pairwise (inside the spread)" in h.words


def test_an_impaired_setting_gets_no_headline():
    assert view.headlines([replace(r, network="loss 1%") for r in RUN], set()) == []


def test_the_compact_table_marks_the_fastest_and_what_is_inside_its_spread():
    [t] = view.compact(RUN, set())
    assert t.series == ["rxelab pairwise", "rxelab parallel", "mpi-ucx mpi-default"]
    (s1, small), (s2, big) = t.rows
    assert (s1, s2) == ("1 KiB", "1 MiB"), "sizes in order, in binary units"
    assert [c.best for c in small] == [True, False, False]
    assert [c.inside for c in small] == [False, True, False], "parallel's 11-13 meets 9-11"
    assert small[0].text == "10.0" and small[0].range == "9.00-11.0"
    assert [c.best for c in big] == [False, True, False] and big[0].inside and big[2].inside


def test_constants_are_said_once_and_the_full_table_drops_them_and_empty_columns():
    shared = view.constants(RUN)
    heads = {h for _, h, _ in shared}
    assert {"op", "nodes", "RoCE MTU", "network", "rounds"} <= heads
    assert "pairs at once" not in heads, "a column empty everywhere is not a constant"
    head, rows = view.full_table(RUN, heads)
    assert head[:4] == ["contender", "algorithm", "size", "ms per call"]
    assert "pairs at once" not in head and "rxe pkts" not in head
    assert rows[0][:5] == ["rxelab", "pairwise", "1 KiB", "10.0", "9.00-11.0"]


def test_the_summary_orders_sizes_as_numbers_and_marks_a_ratio_inside_the_spread():
    run = [row("rxelab", "pairwise", s, 10, 5, 40) for s in (1 << 20, 1024, 16384, 65536)] + \
        [row("mpi-ucx", "mpi-default", s, 20, 15, 25) for s in (1 << 20, 1024, 16384, 65536)]
    records = [Record(status="ok", app="rxelab", transport="tcp", case=0, op="alltoall",
                      algorithm="pairwise")]
    lines = summary.summary_lines(run, records, [])
    sizes = [x.split(", ")[2] for x in lines if "fastest" in x]
    assert sizes == ["1 KiB per peer", "16 KiB per peer", "64 KiB per peer", "1 MiB per peer"]
    assert all("0.50x mpi-ucx's time (inside the rounds' spread)" in x for x in lines if "fastest" in x)


def test_a_variant_of_rxelab_is_ours_not_a_rival():
    run = RUN + [row("rxelab-eager0", "parallel", 1024, 8, 7.5, 8.5)]
    [h] = view.headlines(run, set())
    assert [r.name for r in h.rivals] == ["mpi-ucx"]
    assert h.best.startswith("rxelab-eager0 parallel at 1 KiB")


def test_a_round_that_took_no_time_is_left_out_of_the_headline_not_a_crash():
    run = [replace(r, round_min_us=0.0) if r.contender == "mpi-ucx" and r.size == 1024 else r
           for r in RUN]
    [h] = view.headlines(run, set())
    assert h.rivals[0].sizes == 1, "only 1 MiB compared"


def test_a_size_run_once_on_one_side_is_not_judged_by_a_spread_it_does_not_have():
    run = [replace(r, rounds=1) if r.contender == "mpi-ucx" and r.size == 1024 else r
           for r in RUN]
    [ucx] = view.headlines(run, set())[0].rivals
    assert (ucx.faster, ucx.slower) == (0, 0)
    assert "one round, not judged, at 1 of 2" in ucx.words
    assert "inside the rounds' spread (no real difference) at 1 of 2" in ucx.words


def test_settings_are_in_numeric_order_and_a_varying_mode_is_in_the_title():
    run = [replace(r, nodes=n) for n in (16, 2, 4) for r in RUN[:1]] + \
        [replace(r, mode="stages") for r in RUN[:1]]
    shared = {k for k, _, _ in view.constants(run)}
    titles = [t.title for t in view.compact(run, shared)]
    assert titles == ["alltoall, 2 nodes, back to back", "alltoall, 3 nodes, as stages",
                      "alltoall, 4 nodes, back to back", "alltoall, 16 nodes, back to back"]


def test_the_cpu_tables_give_rank_0s_cpu_per_call_beside_each_series():
    run = [replace(RUN[0], cpu_us=4200.0), replace(RUN[1], cpu_us=None), RUN[2],
           replace(RUN[3], cpu_us=61000.0)]
    [t] = view.cpu_tables(run, set())
    assert t.series == ["rxelab pairwise", "rxelab parallel", "mpi-ucx mpi-default"]
    (s1, small), (s2, big) = t.rows
    assert (s1, s2) == ("1 KiB", "1 MiB")
    assert small[0].text == "4.20" and small[1] is None and small[2] is None, "unsaid: no cell"
    assert big[0].text == "61.0" and big[1] is None
    assert view.cpu_tables(RUN, set()) == [], "no case said its CPU: no section"
    head, rows = view.full_table(run, set())
    at = head.index("CPU per call (ms, rank 0)")
    assert [r[at] for r in rows[:2]] == ["4.20", "-"]

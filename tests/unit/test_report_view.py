"""What a reader sees beside the headline: compact tables that mark the fastest and whatever is
inside its spread; the run's constants said once; the summary's words."""

from dataclasses import replace

from experiments.report import summary, view
from experiments.running.records import Record
from tests.unit.report_helpers import RUN, row


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
    assert all("0.50x the time of MPI over UCX (50 % less, inside the rounds' spread)" in x
               for x in lines if "fastest" in x)


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

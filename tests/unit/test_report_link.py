"""One link, the same in the report's plots and tables: "% of link" is busbw over the one-way
`ib_write_bw` rxe carried between two nodes, the line the busbw plots draw, even where the run
also measured both directions at once; no traffic over rxe goes past it, and rows that did not
cross rxe (MPI over TCP, Gloo, rxelab over tcp or quic) say so instead of a share. From the
run the issue read (tests/fixtures/results-rounds: ib_write_bw 41.25 MB/s, `-b` 36.25)."""

import html
import shutil
from pathlib import Path

import pytest

from experiments import report
from experiments.report import link, plots
from experiments.spec import Case

ROUNDS = Path(__file__).resolve().parent.parent / "fixtures" / "results-rounds"


@pytest.fixture(name="flat")
def flat_fixture():
    records = report.load(ROUNDS)[1]
    flat = report.medians(report.rows(records))
    link.share(flat, link.measured(records))
    return flat


def test_the_link_is_the_one_way_rate_even_where_both_ways_were_measured():
    measured = link.measured(report.load(ROUNDS)[1])
    assert measured == link.Link(41.25, 36.25), "each tool's best between two nodes"
    assert measured.label == "link: one-way ib_write_bw (41.2 MB/s)"
    assert link.Link(None, 36.25).note.startswith("% of link: none"), "no one-way rate, no share"
    assert link.Link(None).note == "" and link.Link(None).label == ""


def test_traffic_over_rxe_is_a_share_of_the_one_way_rate_and_never_past_it(flat):
    """The issue: rxelab's 1 MiB was "90 % of the link" (over half of `-b`, 18.1 MB/s) and at
    40 % of the plotted line; it is now 40 % in both."""
    big = next(r for r in flat if r.contender == "rxelab" and r.algorithm == "parallel"
               and r.size == 1 << 20)
    assert big.link_pct == pytest.approx(100 * big.busbw / 41.25)
    assert round(big.link_pct) == 40
    over = [r for r in flat if r.over_rxe]
    assert over and all(r.link_pct is not None and r.link_pct <= 100 for r in over)


def test_rows_that_did_not_cross_rxe_say_so_instead_of_a_share(flat):
    """MPI over TCP's 1 MiB was "326 % of link": the kernel's TCP stack, not rxe, carried it."""
    tcp = [r for r in flat if r.contender == "mpi-tcp"]
    assert tcp and all(r.link_pct is None and r.link_note == link.NOT_OVER_RXE for r in tcp)
    head, rows = report.view.full_table(flat, set())
    at, who = head.index("% of link"), head.index("contender")
    assert {row[at] for row in rows if row[who] == "mpi-tcp"} == {"not over rxe"}


def test_ranks_that_share_a_node_get_no_share(flat):
    shared = [report.view.Row(**{**vars(flat[0]), "ranks": 6})]
    link.share(shared, link.Link(41.25))
    assert shared[0].link_pct is None and shared[0].link_note == ""


@pytest.mark.parametrize("case, over", [
    ({"app": "rxelab"}, True), ({"app": "rxelab", "rxelab_transport": "verbs"}, True),
    ({"app": "rxelab", "transport": "tcp"}, True),  # an old record's rxelab case over verbs
    ({"app": "rxelab", "rxelab_transport": "tcp"}, False),
    ({"app": "rxelab", "rxelab_transport": "quic"}, False),
    ({"app": "rxelab", "algorithm": "hand-loop"}, True),
    ({"app": "mpi", "transport": "ucx"}, True), ({"app": "mpi", "transport": "tcp"}, False),
    ({"app": "mpi"}, False), ({"app": "gloo"}, False)])
def test_what_crosses_rxe(case, over):
    assert link.over_rxe(Case(**{"op": "alltoall", "algorithm": "pairwise", "nodes": 3,
                                 "size": 1024, "stages": 3, **case})) is over


def test_the_busbw_plot_draws_the_tables_line_and_marks_what_it_does_not_bound(flat, monkeypatch):
    figures = []
    monkeypatch.setattr(plots, "png", lambda fig: figures.append(fig) or b"png")
    names = list(plots.size_scaling(flat, link.Link(41.25, 36.25)))
    ax = figures[names.index("busbw-alltoall-3n.png")].axes[0]
    [line] = [x for x in ax.get_lines() if x.get_label().startswith("link:")]
    assert list(line.get_ydata()) == [41.25, 41.25], "the rate the tables divide by"
    labels = ax.get_legend_handles_labels()[1]
    assert "mpi-tcp mpi-default (not over rxe)" in labels
    assert "mpi-ucx mpi-default" in labels and "rxelab parallel" in labels


@pytest.mark.slow
def test_the_report_names_the_link_and_says_why_tcp_rows_have_no_share(tmp_path):
    results = tmp_path / "run"
    shutil.copytree(ROUNDS, results)
    html_path, md_path = report.write(results)
    md, page = md_path.read_text(), html.unescape(html_path.read_text())
    for text in (md, page):
        assert "% of link: busbw over the link's rate, one-way ib_write_bw between two nodes " \
            "(41.2 MB/s" in text
        assert "18.1 each way (44 % of link)" in text, "what both ways at once left each"
        assert "does not bound them" in text
    assert "| not over rxe |" in md and "<td>not over rxe</td>" in page
    assert "1 MiB per peer" in md and "at 40 % of the link" in md
    assert "busbw over 18.1 MB/s" not in md

"""What a reader sees first: per collective, the best rxelab algorithm against each contender,
in words that say who takes what share of whose time and whether that is faster, judged by the
rounds' spread (a difference inside it is said to be none), each contender named as a reader
says it."""

from dataclasses import replace

import pytest

from experiments.report import headline
from tests.unit.report_helpers import RUN, row


def test_the_headline_ratio_is_the_best_rxelab_over_each_rival_judged_by_the_spread():
    [h] = headline.headlines(RUN, set())
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
    [h] = headline.headlines(run, set())
    assert (h.rivals[0].faster, h.rivals[0].slower) == (0, 1)
    words = h.rivals[0].words
    assert "slower beyond the rounds' spread at 1 of 1" in words and "at 1 KiB" in words


def test_without_a_rival_the_headline_sets_the_algorithms_against_each_other():
    [h] = headline.headlines([r for r in RUN if r.contender == "rxelab"], set())
    assert not h.rivals
    assert "1 KiB: pairwise 1.20x faster than parallel" in h.words
    assert "1 MiB: parallel 1.25x faster than pairwise (inside the spread)" in h.words


def test_an_impaired_setting_gets_no_headline():
    assert headline.headlines([replace(r, network="loss 1%") for r in RUN], set()) == []


def test_a_variant_of_rxelab_is_ours_not_a_rival():
    run = RUN + [row("rxelab-eager0", "parallel", 1024, 8, 7.5, 8.5)]
    [h] = headline.headlines(run, set())
    assert [r.name for r in h.rivals] == ["mpi-ucx"]
    assert h.best.startswith("parallel (rxelab, eager limit 0) at 1 KiB"), "a variant by name"


def test_a_round_that_took_no_time_is_left_out_of_the_headline_not_a_crash():
    run = [replace(r, round_min_us=0.0) if r.contender == "mpi-ucx" and r.size == 1024 else r
           for r in RUN]
    [h] = headline.headlines(run, set())
    assert h.rivals[0].sizes == 1, "only 1 MiB compared"


def test_a_size_run_once_on_one_side_is_not_judged_by_a_spread_it_does_not_have():
    run = [replace(r, rounds=1) if r.contender == "mpi-ucx" and r.size == 1024 else r
           for r in RUN]
    [ucx] = headline.headlines(run, set())[0].rivals
    assert (ucx.faster, ucx.slower) == (0, 0)
    assert "one round, not judged, at 1 of 2" in ucx.words
    assert "inside the rounds' spread (no real difference) at 1 of 2" in ucx.words


@pytest.mark.parametrize("contender, title", [
    ("mpi-ucx", "MPI over UCX"), ("mpi-tcp", "MPI over TCP"), ("gloo", "Gloo"),
    ("rxelab", "rxelab"), ("rxelab-tcp", "rxelab over tcp"), ("rxelab-quic", "rxelab over quic"),
    ("rxelab-eager0", "rxelab, eager limit 0"), ("rxelab-zstd-tcp", "rxelab over tcp, zstd"),
    ("pyverbs", "pyverbs (the hand loop)"), ("rxelab-odd", "rxelab-odd"), ("smpi", "smpi")])
def test_contenders_are_named_as_a_reader_says_them(contender, title):
    assert headline.contender_title(contender) == title


@pytest.mark.parametrize("ratio, said", [(0.87, "13 % less"), (1.39, "39 % more"),
                                         (1.002, "the same time"), (0.5, "50 % less")])
def test_a_ratio_of_times_is_said_as_the_share_more_or_less(ratio, said):
    assert headline.time_change(ratio) == said


def _one(run):
    [h] = headline.headlines(run, set())
    return h.who, h.rivals[0]


def test_the_headline_says_who_takes_what_share_of_whose_time_and_which_way():
    """The issue's "**0.87x** mpi-ucx's time" had no subject and no direction: it now says
    whose time, how much less or more, and faster or slower where the spread allows."""
    faster = [row("rxelab", "parallel", 1024, 8.7, 8.5, 8.9),
              row("mpi-ucx", "mpi-default", 1024, 10, 9.8, 10.2)]
    who, ucx = _one(faster)
    assert (who, ucx.title, f"{ucx.ratio:.2f}") == ("rxelab (best per size)", "MPI over UCX", "0.87")
    assert ucx.change == "13 % less, faster" and ucx.tone == "faster"
    slower = [row("rxelab", "parallel", 1024, 13.9, 13.8, 14),
              row("mpi-tcp", "mpi-default", 1024, 10, 9.9, 10.1)]
    assert _one(slower)[1].change == "39 % more, slower"
    inside = [row("rxelab", "parallel", 1024, 8.7, 7, 12), row("mpi-ucx", "mpi-default", 1024, 10, 8, 12)]
    assert _one(inside)[1].change == "13 % less, inside the rounds' spread (no real difference on the whole)"
    once = [replace(r, rounds=1) for r in slower]
    assert _one(once)[1].change == "39 % more, slower in one round (not judged)"


def test_over_several_sizes_the_share_is_the_geometric_mean_and_a_mixed_result_says_so():
    run = [row("rxelab", "parallel", 1024, 5, 4.9, 5.1), row("mpi-ucx", "mpi-default", 1024, 10, 9.9, 10.1),
           row("rxelab", "parallel", 1 << 20, 12, 11.9, 12.1),
           row("mpi-ucx", "mpi-default", 1 << 20, 10, 9.9, 10.1)]
    ucx = _one(run)[1]
    assert ucx.change == "23 % less (geometric mean of 2 sizes), faster on the whole"
    assert ucx.words.startswith("from 0.50x at 1 KiB to 1.20x at 1 MiB;")


@pytest.mark.slow
def test_the_pages_headline_reads_as_a_sentence(tmp_path):
    """Both pages say it the same way: who, the share in bold, whose time, how much and which
    way; the HTML colours the share by the spread's verdict."""
    import shutil
    from pathlib import Path

    from experiments import report
    results = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent.parent / "fixtures" / "results-rounds", results)
    html_path, md_path = report.write(results)
    md, page = md_path.read_text(), html_path.read_text()
    assert "- rxelab (best per size) takes **0.87x** the time of MPI over UCX: 13 % less " \
        "(geometric mean of 6 sizes), inside the rounds' spread" in md
    assert "takes **1.39x** the time of MPI over TCP: 39 % more (geometric mean of 6 sizes), " \
        "slower in one round (not judged)" in md
    assert "mpi-ucx's time" not in md and "mpi-ucx's time" not in page
    assert 'takes <span class="ratio slower">1.39x</span> the time of MPI over TCP' in page

"""The report's figures read at a glance: busbw on a log axis (five curves no longer lie on one
another below 64 KiB), and the memory bars visible at every size (the axis starts below the
smallest bar, not at it, and each bar says its value). Drawn from hand-made rows, the figures
caught before they become PNGs."""

import pytest

from experiments.readable import size_text
from experiments.report import link, plots
from tests.unit.report_helpers import RUN, row


@pytest.fixture(name="drawn")
def drawn_fixture(monkeypatch):
    """The figures plots draw, in order, instead of their PNGs."""
    figures = []
    monkeypatch.setattr(plots, "png", lambda fig: figures.append(fig) or b"png")
    return figures


def test_busbw_and_latency_are_on_log_axes(drawn):
    run = [row(r.contender, r.algorithm, r.size, r.avg_us / 1e3, busbw=r.size / r.avg_us)
           for r in RUN]
    names = list(plots.size_scaling(run, link.Link(None)))
    assert names == ["latency-alltoall-3n.png", "busbw-alltoall-3n.png"]
    for fig in drawn:
        assert fig.axes[0].get_yscale() == "log", fig.axes[0].get_ylabel()
    assert drawn[1].axes[0].get_ylabel() == "busbw (MB/s) (log scale)"


def test_a_series_with_no_bandwidth_is_left_out_of_a_log_axis_not_drawn_at_zero(drawn):
    run = [row(r.contender, r.algorithm, r.size, r.avg_us / 1e3,
               busbw=0.0 if r.contender == "mpi-ucx" else 1.0) for r in RUN]
    plots.size_scaling(run, link.Link(None))
    labels = drawn[1].axes[0].get_legend_handles_labels()[1]
    assert not any(x.startswith("mpi-ucx") for x in labels) and "rxelab pairwise" in labels


def test_every_memory_bar_shows_and_says_its_value(drawn):
    """The issue's run: 4 MiB pinned at 1 KiB and 64 KiB, 10 MiB at 1 MiB; the axis started at
    4 MiB, so the small sizes' bars had no height."""
    pinned = {1024: 4 << 20, 65536: 4 << 20, 1 << 20: 10 << 20}
    inflight = {1024: 2048, 65536: 128 << 10, 1 << 20: 2 << 20}
    run = [row("rxelab", "parallel", s, 10, peak_pinned=pinned[s], peak_inflight=inflight[s])
           for s in pinned]
    assert plots.memory(run) == b"png"
    [fig] = drawn
    for ax, values in zip(fig.axes[:2], (pinned, inflight), strict=True):
        low, high = ax.get_ylim()
        assert ax.get_yscale() == "log"
        assert low <= min(values.values()) / 4, "the smallest bar is at least 2 steps of 2 high"
        assert high > max(values.values())
        bars = ax.patches
        assert len(bars) == 3 and all(b.get_height() > low for b in bars)
        said = [t.get_text() for t in ax.texts]
        assert said == [size_text(v) for v in values.values()], "each bar says its value"

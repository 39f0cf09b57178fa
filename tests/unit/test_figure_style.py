"""Every figure and table writes sizes, times and colours one way: a series keeps its colour
wherever a reader meets it, and numbers read as a person would write them."""

import matplotlib.pyplot as plt
import pytest

from experiments import readable
from experiments.report import figure_style as fs


def test_colours_are_fixed_per_series_and_each_contender_has_its_own_family():
    assert fs.colour("pairwise") == fs.colour("pairwise", "rxelab")
    assert fs.colour("sequential k=16") == fs.colour("sequential k=4") != fs.colour("sequential")
    ours = {fs.colour(n) for n in fs.RXELAB_ORDER}
    assert len(ours) == len(fs.RXELAB_ORDER), "rxelab's algorithms each their own colour"
    # the all-to-alls, drawn together, far apart (not two greens)
    import matplotlib.colors as mc
    drawn = [mc.to_rgb(fs.colour(n)) for n in ("sequential", "sequential k=16", "pairwise",
                                                 "parallel", "bruck")]
    assert min(sum((a - b) ** 2 for a, b in zip(x, y, strict=True)) ** 0.5
               for i, x in enumerate(drawn) for y in drawn[i + 1:]) > 0.3
    for contender in ("mpi-ucx", "mpi-tcp", "gloo"):
        theirs = {fs.colour(n, contender) for n in fs.MPI_ORDER}
        assert len(theirs) == len(fs.MPI_ORDER)
        assert not theirs & ours, f"{contender} never takes an rxelab colour"
    assert fs.colour("mpi-default", "mpi-ucx") != fs.colour("mpi-default", "mpi-tcp")
    assert fs.style("mpi-tcp", "mpi-default")["linestyle"] != fs.style("rxelab", "pairwise")["linestyle"]


@pytest.mark.parametrize("n, text", [(1, "1 B"), (1000, "1000 B"), (1024, "1 KiB"),
                                     (1536, "1.5 KiB"), (65536, "64 KiB"), (1 << 20, "1 MiB"),
                                     (3 << 30, "3 GiB")])
def test_sizes_read_in_binary_units(n, text):
    assert readable.size_text(n) == text


@pytest.mark.parametrize("us, text", [(123.4, "0.123"), (1234.0, "1.23"), (24567.0, "24.6"),
                                      (420000.0, "420"), (None, "-"), (float("nan"), "-")])
def test_times_read_in_ms_with_three_figures(us, text):
    assert readable.ms_text(us) == text


def test_a_size_axis_is_log2_and_labelled_in_binary_units():
    fig, ax = plt.subplots()
    sizes = [1 << k for k in range(10, 21, 2)]
    ax.plot(sizes, range(len(sizes)))
    fs.size_axis(ax, sizes)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["1 KiB", "4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB"]
    assert ax.get_xscale() == "log"
    assert fs.png(fig)[:4] == b"\x89PNG"


def test_a_variant_of_rxelab_keeps_its_algorithm_s_colour_but_not_its_line():
    ours, variant = fs.style("rxelab", "parallel"), fs.style("rxelab-eager0", "parallel")
    assert ours["color"] == variant["color"]
    assert (ours["linestyle"], ours["marker"]) != (variant["linestyle"], variant["marker"])

"""How every figure and table of rxelab's reports (a lab run's and a simulation's) writes
sizes, times (experiments/readable.py) and colours, kept in one place so that a series looks the
same wherever a reader meets it: sizes as 1 KiB ... 1 MiB on a log2 axis, times in ms, one
colour family per contender (rxelab's algorithms in colour, MPI over UCX in black, MPI over TCP
in grey, Gloo in brown), legends beside the data, PNGs at 150 dpi."""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.readable import size_text

DPI = 150
# rxelab's algorithms, each its own colour (tab10 without its grey and brown, then Dark2)
RXELAB_ORDER = ("sequential", "pairwise", "parallel", "bruck", "ring", "recursive-doubling",
                "star", "binomial", "sequential k", "hand-loop")
MPI_ORDER = ("mpi-default", "mpi-pairwise", "mpi-bruck", "mpi-linear", "mpi-ring")
FAMILIES = {  # contender: its colours, darkest first, one per algorithm in MPI_ORDER
    "mpi-ucx": ("#000000", "#3b3b6b", "#5c3a1e", "#1f4e3d", "#4b0f2e"),
    "mpi-tcp": ("#7f7f7f", "#9a9ac0", "#b08a6a", "#86a898", "#b07a94"),
    "gloo": ("#8c564b", "#a9746a", "#6d3f36", "#c49c94", "#5a3129"),
}
FAMILIES["smpi"] = FAMILIES["mpi-ucx"]  # SMPI's copies of MPI's algorithms, in the simulation
LINESTYLE = {"rxelab": "-", "mpi-ucx": "--", "smpi": "--", "mpi-tcp": ":", "gloo": "-.",
             "pyverbs": (0, (1, 1))}  # the hand loop (rxelab.handloop): the floor, dotted fine


def colour(algorithm: str, contender: str = "rxelab") -> Any:
    """The same colour for a series in every figure: rxelab's algorithms each their own,
    another contender's from its own family (every window of the sequential schedule beside
    the strict one's, k > 1 sharing one)."""
    name = "sequential k" if algorithm.startswith("sequential k=") else algorithm
    if contender in FAMILIES:
        family = FAMILIES[contender]
        index = MPI_ORDER.index(name) if name in MPI_ORDER else sum(map(ord, name))
        return family[index % len(family)]
    if name == "sequential k":  # the palette's next, Dark2's teal, was near parallel's green
        return matplotlib.colormaps["Dark2"].colors[3]  # type: ignore[attr-defined]
    palette = [c for i, c in enumerate(matplotlib.colormaps["tab10"].colors)  # type: ignore[attr-defined]
               if i not in (5, 7)] + list(matplotlib.colormaps["Dark2"].colors)  # type: ignore[attr-defined]
    index = RXELAB_ORDER.index(name) if name in RXELAB_ORDER else sum(map(ord, name))
    return palette[index % len(palette)]


def style(contender: str, algorithm: str) -> dict[str, Any]:
    """Keyword arguments for ax.plot/ax.errorbar of a series."""
    if contender.startswith("rxelab-"):  # a variant of ours (rxelab-eager0): its colour, dotted
        return {"color": colour(algorithm), "linestyle": (0, (3, 1, 1, 1, 1, 1)), "marker": "^",
                "markersize": 5, "markerfacecolor": "none"}
    return {"color": colour(algorithm, contender), "linestyle": LINESTYLE.get(contender, "-"),
            "marker": "o" if contender == "rxelab" else "s", "markersize": 4}


def size_axis(ax: Any, sizes: list[int] | set[int], label: str = "bytes per peer") -> None:
    """A log2 axis of sizes, its ticks at the sizes a run has (at most about eight of them),
    labelled 1 KiB ... 1 MiB."""
    ax.set_xscale("log", base=2)
    shown = sorted({int(s) for s in sizes if s > 0})
    if shown:
        step = max(1, math.ceil(len(shown) / 8))
        ax.set_xticks(shown[::step])
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: size_text(v)))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel(label)


def plain_log(ax: Any, axis: str = "y") -> None:
    """A log axis labelled 0.1, 1, 60, 400 rather than 10^-1, 6x10^1, 4x10^2."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(matplotlib.ticker.NullFormatter())


def legend_outside(ax: Any, **kwargs: Any) -> None:
    """A legend to the right of the plot, where it covers no data."""
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, **kwargs)


def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()

"""What `fab simulate` writes beside its rows: the figures (PNG files that open) and the
summary's tables, whose fastest algorithm and sequential ratio come from the rows given."""

from __future__ import annotations

import struct

import pytest

from experiments.simulation import figures


def row(algorithm, p, seconds, source="rxelab", pairs=1, size=1024, platform="cluster", **extra):
    return {"collective": "alltoall", "algorithm": algorithm, "source": source, "pairs": pairs,
            "ranks": p, "size": size, "platform": platform, "oversubscription": 1,
            "status": "ok", "seconds": seconds, "placeholder": False,
            **({"pinned_bytes": p << 21, "peak_inflight_bytes": size} if source == "rxelab"
               else {}), **extra}


ROWS = [row("sequential", 8, 4e-3), row("sequential", 8, 2e-3, pairs=4), row("pairwise", 8, 1e-3),
        row("mpi-bruck", 8, 5e-4, source="smpi"),
        row("sequential", 64, 0.1), row("sequential", 64, 0.05, pairs=4),
        row("pairwise", 64, 0.01), row("mpi-bruck", 64, 0.02, source="smpi")]


def png_size(path):
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_the_tables_name_the_fastest_and_the_sequential_ratio():
    (table,) = figures.tables(ROWS)
    assert table["title"] == "alltoall 1 KiB on cluster"
    assert table["names"][-1] == "mpi-bruck"  # MPI's after rxelab's
    at8, at64 = table["lines"]
    assert at8["best"] == "mpi-bruck" and at8["sequential"] == 8.0
    assert at64["best"] == "pairwise" and at64["sequential"] == 10.0
    assert at64["ms"]["sequential k=4"] == 0.05


@pytest.mark.slow
def test_figures_and_summary_are_written(tmp_path):
    failed = {**row("parallel", 1024, 0.0), "status": "failed", "error": "ran past 600 s"}
    written = figures.write(tmp_path, [*ROWS, failed])
    assert sorted(p.name for p in written) == ["memory.png", "summary.md", "time.png"]
    width, height = png_size(tmp_path / "time.png")
    assert width > 600 and height > 400  # 150 dpi
    text = (tmp_path / "summary.md").read_text()
    assert "| 64 | **10** | 100 | 50 | 20 | 10.00 |" in text
    assert "alltoall/parallel p=1024 1 KiB on cluster: ran past 600 s" in text
    assert "Placeholder" not in text


def test_one_number_of_ranks_makes_no_figures(tmp_path):
    written = figures.write(tmp_path, [r for r in ROWS if r["ranks"] == 8])
    assert [p.name for p in written] == ["summary.md"]


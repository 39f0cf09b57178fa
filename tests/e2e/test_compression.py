"""Compression on the lab (issue 19), small: the compression spec's kinds of case through
fab, on rxe - a sparse ring allreduce uncoded, with zstd and with bf16 (checked against the
codec's bound), and a random all-to-all with lz4 (which does not shrink: stored). Every case
verifies its data; the coded ones put fewer packets through the RDMA devices; the report
sets each beside its uncoded twin."""

from __future__ import annotations

import pytest

from experiments.running import counters
from tests.e2e.test_experiments import run_spec

pytestmark = pytest.mark.vm

SPEC = """name = "compression-small"
[[runs]]
app = "rxelab"
op = "allreduce"
algorithms = ["ring"]
nodes = [3]
sizes = [262144]
stages = 3
data = ["sparse"]
compression = ["none", "zstd", "bf16"]
eager_limit = 16384

[[runs]]
app = "rxelab"
op = "alltoall"
algorithms = ["parallel"]
nodes = [3]
sizes = [65536]
stages = 3
data = ["random"]
compression = ["none", "lz4"]
eager_limit = 16384
"""


@pytest.fixture(scope="module")
def compression_run(lab, tmp_path_factory):
    records, md, _ = run_spec(lab, tmp_path_factory.mktemp("compression"), SPEC)
    return records, md


def test_coded_cases_verify_their_data_on_rxe(compression_run):
    records, _ = compression_run
    assert [(r["compression"], r["data"], r["status"]) for r in records] == [
        ("none", "sparse", "ok"), ("zstd", "sparse", "ok"), ("bf16", "sparse", "ok"),
        ("none", "random", "ok"), ("lz4", "random", "ok")], [r.get("error") for r in records]
    for r in records:
        assert r["summary"]["ok"] and r["summary"]["wrong"] == 0


def test_coding_moves_fewer_bytes_and_packets_where_the_data_shrinks(compression_run):
    records, _ = compression_run
    plain, zstd, bf16, random_plain, lz4 = records
    sent = {name: counters.total(r["rxe"], "sent_pkts")
            for name, r in (("plain", plain), ("zstd", zstd), ("bf16", bf16))}
    assert sent["zstd"] < sent["bf16"] < sent["plain"], sent
    assert zstd["summary"]["compression_ratio"] > 10
    assert 1.9 < bf16["summary"]["compression_ratio"] <= 2.0
    assert zstd["summary"]["wire_bytes_per_call"] < plain["summary"]["wire_bytes_per_call"] / 10
    assert lz4["summary"]["compression_ratio"] <= 1.0  # random bytes: stored, with a header
    assert plain["summary"]["compression_ratio"] is None


def test_the_report_sets_each_codec_beside_its_uncoded_twin(compression_run):
    _, md = compression_run
    table = md.split("## Compression")[1]
    for codec in ("none", "zstd", "bf16", "lz4"):
        assert f"| {codec} |" in table, codec
    assert "Compression zstd: faster than none in" in md

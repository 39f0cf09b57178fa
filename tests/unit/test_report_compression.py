"""The report's compression table: each coded case beside the same case uncoded, no table
without coded cases, and a dash for a figure that is not a number."""

import json

import pytest

from experiments import report
from tests.unit.report_helpers import results_fixture  # noqa: F401 (the fixture: results)


@pytest.mark.slow
def test_compression_table_sets_each_codec_beside_the_same_case_uncoded(results):
    path = results / "records.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()]
    base = next(r for r in records if r["app"] == "rxelab" and r["status"] == "ok")
    made = []
    for case, (codec, data, us) in enumerate([("none", "sparse", 1000.0), ("zstd", "sparse", 500.0),
                                              ("none", "random", 1000.0), ("zstd", "random", 1500.0)],
                                             start=1000):
        r = json.loads(json.dumps(base))
        r.update(case=case, eager_limit=16384, data=data, round=0)
        if codec != "none":
            r["compression"] = codec
        r["summary"].update(avg_stage_us=us, compression=codec, data=data,
                            compression_ratio=40.0 if codec != "none" else None,
                            codec_ms_per_MiB=12.5 if codec != "none" else None,
                            wire_bytes_per_call=2e5)
        made.append(r)
    path.write_text("".join(json.dumps(r) + "\n" for r in records + made))
    md = report.write(results)[1].read_text()
    table = md.split("## Compression")[1].split("##")[0]
    op = f"{base['op']}/{base['algorithm']}"
    assert f"| {op} | {base['size']} | sparse | none | zstd | 0.5 | 0.50x | 40.0 | 12.5 | 0.20 |" in table
    assert f"| {op} | {base['size']} | random | none | zstd | 1.5 | 1.50x |" in table
    assert table.count("| none | none |") == 2, "each coded case beside its own uncoded twin"
    assert "Compression zstd: faster than none in 1 of 2 cases; best 0.50x" in md


@pytest.mark.slow
def test_no_compression_table_without_coded_cases(results):
    assert "## Compression" not in report.write(results)[1].read_text()


def test_compression_figures_that_are_not_numbers_show_as_a_dash(results):
    from experiments.report import compression
    row = {"op": "allreduce", "algorithm": "ring", "nodes": 3, "size": 8, "data": "sparse",
           "network": "none", "mode": "stages", "app": "rxelab", "status": "ok", "avg_us": 10.0,
           "wire_per_call": None}
    rows = [{**row, "contender": "rxelab", "compression": "none", "ratio": None,
             "codec_ms_per_MiB": None},
            {**row, "contender": "rxelab-zstd", "compression": "zstd", "ratio": "<b>",
             "codec_ms_per_MiB": True}]
    table = compression.table([report.Row(**r) for r in rows])
    assert table[1][7:10] == ["-", "-", "-"] and table[1][6] == "1.00x"

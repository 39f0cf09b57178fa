"""The report, rendered from results recorded once on the 3-node lab (tests/fixtures/results-mini:
every all-to-all algorithm and two MPI ones at two sizes, perftest, load samples)."""

import json
import shutil
from pathlib import Path

import pytest

from experiments import report, report_summary, run_facts

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "results-mini"


@pytest.fixture
def results(tmp_path):
    dest = tmp_path / "run"
    shutil.copytree(FIXTURE, dest)
    return dest


def test_report_has_the_tables_plots_and_the_emulation_caveat(results):
    html_path, md_path = report.write(results)
    page = html_path.read_text()
    assert run_facts.EMULATION_NOTE in page
    records = [json.loads(x) for x in (results / "records.jsonl").read_text().splitlines()]
    collective = [r for r in records if r["app"] != "perftest"]
    assert page.count("<tr><td>") == len(collective) + 1, "one row per case (+1 perftest row)"
    for algo in ("sequential", "pairwise", "parallel", "mpi-default", "mpi-pairwise"):
        assert f"<td>{algo}</td>" in page
    assert page.count("data:image/png;base64,") == 4, "latency, busbw, memory and load inlined"
    for name in ("latency-alltoall-3n.png", "busbw-alltoall-3n.png", "memory.png", "load.png"):
        assert (results / name).stat().st_size > 5000, name
    md = md_path.read_text()
    assert "## Summary" in md and "peak-to-mean" in md and "ib_write_bw" in md
    assert "| 262144 |" in md


def test_busbw_in_the_table_follows_the_model(results):
    flat = report.rows(report.load(results)[1])
    for r in flat:
        algbw, busbw = report.bandwidth(r["size"], r["nodes"], r["avg_us"] / 1e6)
        assert r["busbw"] == pytest.approx(busbw) and r["busbw"] == pytest.approx(algbw * 2 / 3)


def test_summary_names_the_fastest_and_every_failure(results):
    env, records, loads = report.load(results)
    records[0] = {**records[0], "status": "wrong"}
    lines = report.summary_lines(report.rows(records), records, loads)
    assert lines[0].startswith(f"{len(records) - 1} of {len(records)} cases")
    assert "not ok: rxelab sequential (wrong)" in lines[0]
    assert any("fastest" in x and "262144 B per peer" in x for x in lines)


def test_an_incomplete_run_says_so(results):
    env = json.loads((results / "environment.json").read_text())
    (results / "environment.json").write_text(json.dumps({**env, "complete": False}))
    html_path, _ = report.write(results)
    assert "INCOMPLETE" in html_path.read_text()


def test_the_seed_stages_table_appears_when_runs_differ_in_stages(results):
    lines = (results / "records.jsonl").read_text().splitlines()
    extra = []
    for line in lines:
        r = json.loads(line)
        if r["app"] == "rxelab" and r.get("summary"):
            r = {**r, "stages": 100, "summary": {**r["summary"], "stages": 100,
                                                 "total_seconds": r["summary"]["total_seconds"] * 30}}
            extra.append(json.dumps(r))
    (results / "records.jsonl").write_text("\n".join(lines + extra) + "\n")
    _, md_path = report.write(results)
    md = md_path.read_text()
    assert "## Stages (total seconds)" in md and "| run | 3 stages | 100 stages |" in md
    assert "| rxelab alltoall/sequential 1024 B |" in md


def synthetic(results, transform):
    """Rewrite the fixture's records with transform(record) -> list of records."""
    records = [json.loads(x) for x in (results / "records.jsonl").read_text().splitlines()]
    out = [new for r in records for new in transform(r)]
    for i, r in enumerate(out):
        r["case"] = i
    (results / "records.jsonl").write_text("\n".join(json.dumps(r) for r in out) + "\n")
    return out


def test_mpi_rows_are_labelled_by_transport_and_compared_with_rxelab(results):
    def both(r):
        if r["app"] != "mpi":
            return [r]
        return [{**r, "transport": t, "rxe": {"node1": {"sent_pkts": 0 if t == "tcp" else 500}}}
                for t in ("ucx", "tcp")]
    synthetic(results, both)
    _, md_path = report.write(results)
    md = md_path.read_text()
    assert "| mpi-ucx | alltoall |" in md and "| mpi-tcp | alltoall |" in md
    assert "mpi-ucx 500-500" in md and "mpi-tcp 0-0" in md
    assert "best rxelab takes" in md and "x mpi-ucx's time and" in md
    assert "UCX_UD_ETH_DGID_CHECK=n" in md, "how MPI runs over rxe, and why"


def test_loss_study_plot_and_words(results):
    def lossy(r):
        if r["app"] == "perftest" or r["size"] != 1024:
            return [r]
        out = []
        for loss, factor in ((0, 1), (1.0, 3), (5.0, 20)):
            s = dict(r["summary"])
            s["avg_stage_us"] *= factor
            out.append({**r, "netem": {"loss": loss} if loss else {}, "summary": s,
                        "rxe": {"node1": {"sent_pkts": 9, "completer_retry_err": int(loss * 10)}}})
        out.append({**r, "netem": {"loss": 1.0, "delay_ms": 1, "jitter_ms": 2, "reorder": 5},
                    "status": "timeout", "summary": None, "error": "passed its deadline",
                    "partial": {"stages_done": 2, "seconds": 4.0}})
        return out
    synthetic(results, lossy)
    _, md_path = report.write(results)
    md = md_path.read_text()
    assert (results / "loss.png").stat().st_size > 5000
    assert "At 5 % loss, time per call as a multiple of the clean network's" in md
    assert "loss 1%: 3.0x its clean time, 10 retransmission timeouts" in md
    assert "ran out of time (2 of 3 stages done)" in md
    assert "| timeout |" in md and "| 2000000 |" in md, "a timed-out case shows its partial average"


def test_long_runs_get_the_stages_figure_and_call_distributions(results):
    def stages(r):
        if r["app"] == "perftest" or r["size"] != 1024:
            return [r]
        out = []
        for n in (100, 1000):
            s = {**r["summary"], "stages": n, "total_seconds": r["summary"]["total_seconds"] * n}
            out.append({**r, "stages": n, "summary": s, "stage_seconds": [0.01 + i * 1e-5
                                                                          for i in range(n)]})
        return out
    synthetic(results, stages)
    html_path, _ = report.write(results)
    for name in ("stages.png", "distribution.png"):
        assert (results / name).stat().st_size > 5000, name
    page = html_path.read_text()
    assert page.index("alt='stages.png'") < page.index("<h2>Collectives</h2>"), "the answer first"


@pytest.mark.parametrize("op, factor", [("alltoall", 2 / 3), ("allgather", 2 / 3),
                                        ("reduce_scatter", 2 / 3), ("allreduce", 4 / 3),
                                        ("bcast", 1.0)])
def test_bus_bandwidth_follows_each_collectives_model(op, factor):
    algbw, busbw = report.bandwidth(size=3_000_000, ranks=3, seconds=1.0, op=op)
    per_rank = 3_000_000 * (3 if op in ("alltoall", "allgather", "reduce_scatter") else 1)
    assert algbw == pytest.approx(per_rank / 1e6) and busbw == pytest.approx(algbw * factor)


def with_env(results, **env):
    """The fixture's run with environment.json replaced by env (plus spec and complete)."""
    (results / "environment.json").write_text(json.dumps({"spec": "mini", "complete": True, **env}))
    html_path, md_path = report.write(results)
    return html_path.read_text(), md_path.read_text()


def test_the_mtus_are_named_for_what_they_are_and_old_runs_still_say_theirs(results):
    """environment.json says active_mtu (the RoCE path MTU) and netdev_mtu (the data NIC's, a
    spec's `mtu`); a run recorded before says the port's as `mtu` (the fixture's)."""
    assert "RoCE path MTU: 1024 (3) (data NIC MTU unknown)" in report.write(results)[1].read_text()
    for page in with_env(results, active_mtu=4096, netdev_mtu=9000):
        assert "RoCE path MTU: 4096 (data NIC MTU 9000)" in page
    for page in with_env(results, active_mtu="?", mtu=1024, netdev_mtu=1500):
        assert "RoCE path MTU: unknown (data NIC MTU 1500)" in page, "the new key, not the old"


UCX_RXE = {"UCX_NET_DEVICES": "rxe0:1", "UCX_TLS": "rc_v,self", "UCX_UD_ETH_DGID_CHECK": "n",
           "UCX_IB_GID_INDEX": "1"}


def test_a_kvm_run_is_not_called_emulation(results):
    page, md = with_env(results, accel="kvm", virtualization="kvm", nodes=3,
                        versions={"open_mpi": "4.1.4", "ucx": "1.13.1", "rdma_core": "44.0"},
                        ucx_settings=UCX_RXE)
    for text in (page, md):
        assert "emulation (TCG)" not in text and run_facts.EMULATION_NOTE not in text
        assert "hardware virtualization (KVM)" in text and "not hardware numbers" in text
        assert "UCX_UD_ETH_DGID_CHECK=n" in text


def test_a_bare_metal_run_states_its_own_versions_and_device(results):
    page, md = with_env(
        results, accel="none", virtualization="none", nodes=2, kernel="6.8.0-45-generic",
        versions={"open_mpi": "5.0.3", "ucx": "1.16.0", "rdma_core": "50.0",
                  "kernel": "6.8.0-45-generic"},
        ucx_settings={"UCX_NET_DEVICES": "mlx5_0:1", "UCX_TLS": "rc_v,self",
                      "UCX_UD_ETH_DGID_CHECK": "n", "UCX_IB_GID_INDEX": "3"},
        rdma_devices={"node1": "mlx5_0", "node2": "mlx5_0"}, netdevs={"node1": "ens1f0np0"})
    for text in (page, md):
        assert "Open MPI (5.0.3)" in text and "UCX (1.16.0)" in text and "rdma-core 50.0" in text
        assert "mlx5_0" in text and "UCX_NET_DEVICES=mlx5_0:1" in text
        assert "UCX_IB_GID_INDEX=3" in text and "ens1f0np0" in text
        assert "bare metal" in text
        for claim in ("4.1.4", "1.13.1", "TCG", "emulation", "rxe0", "UCX_IB_GID_INDEX=1"):
            assert claim not in text, claim
    assert "<p class='note'>" not in page, "no caveat about VMs on bare metal"


def test_a_tcg_run_carries_the_emulation_caveat_and_its_own_settings(results):
    page, md = with_env(results, accel="tcg", ucx_settings=UCX_RXE,
                        versions={"open_mpi": "4.1.4", "ucx": "1.13.1", "rdma_core": "44.0"})
    for text in (page, md):
        assert "nodes ran as: VMs under emulation (TCG); accel: tcg" in text
        assert "not hardware numbers" in text and "UCX_UD_ETH_DGID_CHECK=n" in text
        assert "Open MPI (4.1.4)" in text and "UCX (1.13.1)" in text
        assert "UCX_NET_DEVICES=rxe0:1" in text and "UCX_IB_GID_INDEX=1" in text
    assert run_facts.EMULATION_NOTE in page and f"> {run_facts.EMULATION_NOTE}" in md
    page, _ = with_env(results, accel="tcg", ucx_settings={**UCX_RXE, "UCX_NET_DEVICES": "rxe1:1",
                                                           "UCX_IB_GID_INDEX": "3"})
    assert run_facts.EMULATION_NOTE in page and "UCX_NET_DEVICES=rxe1:1" in page
    assert "rxe0" not in page and "UCX_IB_GID_INDEX=1" not in page, "the run's gid, not a default"
    page, _ = with_env(results, virtualization="qemu")
    assert run_facts.EMULATION_NOTE in page, "systemd-detect-virt's qemu is emulation too"


def test_an_old_run_takes_versions_from_its_debian_packages(results):
    page, md = with_env(results, accel="tcg", kernel="6.1.0-56-amd64",
                        packages={"openmpi-bin": "4.1.4-3+b1", "libucx0": "1:1.13.1+dfsg-1",
                                  "rdma-core": "44.0-2"})
    for text in (page, md):
        assert "Open MPI (4.1.4)" in text and "UCX (1.13.1)" in text
        assert ("versions: rxelab unknown, Open MPI 4.1.4, UCX 1.13.1, rdma-core 44.0, kernel "
                "6.1.0-56-amd64") in text
    assert run_facts.upstream_version("4.5+0.17-1") == "4.5+0.17"
    assert run_facts.upstream_version("44.0") == "44.0"


def test_the_report_states_the_rxelab_wheel_a_run_used(results):
    page, md = with_env(results, versions={"rxelab": "0.2.0", "open_mpi": "4.1.4"})
    for text in (page, md):
        assert "versions: rxelab 0.2.0, Open MPI 4.1.4" in text


def test_a_run_without_versions_or_settings_says_unknown(results):
    page, md = with_env(results, versions={"open_mpi": None, "ucx": None})
    for text in (page, md):
        assert "Open MPI (unknown)" in text and "UCX (unknown)" in text
        assert ("versions: rxelab unknown, Open MPI unknown, UCX unknown, rdma-core unknown, "
                "kernel unknown") in text
        assert "how the nodes ran" in text.lower() and "was not recorded" in text
        assert "UCX settings that were not recorded" in text
        for claim in ("4.1.4", "1.13.1", "TCG", "rxe0", "None"):
            assert claim not in text, claim


def test_env_values_cannot_inject_html(results):
    bad = "<script>x</script>"
    page, md = with_env(results, spec=bad, accel=bad, virtualization=bad, kernel=bad, image=bad,
                        mtu=bad, netdev_mtu=bad, nodes=bad,
                        versions={"open_mpi": bad, "ucx": bad, "rdma_core": bad, "kernel": bad},
                        packages={bad: bad}, ucx_settings={bad: bad, "UCX_NET_DEVICES": bad},
                        rdma_devices={bad: bad}, netdevs={"node1": bad})
    for text in (page, md):
        assert "<script" not in text and "&lt;script&gt;x&lt;/script&gt;" in text
    page, md = with_env(results, accel="kvm", versions={"open_mpi": "5.0.3\"><img src=x>"})
    assert "<img src=x>" not in page and "<img src=x>" not in md


def _rounds(records, factors):
    """The records as if each case ran once per round, its time scaled by the round's factor."""
    out = []
    for rnd, f in enumerate(factors):
        for r in records:
            r = json.loads(json.dumps(r))
            r["round"] = rnd
            if r.get("summary", {}).get("avg_stage_us"):
                r["summary"]["avg_stage_us"] *= f
                r["summary"]["total_seconds"] *= f
            out.append(r)
    return out


def test_rounds_give_each_case_its_median(results):
    records = report.load(results)[1]
    once = {r["case"]: r["avg_us"] for r in report.rows(records)}
    flat = report.medians(report.rows(_rounds(records, [1.3, 1.0, 7.0])))
    assert sorted(r["case"] for r in flat) == sorted(once), "one row per case"
    assert all(r["avg_us"] == pytest.approx(once[r["case"]] * 1.3) and r["rounds"] == 3
               for r in flat), "the middle of 1.0, 1.3 and 7.0"
    two = report.medians(report.rows(_rounds(records, [2.0, 1.0])))
    assert all(r["avg_us"] == pytest.approx(once[r["case"]]) for r in two), "the lower middle"
    (results / "records.jsonl").write_text(
        "\n".join(json.dumps(r) for r in _rounds(records, [1.3, 1.0, 7.0])) + "\n")
    md = report.write(results)[1].read_text()
    assert "(medians of 3 rounds)" in md and md.count("| rxelab | alltoall | parallel |") == 2


def test_back_to_back_rows_are_compared_apart_from_stage_rows(results):
    records = report.load(results)[1]
    tight = [{**r, "case": r["case"] + 100, "tight": True} for r in records if r["app"] != "perftest"]
    lines = report.summary_lines(report.rows(records + tight), records + tight, [])
    assert any("1024 B per peer, 3 calls back to back: fastest" in x for x in lines)
    assert any("1024 B per peer, 3 stages: fastest" in x for x in lines)


def test_share_of_the_link_and_the_ratio_to_ucx(results):
    records = report.load(results)[1]
    link = report.link_rate(records)
    assert link == pytest.approx(7.854875)
    flat = report.rows(records)
    report.link_share(flat, link)
    big = next(r for r in flat if r["algorithm"] == "parallel" and r["size"] == 262144)
    # each rank moves 2 x 256 KiB each way; busbw is those bytes over the time
    assert big["link_pct"] == pytest.approx(100 * 2 * 262144 / (big["avg_us"] / 1e6) / 1e6 / link)
    assert report.plots.ratio_to(flat, "mpi-ucx") is None, "no UCX rows, nothing to divide by"
    ucx = [{**r, "transport": "ucx"} if r["app"] == "mpi" else r for r in records]
    png = report.plots.ratio_to(report.rows(ucx), "mpi-ucx")
    assert png and png.startswith(b"\x89PNG") and len(png) > 5000
    (results / "records.jsonl").write_text("\n".join(json.dumps(r) for r in ucx) + "\n")
    md = report.write(results)[1].read_text()
    assert "ratio-to-ucx.png" in md and "% of the link" in md and "% of link" in md


def test_the_share_of_the_link_is_of_each_direction_s_share_when_both_ways_were_measured(results):
    records = report.load(results)[1]
    one = report.link_rate(records)
    assert report.share_rate(records)[0] == pytest.approx(one), "one way only: its rate"
    perf = next(r for r in records if r["app"] == "perftest" and r["algorithm"] == "ib_write_bw")
    both = {**perf, "case": 999, "algorithm": "ib_write_bw_bidir",
            "summary": {**perf["summary"], "bw_MBps": 1.5 * one}}
    rate, said = report.share_rate([*records, both])
    assert rate == pytest.approx(0.75 * one), "each direction's half of the sum"
    assert "ib_write_bw -b" in said and f"{one:.1f}" in said
    (results / "records.jsonl").write_text("\n".join(json.dumps(r) for r in [*records, both]) + "\n")
    md = report.write(results)[1].read_text()
    assert f"busbw over {0.75 * one:.1f} MB/s" in md
    flat = report.rows(records)
    report.link_share(flat, rate)
    big = next(r for r in flat if r["algorithm"] == "parallel" and r["size"] == 262144)
    assert big["link_pct"] == pytest.approx(100 * big["busbw"] / (0.75 * one))


def test_an_impaired_case_run_in_rounds_speaks_once_against_its_own_kind_of_clean_run(results):
    """Three rounds of a lossy case are one statement (its median round), and its clean
    reference is a case of the same kind: stage by stage, not back to back."""
    records = [r for r in report.load(results)[1] if r["app"] != "perftest" and r["size"] == 1024]
    base = records[0]
    clean = {**base, "case": 0}
    fast = {**base, "case": 1, "tight": True,
            "summary": {**base["summary"], "avg_stage_us": base["summary"]["avg_stage_us"] / 10}}
    lossy = []
    for rnd, factor in enumerate((3, 2, 9)):
        lossy.append({**base, "case": 2, "round": rnd, "netem": {"loss": 1.0},
                      "summary": {**base["summary"],
                                  "avg_stage_us": base["summary"]["avg_stage_us"] * factor}})
    recs = [clean, fast, *lossy]
    flat = report.medians(report.rows(recs))
    lines = [x for x in report_summary.loss_lines(flat, recs) if x.startswith("Under impairment")]
    assert len(lines) == 1 and lines[0].count("loss 1%") == 1, lines
    assert "loss 1%: 3.0x its clean time" in lines[0], "the median round over the stage-by-stage clean run"


def test_gloo_cases_not_run_are_said_so_and_not_counted_as_failures(results):
    env, records, loads = report.load(results)
    skipped = {**records[0], "app": "gloo", "algorithm": "gloo-default", "status": "skipped",
               "error": "not run: no torch on these nodes (a lab built with EXTRAS=torch has it) (node2)"}
    skipped.pop("summary", None)
    records = [*records, skipped]
    lines = report.summary_lines(report.rows(records), records, loads)
    assert lines[0].startswith(f"{len(records) - 1} of {len(records)} cases") and "not ok" not in lines[0]
    assert "1 gloo cases were not run: not run: no torch on these nodes" in "\n".join(lines)


@pytest.mark.parametrize("hosts, said", [
    ({"node1": {"torch": "1.13.1"}, "node2": {"torch": "1.13.1"}},
     "Gloo (torch.distributed): torch 1.13.1 on every node, over TCP"),
    ({"node1": {"torch": "1.13.1"}, "node2": {"torch": None}},
     "Gloo (torch.distributed): no torch on node2: gloo cases were not run (a lab built with "
     "EXTRAS=torch has it)"),
    ({"node1": {"kernel": "6.1"}}, "Gloo (torch.distributed): unknown"),
])
def test_the_facts_say_whether_the_nodes_had_torch(results, hosts, said):
    assert run_facts.gloo_fact({"hosts": hosts}) == said
    env = json.loads((results / "environment.json").read_text())
    (results / "environment.json").write_text(json.dumps({**env, "hosts": hosts}))
    _, md = report.write(results)
    assert said in md.read_text()


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


def test_no_compression_table_without_coded_cases(results):
    assert "## Compression" not in report.write(results)[1].read_text()


def test_compression_figures_that_are_not_numbers_show_as_a_dash(results):
    from experiments import compression_report
    row = {"op": "allreduce", "algorithm": "ring", "nodes": 3, "size": 8, "data": "sparse",
           "network": "none", "mode": "stages", "app": "rxelab", "status": "ok", "avg_us": 10.0,
           "wire_per_call": None}
    rows = [{**row, "contender": "rxelab", "compression": "none", "ratio": None,
             "codec_ms_per_MiB": None},
            {**row, "contender": "rxelab-zstd", "compression": "zstd", "ratio": "<b>",
             "codec_ms_per_MiB": True}]
    table = compression_report.table(rows)
    assert table[1][7:10] == ["-", "-", "-"] and table[1][6] == "1.00x"

"""The DDP scenario (a spec's [ddp] table, experiments/running/ddp_scenario.py) as far as the
host goes: the job's command, what is read back from it, and what the report says of its
records (the job itself runs on a lab with torch: tests/e2e/test_torch_backend.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from experiments import report, spec
from experiments.report import ddp
from experiments.running import ddp_scenario
from experiments.running.scenario_records import DdpRecord
from infra.inventory import Host


def line(variant: str, mb: float, step: float, spread: float = 50, **extra) -> dict:
    backend, _, hook = variant.partition("+")
    rec = {"bucket_mb": mb, "status": "ok", "app": "ddp", "variant": variant,
           "backend": backend, "hook": hook or "none", "ranks": 3, "params": 1390864,
           "bucket_bytes": [2411584, 3151872], "step_ms": step, "step_ms_min": step - spread,
           "step_ms_max": step + spread, "step_ms_rounds": [step] * 3,
           "bucket_ms": {"0": 400.0, "1": 300.0}, "steps": 4, "rounds": 3,
           "same_on_every_rank": True, "digest": "ab"}
    if backend == "rxelab":
        rec.update(reference="gloo" + ("+" + hook if hook == "fp16" else ""),
                   max_abs_diff=1e-7, rtol=1e-4, atol=1e-5, matches=True)
    return {**rec, **extra}


def records() -> list[DdpRecord]:
    return [DdpRecord.model_validate(x) for x in (
        line("rxelab", 1, 2000), line("gloo", 1, 2600), line("rxelab+fp16", 1, 2550),
        line("gloo+fp16", 1, 2500), line("rxelab", 25, 2400, spread=300),
        line("gloo", 25, 2500, spread=300))]


def test_the_shipped_ddp_spec_is_a_ddp_scenario():
    s = spec.load("ddp")
    assert s.ddp is not None and s.runs == () and s.max_nodes == 3
    assert s.ddp.bucket_mb == [1.0, 4.0, 25.0] and s.ddp.codec is True


def test_the_job_is_our_launcher_around_the_app_with_the_runs_id():
    hosts = [Host(name=f"node{i}", ssh={"host": "127.0.0.1", "port": 2220 + i, "user": "lab",
                                        "key": "/k", "known_hosts": "/kh"},
                  data_ip=f"10.0.0.{i}") for i in (1, 2, 3)]
    dd = spec.load("ddp").ddp
    cmd = ddp_scenario.job_command(dd, hosts, "abc123", 4.0)
    words = shlex.split(cmd.replace("$HOME", "/home/lab"))
    assert words[0] == "RXELAB_RUN_ID=abc123"
    assert words[words.index("--hosts") + 1] == "10.0.0.1,10.0.0.2,10.0.0.3"
    assert words[words.index("--bucket-mb") + 1] == "4" == words[words.index("--first-bucket-mb") + 1]
    assert words[words.index("--hooks") + 1] == "none,fp16,bf16" and "--codec" in words


def test_only_rank_0s_json_lines_are_read_back():
    out = "\n".join(["[1] [INFO] noise", '[0] # round 1/3 rxelab: 2000 ms/step',
                     "[0] " + json.dumps(line("rxelab", 1, 2000)), "[0] {\"app\": \"ddp\", broken",
                     json.dumps(line("gloo", 1, 2600))])
    got = ddp_scenario.parse(out)
    assert [g.variant for g in got] == ["rxelab", "gloo"]


def test_ratios_are_marked_when_the_spreads_overlap():
    recs = records()
    assert ddp.ratio(recs[0], recs) == (2000 / 2600, True)
    r, apart = ddp.ratio(recs[4], recs)
    assert round(r, 2) == 0.96 and not apart
    lines = ddp.summary_lines(recs)
    assert lines[0].startswith("DDP on 3 ranks, a model of 1.39 M parameters")
    assert "buckets of 1 MB: rxelab 0.77x of gloo; rxelab+fp16 1.02x (within spread) of gloo+fp16" in lines[1]
    assert "buckets of 25 MB: rxelab 0.96x (within spread) of gloo" in lines[2]


def test_a_bad_run_is_named():
    recs = records()
    recs[0].matches = False
    recs[2].same_on_every_rank = False
    recs.append(DdpRecord.model_validate({"bucket_mb": 4, "status": "failed", "exit": 1,
                                          "error": "Traceback: boom"}))
    wrong = ddp.problems(recs)
    assert wrong[0] == "rxelab at 1 MB: parameters do not match gloo's (max diff 1e-07)"
    assert wrong[1] == "rxelab+fp16 at 1 MB: parameters differ between ranks"
    assert wrong[2].startswith("buckets of 4 MB: the job failed (exit 1): Traceback: boom")
    skipped = [DdpRecord.model_validate({"bucket_mb": 1, "status": "skipped",
                                         "error": "no torch on node1"})]
    assert ddp.problems(skipped) == []


def test_the_report_has_the_table_the_summary_and_the_plot(tmp_path: Path):
    (tmp_path / "records.jsonl").write_text("")
    (tmp_path / "ddp.jsonl").write_text("\n".join(r.to_json() for r in records()) + "\n")
    (tmp_path / "environment.json").write_text(json.dumps({"spec": "ddp"}))
    html_path, md_path = report.write(tmp_path)
    md = md_path.read_text()
    assert "## DDP against Gloo" in md and "## Collectives" not in md
    assert "| 1 MB | rxelab | 2 | 2000 (1950-2050) | 400 / 300 | 0.77x |" in md
    assert "buckets of 25 MB: rxelab 0.96x (within spread) of gloo" in md
    png = (tmp_path / "ddp.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10000
    assert "DDP against Gloo" in html_path.read_text()


def test_fsdp_variants_are_asked_for_and_a_torch_without_them_is_a_skipped_row(monkeypatch):
    dd = spec.load("ddp").ddp.model_copy(update={"wraps": ["fsdp", "fsdp2"]})
    hosts = [Host(name="node1", ssh={"host": "127.0.0.1", "port": 2221, "user": "lab", "key": "/k",
                                     "known_hosts": "/kh"}, data_ip="10.0.0.1")]
    words = shlex.split(ddp_scenario.job_command(dd, hosts, "abc123", 4.0).replace("$HOME", "/home/lab"))
    assert words[words.index("--wraps") + 1] == "fsdp,fsdp2"
    plain = dd.model_copy(update={"wraps": []})
    assert "--wraps" not in ddp_scenario.job_command(plain, hosts, "abc123", 4.0)
    assert "--wraps" not in ddp_scenario.job_command(dd, hosts, "abc123", 25.0, first=False), \
        "FSDP has no DDP bucket cap: its variants run in the first job only"

    class Runner:  # what the scenario reads of experiments.running.runner's
        spec = type("S", (), {"ddp": dd})()
        with_torch = {"node1"}
        run_id = "abc123"
        said: list[str] = []

        def __init__(self) -> None:
            self.hosts = hosts

        def say(self, text: str) -> None:
            self.said.append(text)

        def _connection(self, host):
            out = "\n".join("[0] " + json.dumps(x) for x in (
                line("rxelab", 4, 2000), line("gloo", 4, 2500),
                line("rxelab+fsdp", 4, 1800, wrap="fsdp", reference="gloo+fsdp"),
                line("gloo+fsdp", 4, 2400, wrap="fsdp"),
                {"app": "ddp", "variant": "rxelab+fsdp2", "backend": "rxelab", "wrap": "fsdp2",
                 "skipped": "FSDP2 (fully_shard) needs torch 2.6 or later"}))
            result = type("R", (), {"stdout": out, "stderr": "", "exited": 0})()
            return type("C", (), {"run": lambda self, *a, **k: result})()

    dd.bucket_mb = [4.0]
    recs = list(ddp_scenario.Scenario(Runner()).run())
    assert [r.status for r in recs] == ["ok"] * 4 + ["skipped"], recs
    assert recs[-1].variant == "rxelab+fsdp2" and "torch 2.6" in (recs[-1].error or "")
    assert any("rxelab+fsdp2: not run: FSDP2" in x for x in Runner.said)
    assert ddp.problems(recs) == []
    _, rows = ddp.table(recs)
    # FSDP shards instead of bucketing: its rows have no cap, and stay out of the caps' plot
    assert rows[0][:2] == ["4 MB", "rxelab"]
    assert rows[2][:3] == ["-", "rxelab+fsdp", "2"] and rows[2][5] == "0.75x"
    assert rows[4][:4] == ["-", "rxelab+fsdp2", "-", "skipped"] and "torch 2.6" in rows[4][6]
    lines = ddp.summary_lines(recs)
    assert lines[1].startswith("buckets of 4 MB: rxelab 0.80x of gloo") and "fsdp" not in lines[1]
    assert lines[2] == "sharded (FSDP): rxelab+fsdp 0.75x of gloo+fsdp (time per step)", lines
    seen: list = []
    monkeypatch.setattr(ddp.plots, "ddp_steps", lambda rs: seen.extend(rs) or b"png")
    assert ddp.figure(recs) == b"png" and {r.variant for r in seen} == {"rxelab", "gloo"}

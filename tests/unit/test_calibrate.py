"""`fab calibrate`'s fit and `fab validate`'s table, on a lab made up here: its figures are
replays with costs chosen by the test, so the fit must find those costs again, and the
validation must find its predictions inside a spread made around the truth (and outside one
made away from it)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from experiments.readable import size_text
from experiments.simulation import calibrate, validate
from experiments.simulation import costs as costs_mod
from tests.unit.calibrate_lab import (
    BANDWIDTH,
    CALL,
    COPY,
    CPU_PER_BYTE,
    DUPLEX,
    HOST_CPUS,
    LATENCY,
    LOOP,
    NODE_CPUS,
    PATH,
    PING_PONG_SIZES,
    REDUCE,
    TRUTH,
    WAKE,
    beside,
    lab,
    link,
    made_up_run,
    record,
    typed,
)
from tests.unit.simulator_helpers import needs_simgrid

pytestmark = needs_simgrid


@pytest.fixture(scope="module")
def fitted():
    return calibrate.fit(typed(made_up_run()), "made-up", NODE_CPUS, HOST_CPUS)


@pytest.mark.slow
def test_the_fit_finds_the_costs_the_lab_was_made_with(fitted):
    assert fitted.latency == pytest.approx(LATENCY) and fitted.bandwidth == pytest.approx(BANDWIDTH)
    assert fitted.duplex_bandwidth == pytest.approx(DUPLEX)
    assert fitted.loop_bandwidth == pytest.approx(LOOP)
    assert fitted.costs.call == pytest.approx(CALL) and fitted.costs.copy_per_byte == pytest.approx(COPY)
    for size, seconds in TRUTH:
        got = fitted.costs.send_cpu(size) + fitted.costs.recv_cpu(size)
        assert got == pytest.approx(seconds, rel=1e-3), size
    assert fitted.costs.reduce_per_byte == pytest.approx(REDUCE, rel=1e-2)
    assert fitted.cpu_per_byte == pytest.approx(CPU_PER_BYTE, rel=1e-6)
    assert fitted.path_bandwidth == pytest.approx(PATH, rel=1e-4)
    assert fitted.wake == pytest.approx(WAKE, rel=1e-3)
    assert not fitted.measured["notes"]
    for what, row in fitted.measured["fit"].items():  # each measurement, replayed, as measured
        assert row["replay_s"] == pytest.approx(row["lab_s"], rel=1e-3), what


@pytest.mark.slow
def test_a_size_measured_faster_than_a_smaller_one_keeps_its_cost_and_is_said():
    run = [r for r in made_up_run() if not (r["app"] == "rxelab" and r["size"] == 65536
                                             and r["summary"]["ranks"] == 2)]
    run += record("alltoall", "pairwise", 2, 65536, LATENCY / 10)  # faster than the link allows
    got = calibrate.fit(typed(run), "odd", NODE_CPUS, HOST_CPUS)
    assert any("65536 B" in n for n in got.measured["notes"])
    # never cheaper than the smaller message before it: costs only grow with size
    assert got.costs.send_cpu(65536) == pytest.approx(got.costs.send_cpu(1024))


@pytest.mark.parametrize("missing", [("perftest", "ib_send_lat"), ("perftest", "ib_write_bw"),
                                     pytest.param(("rxelab", "ring"), marks=pytest.mark.slow)])
def test_a_missing_measurement_is_named(missing):
    run = [r for r in made_up_run() if (r["app"], r["algorithm"]) != missing]
    with pytest.raises(calibrate.CalibrationError, match=missing[1]):
        calibrate.fit(typed(run), "short", NODE_CPUS, HOST_CPUS)


@pytest.mark.slow
def test_a_run_without_the_nodes_cpu_charges_a_byte_to_the_cpu_and_says_so():
    run = made_up_run()
    for r in run:
        r["summary"].pop("node_busy", None)
    got = calibrate.fit(typed(run), "older", NODE_CPUS, HOST_CPUS)
    assert got.cpu_per_byte is None and got.path_bandwidth is None
    assert any("did not measure its nodes' CPU" in n for n in got.measured["notes"])
    assert got.lab(2).byte_cpu == pytest.approx(1 / DUPLEX) and got.lab(2).path_byte == 0


@pytest.mark.parametrize("shares", [[True, True], [float("nan")] * 2, [1.5, 1.5], ["0.8"] * 2,
                                    None, 0.8, "0.8", {"a": 0.8}])
def test_a_busy_share_that_is_no_share_is_not_a_measurement(shares):
    run = [{**r, "summary": {**r["summary"], "node_busy": shares}} if r["app"] == "rxelab"
           else r for r in made_up_run()]
    assert not any(k[0] == "busy" for k in calibrate.measurements(typed(run)))


@pytest.mark.slow
def test_an_exchange_no_busier_at_1_mib_than_at_64_kib_charges_a_byte_to_the_cpu():
    run = made_up_run()
    for r in run:
        if r["app"] == "rxelab" and r["size"] == 1 << 20 and "node_busy" in r["summary"]:
            r["summary"]["node_busy"] = [0.0] * r["summary"]["ranks"]
    got = calibrate.fit(typed(run), "odd", NODE_CPUS, HOST_CPUS)
    assert got.cpu_per_byte is None and got.path_bandwidth is None
    assert any("no busier" in n for n in got.measured["notes"])


@pytest.mark.slow
def test_a_run_without_the_loopback_fits_and_says_so():
    run = [r for r in made_up_run() if r.get("nodes") != 1 or r["app"] != "perftest"]
    got = calibrate.fit(typed(run), "older", NODE_CPUS, HOST_CPUS)
    assert got.loop_bandwidth is None and any("within one node" in n for n in got.measured["notes"])
    assert got.lab(2, per_node=2).loop_byte_cpu == pytest.approx(2 / DUPLEX)


def test_failed_rounds_are_not_measurements():
    run = made_up_run()
    for r in run:
        if r["app"] == "perftest" and r["algorithm"] == "ib_write_bw":
            r["status"] = "failed"
    with pytest.raises(calibrate.CalibrationError, match="ib_write_bw"):
        calibrate.fit(typed(run), "short", NODE_CPUS, HOST_CPUS)


@pytest.mark.slow
def test_a_fitted_profile_is_saved_and_read_back(fitted, tmp_path):
    path = tmp_path / "profiles" / "lab.json"
    calibrate.save(fitted, path)
    loaded = costs_mod.load(path)
    assert loaded.costs == fitted.costs and loaded.cpu_per_byte == fitted.cpu_per_byte
    assert loaded.path_bandwidth == fitted.path_bandwidth and loaded.measured == fitted.measured
    calibrate.save(fitted, path)  # its own profile: replaced
    other = tmp_path / "profiles" / "notes.json"
    other.write_text("my notes")
    with pytest.raises(calibrate.CalibrationError, match="not a profile"):
        calibrate.save(fitted, other)
    assert other.read_text() == "my notes"
    assert sorted(p.name for p in path.parent.iterdir()) == ["lab.json", "notes.json"]


@pytest.mark.parametrize("name", ["../x", "", ".hidden", "a b", "lab.json", "x" * 65])
def test_a_bad_profile_name_is_refused(name):
    with pytest.raises(calibrate.CalibrationError, match="profile name"):
        calibrate.check_name(name)


@pytest.mark.slow
def test_a_run_of_another_spec_is_not_fitted(tmp_path):
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in made_up_run()))
    (tmp_path / "environment.json").write_text(json.dumps({"spec": "smoke", "hosts": {}}))
    with pytest.raises(calibrate.CalibrationError, match="smoke"):
        calibrate.fit_run(tmp_path, "lab")
    (tmp_path / "environment.json").write_text(json.dumps(
        {"spec": "calibrate", "hosts": {"a": {"cpus": 1}, "b": {"cpus": 1}}, "lab_host_cpus": 2}))
    got = calibrate.fit_run(tmp_path, "lab")
    assert got.name == "lab" and (got.node_cpus, got.host_cpus) == (1, 2)
    (tmp_path / "environment.json").write_text(json.dumps(
        {"spec": "calibrate", "hosts": {"a": {"cpus": 1}, "b": {}}}))
    with pytest.raises(calibrate.CalibrationError, match="nproc"):
        calibrate.fit_run(tmp_path, "lab")


@pytest.mark.slow
def test_the_lab_is_vms_sharing_the_machines_cores(fitted):
    """The profile's nodes as VMs of its CPUs on a machine of its cores; a message's bytes
    cost each VM the CPU measured per byte and pass each VM's data path at the rate the
    exchanges measured, and 1/loop within a VM; a profile
    without the CPU per byte charges the CPU 1/duplex, or without a figure both ways,
    1/bandwidth (one way)."""
    three, six = fitted.lab(3), fitted.lab(6, per_node=2)
    assert (three.hosts, three.cores, three.machine_cores) == (3, NODE_CPUS, HOST_CPUS)
    assert three.byte_cpu == pytest.approx(CPU_PER_BYTE)
    assert three.path_byte == pytest.approx(1 / PATH)
    older = replace(fitted, cpu_per_byte=None, path_bandwidth=None)
    assert older.lab(3).byte_cpu == pytest.approx(1 / DUPLEX) and older.lab(3).path_byte == 0
    assert replace(older, duplex_bandwidth=None).lab(3).byte_cpu == pytest.approx(1 / BANDWIDTH)
    assert three.loop_byte_cpu == pytest.approx(1 / LOOP)
    assert (six.hosts, six.host_of(5), six.machine_cores) == (3, 2, HOST_CPUS)


@pytest.mark.slow
@pytest.mark.parametrize(("near", "within"), [(True, True), (False, False)])
def test_validation_sets_predictions_beside_the_lab(fitted, tmp_path, near, within):
    """A lab run at p = 3 made with the truth: the fitted profile predicts inside its spread;
    a lab twice as slow is not predicted."""
    run = []
    for algorithm in ("pairwise", "parallel", "bruck"):
        for size in (1024, 1 << 20):
            seconds = lab("alltoall", algorithm, 3, size) * (1.0 if near else 2.0)
            run += record("alltoall", algorithm, 3, size, seconds)
    run += [{"app": "mpi", "status": "ok", "summary": {"tight": True}}]  # not rxelab: left out
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run))
    out = validate.write(tmp_path, fitted)
    rows = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["within"] is within for r in rows)
    text = out.read_text()
    assert f"**{6 if within else 0} of 6 predictions within" in text
    assert "| alltoall | bruck | 3 (3) | 1 MiB |" in text
    assert f"| 3 (3) | {6 if within else 0} of 6 | {1.0 if near else 0.5:.2f} (" in text
    if near:
        assert "2 of 2 orders of algorithms" in text


def test_the_same_p_on_other_nodes_is_ranked_and_summed_up_apart():
    """p = 6 on 3 nodes and on 6: two orders of algorithms, two summary lines."""
    def row(algorithm, nodes, lab_s, predicted_s):
        return validate.Row("alltoall", algorithm, 6, nodes, 1024, lab_s, lab_s, lab_s, 3,
                            predicted_s)
    table = [row("pairwise", 3, 1.0, 1.0), row("parallel", 3, 2.0, 2.0),
             row("pairwise", 6, 2.0, 1.0), row("parallel", 6, 1.0, 2.0)]
    order = validate.rankings(table)
    assert [(g["nodes"], g["same"]) for g in order] == [(3, True), (6, False)]
    summed = validate.by_ranks(table)
    assert [(g["nodes"], g["within"], g["same"], g["orders"]) for g in summed] == \
        [(3, 2, 1, 1), (6, 0, 0, 1)]


@pytest.mark.slow
def test_validation_of_a_run_without_back_to_back_calls_is_refused(fitted, tmp_path):
    (tmp_path / "records.jsonl").write_text(json.dumps({"app": "rxelab", "status": "ok",
                                                        "summary": {"tight": False}}) + "\n")
    with pytest.raises(validate.CannotValidate, match="tight"):
        validate.write(tmp_path, fitted)
    with pytest.raises(validate.CannotValidate, match="validation"):
        validate.newest(tmp_path / "nothing-here")


@pytest.mark.slow
def test_the_calibrate_spec_measures_what_the_fit_needs():
    """Every figure fit() asks for is a case of the shipped calibrate spec (and nothing there
    goes unused): made up from the spec's own cases, the run fits."""
    from experiments import spec
    run = []
    for c in spec.load(calibrate.SPEC).cases():
        if c.app == "perftest":
            value = {"ib_send_lat": LATENCY * 1e6, "ib_write_bw": BANDWIDTH / 1e6,
                     "ib_write_bw_bidir": DUPLEX / 1e6}[c.algorithm]
            if c.nodes == 1:
                value = LOOP / 1e6
            run += link(c.algorithm, c.size, value, c.nodes)
        elif c.busy_neighbours:
            run += beside(c.size, c.busy_neighbours)
        elif c.nodes == 1:
            run += record(c.op, c.algorithm, 1, c.size, CALL + COPY * c.size)
        else:
            run += record(c.op, c.algorithm, c.nodes, c.size,
                          lab(c.op, c.algorithm, c.nodes, c.size))
    got = calibrate.fit(typed(run), "from-the-spec", NODE_CPUS, HOST_CPUS)
    used = set(got.measured["medians"])
    assert used == {" ".join(map(str, k)) for k in calibrate.measurements(typed(run))}
    assert set(got.measured["fit"]) >= {"exchange 0 B", "exchange 1048576 B", "allreduce ring 1 MiB",
                                        "ping-pong 1 B", "ping-pong 1024 B", "ping-pong 1048576 B",
                                        "exchange 1024 B beside 1 busy"}
    row = got.measured["fit"]["exchange 1024 B beside 1 busy"]  # the wake, fitted on it
    assert got.wake and row["replay_s"] == pytest.approx(row["lab_s"], rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("size", PING_PONG_SIZES)
def test_a_ping_pong_slower_than_its_replay_is_reported_not_fitted(fitted, size):
    """The ping-pong is a check: a lab whose ping-pong took twice what the exchanges' costs
    replay gets the same profile, and a note that names the size and the ratio."""
    run = [r for r in made_up_run()
           if not (r.get("op") == calibrate.PING_PONG[0] and r.get("size") == size)]
    run += record(*calibrate.PING_PONG, 2, size, 2 * lab(*calibrate.PING_PONG, 2, size))
    got = calibrate.fit(typed(run), "slow-pong", NODE_CPUS, HOST_CPUS)
    assert got.costs == fitted.costs and got.path_bandwidth == pytest.approx(fitted.path_bandwidth)
    row = got.measured["fit"][f"ping-pong {size} B"]
    assert row["replay_s"] / row["lab_s"] == pytest.approx(0.5, rel=1e-3)
    [note] = got.measured["notes"]
    assert f"ping-pong of {size_text(size)}" in note and "(0.50x)" in note
    assert any(f"ping-pong {size} B" in line for line in calibrate.describe(got))


@pytest.mark.slow
def test_a_run_without_the_ping_pong_fits_the_same(fitted):
    """Calibration runs from before 2026-11-28 have no ping-pong: the same profile, no check."""
    got = calibrate.fit(typed([r for r in made_up_run() if r.get("op") != calibrate.PING_PONG[0]]),
                        "older", NODE_CPUS, HOST_CPUS)
    assert got.costs == fitted.costs and not got.measured["notes"]
    assert not any(what.startswith("ping-pong") for what in got.measured["fit"])


def test_validate_does_not_pick_the_calibration_it_was_fitted_on(tmp_path):
    for name, spec_name in (("20260101-000000-validation", "validation"),
                            ("20260102-000000-calibrate", "calibrate")):
        run = tmp_path / name
        run.mkdir()
        (run / "records.jsonl").write_text(json.dumps(record("alltoall", "pairwise", 3, 64, 1e-3)[0])
                                           .replace('"tight": true', '"tight": true') + "\n")
        (run / "environment.json").write_text(json.dumps({"spec": spec_name}))
    assert validate.newest(tmp_path).name == "20260101-000000-validation"


def test_a_calibration_run_with_broken_records_is_an_error_not_a_traceback(tmp_path):
    (tmp_path / "records.jsonl").write_text('{"status": "ok", "summary": {}}\n')
    (tmp_path / "environment.json").write_text(json.dumps({"spec": "calibrate", "hosts": 3}))
    with pytest.raises(calibrate.CalibrationError, match="names no hosts"):
        calibrate.fit_run(tmp_path, "lab")
    (tmp_path / "environment.json").write_text(json.dumps(
        {"spec": "calibrate", "hosts": {"a": {"cpus": 1}}}))
    with pytest.raises(calibrate.CalibrationError, match="a record without"):
        calibrate.fit_run(tmp_path, "lab")


def validation_run(tmp_path, includes=("calibrate",)):
    """A run of a spec that includes the calibrate spec: its calibration cases as the runner
    tags them, then p = 3 cases made with the truth, and one of its own that looks like a
    calibration case (a 2-rank exchange of 1 KiB) but took ten times as long."""
    run = [{**r, "included": "calibrate"} for r in made_up_run()]
    for algorithm in ("pairwise", "parallel"):
        for size in (1024, 1 << 20):
            run += record("alltoall", algorithm, 3, size, lab("alltoall", algorithm, 3, size))
    run += record("alltoall", "pairwise", 2, 1024, 10 * lab("alltoall", "pairwise", 2, 1024))
    run += beside(1024, 2)  # its own, as validation-p8's: replayed as a check, not fitted
    run += [{**r, "summary": {**r["summary"], "avg_stage_us": 10 * r["summary"]["avg_stage_us"]}}
            for r in beside(1024, 1)]  # its own beside one, ten times slower: not fitted
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run))
    hosts = {name: {"cpus": NODE_CPUS} for name in "abc"}
    (tmp_path / "environment.json").write_text(json.dumps(
        {"spec": "validation", "hosts": hosts, "lab_host_cpus": HOST_CPUS,
         "includes": list(includes) if isinstance(includes, tuple) else includes}))
    return run


@pytest.mark.slow
def test_a_validation_run_is_predicted_from_its_own_calibration_cases(tmp_path, fitted):
    """A run whose spec includes the calibrate spec: `fab validate` fits a profile on the
    cases the include brought in (saved beside the run), the spec's own cases left out of
    the fit, and predicts those with it; the fitted cases are not in the table. A run whose
    environment does not say so (or says it wrongly) has none."""
    for includes in (None, "calibrate", ["other"]):
        validation_run(tmp_path, includes)
        assert validate.own_profile(tmp_path) is None
        with pytest.raises(calibrate.CalibrationError, match="neither is nor includes"):
            calibrate.fit_run(tmp_path, "lab")
    validation_run(tmp_path)
    profile = validate.own_profile(tmp_path)
    assert profile is not None and profile.name == tmp_path.name
    assert profile.costs == fitted.costs, "the spec's own 2-rank case is not a calibration"
    assert profile.wake == fitted.wake
    assert "exchange 1024 B beside 2 busy (not fitted)" in profile.measured["fit"]
    assert costs_mod.load(tmp_path / "profile.json").costs == profile.costs
    out = validate.write(tmp_path, profile)
    rows = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
    assert sorted((r["algorithm"], r["ranks"], r["size"], r["within"]) for r in rows) == \
        [("pairwise", 2, 1024, False)] + [(a, 3, s, True) for a in ("pairwise", "parallel")
                                          for s in (1024, 1 << 20)]
    assert "run in each of this run's\nrounds" in out.read_text()


@pytest.mark.slow
def test_fab_validate_takes_the_runs_own_profile_unless_told(tmp_path, fitted, capsys):
    from invoke import Context

    import fabfile
    validation_run(tmp_path)
    fabfile.validate(Context(), run=str(tmp_path))
    assert f"profile `{tmp_path.name}`" in (tmp_path / "validation.md").read_text()
    other = tmp_path.parent / "other.json"
    other.write_text(replace(fitted, name="other").to_json())
    fabfile.validate(Context(), run=str(tmp_path), profile=str(other))
    assert "profile `other`" in (tmp_path / "validation.md").read_text()
    assert "validation:" in capsys.readouterr().out


def test_a_validation_run_whose_calibration_failed_says_so(tmp_path):
    """The 1-rank call failed in every round: the figure is named, and what to do."""
    run = validation_run(tmp_path)
    failed = [{**r, "status": "failed"} if r.get("included") and r.get("nodes") == 1
              and r["app"] == "rxelab" else r for r in run]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in failed))
    with pytest.raises(validate.CannotValidate,
                       match="no good round of alltoall pairwise 1 0: rerun it.*--profile lab"):
        validate.own_profile(tmp_path)

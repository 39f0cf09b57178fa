"""Experiment specs: the shipped ones load; anything unknown or impossible is named."""

import copy

import pytest

from experiments import spec

GOOD = {"name": "t", "runs": [
    {"app": "rxelab", "op": "alltoall", "algorithms": ["pairwise"], "nodes": [2, 3], "sizes": [0, 8],
     "stages": 2},
    {"app": "mpi", "op": "allgather", "algorithms": ["mpi-ring"], "nodes": [3], "sizes": [8]},
    {"app": "perftest", "tools": ["ib_write_bw"], "nodes": [2], "sizes": [65536]},
]}


@pytest.mark.parametrize("name", sorted(p.stem for p in spec.SPECS.glob("*.toml")))
def test_shipped_specs_load(name):
    s = spec.load(name)
    assert s.name == name and s.cases()


def test_smoke_covers_every_algorithm_and_mpi():
    cases = spec.load("smoke").cases()
    rx = {(c["op"], c["algorithm"]) for c in cases if c["app"] == "rxelab"}
    assert rx == {("allgather", a) for a in ("star", "ring", "sequential")} | \
        {("alltoall", a) for a in ("sequential", "pairwise", "parallel")}
    assert any(c["app"] == "mpi" for c in cases)


def test_cases_expand_nodes_algorithms_and_sizes():
    s = spec.parse(GOOD)
    cases = s.cases()
    assert len(cases) == 2 * 1 * 2 + 2 + 1, "mpi runs both transports unless told"
    assert cases[0] == {"app": "rxelab", "op": "alltoall", "algorithm": "pairwise", "nodes": 2,
                        "size": 0, "stages": 2, "warmup": 1, "transport": None,
                        "sample_load": False, "netem": {}, "mtu": None, "timeout_s": None}
    assert [c["transport"] for c in cases if c["app"] == "mpi"] == ["ucx", "tcp"]
    assert s.max_nodes == 3


def test_impairments_mtus_and_rxelab_options_multiply_cases():
    doc = copy.deepcopy(GOOD)
    doc["runs"][0].update(netem=[{}, {"loss": 1}, {"loss": 1, "delay_ms": 1, "jitter_ms": 2,
                                                   "reorder": 5}],
                          mtu=[1500, 9000], qp_timeout=12, retry_cnt=3, timeout_s=90)
    doc["runs"][1].update(transport="ucx")
    cases = spec.parse(doc).cases()
    rx = [c for c in cases if c["app"] == "rxelab"]
    assert len(rx) == 2 * 2 * 3 * 2
    assert {c["mtu"] for c in rx} == {1500, 9000}
    assert {tuple(sorted(c["netem"])) for c in rx} == {(), ("loss",),
                                                       ("delay_ms", "jitter_ms", "loss", "reorder")}
    assert all(c["qp_timeout"] == 12 and c["retry_cnt"] == 3 and c["timeout_s"] == 90 for c in rx)
    assert [c["transport"] for c in cases if c["app"] == "mpi"] == ["ucx"]


@pytest.mark.parametrize(
    "mutate, problem",
    [
        (lambda d: d.update(colour="red"), "top level: unknown key 'colour'"),
        (lambda d: d["runs"][0].update(speed=1), "runs[0]: unknown key 'speed'"),
        (lambda d: d["runs"][0].update(app="nccl"), "runs[0].app: must be one of"),
        (lambda d: d["runs"][0].update(op="reduce"), "runs[0].op"),
        (lambda d: d["runs"][0].update(algorithms=["ring"]), "runs[0].algorithms"),
        (lambda d: d["runs"][1].update(algorithms=["mpi-pairwise"]), "runs[1].algorithms"),
        (lambda d: d["runs"][0].update(sizes=[-1]), "runs[0].sizes"),
        (lambda d: d["runs"][0].update(nodes=[]), "runs[0].nodes"),
        (lambda d: d["runs"][0].update(stages=0), "runs[0].stages"),
        (lambda d: d["runs"][0].update(transport="ucx"), "only mpi runs choose a transport"),
        (lambda d: d["runs"][1].update(transport=["ucx", "ib"]), "runs[1].transport"),
        (lambda d: d["runs"][0].update(netem=[{"los": 1}]), "runs[0].netem[0]: unknown key 'los'"),
        (lambda d: d["runs"][0].update(netem=[{"loss": 101}]), "loss must be a number from 0 to 100"),
        (lambda d: d["runs"][0].update(netem=[{"reorder": 5}]), "need a delay_ms"),
        (lambda d: d["runs"][0].update(netem={}), "runs[0].netem: must be a non-empty list"),
        (lambda d: d["runs"][0].update(mtu=[12000]), "runs[0].mtu: must be from 1280 to 9000"),
        (lambda d: d["runs"][0].update(retry_cnt=9), "runs[0].retry_cnt: must be from 0 to 7"),
        (lambda d: d["runs"][1].update(qp_timeout=14), "runs[1].qp_timeout: only rxelab runs"),
        (lambda d: d["runs"][0].update(timeout_s=1), "runs[0].timeout_s"),
        (lambda d: d["runs"][1].update(transport="carrier-pigeon"), "runs[1].transport"),
        (lambda d: d["runs"][2].update(nodes=[3]), "perftest measures one link"),
        (lambda d: d["runs"][2].update(algorithms=["x"]), "perftest runs take `tools`"),
        (lambda d: d.update(runs=[]), "runs: must be a non-empty list"),
    ],
)
def test_bad_specs_name_the_problem(mutate, problem):
    doc = copy.deepcopy(GOOD)
    mutate(doc)
    with pytest.raises(spec.SpecError) as e:
        spec.parse(doc, "my.toml")
    assert "my.toml is not a valid experiment spec" in str(e.value) and problem in str(e.value)


def test_unknown_spec_lists_the_shipped_ones(tmp_path):
    shipped = "kpairs, latency, lossy, memory-and-load, ml, mtu, seed, smoke, sweep"
    with pytest.raises(spec.SpecError, match=f"shipped: {shipped}"):
        spec.find("nope")
    broken = tmp_path / "x.toml"
    broken.write_text("name = ")
    with pytest.raises(spec.SpecError, match="not valid TOML"):
        spec.load(str(broken))

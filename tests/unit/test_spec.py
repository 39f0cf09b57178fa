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


@pytest.mark.parametrize("name", ["smoke", "seed", "sweep", "memory-and-load"])
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
    assert len(cases) == 2 * 1 * 2 + 1 + 1
    assert cases[0] == {"app": "rxelab", "op": "alltoall", "algorithm": "pairwise", "nodes": 2,
                        "size": 0, "stages": 2, "warmup": 1, "transport": "tcp",
                        "sample_load": False}
    assert s.max_nodes == 3


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
    with pytest.raises(spec.SpecError, match="shipped: memory-and-load, seed, smoke, sweep"):
        spec.find("nope")
    broken = tmp_path / "x.toml"
    broken.write_text("name = ")
    with pytest.raises(spec.SpecError, match="not valid TOML"):
        spec.load(str(broken))

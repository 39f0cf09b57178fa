"""Experiment specs: the shipped ones load; anything unknown or impossible is named."""

import copy
import json
import os
import re
from pathlib import Path

import pytest

from experiments import spec


def as_json(s):
    """A spec's cases as their JSON (what a run's records repeat of them)."""
    return [json.loads(c.to_json()) for c in s.cases()]

GOOD = {"name": "t", "runs": [
    {"app": "rxelab", "op": "alltoall", "algorithms": ["pairwise"], "nodes": [2, 3], "sizes": [0, 8],
     "stages": 2},
    {"app": "mpi", "op": "allgather", "algorithms": ["mpi-ring"], "nodes": [3], "sizes": [8]},
    {"app": "perftest", "tools": ["ib_write_bw"], "nodes": [2], "sizes": [65536]},
]}


@pytest.mark.parametrize("name", sorted(p.stem for p in spec.SPECS.glob("*.toml")))
def test_shipped_specs_load(name):
    s = spec.load(name)
    assert s.name == name and (s.cases() or s.elastic or s.ddp)


def test_cases_expand_nodes_algorithms_and_sizes():
    s = spec.parse(GOOD)
    cases = as_json(s)
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
    cases = as_json(spec.parse(doc))
    rx = [c for c in cases if c["app"] == "rxelab"]
    assert len(rx) == 2 * 2 * 3 * 2
    assert {c["mtu"] for c in rx} == {1500, 9000}
    assert {tuple(sorted(c["netem"])) for c in rx} == {(), ("loss",),
                                                       ("delay_ms", "jitter_ms", "loss", "reorder")}
    assert all(c["qp_timeout"] == 12 and c["retry_cnt"] == 3 and c["timeout_s"] == 90 for c in rx)
    assert [c["transport"] for c in cases if c["app"] == "mpi"] == ["ucx"]


def test_a_named_profile_expands_to_its_table():
    doc = copy.deepcopy(GOOD)
    doc["runs"][0].update(netem=["none", "rtt-10ms+loss-0.1"])
    rx = [c for c in as_json(spec.parse(doc)) if c["app"] == "rxelab"]
    assert {tuple(sorted(c["netem"].items())) for c in rx} == {(), (("delay_ms", 5.0), ("loss", 0.1))}


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
        (lambda d: d["runs"][0].update(transport="ucx"), "rxelab runs over verbs or tcp or quic, not ucx"),
        (lambda d: d["runs"][1].update(transport="verbs"), "mpi runs over ucx or tcp, not verbs"),
        (lambda d: d["runs"][0].update(algorithms=["hand-loop"], transport=["tcp"]),
         "the hand-loop is pyverbs by hand: transport = [\"verbs\"] only"),
        (lambda d: d["runs"][1].update(transport=["ucx", "ib"]), "runs[1].transport"),
        (lambda d: d["runs"][0].update(netem=[{"los": 1}]), "runs[0].netem[0]: unknown key 'los'"),
        (lambda d: d["runs"][0].update(netem=[{"loss": 101}]), "loss must be a number from 0 to 100"),
        (lambda d: d["runs"][0].update(netem=[{"reorder": 5}]), "need a delay_ms"),
        (lambda d: d["runs"][0].update(netem=["rtt-5"]), "runs[0].netem[0]: profile 'rtt-5': cannot read"),
        (lambda d: d["runs"][0].update(netem=["jitter-1ms"]), "need a delay_ms"),
        (lambda d: d["runs"][0].update(netem={}), "runs[0].netem: must be a non-empty list"),
        (lambda d: d["runs"][0].update(mtu=[12000]), "runs[0].mtu: must be from 1280 to 9000"),
        (lambda d: d["runs"][0].update(retry_cnt=9), "runs[0].retry_cnt: must be from 0 to 7"),
        (lambda d: d["runs"][1].update(qp_timeout=14), "runs[1].qp_timeout: only rxelab runs"),
        (lambda d: d["runs"][0].update(timeout_s=1), "runs[0].timeout_s"),
        (lambda d: d["runs"][1].update(transport="carrier-pigeon"), "runs[1].transport"),
        (lambda d: d["runs"][2].update(nodes=[3]), "perftest measures one link"),
        (lambda d: d["runs"][2].update(algorithms=["x"]), "perftest runs take `tools`"),
        (lambda d: d.update(runs=[]), "runs: must be a non-empty list"),
        (lambda d: d.update(rounds=0), "rounds: must be from 1 to 20"),
        (lambda d: d.update(rounds=21), "rounds: must be from 1 to 20"),
        (lambda d: d["runs"][0].update(tight="yes"), "runs[0].tight: must be true or false"),
        (lambda d: d["runs"][2].update(tight=True), "only rxelab, mpi and gloo runs take `tight`"),
        (lambda d: d["runs"][1].update(app="gloo", op="reduce_scatter", algorithms=None),
         "reduce_scatter has no Gloo counterpart in torch 1.13"),
        (lambda d: d["runs"][1].update(app="gloo"), "runs[1].algorithms: must be a non-empty list "
                                                    "from gloo-default"),
        (lambda d: d["runs"].append({"app": "gloo", "op": "allreduce", "nodes": [3], "sizes": [8],
                                     "transport": ["tcp"]}), "only mpi and rxelab runs choose a transport"),
        (lambda d: d["runs"].append({"app": "gloo", "op": "allreduce", "nodes": [3], "sizes": [8],
                                     "ranks_per_node": 2}), "only rxelab runs take it"),
        (lambda d: d["runs"][0].update(compression=["bf16"]),
         "bf16 round values: only for allreduce and reduce_scatter (float sums), not alltoall"),
        (lambda d: d["runs"][0].update(compression=["gzip"]), "runs[0].compression: must be a "
                                                              "non-empty list from none, lz4"),
        (lambda d: d["runs"][0].update(compression="zstd"), "runs[0].compression"),
        (lambda d: d["runs"][1].update(compression=["zstd"]), "only rxelab runs compress"),
        (lambda d: d["runs"][0].update(data=["noise"]), "runs[0].data: must be a non-empty list "
                                                        "from pattern, zeros, sparse, random"),
        (lambda d: d["runs"][2].update(data=["zeros"]), "perftest moves its own bytes"),
        (lambda d: d["runs"][0].update(busy_neighbours=-1), "runs[0].busy_neighbours: must be from 0 to 63"),
        (lambda d: d["runs"][0].update(busy_neighbours=64), "runs[0].busy_neighbours: must be from 0 to 63"),
        (lambda d: d["runs"][0].update(busy_neighbours="one"), "runs[0].busy_neighbours"),
        (lambda d: d["runs"][0].update(busy_neighbours=[1]), "runs[0].busy_neighbours"),
    ],
)
def test_bad_specs_name_the_problem(mutate, problem):
    doc = copy.deepcopy(GOOD)
    mutate(doc)
    with pytest.raises(spec.SpecError) as e:
        spec.parse(doc, "my.toml")
    assert "my.toml is not a valid experiment spec" in str(e.value) and problem in str(e.value)


def test_unknown_spec_lists_the_shipped_ones(tmp_path):
    shipped = ", ".join(sorted(p.stem for p in spec.SPECS.glob("*.toml")))
    assert "calibrate" in shipped and "smoke" in shipped
    with pytest.raises(spec.SpecError, match=f"shipped: {shipped}"):
        spec.find("nope")
    broken = tmp_path / "x.toml"
    broken.write_text("name = ")
    with pytest.raises(spec.SpecError, match="not valid TOML"):
        spec.load(str(broken))


def _refused(doc) -> str:
    with pytest.raises(spec.SpecError) as e:
        spec.parse(doc, "my.toml")
    assert str(e.value).startswith("my.toml is not a valid experiment spec:\n  ")
    return str(e.value)


@pytest.mark.parametrize("name", ["../../../x", "a/b", "..", ".hidden", "-rf", "a b", "x\n", "",
                                  "é", "a" * 65, 7])
def test_name_is_a_plain_directory_name(name):
    """The runner makes results/<stamp>-<name>: a name must not climb out of results/."""
    doc = copy.deepcopy(GOOD)
    doc["name"] = name
    assert "\n  name: must be a plain name" in _refused(doc)


@pytest.mark.parametrize("name", ["memory-and-load", "v1.2_x", "A" * 64, "0"])
def test_plain_names_are_kept(name):
    assert spec.parse({**GOOD, "name": name}).name == name


@pytest.mark.parametrize(
    "key, value, problem",
    [
        ("sizes", [2**62], "runs[0].sizes: must be from 0 to 1073741824"),
        ("sizes", [8] * 65, "runs[0].sizes: must be from 0 to 1073741824"),
        ("stages", 10**18, "runs[0].stages: must be from 1 to 10000000"),
        ("stages", True, "runs[0].stages: must be from 1 to 10000000 (a whole number), not True"),
        ("stages", 2.0, "runs[0].stages: must be from 1 to 10000000 (a whole number), not 2.0"),
        ("warmup", 1_000_001, "runs[0].warmup: must be from 0 to 1000000"),
        ("nodes", [65], "runs[0].nodes: must be from 1 to 64"),
        ("nodes", [2] * 65, "runs[0].nodes: must be from 1 to 64"),
        ("timeout_s", 604_801, "runs[0].timeout_s: must be from 10 to 604800"),
        ("mtu", [1500.0], "runs[0].mtu: must be from 1280 to 9000"),
        ("eager_limit", 65537, "runs[0].eager_limit: must be from 0 to 65536"),
        ("netem", [{}] * 65, "runs[0].netem: must be a non-empty list of at most 64 tables"),
        ("sample_load", 1, "runs[0].sample_load: must be true or false, not 1"),
    ],
)
def test_impossible_numbers_name_the_field_and_range(key, value, problem):
    doc = copy.deepcopy(GOOD)
    doc["runs"][0][key] = value
    assert problem in _refused(doc)


def test_the_largest_allowed_values_are_accepted():
    doc = copy.deepcopy(GOOD)
    doc["runs"][0].update(sizes=[1 << 30] * 64, stages=10_000_000, warmup=1_000_000, nodes=[64],
                          timeout_s=604_800, mtu=[9000], netem=[{}] * 64)
    doc["description"] = "x" * 2000
    case = as_json(spec.parse(doc))[0]
    assert (case["size"], case["stages"], case["nodes"], case["timeout_s"]) == \
        (1 << 30, 10_000_000, 64, 604_800)
    doc["description"] += "x"
    assert "\n  description: must be text of at most 2000 characters" in _refused(doc)


def test_every_problem_is_listed_once_in_one_error():
    doc = copy.deepcopy(GOOD)
    doc["name"] = "../x"
    doc["runs"][0].update(sizes=[-1, -2, 2**62], netem=[{}, {"loss": 101}])
    doc["runs"][2]["nodes"] = [3]
    lines = _refused(doc).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == \
        ["name", "runs[0].sizes", "runs[0].netem[1]", "runs[2].nodes"]


def test_the_module_docstring_documents_every_key_and_range():
    for key in spec.KEYS | {"name", "description", "rounds"}:
        assert f"    {key} = " in spec.__doc__, key
    for key, (low, high) in spec.BOUNDS.items():
        assert f"{low}..{high}" in spec.__doc__, key


VALID = 'name = "f"\n[[runs]]\napp = "rxelab"\nsizes = [8]\n'


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda p: p.write_bytes(bytes(range(256)) * 4), "not UTF-8 text"),
        (lambda p: p.write_bytes(VALID.encode("utf-16")), "not UTF-8 text"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_text("a = " + "[" * 100_000 + "]" * 100_000), "nested too deeply"),
        (lambda p: p.write_text(VALID + "stages = " + "1" * 5000 + "\n"), "a number too large"),
        (lambda p: None, "no such file"),
        (lambda p: p.write_text(VALID + "# " + "x" * (1 << 20) + "\n"), "larger than 1 MiB"),
    ],
    ids=["binary", "utf-16", "directory", "nested", "huge-int", "missing", "too-big"],
)
def test_a_broken_file_is_a_one_line_error(tmp_path, make, reason):
    path = tmp_path / "x.toml"
    make(path)
    with pytest.raises(spec.SpecError) as e:
        spec.load(str(path))
    assert str(e.value).startswith(f"{path}: {reason}") and "\n" not in str(e.value)


def test_a_file_of_exactly_the_limit_loads(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text(VALID + "#" * (spec.MAX_BYTES - len(VALID) - 1) + "\n")
    assert path.stat().st_size == spec.MAX_BYTES and spec.load(str(path)).name == "f"


def test_an_unreadable_file_is_a_one_line_error(tmp_path, monkeypatch):
    path = tmp_path / "x.toml"
    path.write_text(VALID)
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads anything: refuse the way the kernel would
        real = Path.open

        def refuse(self, *args, **kwargs):
            if self == path:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *args, **kwargs)
        monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(spec.SpecError, match=r"^.*x\.toml: not readable \(permission denied\)$"):
        spec.load(str(path))


def test_back_to_back_and_rounds_reach_the_cases():
    doc = copy.deepcopy(GOOD)
    doc["rounds"] = 3
    doc["runs"][1]["tight"] = True
    s = spec.parse(doc)
    assert s.rounds == 3
    assert [c.get("tight") for c in as_json(s)] == [None] * 4 + [True, True, None]
    assert spec.parse(GOOD).rounds == 1


@pytest.mark.parametrize(("text", "said"), [
    ("[elastic]\nevents=[{step=1,kill=1,join=2}]", "elastic.events[0]: an event does one thing"),
    ("[elastic]\nevents=[{step=50,kill=1}]", "all before step 40"),
    ("[elastic]\nsize=5\nevents=[{step=1,kill=1}]", "multiple of 4"),
    ("[elastic]\nevents=[{step=2,kill=0},{step=3,join=2}]", "rank 0, the newcomers' rendezvous, is killed"),
    ("[elastic]\nevents=[{step=2,kill=6}]", "kill = 6: a rank from 0 to 5"),
    ("[elastic]\nevents=[{step=2,partition=1}]", "node 1: from 2 to 3"),
    ("[elastic]\nevents=[{step=2,join=4}]", "node 4: from 1 to 3"),
    ("[elastic]\nevents=[{step=5,kill=1},{step=2,kill=2}]", "in order of their steps"),
    ("[elastic]\nsteps=true\nevents=[{step=2,kill=1}]", "elastic.steps: must be from 2 to 100000"),
    ("[elastic]\nevents=[{step=2,kil=1}]", "unknown key 'kil'"),
    ("[elastic]\nmpi=1\nevents=[{step=2,kill=1}]", "elastic.mpi: must be true or false"),
    ("[elastic]\nevents=[]", "elastic.events: must be a list of 1 to 16 events"),
    ("[elastic]\nevents=[{step=2,kill=1}]\n[[runs]]\napp='rxelab'\nop='alltoall'\nnodes=[2]\n"
     "sizes=[1]", "either [[runs]], one [elastic] table or one [ddp] table"),
    ("", "either [[runs]], one [elastic] table or one [ddp] table"),
    ("rounds=3\n[elastic]\nevents=[{step=2,kill=1}]", "runs once: rounds = 1"),
    ("[elastic]\nevents=[{step=2,kill=1},{step=3,kill=1}]", "kill = 1: that rank is killed twice"),
    ("[elastic]\nevents=[{step=2,partition=3},{step=3,kill=5}]", "kill = 5: its node is cut off"),
    ("[elastic]\nevents=[{step=2,partition=3},{step=3,partition=3}]", "cut off twice"),
    ("[elastic]\nevents=[{step=2,partition=2},{step=3,join=2}]", "join = 2: that node is cut off"),
    ("[elastic]\nsteps=12\nadmit_every=5\nevents=[{step=11,join=1}]", "no admit point"),
    ("[ddp]\nwraps=['fsdp3']", "ddp.wraps: must be a list of sharded variants beside DDP's, of "
     "fsdp, fsdp2"),
    ("[ddp]\nwraps=['fsdp','fsdp']", "hooks, bucket_mb and wraps each name a value once"),
    ("[ddp]\nhooks=['none','none']", "hooks, bucket_mb and wraps each name a value once"),
    ("[ddp]\nhooks=['fp8']", "ddp.hooks: must be a list of DDP hooks, of none, fp16, bf16"),
    ("[ddp]\nnodes=65", "ddp.nodes: must be from 2 to 64"),
    ("[ddp]\ntimeout_s=5", "ddp.timeout_s: must be from 10 to 604800"),
    ("rounds=2\n[ddp]", "a [ddp] scenario alternates its own rounds"),
])
def test_a_scenario_is_checked_before_anything_runs(text, said):
    import tomllib
    with pytest.raises(spec.SpecError) as err:
        spec.parse({"name": "x", **tomllib.loads(text)})
    assert said in str(err.value), str(err.value)


def test_a_gloo_run_takes_its_one_label_and_the_same_modes_as_mpi():
    doc = {"name": "g", "runs": [{"app": "gloo", "op": "alltoall", "nodes": [3], "sizes": [8],
                                  "tight": True}]}
    (case,) = as_json(spec.parse(doc))
    assert (case["app"], case["algorithm"], case["tight"], case["transport"]) == \
        ("gloo", "gloo-default", True, None)
    assert spec.contender(spec.Case(**case)) == "gloo"


def test_every_gloo_counterpart_is_a_torch_distributed_call():
    from rxelab import ops
    # torch 1.13's torch.distributed names (no torch on the host: the names, as documented)
    calls = {"all_to_all_single", "all_gather", "all_reduce", "broadcast"}
    described = {name: c.gloo for name, c in ops.COLLECTIVES.items()}
    assert {g for g in described.values() if g} <= calls
    assert described["reduce_scatter"] is None


def test_every_perftest_tool_a_spec_takes_has_its_command():
    from rxelab import perftest

    assert tuple(perftest.TOOLS) == spec.TOOLS


def test_an_included_spec_runs_first_in_every_round(tmp_path):
    """include: the named shipped spec's runs come before the spec's own (so the runner's
    rounds alternate them with the rest); one level deep, [[runs]] only, names only."""
    (tmp_path / "base.toml").write_text(
        'name = "base"\n[[runs]]\napp = "perftest"\ntools = ["ib_send_lat"]\nnodes = [2]\n'
        'sizes = [1]\n')
    doc = {**copy.deepcopy(GOOD), "include": ["base"], "rounds": 3}
    got = spec.parse(doc, "my.toml", tmp_path)
    assert got.includes == ("base",) and got.rounds == 3
    assert [c["algorithm"] for c in as_json(got)][:2] == ["ib_send_lat", "pairwise"]
    assert len(as_json(got)) == len(as_json(spec.parse(GOOD))) + 1
    (tmp_path / "nested.toml").write_text(
        'name = "nested"\ninclude = ["base"]\n[[runs]]\napp = "perftest"\nnodes = [2]\n'
        'sizes = [1]\n')
    (tmp_path / "scenario.toml").write_text(
        'name = "scenario"\n[elastic]\nevents = [{step = 10, kill = 1}]\n')
    (tmp_path / "itself.toml").write_text(
        'name = "itself"\ninclude = ["itself"]\n[[runs]]\napp = "perftest"\nnodes = [2]\n'
        'sizes = [1]\n')
    many = "".join('[[runs]]\napp = "perftest"\nnodes = [2]\nsizes = [1]\n' for _ in range(62))
    (tmp_path / "many.toml").write_text('name = "many"\n' + many)
    shipped = "base, itself, many, nested, scenario"
    for name, said in (("nope", f"include names no shipped spec 'nope' (shipped: {shipped})"),
                       ("nested", "include 'nested': a spec of [[runs]] that includes none"),
                       ("itself", "include 'itself': a spec of [[runs]] that includes none"),
                       ("scenario", "include 'scenario': a spec of [[runs]]"),
                       ("many", "65 [[runs]] with those it includes: at most 64")):
        with pytest.raises(spec.SpecError, match=re.escape(f"my.toml: {said}")):
            spec.parse({**doc, "include": [name]}, "my.toml", tmp_path)
    for bad, said in ((["../base"], "include[0]"), ([], "include: must be a list of 1 to 8"),
                      ("base", "include: must be a list"), (["base", "base"], "each spec once")):
        assert said in _refused({**doc, "include": bad})
    elastic = {"name": "e", "include": ["base"], "elastic": {"events": [{"step": 10, "kill": 1}]}}
    assert "include adds [[runs]]" in _refused(elastic)


def test_the_validation_specs_measure_their_own_calibration():
    for name in ("validation", "validation-p8"):
        got = spec.load(name)
        calibration = as_json(spec.load("calibrate"))
        assert got.includes == ("calibrate",)
        assert as_json(got)[:len(calibration)] == [{**c, "included": "calibrate"} for c in calibration]
        assert not any("included" in c for c in as_json(got)[len(calibration):])


def test_a_ddp_scenario_with_sharded_variants_is_taken():
    import tomllib
    s = spec.parse({"name": "x", **tomllib.loads("[ddp]\nwraps=['fsdp2','fsdp']")})
    assert s.ddp is not None and s.ddp.wraps == ["fsdp2", "fsdp"]


"""What a case is called and what its app is told: codecs, data patterns and the library's
transport multiply a run's cases, and each names its contender (rxelab-eager0-bf16,
rxelab-tcp) as reports compare them."""

from __future__ import annotations

from experiments import spec
from tests.unit.test_spec import as_json


def test_codecs_and_data_multiply_cases_and_name_the_contender():
    doc = {"name": "c", "runs": [
        {"app": "rxelab", "op": "allreduce", "algorithms": ["ring"], "nodes": [3],
         "sizes": [8, 16], "data": ["zeros", "random"], "compression": ["none", "bf16"],
         "eager_limit": 0},
        {"app": "mpi", "op": "allreduce", "nodes": [3], "sizes": [8], "data": ["random"],
         "transport": ["tcp"]}]}
    cases = as_json(spec.parse(doc))
    rx = [c for c in cases if c["app"] == "rxelab"]
    assert len(rx) == 2 * 2 * 2
    assert {(c["data"], c["compression"]) for c in rx} == {
        (d, z) for d in ("zeros", "random") for z in ("none", "bf16")}
    assert {spec.contender(spec.Case(**c)) for c in rx} == {"rxelab-eager0", "rxelab-eager0-bf16"}
    (mpi,) = [c for c in cases if c["app"] == "mpi"]
    assert mpi["data"] == "random" and "compression" not in mpi


def test_rxelab_transports_multiply_cases_name_the_contender_and_reach_the_app():
    from experiments.running import commands
    doc = {"name": "t", "runs": [
        {"app": "rxelab", "op": "allreduce", "algorithms": ["ring"], "nodes": [3], "sizes": [8],
         "transport": ["verbs", "tcp"]},
        {"app": "rxelab", "op": "allreduce", "algorithms": ["ring"], "nodes": [3], "sizes": [8]},
        {"app": "mpi", "op": "allreduce", "nodes": [3], "sizes": [8]}]}
    cases = spec.parse(doc).cases()
    named = sorted(spec.contender(c) for c in cases)
    assert named == ["mpi-tcp", "mpi-ucx", "rxelab", "rxelab", "rxelab-tcp"]
    argv = {spec.contender(c) + str(c.rxelab_transport): commands.rxelab_app(c) for c in cases
            if c.app == "rxelab"}
    assert argv["rxelab-tcptcp"][-2:] == ["--transport", "tcp"]
    assert argv["rxelabverbs"][-2:] == ["--transport", "verbs"]
    assert "--transport" not in argv["rxelabNone"]  # as before transports: the app's default
    # a record of an early version said transport = "tcp" of every case: still rxelab's verbs
    old = spec.Case(app="rxelab", op="alltoall", algorithm="sequential", nodes=3, size=8,
                    transport="tcp")
    assert spec.contender(old) == "rxelab"

"""Which algorithms the shipped specs between a first check and a long study run (issue 59):
smoke verifies every all-to-all and allgather algorithm, latency times every one, and
first-comparison sets every one beside Open MPI over UCX and over TCP at 1 KiB to 1 MiB, in
about 25 minutes. Before, Bruck was in neither smoke nor latency, though the scale study finds
it the fastest all-to-all of small blocks at scale, and nothing lay between smoke (minutes) and
latency (about two hours)."""

from __future__ import annotations

import re

import pytest
from rxelab import ops

from experiments import spec

OPS = ("alltoall", "allgather")


def every_algorithm(op: str) -> set[str]:
    return set(ops.COLLECTIVES[op].algorithms)


def ran(name: str, app: str, **where: object) -> set[tuple]:
    """(op, algorithm, transport) of the spec's cases of `app` that match `where`."""
    return {(c.op, c.algorithm, c.transport) for c in spec.load(name).cases()
            if c.app == app and all(getattr(c, k) == v for k, v in where.items())}


def test_bruck_is_an_algorithm_of_both_ops():
    """What the specs below are held to: the library's own list, Bruck in it."""
    assert all("bruck" in every_algorithm(op) for op in OPS)


@pytest.mark.parametrize("name", ["smoke", "first-comparison"])
def test_the_spec_runs_every_algorithm_of_both_ops(name):
    found = ran(name, "rxelab")
    for op in OPS:
        assert {a for o, a, _ in found if o == op} >= every_algorithm(op), (name, op)


@pytest.mark.parametrize("tight", [False, True])
def test_latency_times_bruck_wherever_it_times_the_other_algorithms(tight):
    """Stage by stage (all-to-all from 1 B, allgather at 1 KiB) and back to back (1 KiB to
    1 MiB): Bruck at every size another algorithm of the library's runs at."""
    cases = [c for c in spec.load("latency").cases() if c.app == "rxelab" and c.tight == tight
             and c.option("eager_limit") is None]
    for op in OPS:
        sizes = {c.size for c in cases if c.op == op}
        assert sizes and {c.size for c in cases if c.op == op and c.algorithm == "bruck"} == sizes


def test_smoke_checks_every_stage_of_every_algorithm_and_mpi():
    cases = spec.load("smoke").cases()
    stage_by_stage = {(c.op, c.algorithm) for c in cases if c.app == "rxelab" and not c.tight}
    assert stage_by_stage == {(op, a) for op in OPS for a in every_algorithm(op)}
    assert {(op, "mpi-default", t) for op in OPS for t in ("ucx", "tcp")} <= ran("smoke", "mpi")


def test_first_comparison_sets_every_algorithm_beside_both_mpis_at_every_size():
    s = spec.load("first-comparison")
    cases = s.cases()
    sizes = {c.size for c in cases if c.app != "perftest"}
    assert min(sizes) == 1 << 10 and max(sizes) == 1 << 20
    assert s.max_nodes == 3 and s.rounds >= 3
    for size in sizes:
        assert ran("first-comparison", "rxelab", size=size) == {
            (op, a, None) for op in OPS for a in every_algorithm(op)}, size
        assert ran("first-comparison", "mpi", size=size) == {
            (op, "mpi-default", t) for op in OPS for t in ("ucx", "tcp")}, size
    assert all(c.tight for c in cases if c.app != "perftest"), "calls back to back"
    assert any(c.app == "perftest" for c in cases), "the link's rate, for '% of link'"


def test_first_comparison_says_how_long_it_takes_and_on_what_basis():
    s = spec.load("first-comparison")
    minutes = int(re.search(r"About (\d+) minutes", s.description).group(1))
    assert 15 <= minutes <= 30, "between smoke's minutes and latency's hours"
    assert "records.jsonl" in s.description and "wall_seconds" in s.description
    cases = len(s.cases()) * s.rounds
    assert f"{cases} in all" in s.description


def test_first_comparison_gives_each_collective_one_headline():
    """The report makes a headline per setting, and the number of calls is part of it: a spec
    with 50 calls at small sizes and 20 at 1 MiB gave each collective two headlines, one of a
    single size (seen on its first run from a fresh clone)."""
    cases = [c for c in spec.load("first-comparison").cases() if c.app != "perftest"]
    assert {c.stages for c in cases if c.app != "perftest"} == {cases[0].stages}

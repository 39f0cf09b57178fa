"""A spec's hand-loop cases (rxelab.handloop, the floor): asked only of what it does."""

import pytest

from experiments import spec


def _refused(doc) -> str:
    with pytest.raises(spec.SpecError) as e:
        spec.parse(doc, "my.toml")
    return str(e.value)


def test_the_hand_loop_is_an_rxelab_case_of_small_alltoall_and_allgather_only():
    """rxelab.handloop, the floor the library is measured against, runs as an rxelab case; a
    spec asks it only of what it does (blocks of one eager slot, as they are)."""
    run = {"app": "rxelab", "op": "alltoall", "algorithms": ["parallel", "hand-loop"],
           "nodes": [3], "sizes": [1024, 65536], "tight": True}
    got = spec.parse({"name": "floor", "runs": [run]}, "my.toml")
    assert sorted(c.algorithm for c in got.cases()) == ["hand-loop"] * 2 + ["parallel"] * 2
    assert "1 to 65536 bytes" in _refused({"name": "x", "runs": [{**run, "sizes": [131072]}]})
    assert "1 to 65536 bytes" in _refused({"name": "x", "runs": [{**run, "sizes": [0]}]})
    assert "as they are" in _refused({"name": "x", "runs": [{**run, "compression": ["lz4"]}]})
    for other in ({**run, "op": "allreduce"}, {**run, "app": "mpi"}):
        assert "hand-loop" in _refused({"name": "x", "runs": [other]})

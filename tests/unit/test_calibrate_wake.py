"""The calibration's wake-up cost (the CPU a blocked rank spends to run again where the lab's
VMs outnumber the machine's cores), on the made-up lab: fitted from the exchange beside a
busy node, checked beside two, and what an older run, a roomy machine or a record without
its loaded nodes give."""

from __future__ import annotations

import pytest

from experiments.simulation import calibrate
from tests.unit.calibrate_lab import (
    HOST_CPUS,
    NODE_CPUS,
    TRUTH,
    beside,
    lab,
    made_up_run,
    typed,
)
from tests.unit.simulator_helpers import needs_simgrid

pytestmark = needs_simgrid


@pytest.mark.slow
def test_a_run_without_the_exchange_beside_busy_nodes_wakes_at_once_and_says_so():
    """Calibration runs from before the exchange beside a busy node (2026-11-28) fit the rest
    as before."""
    got = calibrate.fit(typed([r for r in made_up_run() if not r.get("busy_neighbours")]), "older",
                        NODE_CPUS, HOST_CPUS)
    assert got.wake is None
    for size, seconds in TRUTH:  # the rest as fitted with it
        assert got.costs.send_cpu(size) + got.costs.recv_cpu(size) == pytest.approx(seconds, rel=1e-3)
    [note] = got.measured["notes"]
    assert "no exchange beside one busy node" in note
    assert got.lab(3).wake == 0 and "runs again at once" in "\n".join(calibrate.describe(got))


@pytest.mark.slow
def test_a_machine_with_a_core_for_every_vm_fits_no_wake_and_says_so():
    """Nodes with a core each (eight cores under three VMs) never wait for one: the exchange
    beside a busy node is not the wake-up's measurement there."""
    run = [r for r in made_up_run() if not r.get("busy_neighbours")] + beside(1024, 1, 8)
    got = calibrate.fit(typed(run), "roomy", NODE_CPUS, 8)
    assert got.wake is None
    assert any("no VM waits for a core" in n for n in got.measured["notes"])


def test_the_exchange_beside_busy_nodes_is_not_taken_for_the_exchange_alone():
    """The same op, algorithm, ranks and size, measured beside busy nodes: a figure of its
    own, whichever comes first in the records; one that names no loaded node is no figure."""
    run = made_up_run()
    m = calibrate.measurements(typed(run[-3:] + run[:-3]))
    assert m[("call", "alltoall", "pairwise", 2, 1024)].median == pytest.approx(
        lab("alltoall", "pairwise", 2, 1024))
    assert ("beside", "alltoall", "pairwise", 2, 1024, 1) in m
    nameless = [{**r, "busy_hosts": []} for r in run[-3:]]
    m = calibrate.measurements(typed(run[:-3] + nameless))
    assert not any(k[0] == "beside" for k in m)
    assert m[("call", "alltoall", "pairwise", 2, 1024)].rounds == 3


@pytest.mark.slow
def test_the_exchange_beside_more_busy_nodes_is_replayed_as_a_check_not_fitted():
    """validation-p8 runs the exchange beside two loops too (4 VMs on the 2 cores): the wake
    is still fitted on one loop, and two are replayed with it beside the lab's figure. On the
    made-up lab the replay is the lab's; where the lab took 1.5x that, a note says so."""
    alone = calibrate.fit(typed(made_up_run()), "one", NODE_CPUS, HOST_CPUS)
    two = beside(1024, 2)
    got = calibrate.fit(typed(made_up_run() + two), "two", NODE_CPUS, HOST_CPUS)
    assert got.wake == alone.wake
    row = got.measured["fit"]["exchange 1024 B beside 2 busy (not fitted)"]
    assert row["replay_s"] == pytest.approx(row["lab_s"], rel=1e-3)
    assert not any("beside 2" in n for n in got.measured["notes"])
    slower = [{**r, "summary": {**r["summary"], "avg_stage_us": r["summary"]["avg_stage_us"] * 1.5}}
              for r in two]
    off = calibrate.fit(typed(made_up_run() + slower), "slower", NODE_CPUS, HOST_CPUS)
    [note] = [n for n in off.measured["notes"] if "beside 2 busy nodes" in n]
    assert "(not fitted)" in note and "0.67x" in note
    lone = calibrate.fit(typed([r for r in made_up_run() if not r.get("busy_neighbours")] + two),
                         "lone", NODE_CPUS, HOST_CPUS)  # beside one failed in every round
    assert lone.wake is None and any("no exchange beside one busy node" in n
                                     for n in lone.measured["notes"])

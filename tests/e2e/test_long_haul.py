"""The long-haul study on the lab (issue 58), small: the long-haul spec's kinds of case through
fab - a 64 KiB ring allreduce over rxe, tcp and quic, and Open MPI over TCP, on a 10 ms round
trip with and without 1 % loss (netem profiles by name). Every case verifies its data; the
socket transports put no packet through rxe; the round trip shows in every call; the report
answers the seeds' claims from these figures."""

from __future__ import annotations

import pytest

from experiments.running import counters
from tests.e2e.test_experiments import run_spec

pytestmark = pytest.mark.vm

SPEC = """name = "long-haul-small"
[[runs]]
app = "rxelab"
op = "allreduce"
algorithms = ["ring"]
nodes = [3]
sizes = [65536]
stages = 3
transport = ["verbs", "tcp", "quic"]
netem = ["rtt-10ms", "rtt-10ms+loss-1"]
qp_timeout = 14

[[runs]]
app = "mpi"
op = "allreduce"
nodes = [3]
sizes = [65536]
stages = 3
transport = ["tcp"]
netem = ["rtt-10ms", "rtt-10ms+loss-1"]
"""
RING_STEPS = 4  # a ring allreduce of 3 ranks: 2 (p - 1) steps, each at least a one-way delay


@pytest.fixture(scope="module")
def long_haul_run(lab, tmp_path_factory):
    records, md, _ = run_spec(lab, tmp_path_factory.mktemp("long-haul"), SPEC)
    return records, md


def test_every_transport_verifies_its_data_over_a_long_lossy_link(long_haul_run):
    records, _ = long_haul_run
    assert [r["status"] for r in records] == ["ok"] * 8, [
        (r["app"], r.get("rxelab_transport") or r.get("transport"), r["netem"], r.get("error"))
        for r in records]
    for r in records:
        assert r["summary"]["ok"] and r["summary"]["wrong"] == 0
        assert r["netem"]["delay_ms"] == 5.0  # rtt-10ms: half on each node's data NIC
        one_way_s = r["netem"]["delay_ms"] / 1e3
        assert r["summary"]["avg_stage_us"] >= 0.9 * RING_STEPS * one_way_s * 1e6, r["summary"]
        sent = counters.total(r["rxe"], "sent_pkts")
        over_rxe = r["app"] == "rxelab" and r.get("rxelab_transport") in (None, "verbs")
        assert (sent > 0) == over_rxe, (r["app"], r.get("rxelab_transport"), sent)


def test_the_report_answers_the_seeds_claims_from_the_run(long_haul_run):
    _, md = long_haul_run
    assert "## The seeds' claims on long links" in md
    claims = md.split("## The seeds' claims on long links")[1].split("##")[0]
    for claim in ("TCP suffers badly", "QUIC keeps transfers efficient", "Compression saves"):
        assert claim in claims
    table = md.split("## Long-haul: ms per call by link")[1].split("##")[0]
    for who in ("rxelab", "rxelab-tcp", "rxelab-quic", "mpi-tcp"):
        assert f"| allreduce | 64 KiB | {who} |" in table
    assert "RTT 10 ms, loss 1 % (ms)" in table

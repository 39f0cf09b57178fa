"""Impairment commands for netem and the rxe counters that say what a case really did."""

import pytest

from experiments import counters, netem
from infra.inventory import Host, RdmaEndpoint, SSHEndpoint


@pytest.mark.parametrize("imp, args, label", [
    ({}, [], "none"),
    ({"loss": 0}, [], "none"),
    ({"loss": 1}, ["netem", "loss", "1%"], "loss 1%"),
    ({"loss": 0.1}, ["netem", "loss", "0.1%"], "loss 0.1%"),
    ({"loss": 1, "delay_ms": 1, "jitter_ms": 2, "reorder": 5},
     ["netem", "delay", "1ms", "2ms", "loss", "1%", "reorder", "5%"],
     "loss 1%, delay 1±2 ms, reorder 5%"),
    ({"duplicate": 2, "rate_mbit": 100}, ["netem", "duplicate", "2%", "rate", "100mbit"],
     "duplicate 2%, rate 100 Mbit/s"),
])
def test_netem_arguments_and_labels(imp, args, label):
    assert netem.problems(imp) == []
    assert netem.netem_args(imp) == args and netem.label(imp) == label


def test_apply_replaces_the_root_qdisc_and_no_impairment_clears_it():
    assert netem.apply_command("data0", {"loss": 5}) == \
        "sudo -n tc qdisc replace dev data0 root netem loss 5%"
    clear = netem.apply_command("data0", {})
    assert clear == netem.clear_command("data0")
    assert "tc qdisc del dev data0 root" in clear and "grep -q netem" in clear, \
        "clearing checks that no netem is left"


@pytest.mark.parametrize("imp, problem", [
    ([1], "must be a table"),
    ({"loss": -1}, "loss must be a number from 0 to 100"),
    ({"loss": True}, "loss must be a number"),
    ({"jitter_ms": 2}, "need a delay_ms"),
    ({"drop": 1}, "unknown key 'drop'"),
])
def test_impossible_impairments_are_named(imp, problem):
    assert any(problem in p for p in netem.problems(imp)), netem.problems(imp)


SYSFS = """ack_deferred:0
completer_retry_err:12
duplicate_request:3
rcvd_pkts:1000
sent_pkts:2000
garbage line
link_downed:x
"""


def test_counters_parse_and_delta():
    before = counters.parse(SYSFS)
    assert before["sent_pkts"] == 2000 and "link_downed" not in before and len(before) == 5
    after = {**before, "sent_pkts": 2500, "completer_retry_err": 20, "new": 1}
    d = counters.delta(before, after)
    assert d["sent_pkts"] == 500 and d["completer_retry_err"] == 8 and "new" not in d
    assert counters.delta({"sent_pkts": 10}, {"sent_pkts": 3}) == {"sent_pkts": 0}
    assert counters.total({"a": d, "b": {"sent_pkts": 7}}, "sent_pkts") == 507


def test_counters_are_read_from_the_hosts_device():
    host = Host("n", SSHEndpoint("h"), "10.0.0.1", RdmaEndpoint("mlx5_0", 2, 3))
    assert "/sys/class/infiniband/mlx5_0/ports/2/hw_counters" in counters.read_command(host)

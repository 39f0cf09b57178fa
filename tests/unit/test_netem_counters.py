"""Impairment commands for netem and the rxe counters that say what a case really did."""

import pytest

from experiments.running import counters
from experiments.spec import netem
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


@pytest.mark.parametrize("name, table", [
    ("none", {}),
    ("rtt-50ms", {"delay_ms": 25.0}),  # two nodes' delays on a round trip
    ("rtt-0.2ms+loss-0.01", {"delay_ms": 0.1, "loss": 0.01}),
    ("rtt-100ms+jitter-2ms+loss-1+rate-100mbit",
     {"delay_ms": 50.0, "jitter_ms": 2.0, "loss": 1.0, "rate_mbit": 100.0}),
])
def test_a_named_profile_is_its_table(name, table):
    assert netem.profile(name) == table


@pytest.mark.parametrize("name, said", [
    ("rtt-50", "cannot read 'rtt-50'"),
    ("latency-5ms", "cannot read 'latency-5ms'"),
    ("loss-1%", "cannot read 'loss-1%'"),
    ("rtt-5ms+rtt-6ms", "rtt twice"),
    ("", "cannot read ''"),
])
def test_a_profile_that_cannot_be_read_is_named(name, said):
    with pytest.raises(ValueError, match=said):
        netem.profile(name)


def test_apply_puts_netem_at_the_root_under_the_runs_own_handle():
    assert netem.apply_command("data0", {"loss": 5}, "1a2b") == \
        "sudo -n tc qdisc replace dev data0 root handle 1a2b: netem loss 5%"


FAKE_TC = """#!/bin/sh
# stands in for tc (and sudo): shows the root qdisc of $FAKE_ROOT, records deletions
case "$1" in -n) shift;; esac
[ "$1" = tc ] && shift
case "$*" in
  "qdisc show"*) cat "$FAKE_ROOT";;
  "qdisc del"*) echo "$*" >> "$FAKE_LOG"; echo "qdisc fq_codel 0: root refcnt 2" > "$FAKE_ROOT";;
esac
"""


@pytest.mark.parametrize("root, removed", [
    ("qdisc netem 1a2b: root refcnt 2 limit 1000 loss 5%", True),
    ("qdisc netem 8001: root refcnt 2 limit 1000 delay 5ms", False),  # a user's own netem
    ("qdisc htb 1: root refcnt 2 r2q 10 default 0", False),
    ("qdisc fq_codel 0: root refcnt 2 limit 10240p", False),
])
def test_clearing_removes_only_the_netem_under_the_runs_handle(tmp_path, root, removed):
    import os
    import subprocess

    for name in ("tc", "sudo"):
        (tmp_path / name).write_text(FAKE_TC)
        (tmp_path / name).chmod(0o755)
    (tmp_path / "root").write_text(root + "\n")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "FAKE_ROOT": str(tmp_path / "root"),
           "FAKE_LOG": str(tmp_path / "log")}
    out = subprocess.run(["sh", "-c", "nd=eth9; " + netem.clear_command('"$nd"', "1a2b", "tc")],
                         env=env, capture_output=True, text=True, timeout=30).stdout
    assert (tmp_path / "log").exists() == removed
    assert out.strip() == "netem_ours absent", "ours is gone, or was never there"


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

"""rxelab-bench's header lets a reader redo the run (issue 59): rxelab's version, the command
line as a shell takes it, the date in UTC, every rank's host (gathered) and the path MTU in
bytes; its JSON twin starts with the same facts as a header record and gets each row as it is
measured, so a run cut short keeps what it measured. On the fake fabric (port MTU 4096)."""

import json
import shlex
import socket
from datetime import UTC, datetime

import pytest
import rxelab
from rxelab import bench, bench_report, bootstrap, settings

from tests.unit.fakejob import free_port, run_ranks

IP_JSON = json.dumps([
    {"ifname": "lo", "mtu": 65536, "addr_info": [{"family": "inet", "local": "127.0.0.1"}]},
    {"ifname": "eth1", "mtu": 9000, "addr_info": [{"family": "inet", "local": "10.0.0.2"},
                                                  {"family": "inet6", "local": "fd00::2"}]}])


@pytest.fixture
def alone(monkeypatch):
    """This process is a job of one rank on the fake fabric's one device."""
    for name in (*(v for _, *names in bootstrap.SOURCES for v in names), settings.TRANSPORT_ENV,
                 settings.DEVICE_ENV, settings.IB_PORT_ENV, settings.GID_INDEX_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))


def test_hosts_are_said_once_each_with_their_ranks():
    assert bench_report.hosts_said(["a", "a", "a", "b"]) == "a (ranks 0-2), b (rank 3)"
    assert bench_report.hosts_said(["a", "b", "a"]) == "a (ranks 0,2), b (rank 1)"


def test_the_mtu_of_the_interface_that_holds_the_address():
    assert bench_report.interface_mtu("10.0.0.2", IP_JSON) == (9000, "eth1")
    assert bench_report.interface_mtu("fd00::2", IP_JSON) == (9000, "eth1")
    assert bench_report.interface_mtu("10.9.9.9", IP_JSON) == (None, "")
    assert bench_report.interface_mtu("10.0.0.2", "not json") == (None, "")
    assert bench_report.mtu_said([1500, 9000, None], "x") == \
        "1500 bytes (the smallest of 1500, 9000), x; 1 rank(s) could not tell"
    assert bench_report.mtu_said([None], "x") == "- (not known)"


def test_every_ranks_host_and_mtu_are_gathered_and_rank_0s_readiness_known_to_all():
    got = run_ranks(3, lambda comm: bench_report.gather(comm, comm.rank != 0))
    for seen in got:
        assert seen.hosts == [socket.gethostname()] * 3
        assert seen.mtus == [4096] * 3, "IBV_MTU_4096, in bytes"
        assert seen.ready is False, "rank 0 could not start, and every rank knows it"


def test_the_header_and_its_json_record_say_version_command_date_hosts_and_mtu(
        alone, tmp_path, capsys):
    out = tmp_path / "run 1.jsonl"  # a space: the command line quotes it as a shell would
    argv = ["--op", "allreduce", "--sizes", "1024,4096", "-i", "2", "-x", "0", "--json", str(out)]
    before = datetime.now(UTC).replace(microsecond=0)
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    command = "rxelab-bench " + shlex.join(argv)
    assert f"'{out}'" in command
    for line in (f"# rxelab {rxelab.__version__}, kernel", f"# command {command}",
                 f"# hosts {socket.gethostname()} (rank 0)",
                 "# path MTU 4096 bytes, the RDMA port's active MTU",
                 "# device fake0 port 1 gid index 1 mtu enum 5, ranks 1",
                 "# iterations 2; warm-up 0"):
        assert any(x.startswith(line) for x in printed), (line, printed)
    date = next(x for x in printed if x.startswith("# date "))[len("# date "):]
    assert before <= datetime.fromisoformat(date) <= datetime.now(UTC), date
    records = [json.loads(x) for x in out.read_text().splitlines()]
    head = records[0]
    assert head["record"] == "header" and head["rxelab"] == rxelab.__version__
    assert head["command"] == command and head["date"] == date
    assert head["hosts"] == [socket.gethostname()] and head["mtu_bytes"] == [4096]
    assert head["settings"]["timeout"] == 120.0 and head["ranks"] == 1
    assert (head["transport"], head["device"], head["port"], head["gid_index"]) == \
        ("verbs", "fake0", 1, 1)
    assert [(r["record"], r["size"]) for r in records[1:]] == \
        [("row", s) for _ in rxelab.ALLREDUCE_ALGORITHMS for s in (1024, 4096)]


def test_each_row_is_in_the_json_file_before_the_next_size_is_measured(
        alone, tmp_path, monkeypatch):
    out = tmp_path / "rows.jsonl"
    seen, measure = [], bench.measure

    def watched(*args, **kwargs):
        seen.append(len(out.read_text().splitlines()))
        return measure(*args, **kwargs)

    monkeypatch.setattr(bench, "measure", watched)
    assert bench.main(["--algorithms", "sequential", "--sizes", "1,2,3", "-i", "1", "-x", "0",
                       "--json", str(out)]) == 0
    assert seen == [1, 2, 3], "the header, then every row measured so far"


def test_an_unchecked_run_says_so_in_the_wrong_column(alone, tmp_path, capsys):
    out = tmp_path / "c0.jsonl"
    assert bench.main(["--algorithms", "sequential", "--sizes", "16", "-i", "1", "-x", "0",
                       "-c", "0", "--json", str(out)]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("16 "))
    assert row.split()[-1] == "-"
    assert json.loads(out.read_text().splitlines()[1])["wrong"] is None


def test_an_existing_json_file_is_kept_and_refused_in_one_line(alone, tmp_path, capsys):
    out = tmp_path / "old.jsonl"
    out.write_text("kept\n")
    assert bench.main(["--sizes", "1", "-i", "1", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"bench: --json {out}: File exists", err
    assert out.read_text() == "kept\n"

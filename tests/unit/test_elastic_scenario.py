"""The elastic scenario's commands, output parsing and report, without a lab: what a run of
the spec's [elastic] table sends to the nodes, and what its records say."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from experiments import report, spec
from experiments.report import elastic
from experiments.running import elastic_scenario
from experiments.running.scenario_records import ElasticRecord
from infra.inventory import Host, RdmaEndpoint, SSHEndpoint

HOSTS = [Host(f"node{i}", SSHEndpoint("127.0.0.1", 2220 + i), f"10.10.0.{10 + i}", RdmaEndpoint())
         for i in (1, 2, 3)]
RUN = "0123456789ab"
EL = spec.load("elastic").elastic
SECRET = "$HOME/rxelab/runs/0123456789ab/secret"


def test_the_shipped_scenario_kills_partitions_and_joins():
    assert [sorted(set(e.model_dump(exclude_none=True)) - {"step"}) for e in EL.events] == \
        [["kill"], ["partition"], ["join"]]
    assert EL.nodes * EL.ranks_per_node >= 4, "4 to 6 ranks on 3 nodes"


def test_the_job_is_elastic_and_carries_the_run_id_and_the_secret_file():
    cmd = elastic_scenario.job_command(EL, HOSTS, RUN, SECRET)
    assert cmd.startswith(f"RXELAB_RUN_ID={RUN} ")
    assert "rxelab.launch --hosts 10.10.0.11,10.10.0.12,10.10.0.13 --port 29650" in cmd
    assert '--secret-file "$HOME"/rxelab/runs/0123456789ab/secret --elastic --per-host 2 --' in cmd
    assert "--kill 10:3" in cmd and "--admit-every 5" in cmd and "--join" not in cmd
    # the one newcomer is awaited at admit points: a short job cannot end before it came
    assert "--expect-newcomers 1 --admit-timeout 30" in cmd
    no_join = EL.model_copy(update={"events": [e for e in EL.events if e.join is None]})
    alone = elastic_scenario.job_command(no_join, HOSTS, RUN, SECRET)
    assert "--expect-newcomers" not in alone and "--admit-timeout" not in alone
    new = elastic_scenario.newcomer_command(EL, HOSTS[1], HOSTS[0], RUN, SECRET)
    assert "--hosts 10.10.0.12" in new and "--join --master 10.10.0.11" in new
    assert new.rstrip().endswith("--join --join-timeout 900")
    mpi = elastic_scenario.mpi_command(EL, HOSTS, "10.10.0.0/24", RUN)
    assert "mpirun -np 6 --host \"$(hostname)\":2,10.10.0.12:2,10.10.0.13:2" in mpi
    assert "--mpi" in mpi and "--kill 10:3" in mpi and "UCX_TLS=rc_v,self,sm" in mpi


def test_the_secret_file_is_private_from_its_first_byte_and_never_on_a_command_line(tmp_path):
    path = tmp_path / "run dir" / "secret"
    cmd = elastic_scenario.secret_command(str(path))
    subprocess.run(["sh", "-c", cmd], check=True, input="s3cret\nrest\n", text=True)
    assert path.read_text() == "s3cret\n" and path.stat().st_mode & 0o777 == 0o600
    assert "s3cret" not in cmd


def test_heal_puts_back_the_addresses_it_found_and_waits_for_the_port():
    cmd = elastic_scenario.heal_command(HOSTS[2], "ens7", ["10.10.0.13/24"])
    assert cmd.startswith("nd=ens7; ") and "gid_attrs" not in cmd, "named as found: no GID then"
    assert 'sudo -n ip link set dev "$nd" up' in cmd
    assert "sudo -n ip addr replace 10.10.0.13/24 dev \"$nd\"" in cmd
    assert "/sys/class/infiniband/rxe0/ports/1/state" in cmd and "ACTIVE" in cmd
    cut = elastic_scenario.partition_command(HOSTS[2], RUN)
    assert cut.endswith('sudo -n ip link set dev "$nd" down') and "SSH_CLIENT" in cut
    assert f"RXELAB_RUN_ID={RUN}-watchdog nohup sh -c" in cut, "a watchdog of its own id"
    assert "watchdog \"$nd\"" in cut and "dev $nd up" not in cut, "the name is an argument"
    assert elastic_scenario.healed("port 4: ACTIVE\naddresses back\n")
    assert not elastic_scenario.healed("port 4: ACTIVE\n"), "the addresses count too"


def test_output_lines_are_parsed_with_the_launcher_prefix_and_stamped():
    text = ('[0] {"record": "elastic", "event": "step", "step": 3}\n# a comment\n'
            '[1] {"record": "stage"}\n[2] {broken\n{"record": "elastic", "event": "done"}\n')
    got = elastic_scenario.parse(text, 12.5)
    assert [e.event for e in got] == ["step", "done"] and all(e.arrived == 12.5 for e in got)


R = ElasticRecord.model_validate  # a record as read back


def scenario_records() -> list[dict]:
    """A run as the runner records it: 6 ranks, rank 3 dies at step 10 (the others shrink to
    5), node 3 is cut off at step 20 (shrink to 3), a newcomer joins at step 30 (4); then
    Open MPI's job ends 1.5 s after its kill."""
    t0 = 1000.0
    ev: list[dict[str, Any]] = [
        {"event": "step", "step": k, "seconds": 0.1 if k < 10 else 0.12, "arrived": t0 + k,
         "size": 6 if k < 10 else 5 if k < 20 else 3 if k < 30 else 4} for k in range(40)]
    ev += [{"event": "dying", "id": 3, "step": 10, "arrived": t0 + 10.0}]
    ev += [{"event": "shrink", "id": i, "step": 9, "size": 5, "detect_s": 0.8, "agree_s": 0.05,
            "build_s": 0.3 + i / 100, "lost": [3], "generation": 1, "arrived": t0 + 11.5}
           for i in (0, 1, 2, 4, 5)]
    ev += [{"event": "shrink", "id": i, "step": 20, "size": 3, "detect_s": 4.0, "agree_s": 2.0,
            "build_s": 0.4, "lost": [3, 4], "generation": 2, "arrived": t0 + 27.0}
           for i in (0, 1, 2)]
    ev += [{"event": "admit", "id": i, "step": 30, "size": 4, "build_s": 0.5, "generation": 3,
            "arrived": t0 + 31.0} for i in (0, 1, 2)]
    ev += [{"event": "done", "id": i, "params": "abc", "size": 4, "arrived": t0 + 45}
           for i in (0, 1, 2, 3000)]
    rxelab = {"contender": "rxelab", "started": t0, "exit": 0, "ended": t0 + 46,
              "actions": [{"kind": "partition", "node": "node3", "step": 20, "time": t0 + 20.2},
                          {"kind": "join", "node": "node2", "step": 30, "time": t0 + 30.1}],
              "events": ev, "spec": EL}
    mpi = {"contender": "mpi-ucx", "started": t0 + 100, "exit": 137, "ended": t0 + 111.5,
           "actions": [], "events": [
               *[{"event": "step", "step": k, "seconds": 0.09, "arrived": t0 + 100 + k}
                 for k in range(10)],
               {"event": "dying", "id": 3, "step": 10, "arrived": t0 + 110.0}], "spec": EL}
    return [rxelab, mpi]


def test_each_change_says_what_caused_it_and_what_it_cost():
    rows = elastic.changes(R(scenario_records()[0]))
    kill, cut, join = rows
    assert kill["kind"] == "kill" and kill["host_s"] == pytest.approx(1.5)
    assert kill["build_s"] == pytest.approx(0.35) and kill["detect_s"] == 0.8
    assert kill["redone"] == 2, "back to step 9: steps 9 and 10 again"
    assert cut["kind"] == "partition" and cut["size"] == 3 and cut["host_s"] == pytest.approx(6.8)
    assert join["outcome"] == "admit to 4 ranks" and join["host_s"] == pytest.approx(0.9)
    assert join["agree_s"] is None and "detect_s" not in join, "nothing agreed: not 0.00"
    before, after = elastic.step_times(R(scenario_records()[0]))
    assert before == pytest.approx(0.1) and after == pytest.approx(0.12)
    mpi = elastic.mpi_outcome(R(scenario_records()[1]))
    assert mpi == {"exit": 137, "steps_done": 10, "abort_s": pytest.approx(1.5)}
    assert elastic.problems([R(r) for r in scenario_records()]) == []


def test_two_causes_never_claim_one_change_and_a_timed_out_mpi_is_not_an_abort():
    rx, mpi = scenario_records()
    # a second kill right after the first: the shrink that followed goes to the first only
    twice = {**rx, "events": [*rx["events"], {"event": "dying", "id": 5, "step": 10,
                                             "arrived": 1010.5}]}
    rows = elastic.changes(R(twice))
    claimed = [r["done"] for r in rows if "done" in r]
    assert len(claimed) == len(set(claimed)) == 3, "each change once"
    assert rows[0]["who"] == "rank 3" and rows[0]["size"] == 5
    late = {**mpi, "exit": "timeout"}
    line = elastic.summary_lines([R(late)])[0]
    assert "did not end by its deadline" in line and "after the kill" not in line
    finished = {**mpi, "exit": 0, "events": [e for e in mpi["events"] if e["event"] != "dying"]}
    assert "ended (exit 0)" in elastic.summary_lines([R(finished)])[0]


def test_a_bad_run_is_named():
    rx, mpi = scenario_records()
    differ = {**rx, "events": [*rx["events"], {"event": "done", "params": "xyz", "arrived": 1}]}
    assert elastic.problems([R(differ)]) == ["rxelab: the survivors' parameters differ"]
    wrong = {**mpi, "events": [{"event": "wrong", "error": "step 3: 1 != 2"}]}
    assert elastic.problems([R(wrong)]) == ["mpi-ucx: step 3: 1 != 2"]
    failed = {**rx, "exit": 3}
    assert "ended with 3" in elastic.problems([R(failed)])[0]
    uncut = {**rx, "actions": [{**rx["actions"][0], "ok": False, "error": "sudo: a password"}]}
    assert "the partition of node3 did not happen: sudo" in elastic.problems([R(uncut)])[0]
    lost = {**rx, "newcomers": [{"exit": 143, "tail": "never admitted"}]}
    assert "a newcomer ended with 143" in elastic.problems([R(lost)])[0]


def test_the_report_has_the_table_the_summary_and_the_plot(tmp_path: Path):
    (tmp_path / "records.jsonl").write_text("")
    (tmp_path / "elastic.jsonl").write_text(
        "\n".join(R(r).to_json() for r in scenario_records()) + "\n")
    (tmp_path / "environment.json").write_text(json.dumps({"spec": "elastic"}))
    html_path, md_path = report.write(tmp_path)
    md = md_path.read_text()
    assert "## Changes of members" in md and "## Collectives" not in md
    assert "| rxelab | kill rank 3 | 10 | shrink to 5 ranks | 1.50 |" in md
    assert "mpi-ucx: the job ended 1.5 s after the kill (exit 137), after 10 of 50 steps" in md
    assert "their parameters agree" in md and "0 of 0 cases" not in md
    png = (tmp_path / "elastic.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10000
    assert "Changes of members" in html_path.read_text()

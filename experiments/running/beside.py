"""What the runner starts on nodes beside a case's own work, and stops by the run's id when the
case ends: a load sampler on each of the case's nodes (`sample_load`), and a CPU loop on each
of the nodes after them (`busy_neighbours`: the machine busy, as `fab calibrate` measures a
rank's wake-up). Each carries an id of its own (the run's, suffixed), so stopping one kind
leaves the other, and the run's end stops both."""

from __future__ import annotations

import shlex
import time
from typing import Any

from experiments.running import commands, fleet
from experiments.running.caselog import tail
from experiments.running.records import Load, Sample
from experiments.spec import Case
from infra.inventory import Host

LOOP = "while :; do :; done"  # a shell's busy loop: all of a CPU, no memory, no I/O
GRACE_S = 120  # a loop outlives its case's deadline by this much at most, should all else fail
SETTLE_S = 0.5  # seconds before a loop is looked for: one that could not start has ended by then


def load_id(run_id: str) -> str:
    return run_id + "-load"


def loop_id(run_id: str) -> str:
    return run_id + "-busy"


def neighbours(hosts: list[Host], case: Case) -> list[Host]:
    """The nodes a case loads: the `busy_neighbours` after its own (the run's hosts, in the
    inventory's order: the spec counted them in its nodes)."""
    return hosts[case.nodes:case.nodes + case.busy_neighbours]


def loop_command(run_id: str, seconds: float) -> str:
    """A CPU loop in the background, ended by the run's stop or, at the latest, after
    `seconds`; says its pid once it is seen running (a loop that ended at once, say for want
    of `timeout`, fails the command, as does a shell that cannot wait to look: no `sleep`)."""
    return (f"{commands.started_by(loop_id(run_id))}nohup timeout {int(seconds)} sh -c "
            f"{shlex.quote(LOOP)} >/dev/null 2>&1 & p=$!; "
            f"sleep {SETTLE_S} || "
            "{ kill $p 2>/dev/null; echo 'cannot wait to look for the loop' >&2; exit 1; }; "
            "if kill -0 $p 2>/dev/null; then echo loop $p; "
            "else echo 'the loop ended at once' >&2; exit 1; fi")


def start_loops(runner: Any, hosts: list[Host], seconds: float) -> list[str]:
    """A loop on each host; the problems, by host (none: all run). A host whose loop did not
    start is said, so the case is not measured on a machine less busy than it claims."""
    problems = []
    for h in hosts:
        try:
            r = runner._connection(h).run(loop_command(runner.run_id, seconds + GRACE_S),
                                          hide=True, warn=True, timeout=30, pty=False)
            if r.exited != 0 or not r.stdout.strip().startswith("loop "):
                problems.append(f"{h.name}: {r.stderr.strip() or tail(r.stdout, 2) or f'exit {r.exited}'}")
        except Exception as err:  # said with the others: the case is not run
            problems.append(f"{h.name}: {err}")
    return problems


def stop_loops(runner: Any, hosts: list[Host]) -> list[str]:
    """Stop the run's loops on `hosts`; the hosts where one may still run, with why (none: all
    stopped). The runner then stops the run, so no case is measured beside a loop it did not
    ask for."""
    if not hosts:
        return []
    results = runner._on_hosts(hosts, lambda h: commands.stop_command(
        loop_id(runner.run_id), say_left=True), timeout=60)
    left = []
    for name, r in results.items():
        if isinstance(r, Exception):
            left.append(f"{name}: {r}")
        elif "left " in r.stdout or r.exited != 0:
            left.append(f"{name}: {r.stdout.strip() or r.stderr.strip() or f'exit {r.exited}'}")
    return left


def start_samplers(runner: Any, hosts: list[Host], index: int) -> list[Host]:
    p = fleet.remote_paths()
    for h in hosts:
        argv = [f"--netdev={runner.netdevs[h.name]}", f"--rdma={h.rdma.device}",
                f"--port={h.rdma.port}", "--duration=3600"]
        sampler = commands.remote_word(f"{p['apps']}/load_sampler.py")
        command = (f"mkdir -p {runner.remote_dir} && {commands.started_by(load_id(runner.run_id))}"
                   f"nohup python3 {sampler} {shlex.join(argv)} "
                   f"--out {runner.remote_dir}/load-{index}.jsonl >/dev/null 2>&1 &")
        runner._connection(h).run(command, hide=True, timeout=30, pty=False)
    time.sleep(2)  # Python starts slowly under emulation: let it take a baseline
    return hosts


def stop_samplers(runner: Any, hosts: list[Host], index: int) -> list[Load]:
    out = []
    for h in hosts:
        c = runner._connection(h)
        c.run(commands.stop_command(load_id(runner.run_id)), hide=True, warn=True, timeout=30)
        data = f"{runner.remote_dir}/load-{index}.jsonl"
        r = c.run(f"cat {data}; rm -f {data}", hide=True, warn=True, timeout=60)
        samples = [Sample.from_json(x) for x in r.stdout.splitlines() if x.startswith("{")]
        out.append(Load(case=index, node=h.name, samples=samples))
    return out

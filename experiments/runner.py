"""Runs an experiment spec on the nodes and keeps everything it learns.

Each case is one command started on the first node of the case (our launcher, mpirun, or a
perftest pair); its output goes through the apps' one parser. Around it, every node of the
case gets the case's MTU and impairment and has its RDMA counters read before and after, so
each record says what really moved over the RDMA device. Every case has a deadline: one that
passes it is recorded as timed out, with the stages it finished. Results go to their own
directory, record by record as they arrive: the exact spec, the environment, records.jsonl,
load.jsonl. An interrupted or failed run keeps its partial results, is marked incomplete, and
leaves nothing running or impaired on the nodes.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from invoke.exceptions import CommandTimedOut

from apps.stages import parse_output
from experiments import commands, counters, fleet, netem
from experiments.commands import CLEANUP, TIMED_OUT, case_timeout
from experiments.spec import Spec, contender
from infra.inventory import Host, Inventory

NOT_RDMA = "moved no packets over the RDMA device: this run did not use RDMA"


class Runner:
    def __init__(self, spec: Spec, inv: Inventory, results_root: Path, *,
                 say: Callable[[str], None] = print, netdev: str = "data0",
                 lab_mtu: int | None = None) -> None:
        if spec.max_nodes > len(inv.hosts):
            raise fleet.FleetError(f"spec {spec.name} needs {spec.max_nodes} nodes, the inventory "
                                   f"has {len(inv.hosts)}")
        too_big = [c["mtu"] for c in spec.cases() if c["mtu"] and lab_mtu and c["mtu"] > lab_mtu]
        if too_big:
            raise fleet.FleetError(f"spec {spec.name} asks for MTU {max(too_big)}, the lab's data "
                                   f"network carries {lab_mtu} (make provision MTU=...)")
        self.spec, self.inv, self.say, self.netdev = spec, inv, say, netdev
        self.original_mtu: dict[str, int] = {}  # per node, as found before the first case
        self.connections: dict[str, Any] = {}  # one SSH connection per node for the whole run
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.dir = results_root / f"{stamp}-{spec.name}"
        n = 1
        while self.dir.exists():
            self.dir = results_root / f"{stamp}-{spec.name}.{n}"
            n += 1
        self.dir.mkdir(parents=True)

    def run(self, environment: dict[str, Any]) -> Path:
        shutil.copy(self.spec.source, self.dir / "spec.toml")
        state = {"spec": self.spec.name, "started": time.time(), "complete": False, **environment}
        self._write_env(state)
        cases = self.spec.cases()
        head = fleet.connect(self.inv.hosts[0])
        try:
            with open(self.dir / "records.jsonl", "x") as records, \
                    open(self.dir / "load.jsonl", "x") as loads:
                for i, case in enumerate(cases):
                    self.say(f"[{i + 1}/{len(cases)}] {case_label(case)}")
                    record, load = self._case(head, i, case)
                    records.write(json.dumps(record) + "\n")
                    records.flush()
                    for line in load:
                        loads.write(json.dumps(line) + "\n")
                    self.say(f"    {record['status']}: {outcome(record)}")
            state["complete"] = True
        except KeyboardInterrupt:
            self.say("interrupted: partial results kept, marked incomplete")
            raise
        finally:
            state["finished"] = time.time()
            self._write_env(state)
            self._cleanup()
            head.close()
            for c in self.connections.values():
                c.close()
        return self.dir

    def _write_env(self, state: dict[str, Any]) -> None:
        (self.dir / "environment.json").write_text(json.dumps(state, indent=2) + "\n")

    def _on_hosts(self, hosts: list[Host], command: Callable[[Host], str],
                  timeout: float = 60) -> dict[str, Any]:
        """One command per host, in parallel; the Result (or the exception) per host name."""
        def one(h: Host) -> Any:
            try:
                return self._connection(h).run(command(h), hide=True, warn=True, timeout=timeout)
            except Exception as err:  # noqa: BLE001 - reported per host by the caller
                self.connections.pop(h.name, None)  # a broken connection is made anew next time
                return err
        with ThreadPoolExecutor(max_workers=8) as pool:
            return dict(zip([h.name for h in hosts], pool.map(one, hosts), strict=True))

    def _connection(self, host: Host) -> Any:
        """SSH connections are slow to open under emulation: one per node, kept for the run."""
        if host.name not in self.connections:
            self.connections[host.name] = fleet.connect(host)
        return self.connections[host.name]

    def _cleanup(self) -> None:
        """Nothing of ours left running, impaired or resized on any node (best effort)."""
        def undo(h: Host) -> str:
            return f"{CLEANUP}; {commands.restore_command(h, self.original_mtu.get(h.name))}"
        self._on_hosts(list(self.inv.hosts), undo, timeout=30)

    def _prepare(self, hosts: list[Host], case: dict[str, Any]) -> dict[str, dict[str, Any]]:
        results = self._on_hosts(hosts, lambda h: commands.prepare_command(h, case))
        readings, problems = {}, []
        for h in hosts:
            r = results[h.name]
            if isinstance(r, Exception) or r.exited != 0:
                why = r if isinstance(r, Exception) else (r.stderr.strip() or f"exit {r.exited}")
                problems.append(f"{h.name}: {why}")
                continue
            readings[h.name] = commands.parse_readings(r.stdout)
        if problems:
            raise CaseSetupError("could not set the case up (MTU, netem): " + "; ".join(problems))
        return readings

    def _restore(self, hosts: list[Host]) -> dict[str, dict[str, Any]]:
        results = self._on_hosts(
            hosts, lambda h: commands.restore_command(h, self.original_mtu.get(h.name)))
        return {name: commands.parse_readings(r.stdout) for name, r in results.items()
                if not isinstance(r, Exception)}

    def _case(self, head: Any, index: int, case: dict[str, Any]) -> tuple[dict[str, Any], list[dict]]:
        hosts = list(self.inv.hosts[:case["nodes"]])
        record: dict[str, Any] = {"case": index, **case, "netem_label": netem.label(case["netem"]),
                                  "hosts": [h.name for h in hosts]}
        if case["mtu"]:  # remember what to put back before the first change
            for name, reading in self._readings_now(hosts).items():
                self.original_mtu.setdefault(name, reading.get("netdev_mtu", 0))
        samplers: list[Host] = []
        before: dict[str, dict[str, Any]] = {}
        started = time.monotonic()
        try:
            before = self._prepare(hosts, case)
            samplers = self._start_samplers(hosts, index) if case["sample_load"] else []
            started = time.monotonic()
            self._execute(head, index, case, hosts, record)
        except CaseSetupError as err:
            record.update(status="failed", error=str(err))
        finally:
            record["wall_seconds"] = time.monotonic() - started
            load = self._stop_samplers(samplers, index)
            after = self._restore(hosts)
            if record.get("status") != "ok":  # a failed or timed-out case leaves no rank behind
                self._on_hosts(hosts, lambda h: CLEANUP, timeout=30)
        record["active_mtu"] = before.get(hosts[0].name, {}).get("active_mtu")
        record["rxe"] = {name: counters.delta(before[name]["counters"], after[name]["counters"])
                         for name in before if name in after and before[name]["counters"]}
        if (record["status"] == "ok" and case["app"] == "mpi" and case["transport"] == "ucx"
                and record["rxe"] and counters.total(record["rxe"], "sent_pkts") == 0):
            record.update(status="failed", error=NOT_RDMA)
        return record, load

    def _readings_now(self, hosts: list[Host]) -> dict[str, dict[str, Any]]:
        results = self._on_hosts(hosts, commands.readings_command)
        return {n: commands.parse_readings(r.stdout) for n, r in results.items()
                if not isinstance(r, Exception)}

    def _execute(self, head: Any, index: int, case: dict[str, Any], hosts: list[Host],
                 record: dict[str, Any]) -> None:
        deadline = case_timeout(case)
        summary = None
        if case["app"] == "perftest":
            text, exit_code = self._perftest(case, hosts), 0
            summary = commands.parse_perftest(case["algorithm"], text, case["size"])
        else:
            cmd = (commands.rxelab_command(case, hosts, 29700 + index % 200)
                   if case["app"] == "rxelab" else commands.mpi_command(case, hosts, self.netdev))
            try:
                r = run_interruptibly(head, cmd, timeout=deadline + 60)
                stdout, text, exit_code = r.stdout, r.stdout + r.stderr, r.exited
            except CommandTimedOut as err:  # the remote deadline did not end it: ours did
                stdout = text = err.result.stdout or ""
                exit_code = TIMED_OUT
            found = parse_output(stdout)
            summary = next((x for x in reversed(found) if x["record"] == "summary"), None)
            stages = [x["seconds"] for x in found if x["record"] == "stage"]
            if stages:
                record["stage_seconds"] = stages
            progress = [x for x in found if x["record"] == "progress"]
            if summary is None and progress:
                record["partial"] = progress[-1]
        if summary is None and exit_code == TIMED_OUT:
            record.update(status="timeout",
                          error=f"passed its deadline of {deadline:.0f} s; " + _tail(text, 5))
        elif summary is None:
            record.update(status="failed", error=_tail(text))
        else:
            record.update(status="ok" if summary.get("ok") else "wrong", summary=summary)

    def _perftest(self, case: dict[str, Any], hosts: list[Host]) -> str:
        client, server = hosts[0], hosts[1]
        timeout = case_timeout(case)
        with fleet.connect(server) as s:
            s.run(f"timeout {timeout:.0f} {' '.join(commands.perftest_argv(case, server))} "
                  ">/dev/null 2>&1 &", hide=True, timeout=30, pty=False)
            time.sleep(2)
            with fleet.connect(client) as c:
                r = run_interruptibly(c, f"timeout {timeout:.0f} " + " ".join(
                    [*commands.perftest_argv(case, client), server.data_ip]), timeout=timeout + 30)
        return r.stdout + r.stderr

    def _start_samplers(self, hosts: list[Host], index: int) -> list[Host]:
        p = fleet.remote_paths()
        for h in hosts:
            command = (f"nohup python3 {p['apps']}/load_sampler.py --netdev {self.netdev} "
                       f"--rdma {h.rdma.device} --out /tmp/rxelab-load-{index}.jsonl "
                       f"--duration 3600 >/dev/null 2>&1 &")
            self._connection(h).run(command, hide=True, timeout=30, pty=False)
        time.sleep(2)  # Python starts slowly under emulation: let it take a baseline
        return hosts

    def _stop_samplers(self, hosts: list[Host], index: int) -> list[dict]:
        out = []
        for h in hosts:
            c = self._connection(h)
            c.run("pkill -u \"$(id -un)\" -f '[l]oad_sampler.py' || true", hide=True, warn=True,
                  timeout=30)
            r = c.run(f"cat /tmp/rxelab-load-{index}.jsonl; rm -f /tmp/rxelab-load-{index}.jsonl",
                      hide=True, warn=True, timeout=60)
            samples = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
            out.append({"case": index, "node": h.name, "samples": samples})
        return out


class CaseSetupError(Exception):
    pass


def run_interruptibly(connection: Any, command: str, timeout: float) -> Any:
    """A long remote command that Ctrl-C can stop. Fabric's own run, given Ctrl-C without a
    pty, re-raises it and then waits for the remote command to end (its output readers join
    with no timeout), so a run of 100000 stages would hold Ctrl-C for hours. Here we wait,
    and on Ctrl-C we close the channel and cancel the timeout's (non-daemon) timer thread,
    which would otherwise keep the process alive; the caller's clean-up ends the remote ranks."""
    promise = connection.run(command, hide=True, warn=True, timeout=timeout, asynchronous=True)
    runner = promise.runner
    try:
        while not (runner.process_is_finished or runner.has_dead_threads):
            time.sleep(0.1)
    except KeyboardInterrupt:
        runner.stop()  # closes the channel and cancels the timeout's timer thread
        connection.close()
        raise
    return promise.join()


def case_label(case: dict[str, Any]) -> str:
    extra = "".join([f", {case['ranks_per_node']} ranks per node" if case.get("ranks_per_node") else "",
                     f", pairs={case['pairs']}" if case.get("pairs") else "",
                     f", MTU {case['mtu']}" if case.get("mtu") else "",
                     f", {netem.label(case['netem'])}" if any(case.get("netem", {}).values()) else ""])
    return (f"{contender(case)} {case['op']}/{case['algorithm']} {case['nodes']} nodes "
            f"{case['size']} B x {case['stages']}{extra}")


def outcome(record: dict[str, Any]) -> str:
    shown = record.get("summary", {})
    moved = counters.total(record.get("rxe", {}), "sent_pkts")
    pkts = f", {moved} rxe packets" if record.get("rxe") else ""
    if "avg_stage_us" in shown:
        return f"{shown['avg_stage_us']:.0f} us/stage{pkts}"
    if shown:
        return f"{shown.get('bw_MBps', shown.get('lat_us', 0)):.2f}{pkts}"
    partial = record.get("partial")
    done = f" ({partial['stages_done']} stages done)" if partial else ""
    return record.get("error", "")[:200] + done


def _tail(text: str, lines: int = 15) -> str:
    """The last lines that say something: not the JSON records, not `#` notes."""
    said = [x for x in text.strip().splitlines()
            if not x.split("] ", 1)[-1].lstrip().startswith(("{", "#"))]
    return "\n".join(said[-lines:]) or "no output"


def environment(inv: Inventory, lab_state: Path | None) -> dict[str, Any]:
    """Kernel, rdma-core, Open MPI, UCX, MTUs from the first node; qemu accel, image and the
    data network's MTU from the lab; the UCX settings MPI-over-RDMA cases use."""
    env: dict[str, Any] = {"nodes": len(inv.hosts), "inventory_lab": inv.lab}
    host = inv.hosts[0]
    with fleet.connect(host) as c:
        r = c.run(
            "uname -r; dpkg-query -W -f='${Package} ${Version}\\n' rdma-core python3-pyverbs "
            "openmpi-bin libucx0 perftest 2>/dev/null; " + commands.readings_command(host),
            hide=True, warn=True, timeout=60)
    lines = r.stdout.splitlines()
    env["kernel"] = lines[0] if lines else "?"
    env["packages"] = dict(x.split(" ", 1) for x in lines[1:] if " " in x
                           and x.split(" ", 1)[0] in ("rdma-core", "python3-pyverbs", "openmpi-bin",
                                                      "libucx0", "perftest"))
    readings = commands.parse_readings(r.stdout)
    env["mtu"] = readings.get("active_mtu", "?")  # the RoCE path MTU
    env["netdev_mtu"] = readings.get("netdev_mtu", "?")
    env["ucx_settings"] = commands.ucx_settings(host)
    if lab_state is not None and (lab_state / "boot.json").exists():
        boot = json.loads((lab_state / "boot.json").read_text())
        env["accel"] = boot.get("accel")
        env["image"] = boot.get("image", {}).get("kind")
    return env

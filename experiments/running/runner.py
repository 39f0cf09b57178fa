"""Runs an experiment spec on the nodes and keeps everything it learns.

Each case is one command started on the first node of the case (our launcher, mpirun, or a
perftest pair); its output goes through the apps' one parser. Around it, every node of the
case gets the case's MTU and impairment and has its RDMA counters read before and after, so
each record says what really moved over the RDMA device. Every case has a deadline: one that
passes it is recorded as timed out, with the stages it finished. Results go to their own
directory, record by record as they arrive: the exact spec, the environment, records.jsonl,
load.jsonl. An interrupted or failed run keeps its partial results, is marked incomplete, and
leaves nothing running or impaired on the nodes.

The nodes may be someone else's machines: the run finds their data NIC behind the RDMA device
(never assumes a name), and undoes exactly what it did - the processes carrying its id, the
impairments it put on, the MTUs it changed, the files under its own run directory.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabric import Connection
from invoke.exceptions import CommandTimedOut
from invoke.runners import Result

from apps.stages import parse_output
from experiments.running import (
    beside,
    caselog,
    commands,
    counters,
    datapath,
    ddp_scenario,
    elastic_scenario,
    fleet,
    srun,
)
from experiments.running import progress as progress_mod
from experiments.running.commands import TIMED_OUT, Readings, case_timeout
from experiments.running.records import Environment, Load, Record
from experiments.spec import LAUNCHERS, SPECS, Case, Spec, launcher_problem
from infra.inventory import Host, Inventory

NOT_RDMA = "moved no packets over the RDMA device: this run did not use RDMA"
NO_TORCH = "not run: no torch on these nodes (a lab built with EXTRAS=torch has it)"


class Runner:
    def __init__(self, spec: Spec, inv: Inventory, results_root: Path, *,
                 say: Callable[[str], None] = print, lab_mtu: int | None = None,
                 launcher: str | None = None,
                 progress: Callable[[list[progress_mod.Step], int], progress_mod.Lines] | None = None
                 ) -> None:
        if spec.max_nodes > len(inv.hosts):
            raise fleet.FleetError(f"spec {spec.name} needs {spec.max_nodes} nodes, the inventory "
                                   f"has {len(inv.hosts)}")
        too_big = [c.mtu for c in spec.cases() if c.mtu and lab_mtu and c.mtu > lab_mtu]
        if too_big:
            raise fleet.FleetError(f"spec {spec.name} asks for MTU {max(too_big)}, the lab's data "
                                   f"network carries {lab_mtu} (make provision MTU=...)")
        self.spec, self.inv, self.say = spec, inv, say
        # how the cases' progress is shown: plain lines through `say` unless told otherwise
        self.progress = progress or (lambda steps, rounds: progress_mod.Lines(steps, rounds, say))
        self.launcher = launcher or spec.launcher  # how the ranks start: ssh or srun
        if self.launcher not in LAUNCHERS:
            raise fleet.FleetError(f"launcher {self.launcher!r}: must be one of {', '.join(LAUNCHERS)}")
        problem = launcher_problem(spec, self.launcher)
        if problem:
            raise fleet.FleetError(problem)
        self.hosts = list(inv.hosts[:spec.max_nodes])  # the only nodes this run touches
        self.run_id = secrets.token_hex(6)
        self.original_mtu: dict[str, int] = {}  # per node, as found before the first change
        self.netem_on: set[str] = set()  # nodes that carry our impairment right now
        self.netdevs: dict[str, str] = {}  # per node: the NIC behind its RDMA device
        self.inets: dict[str, list[str]] = {}  # per node: that NIC's addresses, as found
        self.links_down: dict[str, list[str]] = {}  # nodes whose data NIC we took down
        self.network = ""  # the data network as Open MPI's if_include takes it
        self.slurm_nodes: dict[str, str] = {}  # per node: its name as Slurm knows it (srun)
        self.connections: dict[str, Connection] = {}  # one SSH connection per node for the run
        self.with_torch: set[str] = set()  # nodes that said they can run the gloo contender
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.dir = results_root / f"{stamp}-{spec.name}"
        n = 1
        while self.dir.exists():
            self.dir = results_root / f"{stamp}-{spec.name}.{n}"
            n += 1
        self.dir.mkdir(parents=True)

    @property
    def remote_dir(self) -> str:
        """This run's own directory on every node (inside the deploy directory, which is ours)."""
        return commands.remote_word(f"$HOME/{fleet.REMOTE_HOME}/runs/{self.run_id}")

    def run(self, environment: Environment) -> Path:  # what the nodes said (about.environment)
        shutil.copy(self.spec.source, self.dir / "spec.toml")
        for name in self.spec.includes:  # what its include added, as it was
            shutil.copy(SPECS / f"{name}.toml", self.dir / f"include-{name}.toml")
        state = Environment.model_validate({
            "spec": self.spec.name, "includes": list(self.spec.includes), "started": time.time(),
            "complete": False, "run_id": self.run_id, "launcher": self.launcher,
            **environment.model_dump(exclude_unset=True)})
        self._write_env(state)
        self.with_torch = {name for name, h in (state.hosts or {}).items() if h.torch}
        cases = self.spec.cases()
        head = fleet.connect(self.hosts[0])
        try:
            self._discover()
            state.netdevs, state.data_network = dict(self.netdevs), self.network
            state.rdma_devices = {h.name: h.rdma.device for h in self.hosts}
            if self.slurm_nodes:
                state.slurm_nodes = dict(self.slurm_nodes)
            with open(self.dir / "records.jsonl", "x") as records, \
                    open(self.dir / "load.jsonl", "x") as loads:
                scenarios = (("elastic", elastic_scenario.Scenario), ("ddp", ddp_scenario.Scenario))
                for name, scenario in scenarios:
                    if getattr(self.spec, name) is not None:
                        with open(self.dir / f"{name}.jsonl", "x") as out:
                            for said in scenario(self).run():
                                out.write(said.to_json() + "\n")
                                out.flush()
                steps = self._order(cases)
                with self.progress(steps, self.spec.rounds) as shown:
                    for rnd, i, case in steps:
                        shown.begin(i, rnd, case)
                        record, load = self._case(head, i, case, rnd)
                        records.write(record.to_json() + "\n")
                        records.flush()
                        for line in load:
                            loads.write(line.to_json() + "\n")
                        shown.end(i, record)
                        if record.status in datapath.AFTER:
                            datapath.check(self._on_hosts, self.inv.hosts[:case.nodes], i)
                        if record.busy_left:
                            raise fleet.FleetError(
                                "a busy neighbour's CPU loop may still run ("
                                + "; ".join(record.busy_left) + "): the run stops here, so "
                                "no case is measured beside it; it ends by itself within "
                                f"{commands.case_timeout(case) + beside.GRACE_S:.0f} s")
            state.complete = True
        except KeyboardInterrupt:
            self.say("interrupted: partial results kept, marked incomplete")
            raise
        finally:
            try:
                self._cleanup()  # first: a full disk below must not leave the nodes impaired
            finally:
                head.close()
                for c in self.connections.values():
                    c.close()
                state.finished = time.time()
                self._write_env(state)
        return self.dir

    def _order(self, cases: list[Case]) -> list[progress_mod.Step]:
        """(round, case index, case): every case once per round, so contenders alternate (A, B,
        A, B, ...) and a drift of the lab spreads over all of them."""
        return [(rnd, i, case) for rnd in range(self.spec.rounds) for i, case in enumerate(cases)]

    def _discover(self) -> None:
        """Each node's data NIC (the netdev under its RDMA port's GID) and the data network
        its address is on, read from the nodes themselves."""
        readings = self._readings_now(self.hosts)
        networks, problems = [], []
        for h in self.hosts:
            got = readings.get(h.name, {})
            net = commands.data_network(h, got.get("inet", []))
            if not got.get("netdev") or net is None:
                problems.append(f"{h.name}: no network interface under {h.rdma.device} port "
                                f"{h.rdma.port} GID {h.rdma.gid_index} carries {h.data_ip}")
                continue
            self.netdevs[h.name] = got["netdev"]
            self.inets[h.name] = list(got.get("inet", []))
            networks.append(net)
        if problems:
            raise fleet.FleetError("cannot find the data network: " + "; ".join(problems))
        self.network = ",".join(dict.fromkeys(networks))
        if self.launcher == "srun":
            self._discover_slurm()

    def _discover_slurm(self) -> None:
        """Each node's name as Slurm knows it, and that Slurm would start a job there."""
        results = self._on_hosts(self.hosts, lambda h: srun.PROBE)
        problems, cpus = [], {}
        for h in self.hosts:
            r = results[h.name]
            found = {} if isinstance(r, Exception) else srun.parse_probe(r.stdout)
            if why := (f"{h.name}: {r}" if isinstance(r, Exception) else srun.node_problem(h, found)):
                problems.append(why)
            else:
                self.slurm_nodes[h.name] = found["node"]
                if found.get("cputot", "").isdigit():
                    cpus[h.name] = int(found["cputot"])
        cases = self.spec.cases()
        per_node = max((c.ranks_per_node or 1 for c in cases if c.app != "perftest"), default=1)
        problems += srun.placement_problems(self.slurm_nodes, cpus, per_node)
        if any(c.app == "gloo" for c in cases) and len(set(self.netdevs.values())) > 1:
            problems.append("Gloo under srun needs one data NIC name on every node (its "
                            f"GLOO_SOCKET_IFNAME), these differ: {self.netdevs}")
        if problems:
            raise fleet.FleetError("launcher = \"srun\": " + "; ".join(problems))

    def _write_env(self, state: Environment) -> None:
        (self.dir / "environment.json").write_text(state.to_json(indent=2) + "\n")

    def _on_hosts(self, hosts: list[Host], command: Callable[[Host], str],
                  timeout: float = 60) -> dict[str, Result | Exception]:
        """One command per host, in parallel; the Result (or the exception) per host name."""
        def one(h: Host) -> Result:
            try:
                return self._connection(h).run(command(h), hide=True, warn=True, timeout=timeout)
            except Exception:  # reported per host by the caller
                self.connections.pop(h.name, None)  # a broken connection is made anew next time
                raise
        return fleet.on_every_host(hosts, one)

    def _connection(self, host: Host) -> Any:
        """SSH connections are slow to open under emulation: one per node, kept for the run."""
        if host.name not in self.connections:
            self.connections[host.name] = fleet.connect(host)
        return self.connections[host.name]

    def _cleanup(self) -> None:
        """Nothing of ours left running, impaired or resized on any node (best effort)."""
        def undo(h: Host) -> str:
            restore = commands.restore_command(h, self.original_mtu.get(h.name), self.run_id,
                                               h.name in self.netem_on)
            if h.name in self.links_down:  # first: the NIC we took down comes back up
                heal = elastic_scenario.heal_command(h, self.netdevs[h.name], self.links_down[h.name])
                restore = f"{heal}; {restore}"
            ids = (self.run_id, beside.load_id(self.run_id), beside.loop_id(self.run_id),
                   elastic_scenario.watchdog_id(self.run_id))
            cancel = f"{srun.cancel_command(self.run_id)}; " if self._slurm_head(h) else ""
            return (f"{cancel}{commands.stop_command(*ids)}; {restore}; "
                    f"rm -rf {self.remote_dir}")
        results = self._on_hosts(self.hosts, undo, timeout=60 + elastic_scenario.HEAL_S)
        self.netem_on.clear()
        for name in list(self.links_down):
            out = results[name]  # every host has its entry
            if isinstance(out, Exception) or not elastic_scenario.healed(out.stdout):
                self.say(f"WARNING: {name}'s data NIC ({self.netdevs.get(name)}) may still be "
                         f"down: {out if isinstance(out, Exception) else out.stdout.strip()}; "
                         f"its own watchdog brings it up within {elastic_scenario.WATCHDOG_S} s")
        self.links_down.clear()

    def _prepare(self, hosts: list[Host], case: Case) -> dict[str, Readings]:
        if any(case.netem.values()):
            self.netem_on.update(h.name for h in hosts)  # tried: undone whatever the outcome
        results = self._on_hosts(hosts, lambda h: commands.prepare_command(h, case, self.run_id))
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

    def _restore(self, hosts: list[Host]) -> dict[str, Readings]:
        results = self._on_hosts(hosts, lambda h: commands.restore_command(
            h, self.original_mtu.get(h.name), self.run_id, h.name in self.netem_on))
        readings = {name: commands.parse_readings(r.stdout) for name, r in results.items()
                    if not isinstance(r, Exception)}
        self.netem_on -= {name for name, got in readings.items() if got.get("netem_gone")}
        return readings

    def _case(self, head: Any, index: int, case: Case, rnd: int = 0) -> tuple[Record, list[Load]]:
        hosts = list(self.inv.hosts[:case.nodes])
        record = Record.of(case, index, rnd, [h.name for h in hosts],
                           "ssh" if case.app == "perftest" else self.launcher)
        samplers: list[Host] = []
        loaded: list[Host] = []  # busy_neighbours: the nodes whose CPU loops it stops
        before: dict[str, Readings] = {}
        lacking = sorted({h.name for h in hosts} - self.with_torch)
        if case.app == "gloo" and lacking:  # nothing is touched for a case that cannot run
            record.status, record.wall_seconds = "skipped", 0.0
            record.error = f"{NO_TORCH} ({', '.join(lacking)})"
            return record, []
        started = time.monotonic()
        try:
            if case.mtu:
                self._remember_mtus(hosts)
            before = self._prepare(hosts, case)
            samplers = beside.start_samplers(self, hosts, index) if case.sample_load else []
            if case.busy_neighbours:
                loaded = beside.neighbours(self.hosts, case)
                record.busy_hosts = [h.name for h in loaded]
                problems = beside.start_loops(self, loaded, case_timeout(case))
                if problems:
                    raise CaseSetupError("could not load the nodes beside it: " + "; ".join(problems))
            started = time.monotonic()
            self._execute(head, index, case, hosts, record)
        except CaseSetupError as err:
            record.status, record.error = "failed", str(err)
        finally:
            record.wall_seconds = time.monotonic() - started
            left = beside.stop_loops(self, loaded)
            if left:  # the run stops after this record (run): nothing measured beside them
                record.busy_left = left
            load = beside.stop_samplers(self, samplers, index)
            after = self._restore(hosts)
            # a failed or timed-out case, or one whose job ended badly after its figures, leaves
            # no rank behind
            if record.status != "ok" or record.after_summary:
                self._on_hosts(hosts, lambda h: (
                    srun.cancel_command(self.run_id) + "; " if self._slurm_head(h) else ""
                ) + commands.stop_command(self.run_id), timeout=30)
        record.active_mtu = before.get(hosts[0].name, {}).get("active_mtu")
        record.rxe = {name: counters.delta(before[name]["counters"], after[name]["counters"])
                      for name in before if name in after and before[name]["counters"]}
        if (record.status == "ok" and case.app == "mpi" and case.transport == "ucx"
                and record.rxe and counters.total(record.rxe, "sent_pkts") == 0):
            record.status, record.error = "failed", NOT_RDMA
        return record, load

    def _remember_mtus(self, hosts: list[Host]) -> None:
        """What to put back, before the first change: a MTU that cannot be read is not changed."""
        unread = [h for h in hosts if h.name not in self.original_mtu]
        readings = self._readings_now(unread) if unread else {}
        for h in unread:
            mtu = readings.get(h.name, {}).get("netdev_mtu")
            if not mtu:
                raise CaseSetupError(f"cannot read {h.name}'s data NIC MTU: not changing it")
            self.original_mtu[h.name] = mtu

    def _readings_now(self, hosts: list[Host]) -> dict[str, Readings]:
        results = self._on_hosts(hosts, commands.readings_command)
        return {n: commands.parse_readings(r.stdout) for n, r in results.items()
                if not isinstance(r, Exception)}

    def _execute(self, head: Any, index: int, case: Case, hosts: list[Host], record: Record) -> None:
        deadline = case_timeout(case)
        summary = None
        if case.app == "perftest":
            text, exit_code = self._perftest(case, hosts), 0
            summary = commands.parse_perftest(case.algorithm, text, case.size)
        else:
            cmd = self._command(index, case, hosts)
            try:
                r = fleet.run_interruptibly(head, cmd, timeout=deadline + 60)
                stdout, text, exit_code = r.stdout, r.stdout + r.stderr, r.exited
            except CommandTimedOut as err:  # the remote deadline did not end it: ours did
                stdout = text = err.result.stdout or ""
                exit_code = TIMED_OUT
            summary = record.read_output(parse_output(stdout))
        if summary is None and exit_code == TIMED_OUT:
            record.status = "timeout"
            record.error = (f"passed its deadline of {deadline:.0f} s (the spec's timeout_s extends "
                            "it); " + caselog.tail(text, 5))
        elif summary is None:
            record.status, record.error = "failed", caselog.tail(text)
        else:
            record.status, record.summary = "ok" if summary.ok else "wrong", summary
            if exit_code not in (0, None):  # its figures came, then the job did not end well
                record.after_summary = f"exit {exit_code}: " + caselog.tail(text, 3)

    def _command(self, index: int, case: Case, hosts: list[Host]) -> str:
        """The case's command for its first node, by the run's launcher."""
        if self.launcher == "srun":
            nodes = [self.slurm_nodes[h.name] for h in hosts]
            return (srun.rxelab_command(case, nodes, self.run_id) if case.app == "rxelab"
                    else srun.gloo_command(case, nodes, self.run_id, self.netdevs[hosts[0].name])
                    if case.app == "gloo"
                    else srun.mpi_command(case, hosts, nodes, self.network, self.run_id))
        port = 29700 + index % 200
        return (commands.rxelab_command(case, hosts, port, self.run_id) if case.app == "rxelab"
                else commands.gloo_command(case, hosts, port, self.run_id) if case.app == "gloo"
                else commands.mpi_command(case, hosts, self.network, self.run_id))

    def _slurm_head(self, host: Host) -> bool:
        """Whether this is the node the run's srun jobs start from (and are cancelled from)."""
        return self.launcher == "srun" and host.name == self.hosts[0].name

    def _perftest(self, case: Case, hosts: list[Host]) -> str:
        """A perftest pair: server on the second node, client on the first; on one node, both
        there (rxe's loopback: what a message between two ranks of one node costs)."""
        client, server = hosts[0], hosts[-1]
        timeout = case_timeout(case)
        self._connection(server).run(
            commands.perftest_command(case, server, self.run_id) + " >/dev/null 2>&1 &",
            hide=True, timeout=30, pty=False)
        time.sleep(2)
        r = fleet.run_interruptibly(self._connection(client), commands.perftest_command(
            case, client, self.run_id, server.data_ip), timeout=timeout + 30)
        return r.stdout + r.stderr


class CaseSetupError(Exception):
    pass

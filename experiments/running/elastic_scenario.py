"""The elastic scenario of a spec's [elastic] table: apps/elastic_train.py trains under our
launcher while ranks die (the app's --kill: SIGKILL at a step, exact), a node drops off the
data network (its data NIC down, from outside) and a newcomer joins (another launcher with
--join); then Open MPI over UCX runs the same loop with the same kills, to show what a job
without shrink does. The run watches each job's output as it comes (the step it has reached
triggers the outside events) and keeps every JSON line with the host's time of arrival, so
intervals across nodes are measured on one clock.

Everything touches only what the run made: the processes carry its id, the secret file lives
in its run directory, and a NIC it took down is brought back up (with its address, and its
RDMA port ACTIVE again) by the run's clean-up too.
"""

from __future__ import annotations

import io
import json
import secrets as random_secrets
import shlex
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from experiments.running import commands, fleet
from experiments.running.commands import RUN_ID, remote_join, remote_word, started_by
from experiments.running.scenario_records import Action, ElasticEvent, ElasticRecord, JobEnd
from experiments.spec.scenarios import ElasticDoc, Event
from infra import rdmaport
from infra.inventory import Host

PORT = 29650  # the job's rendezvous on the first node
POLL_S = 0.2
HEAL_S = 60  # a NIC brought back up must have its address and its RDMA port within this
LOOK_S = 2.0  # how often a partitioned node is looked at (over its management network)
PARTITION_MAX_S = 180  # a partitioned node whose ranks have not ended by then is healed anyway
WATCHDOG_S = PARTITION_MAX_S + 2 * HEAL_S  # a node brings its NIC back up by itself after this
ADMIT_WAIT_S = 30.0  # an admit point waits this long for a newcomer not come yet (rank 0 listens
# for at most half the communicator's timeout, 60 s by default)


def kills(el: ElasticDoc) -> list[str]:
    return [f"{e.step}:{e.kill}" for e in el.events if e.kill is not None]


def app_argv(el: ElasticDoc, *extra: str) -> list[str]:
    p = fleet.remote_paths()
    return [p["python"], f"{p['apps']}/elastic_train.py", "--steps", str(el.steps),
            "--size", str(el.size), "--admit-every", str(el.admit_every),
            "--pause", f"{el.pause:g}", *[a for k in kills(el) for a in ("--kill", k)], *extra]


def launcher(hosts_arg: list[str], secret: str, timeout: float, *extra: str) -> list[str]:
    return [fleet.remote_paths()["python"], "-m", "rxelab.launch", "--hosts", ",".join(hosts_arg),
            "--port", str(PORT),
            "--timeout", f"{timeout:.0f}", "--secret-file", secret, *extra]


def job_command(el: ElasticDoc, hosts: list[Host], run_id: str, secret: str) -> str:
    # the job waits for the newcomers the scenario starts (their start-up on a busy node can
    # outlast a short job): each admit point up to ADMIT_WAIT_S while they have not come
    joins = sum(1 for e in el.events if e.join is not None)
    waits = ["--expect-newcomers", str(joins), "--admit-timeout", f"{ADMIT_WAIT_S:g}"] if joins \
        else []
    argv = [*launcher([h.data_ip for h in hosts], secret, el.timeout_s, "--elastic",
                      "--per-host", str(el.ranks_per_node)), "--", *app_argv(el, *waits)]
    return started_by(run_id) + remote_join(argv)


def newcomer_command(el: ElasticDoc, host: Host, head: Host, run_id: str, secret: str) -> str:
    argv = [*launcher([host.data_ip], secret, el.timeout_s, "--join", "--master", head.data_ip),
            "--", *app_argv(el, "--join", "--join-timeout", f"{el.timeout_s:.0f}")]
    return started_by(run_id) + remote_join(argv)


def mpi_command(el: ElasticDoc, hosts: list[Host], network: str, run_id: str) -> str:
    per = el.ranks_per_node
    argv = ["timeout", "-k", str(commands.KILL_AFTER_S), f"{el.timeout_s:.0f}", "mpirun", "-np",
            str(len(hosts) * per),
            "--host", commands.mpi_hosts(hosts, per),
            "--mca", "oob_tcp_if_include", network, "-x", RUN_ID,
            *commands.mca_args(commands.UCX_MCA),
            *commands.export_args(commands.ucx_settings(hosts[0], per)), *app_argv(el, "--mpi")]
    return started_by(run_id) + remote_join(argv)


def secret_command(path: str) -> str:
    """The job's secret (from standard input: never on a command line, which `ps` shows to
    every user) into a file only its owner can read, made so from its first byte (path: as
    the launcher takes it, $HOME left for the node's shell)."""
    word = remote_word(path)
    return f"mkdir -p \"$(dirname {word})\" && (umask 077 && head -n 1 > {word})"


def ours_command(run_id: str) -> str:
    """How many processes of the run live on a host."""
    return (f"grep -lsxzF {shlex.quote(f'{RUN_ID}={run_id}')} /proc/[0-9]*/environ 2>/dev/null "
            "| wc -l")


def watchdog_id(run_id: str) -> str:
    return f"{run_id}-watchdog"


def partition_command(host: Host, run_id: str) -> str:
    """The data NIC down - unless this very SSH session rides it (then nothing could bring
    it back) - with a watchdog on the node that brings it up again if the run never does
    (the controller killed, its network gone). The watchdog carries an id of its own: the
    run's clean-up stops it, and it does not count as one of the run's ranks."""
    return (f"{rdmaport.netdev_assign(host.rdma)} && [ -n \"$nd\" ] || exit 5; "
            "set -- $SSH_CLIENT; "
            'if [ -n "$1" ] && ip -o route get "$1" 2>/dev/null | grep -qw "dev $nd"; then '
            'echo "this SSH session rides $nd: not taking it down" >&2; exit 6; fi; '
            # the NIC's name (the node's own, any characters) as an argument, never as code
            f"{started_by(watchdog_id(run_id))}nohup sh -c "
            f"'sleep {WATCHDOG_S}; sudo -n ip link set dev \"$1\" up' watchdog \"$nd\" "
            ">/dev/null 2>&1 & "
            'sudo -n ip link set dev "$nd" down')


def heal_command(host: Host, netdev: str, inets: list[str]) -> str:
    """The NIC up again, its addresses back (networkd may have dropped them), and wait until
    the RDMA port is ACTIVE; prints the port's state. The NIC is named as found before it
    went down: while it is down the RDMA port's GID table no longer leads to it."""
    state = shlex.quote(rdmaport.state_path(host.rdma))
    readd = "; ".join(f"ip -o addr show dev \"$nd\" | grep -qF {shlex.quote(' ' + i + ' ')} || "
                      f"sudo -n ip addr replace {shlex.quote(i)} dev \"$nd\"" for i in inets)
    check = " && ".join(f"ip -o addr show dev \"$nd\" | grep -qF {shlex.quote(' ' + i + ' ')}"
                        for i in inets) or "true"
    return (f"nd={shlex.quote(netdev)}; sudo -n ip link set dev \"$nd\" up; "
            f"{rdmaport.wait_active(host.rdma, HEAL_S)}; "
            f"{readd + '; ' if readd else ''}echo \"port $(cat {state})\"; "
            f"{check} && echo addresses back")


def healed(output: str) -> bool:
    """Whether heal_command's output says the port is ACTIVE and the addresses are back."""
    return "ACTIVE" in output and "addresses back" in output


def parse(text: str, arrived: float | None = None) -> list[ElasticEvent]:
    """The app's JSON lines (a launcher's `[rank] ` prefix allowed), each with the host's
    time of arrival when given."""
    out = []
    for line in text.splitlines():
        body = line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line
        body = body.strip()
        if not body.startswith("{"):
            continue
        try:
            rec = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("record") == "elastic":
            out.append(ElasticEvent.model_validate(
                rec if arrived is None else {**rec, "arrived": arrived}))
    return out


class Watch:
    """A remote command started without waiting: its output read as it comes."""

    def __init__(self, connection: Any, command: str, timeout: float, host: Host | None = None) -> None:
        self.started = time.time()
        self.host = host
        self.promise = connection.run(command, hide=True, warn=True, timeout=timeout,
                                      asynchronous=True)
        self.seen = 0
        self.partial = ""
        self.events: list[ElasticEvent] = []

    def poll(self) -> list[ElasticEvent]:
        """The events that arrived since the last look, stamped with the time now."""
        text = "".join(self.promise.runner.stdout)
        new, self.seen = text[self.seen:], len(text)
        lines = (self.partial + new).split("\n")
        self.partial = lines.pop()
        found = parse("\n".join(lines), time.time())
        self.events += found
        return found

    def admitted(self) -> bool:
        """Whether its output says it joined (an admitted newcomer finishes with the job)."""
        self.poll()
        return any(e.event == "joined" for e in self.events)

    def abandon(self) -> None:
        """Close its channel and cancel its timer (a non-daemon thread that would keep this
        process alive until the command's deadline); the run's clean-up ends the process."""
        if not self.done:
            self.promise.runner.stop()

    def stop(self, connection: Any, run_id: str) -> None:
        """End it: the run's processes on its host, then (if its channel still waits) the
        channel and its timer, which would otherwise keep this process alive."""
        connection.run(commands.stop_command(run_id), hide=True, warn=True, timeout=30)
        end = time.monotonic() + 15
        while not self.done and time.monotonic() < end:
            time.sleep(0.2)
        if not self.done:
            self.promise.runner.stop()

    @property
    def done(self) -> bool:
        r = self.promise.runner
        return bool(r.process_is_finished or r.has_dead_threads)

    def finish(self) -> JobEnd:
        result = self.promise.join()
        self.poll()
        if self.partial:
            self.events += parse(self.partial, time.time())
            self.partial = ""
        return JobEnd(exit=result.exited, ended=time.time(),
                      tail="\n".join((result.stdout + result.stderr).splitlines()[-15:])[-3000:])


class Scenario:
    """One run of the spec's [elastic] table on the runner's nodes (see the module's
    docstring); the runner supplies connections, its run id and directory, the nodes' data
    NICs, and its clean-up."""

    def __init__(self, runner: Any) -> None:
        self.r = runner
        self.el: ElasticDoc = runner.spec.elastic
        self.hosts: list[Host] = runner.hosts[:self.el.nodes]
        self.secret_file = f"$HOME/{fleet.REMOTE_HOME}/runs/{runner.run_id}/secret"

    def run(self) -> Iterator[ElasticRecord]:
        """Each contender's record as soon as it has one (an interrupted run keeps them)."""
        secret = random_secrets.token_urlsafe(32)  # 256 bits (a job's secret needs 128)
        for h in self.hosts:
            r = self.r._connection(h).run(secret_command(self.secret_file), hide=True, warn=True,
                                          timeout=30, in_stream=io.StringIO(secret + "\n"))
            if r.exited != 0:
                raise fleet.FleetError(f"{h.name}: cannot write the job's secret file: "
                                       f"{r.stderr.strip()}")
        yield self._rxelab()
        if not self.el.mpi:
            return
        if self.r.links_down:
            self.r.say(f"elastic: not running Open MPI: {', '.join(self.r.links_down)} still "
                       "cut off")
            return
        yield self._mpi()

    def _rxelab(self) -> ElasticRecord:
        el, head = self.el, self.hosts[0]
        self.r.say(f"elastic: {len(self.hosts) * el.ranks_per_node} ranks on "
                   f"{len(self.hosts)} nodes, {el.steps} steps of {el.size} B")
        job = Watch(self.r._connection(head), job_command(el, self.hosts, self.r.run_id,
                                                          self.secret_file), el.timeout_s + 60)
        pending = [e for e in el.events if e.kill is None]
        actions: list[Action] = []
        newcomers: list[Watch] = []
        reached = -1
        deadline = time.monotonic() + el.timeout_s + 60
        looked = 0.0
        healing: Future[None] | None = None
        pool = ThreadPoolExecutor(max_workers=1)  # heals wait for a port: not in this loop
        finished = False
        try:
            while not job.done and time.monotonic() < deadline:
                if (self.r.links_down and time.monotonic() - looked > LOOK_S
                        and (healing is None or healing.done())):
                    looked = time.monotonic()
                    healing = pool.submit(self._heal, actions, True)
                for e in job.poll():
                    if e.event == "step" and e.step is not None:
                        reached = max(reached, e.step)
                    if e.event in ("shrink", "admit", "dying", "stopped", "joined"):
                        self.r.say(f"    {e.event} (rank id {e.id}): step "
                                   f"{e.step}, size {'-' if e.size is None else e.size}")
                while pending and reached + 1 >= pending[0].step:
                    actions.append(self._act(pending.pop(0), reached + 1, newcomers))
                time.sleep(POLL_S)
            outcome = job.finish() if job.done else JobEnd(exit="timeout", ended=time.time())
            joined = []
            end = time.monotonic() + 60  # an admitted newcomer finishes with the job
            for w in newcomers:
                while not w.done and time.monotonic() < end and w.admitted():
                    time.sleep(POLL_S)
                if not w.done:  # never admitted (no admit point left): stopped
                    w.stop(self.r._connection(w.host), self.r.run_id)
                if w.done:
                    joined.append(w.finish())
                    job.events += w.events
            finished = True
        finally:
            pool.shutdown(wait=True)
            if not finished:  # interrupted: no channel or timer of ours may outlive the run
                for w in [job, *newcomers]:
                    w.abandon()
            self._heal(actions)
        return ElasticRecord(contender="rxelab", started=job.started,
                             **outcome.model_dump(exclude_unset=True), actions=actions,
                             newcomers=joined, events=job.events, spec=el)

    def _act(self, event: Event, step: int, newcomers: list[Watch]) -> Action:
        at = time.time()
        if event.partition is not None:
            host = self.hosts[event.partition - 1]
            self.r.links_down[host.name] = self.r.inets.get(host.name, [])
            result = self.r._connection(host).run(partition_command(host, self.r.run_id),
                                                  hide=True, warn=True, timeout=30)
            ok = result.exited == 0
            if not ok:
                del self.r.links_down[host.name]
            self.r.say(f"    partition: {host.name}'s data NIC down at step {step}" if ok else
                       f"    partition of {host.name} failed: {result.stderr.strip()[-300:]}")
            return Action(kind="partition", node=host.name, step=step, time=at, ok=ok,
                          **({} if ok else {"error": result.stderr.strip()[-300:]}))
        assert event.join is not None  # an event does one thing: the kills are the app's
        host = self.hosts[event.join - 1]
        newcomers.append(Watch(self.r._connection(host), newcomer_command(
            self.el, host, self.hosts[0], self.r.run_id, self.secret_file), self.el.timeout_s,
            host))
        self.r.say(f"    join: a newcomer starts on {host.name} at step {step}")
        return Action(kind="join", node=host.name, step=step, time=at, ok=True)

    def _heal(self, actions: list[Action], when_idle: bool = False) -> None:
        """Bring partitioned NICs back up: at the end, or (when_idle) once the node's ranks
        have ended - their launcher's SSH sessions ride the data network, so their last words
        arrive only then - or after PARTITION_MAX_S."""
        for name in list(self.r.links_down):
            host = next(h for h in self.hosts if h.name == name)
            if when_idle:
                since = next((a.time for a in reversed(actions) if a.node == name
                              and a.kind == "partition"), time.time())
                left = self.r._connection(host).run(ours_command(self.r.run_id), hide=True,
                                                    warn=True, timeout=30).stdout.strip()
                if left != "0" and time.time() - since < PARTITION_MAX_S:
                    continue
            result = self.r._connection(host).run(
                heal_command(host, self.r.netdevs[name], self.r.links_down[name]),
                hide=True, warn=True, timeout=HEAL_S + 30)
            if healed(result.stdout):
                del self.r.links_down[name]
                actions.append(Action(kind="heal", node=name, time=time.time(), ok=True))
                self.r.say(f"    heal: {name}'s data NIC up again, its RDMA port ACTIVE")
            else:
                self.r.say(f"    {name}: the data NIC is up but its RDMA port is not ACTIVE: "
                           f"{result.stdout.strip()} {result.stderr.strip()}")

    def _mpi(self) -> ElasticRecord:
        el = self.el
        self.r.say("elastic: the same loop under Open MPI over UCX, with the same kills")
        job = Watch(self.r._connection(self.hosts[0]), mpi_command(
            el, self.hosts, self.r.network, self.r.run_id), el.timeout_s + 60)
        deadline = time.monotonic() + el.timeout_s + 60
        try:
            while not job.done and time.monotonic() < deadline:
                job.poll()
                time.sleep(POLL_S)
            outcome = job.finish() if job.done else JobEnd(exit="timeout", ended=time.time())
        except BaseException:
            job.abandon()
            raise
        self.r._on_hosts(self.hosts, lambda h: commands.stop_command(self.r.run_id), timeout=30)
        return ElasticRecord(contender="mpi-ucx", started=job.started,
                             **outcome.model_dump(exclude_unset=True), actions=[],
                             events=job.events, spec=el)

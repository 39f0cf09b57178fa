"""Runs an experiment spec on the nodes and keeps everything it learns.

Each case is one command started on the first node of the case (our launcher, mpirun, or a
perftest pair); its output goes through the apps' one parser. Results go to their own
directory, record by record as they arrive: the exact spec, the environment, records.jsonl,
load.jsonl. An interrupted or failed run keeps its partial results, is marked incomplete, and
leaves nothing running on the nodes.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from invoke.exceptions import CommandTimedOut

from apps.stages import parse_output
from experiments import fleet
from experiments.spec import MPI_ALGORITHMS, Spec
from infra.inventory import Host, Inventory

CLEANUP = ("pkill -u \"$(id -un)\" -f 'server_client.py|mpi_compare.py|rxelab.launch|"
           "load_sampler.py|ib_write_bw|ib_send_bw|ib_send_lat|orted|mpirun' || true")
PERFTEST_PORT = 18515


def case_timeout(case: dict[str, Any]) -> float:
    """Generous under emulation: ~40 ms per small stage, ~5 MB/s per node pair."""
    volume = case["size"] * case["nodes"] * (case["stages"] + case["warmup"])
    return 180 + 0.2 * (case["stages"] + case["warmup"]) + volume / 1e6


def rxelab_command(case: dict[str, Any], hosts: list[Host], port: int) -> str:
    p = fleet.remote_paths()
    app = (f"python3 {p['apps']}/server_client.py --op {case['op']} --algorithm "
           f"{case['algorithm']} --size {case['size']} --stages {case['stages']} "
           f"--warmup {case['warmup']}")
    return (f"PYTHONPATH={p['lib']} python3 -m rxelab.launch --hosts "
            f"{','.join(h.data_ip for h in hosts)} --port {port} "
            f"--timeout {case_timeout(case):.0f} -- {app}")


def mpi_command(case: dict[str, Any], hosts: list[Host], netdev: str) -> str:
    p = fleet.remote_paths()
    forced = MPI_ALGORITHMS[case["op"]][case["algorithm"]]
    mca = [] if forced is None else [
        "--mca", "coll_tuned_use_dynamic_rules", "1",
        "--mca", f"coll_tuned_{case['op']}_algorithm", str(forced)]
    if case["transport"] == "tcp":
        transport = ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                     "--mca", "btl_tcp_if_include", netdev]
    else:  # UCX over the RDMA device: what would make Open MPI use rxe
        transport = ["--mca", "pml", "ucx", "--mca", "btl", "^tcp,openib,uct",
                     "-x", f"UCX_NET_DEVICES={hosts[0].rdma.device}:{hosts[0].rdma.port}"]
    argv = ["timeout", f"{case_timeout(case):.0f}", "mpirun", "-np", str(len(hosts)),
            "--host", ",".join(h.data_ip for h in hosts), "--mca", "oob_tcp_if_include", netdev,
            *transport, *mca, "python3", f"{p['apps']}/mpi_compare.py", "--op", case["op"],
            "--algorithm", case["algorithm"], "--size", str(case["size"]),
            "--stages", str(case["stages"]), "--warmup", str(case["warmup"])]
    # $HOME must reach the remote shell unquoted; everything else is quoted
    return " ".join(a if a.startswith("$HOME") else shlex.quote(a) for a in argv)


def perftest_argv(case: dict[str, Any], host: Host) -> list[str]:
    tool = case["algorithm"]
    argv = [tool, "-d", host.rdma.device, "-i", str(host.rdma.port), "-x", str(host.rdma.gid_index),
            "-F", "-s", str(max(case["size"], 1 if tool != "ib_send_lat" else 2)),
            "-n", str(case["stages"]), "-p", str(PERFTEST_PORT)]
    return argv if tool == "ib_send_lat" else [*argv, "--report_gbits"]


def parse_perftest(tool: str, text: str, size: int) -> dict[str, Any] | None:
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0].isdigit() and all(re.fullmatch(r"[\d.]+", x) for x in f[1:5]):
            rec: dict[str, Any] = {"record": "summary", "app": "perftest", "op": tool, "size": size,
                                   "iterations": int(f[1]), "ok": True}
            if tool == "ib_send_lat":  # bytes iters t_min t_max t_typical t_avg ...
                rec["lat_us"] = float(f[4])
            else:  # bytes iters bw_peak bw_avg[Gb/s] msg_rate
                rec["bw_MBps"] = float(f[3]) * 1e9 / 8 / 1e6
            return rec
    return None


class Runner:
    def __init__(self, spec: Spec, inv: Inventory, results_root: Path, *,
                 say: Callable[[str], None] = print, netdev: str = "data0") -> None:
        if spec.max_nodes > len(inv.hosts):
            raise fleet.FleetError(f"spec {spec.name} needs {spec.max_nodes} nodes, the inventory "
                                   f"has {len(inv.hosts)}")
        self.spec, self.inv, self.say, self.netdev = spec, inv, say, netdev
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
                    label = (f"{case['app']} {case['op']}/{case['algorithm']} {case['nodes']} nodes "
                             f"{case['size']} B x {case['stages']}")
                    self.say(f"[{i + 1}/{len(cases)}] {label}")
                    record, load = self._case(head, i, case)
                    records.write(json.dumps(record) + "\n")
                    records.flush()
                    for line in load:
                        loads.write(json.dumps(line) + "\n")
                    status = record["status"]
                    shown = record.get("summary", {})
                    detail = (f"{shown.get('avg_stage_us', 0):.0f} us/stage" if "avg_stage_us" in shown
                              else f"{shown.get('bw_MBps', shown.get('lat_us', 0)):.2f}"
                              if shown else record.get("error", "")[:200])
                    self.say(f"    {status}: {detail}")
            state["complete"] = True
        except KeyboardInterrupt:
            self.say("interrupted: partial results kept, marked incomplete")
            raise
        finally:
            state["finished"] = time.time()
            self._write_env(state)
            self._cleanup()
            head.close()
        return self.dir

    def _write_env(self, state: dict[str, Any]) -> None:
        (self.dir / "environment.json").write_text(json.dumps(state, indent=2) + "\n")

    def _cleanup(self) -> None:
        for host in self.inv.hosts:
            try:
                with fleet.connect(host) as c:
                    c.run(CLEANUP, hide=True, warn=True, timeout=30)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass

    def _case(self, head: Any, index: int, case: dict[str, Any]) -> tuple[dict[str, Any], list[dict]]:
        hosts = list(self.inv.hosts[:case["nodes"]])
        record: dict[str, Any] = {"case": index, **case, "hosts": [h.name for h in hosts]}
        samplers = self._start_samplers(hosts, index) if case["sample_load"] else []
        started = time.monotonic()
        try:
            if case["app"] == "perftest":
                text = self._perftest(case, hosts)
                summary = parse_perftest(case["algorithm"], text, case["size"])
            else:
                cmd = (rxelab_command(case, hosts, 29700 + index % 200) if case["app"] == "rxelab"
                       else mpi_command(case, hosts, self.netdev))
                r = head.run(cmd, hide=True, warn=True, timeout=case_timeout(case) + 60)
                text = r.stdout + r.stderr
                found = [x for x in parse_output(r.stdout) if x["record"] == "summary"]
                summary = found[-1] if found else None
            if summary is None:
                record.update(status="failed", error=_tail(text))
            else:
                record.update(status="ok" if summary.get("ok") else "wrong", summary=summary)
        except CommandTimedOut as err:
            record.update(status="failed", error=f"timed out after {err.timeout} s")
        record["wall_seconds"] = time.monotonic() - started
        load = self._stop_samplers(samplers, index)
        return record, load

    def _perftest(self, case: dict[str, Any], hosts: list[Host]) -> str:
        client, server = hosts[0], hosts[1]
        timeout = case_timeout(case)
        with fleet.connect(server) as s:
            s.run(f"timeout {timeout:.0f} {shlex.join(perftest_argv(case, server))} "
                  ">/dev/null 2>&1 &", hide=True, timeout=30, pty=False)
            time.sleep(2)
            with fleet.connect(client) as c:
                r = c.run(f"timeout {timeout:.0f} "
                          f"{shlex.join([*perftest_argv(case, client), server.data_ip])}",
                          hide=True, warn=True, timeout=timeout + 30)
        return r.stdout + r.stderr

    def _start_samplers(self, hosts: list[Host], index: int) -> list[Host]:
        p = fleet.remote_paths()
        for h in hosts:
            with fleet.connect(h) as c:
                c.run(f"nohup python3 {p['apps']}/load_sampler.py --netdev {self.netdev} "
                      f"--rdma {h.rdma.device} --out /tmp/rxelab-load-{index}.jsonl "
                      f"--duration 3600 >/dev/null 2>&1 &", hide=True, timeout=30, pty=False)
        time.sleep(2)  # Python starts slowly under emulation: let it take a baseline
        return hosts

    def _stop_samplers(self, hosts: list[Host], index: int) -> list[dict]:
        out = []
        for h in hosts:
            with fleet.connect(h) as c:
                c.run("pkill -u \"$(id -un)\" -f load_sampler.py || true", hide=True, warn=True,
                      timeout=30)
                r = c.run(f"cat /tmp/rxelab-load-{index}.jsonl; rm -f /tmp/rxelab-load-{index}.jsonl",
                          hide=True, warn=True, timeout=60)
            samples = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
            out.append({"case": index, "node": h.name, "samples": samples})
        return out


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "no output"


def environment(inv: Inventory, lab_state: Path | None) -> dict[str, Any]:
    """Kernel, rdma-core, Open MPI, MTU from the first node; qemu accel and image from the lab."""
    env: dict[str, Any] = {"nodes": len(inv.hosts), "inventory_lab": inv.lab}
    host = inv.hosts[0]
    with fleet.connect(host) as c:
        r = c.run(
            "uname -r; dpkg-query -W -f='${Package} ${Version}\\n' rdma-core python3-pyverbs "
            "openmpi-bin perftest 2>/dev/null; "
            f"ibv_devinfo -d {host.rdma.device} 2>/dev/null | grep -m1 active_mtu",
            hide=True, warn=True, timeout=60)
    lines = r.stdout.splitlines()
    env["kernel"] = lines[0] if lines else "?"
    env["packages"] = dict(x.split(" ", 1) for x in lines[1:] if " " in x and "mtu" not in x)
    mtu = [x for x in lines if "active_mtu" in x]
    env["mtu"] = mtu[0].split(":", 1)[1].strip() if mtu else "?"
    if lab_state is not None and (lab_state / "boot.json").exists():
        boot = json.loads((lab_state / "boot.json").read_text())
        env["accel"] = boot.get("accel")
        env["image"] = boot.get("image", {}).get("kind")
    return env

"""`make boot-profile`: where each node's boot went, from the guest's own records.

Under TCG a boot is CPU-bound and three nodes share two host cores, so the profile gives each
phase's wall time and, per cgroup, the guest CPU it burnt. The phases are read, not estimated:
the kernel's log (when /init ran), `systemd-analyze time` (when userspace began), the units'
start and end stamps and CPU use (`systemctl show`), cloud-init's own stage records
(`/run/cloud-init/status.json`) and its "running '<stage>' ... Up N seconds" lines (which
tell a stage's Python start-up from its work), the module events in cloud-init's log, and
`systemd-analyze critical-chain` of sshd and the RDMA device's unit. The host adds when each
qemu started and when it saw the node ready (`run/ready.json`, written by the provision's
wait), which bounds the readiness poll. Everything is read after the boot, so profiling costs
the boot nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from rich.console import Console
from rich.table import Table

from infra.errors import LabError
from infra.inventory import Host
from infra.ssh import shell_vars, ssh_run
from infra.state import LabState

STAGES = (  # cloud-init's stage, its systemd unit, its name in the console line
    ("init-local", "cloud-init-local.service", "init-local"),
    ("init", "cloud-init.service", "init"),
    ("modules-config", "cloud-config.service", "modules:config"),
    ("modules-final", "cloud-final.service", "modules:final"),
)
NETWORK_UNITS = ("systemd-networkd.service", "systemd-networkd-wait-online.service")
# Slurm's daemons (issue 28): started after the node is ready, so they are not part of "ready";
# what they cost shows as when each came up and its CPU (slurmd's includes its jobs' since boot).
SLURM_UNITS = ("munge.service", "slurmd.service", "slurmctld.service")
TOP_CPU = 8
TOP_MODULES = 6

REMOTE = r"""
u="cloud-init-local.service cloud-init.service cloud-config.service cloud-final.service
   systemd-networkd.service systemd-networkd-wait-online.service ssh.service
   munge.service slurmd.service slurmctld.service $unit"
echo '== time'; systemd-analyze time 2>/dev/null | head -n 1
echo '== dmesg'; sudo -n dmesg 2>/dev/null | grep -m 1 'Run /init as init process'
echo '== units'; systemctl show -p Id -p InactiveExitTimestampMonotonic \
  -p ActiveEnterTimestampMonotonic -p CPUUsageNSec $u
echo '== cpu'; cd /sys/fs/cgroup && for f in $(find . -name cpu.stat); do
  echo "$(awk '/^usage_usec/ {print $2}' "$f") ${f%/cpu.stat}"; done
echo '== status'; cat /run/cloud-init/status.json 2>/dev/null
echo '== btime'; awk '/^btime/ {print $2}' /proc/stat
echo '== console'; sudo -n grep -h "running '" /var/log/cloud-init-output.log 2>/dev/null
echo '== finished'; stat -c %Y /var/lib/cloud/instance/boot-finished 2>/dev/null
echo '== chain'; systemd-analyze critical-chain --no-pager ssh.service "$unit" 2>/dev/null
echo '== modules'; sudo -n grep -hE ': (start|finish): [a-z-]+/config-' /var/log/cloud-init.log 2>/dev/null
echo '== end'
"""


@dataclass
class NodeProfile:
    name: str
    phases: dict[str, float] = field(default_factory=dict)  # phase -> wall seconds
    marks: dict[str, float] = field(default_factory=dict)  # event -> s after the kernel started
    cpu: list[tuple[float, str]] = field(default_factory=list)  # (guest CPU s, cgroup)
    modules: list[tuple[float, str]] = field(default_factory=list)
    chain: str = ""
    guest_ready: float | None = None  # seconds after the kernel started
    seen_ready: float | None = None  # seconds after qemu started, as the host saw it


def sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("== "):
            current = line[3:].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return out


def parse_units(lines: list[str]) -> dict[str, dict[str, int]]:
    """`systemctl show` blocks (blank-line separated) -> {unit: {property: int}}."""
    units: dict[str, dict[str, int]] = {}
    block: dict[str, str] = {}
    for line in [*lines, ""]:
        if not line.strip():
            if "Id" in block:
                units[block["Id"]] = {k: int(v) for k, v in block.items()
                                      if k != "Id" and v.isdigit()}
            block = {}
        elif "=" in line:
            k, v = line.split("=", 1)
            block[k] = v.strip()
    return units


def _seconds(text: str) -> float | None:
    """systemd's '8.248s', '1min 538ms', '1min 2.5s' -> seconds."""
    total, found = 0.0, False
    for number, unit in re.findall(r"([\d.]+)(min|ms|s|us)\b", text):
        total += float(number) * {"min": 60, "s": 1, "ms": 1e-3, "us": 1e-6}[unit]
        found = True
    return total if found else None


def parse(name: str, text: str, seen_ready: float | None = None) -> NodeProfile:
    s = sections(text)
    p = NodeProfile(name, seen_ready=seen_ready)
    units = parse_units(s.get("units", []))

    def start(unit: str) -> float | None:
        v = units.get(unit, {}).get("InactiveExitTimestampMonotonic")
        return v / 1e6 if v else None

    def end(unit: str) -> float | None:
        v = units.get(unit, {}).get("ActiveEnterTimestampMonotonic")
        return v / 1e6 if v else None

    kernel_total = None
    if s.get("time"):
        m = re.search(r"in (.+?) \(kernel\)", s["time"][0])
        kernel_total = _seconds(m.group(1)) if m else None
    run_init = None
    for line in s.get("dmesg", []):
        if m := re.match(r"\[\s*([\d.]+)\]", line):
            run_init = float(m.group(1))
    if run_init is not None:
        p.phases["kernel"] = run_init
        if kernel_total is not None:
            p.phases["initrd"] = kernel_total - run_init
    elif kernel_total is not None:
        p.phases["kernel + initrd"] = kernel_total
    first = start(STAGES[0][1])
    if kernel_total is not None and first is not None:
        p.phases["systemd until cloud-init"] = first - kernel_total

    status = _json(s.get("status", []))
    btime = _int(s.get("btime", []))
    console = {m.group(1): float(m.group(2)) for line in s.get("console", [])
               if (m := re.search(r"running '([^']+)' at .*Up ([\d.]+) seconds", line))}
    previous_end = None
    for stage, unit, said in STAGES:
        record = status.get("v1", {}).get(stage) or {}
        work = (record["finished"] - record["start"]
                if record.get("start") and record.get("finished") else None)
        u0, u1 = start(unit), end(unit)
        if u0 is not None and u1 is not None:  # the stage's own unit, its own process
            if previous_end is not None and u0 - previous_end > 0.05:
                p.phases[f"waiting before {stage}"] = u0 - previous_end
            p.phases[f"cloud-init {stage}"] = u1 - u0
            if said in console:
                p.phases[f"  {stage}: Python start-up"] = console[said] - u0
            previous_end = u1
        elif work is not None:  # run inside an earlier stage's process
            p.phases[f"cloud-init {stage} (same process)"] = work
            continue
        if work is not None:
            p.phases[f"  {stage}: its work"] = work
    local_end = end(STAGES[0][1])
    net = [t for u in NETWORK_UNITS if (t := end(u)) is not None]
    if net and local_end is not None:
        p.phases["network up after init-local (networkd, wait-online)"] = max(net) - local_end
    device_unit = next((u for u in units if u not in {x[1] for x in STAGES} | set(NETWORK_UNITS)
                        | set(SLURM_UNITS) | {"ssh.service"}), None)
    finished = _int(s.get("finished", []))
    marks = {
        "ssh.service active": end("ssh.service"),
        f"{device_unit} active": end(device_unit) if device_unit else None,
        "cloud-init finished (boot-finished)": finished - btime if finished and btime else None,
    }
    for label, t in marks.items():
        if t is not None:
            p.marks[label] = t
    if len(p.marks) == len(marks):
        p.guest_ready = max(p.marks.values())
    for unit in SLURM_UNITS:  # after "ready" is settled: not part of it
        if (t := end(unit)) is not None:
            p.marks[f"{unit} active"] = t
    slurm_cpu = [units[u]["CPUUsageNSec"] / 1e9 for u in SLURM_UNITS
                 if units.get(u, {}).get("CPUUsageNSec") is not None and end(u) is not None]
    if slurm_cpu:
        p.phases["Slurm daemons' CPU since boot (munged, slurmd, slurmctld)"] = sum(slurm_cpu)
    for line in s.get("cpu", []):
        parts = line.split(maxsplit=1)
        if len(parts) == 2 and parts[0].isdigit() and parts[1] not in (".", "./system.slice"):
            p.cpu.append((int(parts[0]) / 1e6, parts[1].lstrip("./")))
    p.cpu.sort(reverse=True)
    p.modules = module_times(s.get("modules", []))
    p.chain = "\n".join(s.get("chain", []))
    return p


def module_times(lines: list[str]) -> list[tuple[float, str]]:
    """cloud-init.log's start/finish events of each module -> (seconds, stage/module), slowest
    first; the latest boot's where the log holds several. (`cloud-init analyze blame` reads the
    same events, but 22.4's fails on a stage that runs no module.)"""
    started: dict[str, datetime] = {}
    took: dict[str, float] = {}
    for line in lines:
        m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?: (start|finish): ([\w-]+/config-[\w-]+)",
                     line)
        if not m:
            continue
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        if m.group(2) == "start":
            started[m.group(3)] = at
        elif m.group(3) in started:
            took[m.group(3)] = (at - started.pop(m.group(3))).total_seconds()
    return sorted(((s, name) for name, s in took.items()), reverse=True)


def _json(lines: list[str]) -> dict:
    try:
        return json.loads("\n".join(lines)) if lines else {}
    except ValueError:
        return {}


def _int(lines: list[str]) -> int | None:
    return int(lines[0]) if lines and lines[0].strip().isdigit() else None


def collect(hosts: list[Host], state: LabState) -> list[NodeProfile]:
    try:
        seen = json.loads((state.run / "ready.json").read_text())
    except (FileNotFoundError, ValueError):
        seen = {}

    def one(host: Host) -> NodeProfile:
        r = ssh_run(host, shell_vars(unit=f"{host.rdma.device}.service") + REMOTE,
                    timeout=180, check=False)
        if "== end" not in r.stdout:
            raise LabError(f"{host.name}: the boot profile could not be read over SSH "
                           f"({(r.stderr or r.stdout).strip()[-300:]})",
                           hint="is the lab running? `make status`")
        t = seen.get(host.name, {})
        seen_ready = t["ready"] - t["qemu_started"] if "ready" in t and "qemu_started" in t else None
        return parse(host.name, r.stdout, seen_ready)

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, hosts))


def _small_table(title: str, column: str, unit: str, rows: list[tuple[float, str]],
                 digits: int) -> Table:
    table = Table(title=title)
    table.add_column(column)
    table.add_column(unit, justify="right")
    for seconds, name in rows:
        table.add_row(name, f"{seconds:.{digits}f}")
    return table


def show(profiles: list[NodeProfile], console: Console | None = None) -> None:
    console = console or Console(width=None)
    table = Table(title="boot profile: seconds of wall time per phase (under TCG, CPU-bound)")
    table.add_column("phase")
    for p in profiles:
        table.add_column(p.name, justify="right")

    def rows(label: str, value: Callable[[NodeProfile], float | None]) -> None:
        table.add_row(label, *(f"{v:.1f}" if (v := value(p)) is not None else "-"
                               for p in profiles))

    def entry(kind: str, name: str) -> Callable[[NodeProfile], float | None]:
        return lambda p: getattr(p, kind).get(name)

    for kind, suffix in (("phases", ""), ("marks", ", at")):
        names: list[str] = []
        for p in profiles:
            names += [k for k in getattr(p, kind) if k not in names]
        for name in names:
            rows(name + suffix, entry(kind, name))
    rows("guest ready (all three), s after the kernel started", lambda p: p.guest_ready)
    rows("host saw it ready, s after qemu started", lambda p: p.seen_ready)
    console.print(table)
    slowest = max(profiles, key=lambda p: p.seen_ready or p.guest_ready or 0)
    console.print(_small_table(f"guest CPU seconds by cgroup ({slowest.name}, top {TOP_CPU})",
                               "cgroup", "CPU s", slowest.cpu[:TOP_CPU], 1))
    if slowest.modules:
        console.print(_small_table(f"cloud-init modules ({slowest.name}, top {TOP_MODULES})",
                                   "stage/module", "s", slowest.modules[:TOP_MODULES], 2))
    if slowest.chain:
        console.print(f"critical chains to ssh and the RDMA device ({slowest.name}):")
        console.print(slowest.chain, markup=False, highlight=False)
    worst = max((p.seen_ready for p in profiles if p.seen_ready), default=None)
    if worst is not None:
        console.print(f"slowest node ready {worst:.1f} s after its qemu started (target <= 45 s)")

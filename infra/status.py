"""`make status`: one row per node of any inventory, probed over SSH in parallel."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from infra import rdmaport
from infra.errors import LabError
from infra.inventory import Host, Inventory
from infra.ssh import shell_vars, ssh_run

MISSING = "missing"
PROBE_TIMEOUT_S = 60  # a busy TCG guest takes seconds of its CPU for one SSH login


def probe_command(host: Host) -> str:
    """The port's state, whether the data IP is set, the netdev under the port's GID with its
    MTU and the port's active MTU (`mtu NETDEV MTU ACTIVE_MTU`), and Slurm's view of the node.
    Inventory values reach the remote shell only quoted."""
    r = host.rdma
    return (
        shell_vars(ip=host.data_ip)
        + rdmaport.state_command(r, MISSING) + "; "
        + 'ip -4 -br addr show 2>/dev/null | grep -qF " $ip/" && echo has-ip || echo no-ip; '
        + rdmaport.netdev_assign(r, quiet=True) + "; "
        + f'echo "mtu ${{nd:-?}} $({rdmaport.netdev_mtu()} 2>/dev/null || echo ?) '
        + f'$({rdmaport.active_mtu(r)})"; '
        # Slurm's view of this node (idle, allocated, down...), where the host has Slurm
        + 'command -v sinfo >/dev/null && echo "slurm $(timeout 10 sinfo -h -N -n "$(hostname)" '
        + '-o %T 2>/dev/null | head -n 1)"; true'
    )


@dataclass(frozen=True)
class NodeStatus:
    host: Host
    state: str  # running | unreachable | no answer (SSH did not finish in time) | stopped
    rdma: str
    data_ip_ok: bool
    mtu: str = "-"  # "data0 9000 / rdma 4096": the netdev, its MTU, the port's active MTU
    slurm: str = "-"  # what Slurm says of the node (idle, allocated, down, ...); "-": no Slurm


def probe(host: Host, running: bool | None) -> NodeStatus:
    if running is False:
        return NodeStatus(host, "stopped", "-", False)
    try:
        r = ssh_run(host, probe_command(host), timeout=PROBE_TIMEOUT_S, check=False)
    except LabError:  # it did not answer in time: a row that says so, not a failure of all
        return NodeStatus(host, "no answer", "?", False)
    if r.returncode != 0:
        return NodeStatus(host, "unreachable", "?", False)
    lines = r.stdout.split("\n")
    port_state = lines[0].strip()  # e.g. "4: ACTIVE"
    rdma = MISSING if port_state == MISSING else rdmaport.parse_state(port_state)
    return NodeStatus(host, "running", rdma, "has-ip" in r.stdout, parse_mtu(r.stdout),
                      parse_slurm(r.stdout))


def parse_slurm(text: str) -> str:
    """The probe's `slurm STATE` line: "-" without Slurm, "no answer" when slurmctld said
    nothing (not up yet, or down)."""
    for line in text.splitlines():
        if line.startswith("slurm"):
            state = line.removeprefix("slurm").strip()
            return state[:20] if state and state.replace("*", "").replace("~", "").isalpha() \
                else "no answer"
    return "-"


def parse_mtu(text: str) -> str:
    """The probe's `mtu NETDEV MTU ACTIVE_MTU` line, as the status table shows it."""
    for line in text.splitlines():
        f = line.split()
        if f[:1] == ["mtu"] and len(f) >= 3:
            return f"{f[1]} {f[2]} / rdma {f[3] if len(f) > 3 else '?'}"
    return "?"


def collect(inv: Inventory, running: dict[str, bool] | None = None) -> list[NodeStatus]:
    running = running or {}
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(lambda h: probe(h, running.get(h.name)), inv.hosts))


def show(rows: list[NodeStatus], console: Console | None = None) -> None:
    table = Table(title="rxelab nodes")
    for col in ("node", "state", "SSH endpoint", "data IP", "RDMA device", "port state", "MTU",
                "Slurm"):
        table.add_column(col)
    for s in rows:
        h = s.host
        style = "green" if s.rdma == "ACTIVE" else "red"
        table.add_row(
            h.name,
            s.state,
            f"{h.ssh.user}@{h.ssh.host}:{h.ssh.port}",
            h.data_ip + ("" if s.data_ip_ok or s.state != "running" else " (not set!)"),
            f"{h.rdma.device}/{h.rdma.port} gid {h.rdma.gid_index}",
            f"[{style}]{s.rdma}[/{style}]",
            s.mtu,
            s.slurm,
        )
    # Not a terminal (CI, Terraform, a pipe): rich would squeeze the table into 80 columns.
    (console or Console(width=None if sys.stdout.isatty() else 120)).print(table)

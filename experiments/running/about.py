"""What the nodes say of themselves before a run (kernel, how they run, the versions of what
the contenders use, the MTUs) and what the lab says of itself: the run's environment.json, so
every figure of a report can name what produced it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from experiments.running import commands, fleet
from experiments.running.records import Environment
from infra.inventory import Host

# What each node says of itself: its kernel, how it runs (systemd-detect-virt: qemu = TCG,
# kvm, none = bare metal), and the versions of what the contenders use.
ABOUT = (
    'echo "kernel $(uname -r)"; '
    'echo "virt $(systemd-detect-virt 2>/dev/null || true)"; '
    'echo "cpus $(nproc 2>/dev/null || true)"; '
    'echo "open_mpi $(mpirun --version 2>/dev/null | sed -n \'s/.*(Open MPI) *//p\' | head -n 1)"; '
    'echo "ucx $(ucx_info -v 2>/dev/null | sed -n \'s/.*version=\\([^ ]*\\).*/\\1/p\' | head -n 1)"; '
    "dpkg-query -W -f='pkg ${Package} ${Version}\\n' rdma-core python3-pyverbs openmpi-bin libucx0 "
    "perftest 2>/dev/null; "
    # torch (the gloo contender) from its metadata: importing it costs seconds under TCG
    "python3 -c 'import importlib.metadata as m; print(\"torch\", m.version(\"torch\"))' "
    "2>/dev/null; "
    # the rxelab the ranks run: the wheel fab deploy installed
    '"$HOME"/rxelab/venv/bin/python3 -c \'import importlib.metadata as m; '
    'print("rxelab", m.version("rxelab"))\' 2>/dev/null; '
)
PACKAGES = ("rdma-core", "python3-pyverbs", "openmpi-bin", "libucx0", "perftest")
ACCEL = {"qemu": "tcg", "kvm": "kvm", "none": "none"}


@dataclass
class About:
    """What a node said of itself (ABOUT's output), each None where it said nothing."""

    packages: dict[str, str] = field(default_factory=dict)  # PACKAGES' Debian versions
    cpus: int | None = None
    kernel: str | None = None
    virt: str | None = None  # systemd-detect-virt's word
    open_mpi: str | None = None
    ucx: str | None = None
    torch: str | None = None
    rxelab: str | None = None


SAID = ("kernel", "virt", "open_mpi", "ucx", "torch", "rxelab")  # About's words, each a line


def parse_about(text: str) -> About:
    about = About()
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "pkg" and value.split(" ", 1)[0] in PACKAGES and " " in value:
            name, version = value.split(" ", 1)
            about.packages[name] = version
        elif key == "cpus" and value.strip().isdigit():
            about.cpus = int(value.strip())
        elif key in SAID and value.strip():
            setattr(about, key, value.strip()[:200])
    return about


def environment(hosts: list[Host], lab_state: Path | None) -> Environment:
    """Read from the nodes themselves: kernel, how they run (the accelerator), rdma-core, Open
    MPI and UCX versions, MTUs; from the lab, if this is one, its image. The first node speaks
    for the run; every node's own account is kept under `hosts`."""
    def ask(h: Host) -> tuple[About, commands.Readings]:
        with fleet.connect(h) as c:
            r = c.run(ABOUT + commands.readings_command(h), hide=True, warn=True, timeout=60)
        return parse_about(r.stdout), commands.parse_readings(r.stdout)

    said = fleet.on_every_host(hosts, ask)
    if failed := fleet.failed_hosts(said):
        cause = next(e for e in said.values() if isinstance(e, Exception))
        raise fleet.FleetError("could not ask the nodes what they run:\n  "
                               + "\n  ".join(failed)) from cause
    answers = {name: a for name, a in said.items() if not isinstance(a, Exception)}
    first, readings = answers[hosts[0].name]
    virt = "?" if first.virt is None else first.virt
    env = Environment.model_validate({
        "nodes": len(hosts), "kernel": "?" if first.kernel is None else first.kernel,
        "virtualization": virt, "accel": ACCEL.get(virt, virt),
        # as the tools say them; the report falls back to the packages' versions
        "versions": {"open_mpi": first.open_mpi, "ucx": first.ucx, "kernel": first.kernel,
                     "torch": first.torch, "rxelab": first.rxelab},
        "packages": first.packages,
        "active_mtu": readings.get("active_mtu", "?"),  # the RoCE path MTU
        "netdev_mtu": readings.get("netdev_mtu", "?"),  # the data NIC's (a spec's `mtu`)
        "ucx_settings": commands.ucx_settings(hosts[0]),
        "hosts": {name: {"kernel": a.kernel, "virtualization": a.virt, "open_mpi": a.open_mpi,
                         "torch": a.torch, "cpus": a.cpus, "rdma_device": h.rdma.device}
                  for (name, (a, _)), h in zip(answers.items(), hosts, strict=True)},
    })
    if lab_state is not None and (lab_state / "boot.json").exists():
        boot = json.loads((lab_state / "boot.json").read_text())
        env.lab_accel = boot.get("accel")
        env.image = boot.get("image", {}).get("kind")
        env.lab_host_cpus = os.cpu_count()  # the lab's VMs share this machine's cores
    return env

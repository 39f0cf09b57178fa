"""The platforms a simulation runs on, as SimGrid XML from one template:
- lab: the machine (`machine_cores` cores) and its VMs, SimGrid's own (`per_node` ranks each,
  placed in blocks as rxelab.launch places them, `cores` CPUs each): busy VMs share the
  machine's cores, idle ones leave them to the others (a CPU loop on 1, 2, 3, 4 of the 4-VM
  lab's VMs at once: 5.0, 3.9, 6.3, 7.2 s, measured). Under TCG rxe's bytes cost the VMs'
  CPU (ib_write_bw one way fell from 41.5 to 21.9 MB/s with the two other VMs busy, both ways
  from 22.2 to 10.2), but not all of a transfer's time: two VMs exchanging 1 MiB kept 0.8 of a
  core each busy, and three VMs exchanging at once 1.8 of the machine's 2 cores (2026-11-27,
  the qemu processes' CPU time), each pair's step only 1.3x as long. So a message's bytes
  cost `cpu_per_byte` seconds each on the sending VM and on the receiving one, and at once
  pass through both VMs' data paths (a resource of each VM, its sends and receives sharing
  `path_bandwidth`, the rate the library's own exchanges showed); a profile
  from before the CPU was measured charges all of 1/`bandwidth` to the CPU. Between two
  ranks of one VM: 1/`loop_bandwidth` on that VM (rxe's loopback, 66 MB/s against
  32-41 MB/s between VMs, measured). Then the bytes cross the machine's loopback with the
  link's latency; a sender that waits for its message (RC's completion) learns of it by the
  acknowledgement, a latency later;
- cluster: one rank per host, each host with its own link (up and down apart) into a crossbar
  (full bisection; no backbone link: it made simulation ~10x slower with the same results);
- fat-tree: a two-level fat tree of leaf switches, with `oversubscription`:1 fewer uplinks than
  hosts per leaf;
- torus: a 3-D torus.
The network model is CM02 (SimGrid's default LV08 multiplies latency by 13.01). A route
between two hosts of a leaf crosses two links (the sender's up, the receiver's down): each
has half the platform's host-to-host latency; a route over more switches takes longer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import jinja2

TEMPLATE = Path(__file__).resolve().parent.parent / "simulator" / "platform.xml.j2"
KINDS = ("lab", "cluster", "fat-tree", "torus")
LEAF = 32  # hosts per leaf switch of a fat tree (fewer when the job is smaller)
FLOPS = 1e9  # flop/s of a core at full speed: a second of CPU work is this much


class PlatformError(ValueError):
    pass


@dataclass(frozen=True)
class Platform:
    kind: str
    ranks: int
    bandwidth: float  # bytes/s of one link
    latency: float  # seconds host to host on the nearest route (two links: half each)
    cores: int = 1  # per host (lab: per VM)
    speed: float = FLOPS  # flop/s of a core (below FLOPS: slower than where costs were measured)
    oversubscription: int = 1  # fat-tree: hosts per uplink of a leaf
    per_node: int = 1  # lab: ranks on each host (VM)
    machine_cores: int = 0  # lab: the machine's cores under all of its VMs (0: one per VM CPU)
    loop_bandwidth: float = 0.0  # lab: bytes/s between two ranks of one VM (0: half `bandwidth`)
    cpu_per_byte: float = 0.0  # lab: CPU seconds a byte costs each side's VM (0: 1/`bandwidth`)
    path_bandwidth: float = 0.0  # lab: bytes/s through each VM's data path (0: no bound)
    wake: float = 0.0  # lab: CPU a blocked rank spends to run again, the others wanting all

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PlatformError(f"platform {self.kind!r}: one of {', '.join(KINDS)}")
        if not 1 <= self.ranks <= 4096:
            raise PlatformError(f"{self.ranks} ranks: from 1 to 4096")
        for name in ("loop_bandwidth", "cpu_per_byte", "path_bandwidth", "wake"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float))
                                               and math.isfinite(value) and value >= 0):
                raise PlatformError(f"{name}={value!r}: a number from 0")
            if value and self.kind != "lab":
                raise PlatformError(f"{name}={value!r}: on the lab only")
        for name in ("bandwidth", "latency", "speed"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise PlatformError(f"{name}={value!r}: a number above 0")
        if not 1 <= self.cores <= 1024:
            raise PlatformError(f"cores={self.cores!r}: from 1 to 1024")
        if not 1 <= self.per_node <= 64 or (self.per_node > 1 and self.kind != "lab"):
            raise PlatformError(f"per_node={self.per_node!r}: from 1 to 64, on the lab only")
        if isinstance(self.machine_cores, bool) or not isinstance(self.machine_cores, int) \
                or not 0 <= self.machine_cores <= 4096 or (self.machine_cores and self.kind != "lab"):
            raise PlatformError(f"machine_cores={self.machine_cores!r}: a whole number from 1 to "
                                "4096 (0: one core per VM CPU), on the lab only")
        if self.kind == "fat-tree" and not 1 <= self.oversubscription <= LEAF:
            raise PlatformError(f"oversubscription={self.oversubscription!r}: from 1 to {LEAF}")

    @property
    def hosts(self) -> int:
        """Hosts the platform has: one per VM for the lab, else one per rank (a fat tree's
        last leaf and a torus are filled up with hosts no rank runs on)."""
        if self.kind == "lab":
            return -(-self.ranks // self.per_node)
        if self.kind == "fat-tree":
            leaf = min(LEAF, self.ranks)
            return -(-self.ranks // leaf) * leaf
        if self.kind == "torus":
            return math.prod(torus_dims(self.ranks))
        return self.ranks

    def topology(self) -> tuple[str, str]:
        """SimGrid's cluster topology and its parameters."""
        if self.kind == "fat-tree":
            leaf = min(LEAF, self.ranks)
            leaves = self.hosts // leaf
            up = max(1, leaf // self.oversubscription)
            if leaves == 1:  # one switch: nothing above it to oversubscribe
                return "", ""
            return "FAT_TREE", f"2;{leaf},{leaves};1,{up};1,1"
        if self.kind == "torus":
            return "TORUS", ",".join(map(str, torus_dims(self.ranks)))
        return "", ""

    def describe(self) -> str:
        extra = {"fat-tree": f", {self.oversubscription}:1 oversubscribed",
                 "torus": f" {'x'.join(map(str, torus_dims(self.ranks)))}"}.get(self.kind, "")
        if self.kind == "lab":
            path = (f", through each VM's data path at {self.path_bandwidth / 1e6:g} MB/s"
                    if self.path_bandwidth else f" ({self.bandwidth / 1e6:g} MB/s)")
            woken = (f"; a blocked rank spends up to {self.wake * 1e3:.3g} ms of CPU running "
                     "again, as the other VMs want the cores (more VMs' CPUs than cores)"
                     if self.wake and self.crowded else "")
            return (f"lab: {self.ranks} ranks on {self.hosts} VMs of {self.cores} CPUs sharing "
                    f"{self.machine_cores_or_all} cores; a message's bytes cost each VM "
                    f"{self.byte_cpu * 1e9:.3g} ns/B of CPU{path}, {self.latency * 1e6:g} us"
                    f"{woken}")
        return (f"{self.kind}{extra}: {self.ranks} ranks, one per host, links "
                f"{self.bandwidth / 1e6:g} MB/s, {self.latency * 1e6:g} us")

    @property
    def machine_cores_or_all(self) -> int:
        """The lab machine's cores (as many as its VMs' CPUs, where not given)."""
        return self.machine_cores or self.hosts * self.cores

    @property
    def crowded(self) -> bool:
        """lab: whether its VMs' CPUs outnumber the machine's cores (a blocked rank then
        spends CPU to run again: `wake` times the share of the cores the other VMs want)."""
        return self.kind == "lab" and self.hosts * self.cores > self.machine_cores_or_all

    @property
    def byte_cpu(self) -> float:
        """lab: the CPU seconds a byte of a message costs its sending VM, and its receiving
        one, under TCG (0 elsewhere: the links carry the bytes)."""
        if self.kind != "lab":
            return 0.0
        return self.cpu_per_byte or 1.0 / self.bandwidth

    @property
    def path_byte(self) -> float:
        """lab: the seconds a byte takes through a VM's data path (its sends and receives
        share it; 0: the CPU alone bounds them)."""
        return 1.0 / self.path_bandwidth if self.kind == "lab" and self.path_bandwidth else 0.0

    @property
    def loop_byte_cpu(self) -> float:
        """lab: the CPU seconds a byte between two ranks of one VM costs that VM (sending and
        receiving both)."""
        if self.kind != "lab":
            return 0.0
        return 1.0 / (self.loop_bandwidth or self.bandwidth / 2)

    def xml(self, vms: bool = True) -> str:
        """The platform for the replayer; vms=False: for SMPI, which places ranks on hosts of
        its own, the lab as it was modelled before VMs (a host per VM at the share of the
        machine's cores all of them would get, one link per VM both ways share)."""
        topology, parameters = self.topology()
        template = jinja2.Template(TEMPLATE.read_text(), undefined=jinja2.StrictUndefined,
                                   keep_trailing_newline=True, autoescape=True)
        fixed = self.kind == "lab" and not vms  # with VMs, SimGrid shares the cores itself
        share = min(1.0, self.machine_cores_or_all / (self.hosts * self.cores)) if fixed else 1.0
        return template.render(kind=self.kind, hosts=self.hosts, vms=vms,
                               speed=f"{self.speed * share:.6g}", path_speed=f"{FLOPS:.6g}",
                               cores=self.cores, machine_cores=self.machine_cores_or_all,
                               bandwidth=f"{self.bandwidth * share:.6g}",
                               latency=f"{self.latency / 2:.6g}", topology=topology,
                               sharing="SHARED" if fixed else "SPLITDUPLEX",
                               topo_parameters=parameters, description=self.describe())

    def config(self, vms: bool = True) -> list[str]:
        """SimGrid options: the CM02 model without TCP's acknowledgements modelled as traffic
        the other way (cross-traffic: 5 % of a link that RC's small acknowledgements do not
        take); on the lab with VMs, the machine's loopback takes the link's latency, and its
        bytes nothing (the VMs' CPU pays for them; nor does CM02's TCP window bound them)."""
        machine = [f"--cfg=network/loopback-lat:{self.latency:.6g}",
                   "--cfg=network/loopback-bw:1e15", "--cfg=network/TCP-gamma:1e18"]
        return ["--cfg=network/model:CM02", "--cfg=network/crosstraffic:0",
                *(machine if self.kind == "lab" and vms else [])]

    def host_of(self, rank: int) -> int:
        return rank // self.per_node


def torus_dims(n: int) -> tuple[int, int, int]:
    """Three sides, as equal as can be, whose product is at least n (the smallest such)."""
    best: tuple[int, int, int] | None = None
    side = max(1, round(n ** (1 / 3)))
    for a in range(max(1, side - 2), side + 3):
        for b in range(a, side + 4):
            c = -(-n // (a * b))
            if c < b:
                continue
            dims = (a, b, c)
            if best is None or (math.prod(dims), c - a) < (math.prod(best), best[2] - best[0]):
                best = dims
    assert best is not None
    return best

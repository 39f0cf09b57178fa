"""The platforms a simulation runs on, as SimGrid XML from one template:
- lab: a host per VM (`per_node` ranks each, placed in blocks as rxelab.launch places them)
  with the VM's CPUs, slowed where the VMs outnumber the machine's cores, and one link per VM
  that both directions share (its `bandwidth` is what a VM moves in and out together, as
  `ib_write_bw -b` measures it: under TCG the VM's CPU does rxe's work, not a NIC);
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
    cores: int = 1  # per host (lab: the lab host's)
    speed: float = FLOPS  # flop/s of a core (below FLOPS: slower than where costs were measured)
    oversubscription: int = 1  # fat-tree: hosts per uplink of a leaf
    per_node: int = 1  # lab: ranks on each host (VM)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PlatformError(f"platform {self.kind!r}: one of {', '.join(KINDS)}")
        if not 1 <= self.ranks <= 4096:
            raise PlatformError(f"{self.ranks} ranks: from 1 to 4096")
        for name in ("bandwidth", "latency", "speed"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise PlatformError(f"{name}={value!r}: a number above 0")
        if not 1 <= self.cores <= 1024:
            raise PlatformError(f"cores={self.cores!r}: from 1 to 1024")
        if not 1 <= self.per_node <= 64 or (self.per_node > 1 and self.kind != "lab"):
            raise PlatformError(f"per_node={self.per_node!r}: from 1 to 64, on the lab only")
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
        where = (f"{self.ranks} ranks on {self.hosts} VMs of {self.cores} CPUs at "
                 f"{self.speed / 1e9:.3g} of full speed, links shared both ways"
                 if self.kind == "lab" else f"{self.ranks} ranks, one per host")
        return (f"{self.kind}{extra}: {where}, links {self.bandwidth / 1e6:g} MB/s, "
                f"{self.latency * 1e6:g} us")

    def xml(self) -> str:
        topology, parameters = self.topology()
        template = jinja2.Template(TEMPLATE.read_text(), undefined=jinja2.StrictUndefined,
                                   keep_trailing_newline=True, autoescape=True)
        return template.render(kind=self.kind, hosts=self.hosts, speed=f"{self.speed:.6g}",
                               cores=self.cores, bandwidth=f"{self.bandwidth:.6g}",
                               latency=f"{self.latency / 2:.6g}", topology=topology,
                               sharing="SHARED" if self.kind == "lab" else "SPLITDUPLEX",
                               topo_parameters=parameters, description=self.describe())

    def config(self) -> list[str]:
        """SimGrid options: the CM02 model without TCP's acknowledgements modelled as traffic
        the other way (cross-traffic: 5 % of a link that RC's small acknowledgements do not
        take)."""
        return ["--cfg=network/model:CM02", "--cfg=network/crosstraffic:0"]

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

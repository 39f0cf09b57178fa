"""A checked experiment spec (experiments/spec/__init__.py makes one from its file) and the cases it
expands to, each one measurement's settings; who ran a case and with how many ranks."""

from dataclasses import dataclass
from typing import Any

from rxelab import codecs
from rxelab.bench import HAND_LOOP


@dataclass(frozen=True)
class Run:
    app: str
    op: str
    algorithms: tuple[str, ...]
    nodes: tuple[int, ...]
    sizes: tuple[int, ...]
    stages: int
    warmup: int
    transports: tuple[str | None, ...]
    sample_load: bool
    netem: tuple[dict[str, Any], ...] = ({},)
    mtus: tuple[int | None, ...] = (None,)
    timeout_s: int | None = None
    options: tuple[tuple[str, int | float], ...] = ()  # rxelab: init()'s options
    pairs: tuple[int | None, ...] = (None,)
    tight: bool = False
    data: tuple[str | None, ...] = (None,)
    compressions: tuple[str | None, ...] = (None,)
    included: str | None = None  # the shipped spec whose include brought this run in
    busy_neighbours: int = 0  # nodes after the case's that each run a CPU loop while it runs

    def cases(self) -> list[dict[str, Any]]:
        """One case per (nodes, mtu, impairment, transport, algorithm or tool, data,
        compression, size), in a stable order."""
        return [{"app": self.app, "op": self.op, "algorithm": a, "nodes": n, "size": s,
                 "stages": self.stages, "warmup": self.warmup, "transport": t,
                 "sample_load": self.sample_load, "netem": dict(imp), "mtu": mtu,
                 "timeout_s": self.timeout_s, **dict(self.options),
                 **({"pairs": k} if k is not None else {}),
                 **({"tight": True} if self.tight else {}),
                 **({"busy_neighbours": self.busy_neighbours} if self.busy_neighbours else {}),
                 **({"data": d} if d is not None else {}),
                 **({"compression": z} if z is not None else {}),
                 **({"included": self.included} if self.included else {})}
                for n in self.nodes for mtu in self.mtus for imp in self.netem
                for t in self.transports for a in self.algorithms for k in self.pairs
                for d in self.data for z in self.compressions for s in self.sizes]


@dataclass(frozen=True)
class Spec:
    name: str
    description: str
    runs: tuple[Run, ...]
    source: str
    rounds: int = 1
    elastic: dict[str, Any] | None = None  # the elastic scenario, instead of runs
    launcher: str = "ssh"  # how the cases' ranks start (LAUNCHERS)
    ddp: dict[str, Any] | None = None  # the DDP scenario (running/ddp_scenario.py), instead of runs

    def cases(self) -> list[dict[str, Any]]:
        return [c for r in self.runs for c in r.cases()]

    @property
    def includes(self) -> tuple[str, ...]:
        """The shipped specs whose runs an include brought in (they come first in `runs`)."""
        return tuple(dict.fromkeys(r.included for r in self.runs if r.included))

    @property
    def max_nodes(self) -> int:
        for scenario in (self.elastic, self.ddp):
            if scenario is not None:
                return int(scenario["nodes"])
        return max(n + r.busy_neighbours for r in self.runs for n in r.nodes)


def contender(case: dict[str, Any]) -> str:
    """Who ran a case: rxelab, mpi-ucx, mpi-tcp, gloo or perftest (what a reader compares); an
    rxelab run with its own eager limit or a codec says so (rxelab-eager0: rendezvous only;
    rxelab-zstd). The hand loop is not the library but the floor it is held to: pyverbs."""
    if case["app"] == "mpi":
        return f"mpi-{case['transport']}"
    if case["app"] == "rxelab" and case.get("algorithm") == HAND_LOOP:
        return "pyverbs"
    name = str(case["app"])
    if case["app"] == "rxelab" and case.get("eager_limit") is not None:
        name += f"-eager{case['eager_limit']}"
    if case["app"] == "rxelab" and case.get("compression") not in (None, codecs.NONE):
        name += f"-{case['compression']}"
    return name


def ranks(case: dict[str, Any]) -> int:
    return int(case["nodes"]) * int(case.get("ranks_per_node") or 1)

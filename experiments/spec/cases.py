"""A checked experiment spec (experiments/spec/__init__.py makes one from its file) and the cases
it expands to, each one measurement's settings (`Case`, what a run's records repeat); who ran a
case and with how many ranks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Self

from pydantic import BaseModel, ConfigDict
from rxelab import codecs
from rxelab.bench import HAND_LOOP

from experiments.spec.scenarios import DdpDoc, ElasticDoc


class Case(BaseModel):
    """One case: what a run of a spec measures once per round. A key a case does not set (the
    sometimes-there ones: ranks_per_node, pairs, tight, busy_neighbours, data, compression,
    included, and init()'s options) is left out of its JSON, as it always was: `to_json` gives
    exactly the keys that were set. A record of another version reads too: keys it lacks take
    the spec's defaults, keys this one does not know are kept (extra="allow")."""

    model_config = ConfigDict(extra="allow", frozen=True)

    app: str
    op: str
    algorithm: str
    nodes: int
    size: int
    stages: int = 10  # a spec's defaults, for a record of another version that lacks them
    warmup: int = 1
    transport: str | None = None  # mpi's: ucx or tcp (an old record's rxelab case may say tcp)
    # the library's transport (a spec's `transport` of an rxelab run): verbs, tcp or quic; None:
    # verbs, as every record from before the library had transports
    rxelab_transport: str | None = None
    sample_load: bool = False
    netem: dict[str, int | float] = {}  # the impairment (experiments.spec.netem); {}: none
    mtu: int | None = None
    timeout_s: int | None = None
    ranks_per_node: int | None = None
    pairs: int | None = None
    tight: bool = False
    busy_neighbours: int = 0  # nodes after the case's that each run a CPU loop while it runs
    data: str | None = None
    compression: str | None = None
    included: str | None = None  # the shipped spec whose include brought this case in

    def option(self, name: str) -> int | float | None:
        """init()'s option `name` (rxelab.settings.OPTIONS) as the case sets it, or None (the
        library's default). Options are keys of their own in a case's JSON."""
        value = (self.model_extra or {}).get(name)
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    def to_json(self) -> str:
        """The case as a JSON object: the keys it sets, no others."""
        return json.dumps(self.model_dump(exclude_unset=True))

    @classmethod
    def from_json(cls, line: str) -> Self:
        return cls.model_validate(json.loads(line))


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
    netem: tuple[dict[str, int | float], ...] = ({},)
    mtus: tuple[int | None, ...] = (None,)
    timeout_s: int | None = None
    options: tuple[tuple[str, int | float], ...] = ()  # rxelab: init()'s options
    pairs: tuple[int | None, ...] = (None,)
    tight: bool = False
    data: tuple[str | None, ...] = (None,)
    compressions: tuple[str | None, ...] = (None,)
    included: str | None = None  # the shipped spec whose include brought this run in
    busy_neighbours: int = 0  # nodes after the case's that each run a CPU loop while it runs

    def cases(self) -> list[Case]:
        """One case per (nodes, mtu, impairment, transport, algorithm or tool, data,
        compression, size), in a stable order; the keys a run leaves at their defaults are not
        set (a case's JSON has them only where they say something)."""
        return [Case.model_validate({"app": self.app, "op": self.op, "algorithm": a, "nodes": n, "size": s,
                 "stages": self.stages, "warmup": self.warmup,
                 "transport": t if self.app != "rxelab" else None,
                 **({"rxelab_transport": t} if self.app == "rxelab" and t is not None else {}),
                 "sample_load": self.sample_load, "netem": dict(imp), "mtu": mtu,
                 "timeout_s": self.timeout_s, **dict(self.options),
                 **({"pairs": k} if k is not None else {}),
                 **({"tight": True} if self.tight else {}),
                 **({"busy_neighbours": self.busy_neighbours} if self.busy_neighbours else {}),
                 **({"data": d} if d is not None else {}),
                 **({"compression": z} if z is not None else {}),
                 **({"included": self.included} if self.included else {})})
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
    elastic: ElasticDoc | None = None  # the elastic scenario, instead of runs
    launcher: str = "ssh"  # how the cases' ranks start (LAUNCHERS)
    ddp: DdpDoc | None = None  # the DDP scenario (running/ddp_scenario.py), instead of runs

    def cases(self) -> list[Case]:
        return [c for r in self.runs for c in r.cases()]

    @property
    def includes(self) -> tuple[str, ...]:
        """The shipped specs whose runs an include brought in (they come first in `runs`)."""
        return tuple(dict.fromkeys(r.included for r in self.runs if r.included))

    @property
    def max_nodes(self) -> int:
        for scenario in (self.elastic, self.ddp):
            if scenario is not None:
                return scenario.nodes
        return max(n + r.busy_neighbours for r in self.runs for n in r.nodes)


def contender(case: Case) -> str:
    """Who ran a case: rxelab, mpi-ucx, mpi-tcp, gloo or perftest (what a reader compares); an
    rxelab run with its own eager limit or a codec says so (rxelab-eager0: rendezvous only;
    rxelab-zstd), and one over another transport than verbs names it (rxelab-tcp). The hand
    loop is not the library but the floor it is held to: pyverbs. An
    MPI case of a record from before transports were recorded ran over TCP."""
    if case.app == "mpi":
        return f"mpi-{case.transport or 'tcp'}"
    if case.app == "rxelab" and case.algorithm == HAND_LOOP:
        return "pyverbs"
    name = case.app
    eager = case.option("eager_limit")
    if case.app == "rxelab" and eager is not None:
        name += f"-eager{eager}"
    if case.app == "rxelab" and case.compression not in (None, codecs.NONE):
        name += f"-{case.compression}"
    if case.app == "rxelab" and case.rxelab_transport not in (None, "verbs"):
        name += f"-{case.rxelab_transport}"
    return name


def ranks(case: Case) -> int:
    return case.nodes * (case.ranks_per_node or 1)

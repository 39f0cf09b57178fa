"""Experiment specs: TOML files that say what to run, checked strictly before anything runs.

    name = "smoke"            # a plain name (it names the results directory): a letter or
                              #   digit, then up to 63 letters, digits, '.', '_' or '-'
    description = "..."       # at most 2000 characters
    rounds = 1                # every case runs this many times, all cases once per round
                              #   (A, B, A, B, ...); the report gives each case's median, 1..20
    launcher = "ssh"          # how a case's ranks start: ssh (ours, or mpirun, over SSH) or
                              #   srun (Slurm starts them: srun, srun --mpi=pmix for MPI;
                              #   perftest pairs start over SSH either way); [[runs]] only
    [[runs]]                  # 1 to 64 runs
    app = "rxelab"            # rxelab | mpi | gloo | perftest (gloo: torch.distributed's Gloo
                              #   over TCP, on a lab built with EXTRAS=torch; skipped, and said
                              #   so, where the nodes have no torch)
    op = "allgather"          # allgather | alltoall | allreduce | reduce_scatter | bcast
    algorithms = ["star"]     # rxelab: the library's; mpi: mpi-default|mpi-linear|mpi-pairwise|
                              #   mpi-ring|mpi-bruck (forced through Open MPI's coll_tuned);
                              #   gloo: gloo-default
    tools = ["ib_write_bw"]   # perftest: ib_write_bw | ib_write_bw_bidir | ib_send_bw | ib_send_lat
    nodes = [2, 3]            # how many nodes take part (1 rank each), 1..64
    sizes = [1024, 65536]     # bytes per peer, 0..1073741824 (1 GiB)
    stages = 10               # repetitions (perftest: iterations), 1..10000000
    warmup = 1                # 0..1000000
    transport = ["ucx", "tcp"]  # mpi: Open MPI over UCX on the RDMA device, and/or over TCP
    sample_load = false       # sample each node's data NIC counters during the run
    tight = false             # rxelab, mpi, gloo: the calls back to back on the same data, timed as
                              #   the slowest rank's span (apps' --tight), not stage by stage
    netem = [{}, {loss = 1}]  # impairments of the data NICs, one case each (experiments/netem.py)
    mtu = [1500, 9000]        # data NIC MTU for the case, 1280..9000 (default: as provisioned)
    timeout_s = 300           # a case's deadline, 10..604800 (default: grows with the work)
    ranks_per_node = 2        # rxelab: ranks on each node (default 1), 1..8
    pairs = [1, 2, 15]        # rxelab sequential: at most this many pairs at once, a case each,
                              #   1..130816 (every pair of 64 nodes x 8 ranks)
    compression = ["none", "zstd"]  # rxelab: how rendezvous blocks travel, a case each: none,
                              #   lz4, zstd; fp16, bf16 for allreduce and reduce_scatter only
    data = ["zeros", "random"]  # rxelab, mpi, gloo: what the buffers hold, a case each: pattern
                              #   (default), zeros, sparse (1 in 100 set), random

An rxelab run also takes every option of init() (rxelab.settings), under its own name:
{options}

Instead of [[runs]], a spec may describe one elastic scenario (apps/elastic_train.py under
rxelab, then the same loop under Open MPI over UCX; experiments/elastic.py):

    [elastic]
    nodes = 3                 # 2..64
    ranks_per_node = 2        # 1..8
    steps = 40                # training steps, 2..100000
    size = 65536              # gradient bytes (float32), a multiple of 4, 4..1 GiB
    admit_every = 5           # newcomers are let in every N steps, 1..100000
    pause = 0.05              # seconds of computation per step, 0..10
    timeout_s = 900           # the scenario's deadline, 10..604800
    mpi = true                # also run Open MPI's loop with the same kill (its abort)
    events = [                # 1..16, each at a step, in order, one action each:
      {step = 10, kill = 3},          # rank 3 (its first number) dies as kill -9 would
      {step = 20, partition = 3},     # node 3's data NIC goes down (back up afterwards)
      {step = 30, join = 1},          # a newcomer starts on node 1 and joins
    ]

A list-valued key (nodes, sizes, algorithms, tools, transport, netem, mtu, pairs, compression,
data) holds 1 to 64
values and makes one case per value. Numbers are whole numbers (not true/false, not 1.0). An
unknown key or an impossible value is an error that names the file, the run and the key; the
file itself must be UTF-8 TOML of at most 1 MiB.
"""

import reprlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from rxelab import codecs, ops, perftest
from rxelab import settings as library

from experiments import netem
from infra import documents
from infra.documents import spell

__doc__ = __doc__.replace("{options}", "\n".join(  # type: ignore[union-attr]
    f"    {o.name} = {library.show(o.default)}".ljust(30) + f"# {o.meaning}, {o.low}..{o.high}"
    + (" (the same on every rank)" if o.shared else "") for o in library.OPTIONS))
SPECS = Path(__file__).resolve().parent / "specs"
APPS = ("rxelab", "mpi", "gloo", "perftest")
GLOO_ALGORITHMS = ("gloo-default",)  # Gloo picks its own; the label names the contender's row
OPS = tuple(ops.COLLECTIVES)
TOOLS = tuple(perftest.TOOLS)  # perftest's tools by their names (rxelab.perftest)
TRANSPORTS = ("ucx", "tcp")
LAUNCHERS = ("ssh", "srun")
# rxelab runs take every option of init(), under its own name and in its own range
LIBRARY = {o.name: (o.low, o.high) for o in library.OPTIONS}
RXELAB_ONLY = {"ranks_per_node": (1, 8), **LIBRARY}
MTU_RANGE = (1280, 9000)
# Whole numbers' ranges: what the lab can do, far below where a deadline or a buffer overflows.
BOUNDS = {"nodes": (1, 64), "sizes": (0, 1 << 30), "stages": (1, 10_000_000),
          "warmup": (0, 1_000_000), "timeout_s": (10, 604_800), "mtu": MTU_RANGE,
          "pairs": (1, 64 * 8 * (64 * 8 - 1) // 2), "rounds": (1, 20), **RXELAB_ONLY}
MAX_ENTRIES = 64  # of every list
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"  # pydantic's regex: $ is the very end, no newline
MAX_BYTES = documents.MAX_BYTES
MAX_PROBLEMS, MAX_LINE = 40, 300  # what an error shows of a broken file


class SpecError(Exception):
    pass


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

    def cases(self) -> list[dict[str, Any]]:
        """One case per (nodes, mtu, impairment, transport, algorithm or tool, data,
        compression, size), in a stable order."""
        return [{"app": self.app, "op": self.op, "algorithm": a, "nodes": n, "size": s,
                 "stages": self.stages, "warmup": self.warmup, "transport": t,
                 "sample_load": self.sample_load, "netem": dict(imp), "mtu": mtu,
                 "timeout_s": self.timeout_s, **dict(self.options),
                 **({"pairs": k} if k is not None else {}),
                 **({"tight": True} if self.tight else {}),
                 **({"data": d} if d is not None else {}),
                 **({"compression": z} if z is not None else {})}
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

    def cases(self) -> list[dict[str, Any]]:
        return [c for r in self.runs for c in r.cases()]

    @property
    def max_nodes(self) -> int:
        if self.elastic is not None:
            return int(self.elastic["nodes"])
        return max(n for r in self.runs for n in r.nodes)


def contender(case: dict[str, Any]) -> str:
    """Who ran a case: rxelab, mpi-ucx, mpi-tcp, gloo or perftest (what a reader compares); an
    rxelab run with its own eager limit or a codec says so (rxelab-eager0: rendezvous only;
    rxelab-zstd)."""
    if case["app"] == "mpi":
        return f"mpi-{case['transport']}"
    name = str(case["app"])
    if case["app"] == "rxelab" and case.get("eager_limit") is not None:
        name += f"-eager{case['eager_limit']}"
    if case["app"] == "rxelab" and case.get("compression") not in (None, codecs.NONE):
        name += f"-{case['compression']}"
    return name


def ranks(case: dict[str, Any]) -> int:
    return int(case["nodes"]) * int(case.get("ranks_per_node") or 1)


# --- the document's shape: pydantic models of the TOML as written -------------------------
# A field's description is the message for any problem with its value; the cross-field rules
# raise their own (_bad). Either way SpecError names the field, as _where spells it.

def _short(value: Any) -> str:
    return reprlib.repr(value)


def _bad(what: str) -> PydanticCustomError:
    return PydanticCustomError("spec", "{what}", {"what": what})


def _whole(key: str, optional: bool = False) -> Any:
    low, high = BOUNDS[key]
    return Annotated[int | None if optional else int,
                     Field(ge=low, le=high, description=f"must be from {low} to {high} (a whole number)")]


def _list(item: Any, what: str, optional: bool = False) -> Any:
    return Annotated[list[item] | None if optional else list[item],
                     Field(min_length=1, max_length=MAX_ENTRIES, description=what)]


def _wholes(key: str, optional: bool = False) -> Any:
    low, high = BOUNDS[key]
    return _list(Annotated[int, Field(ge=low, le=high)],
                 f"must be from {low} to {high} (a non-empty list of at most {MAX_ENTRIES} "
                 "whole numbers)", optional)


def _impairment(imp: Any) -> Any:
    """netem.py's own rules, so a spec and the runner agree on what an impairment is."""
    if found := netem.problems(imp):
        raise _bad("; ".join(found))
    return imp


def _algorithms(app: str | None, op: str | None) -> tuple[str, ...]:
    """What a run of `app` may run for `op`; () when either is not known."""
    if app == "rxelab":
        described = ops.COLLECTIVES.get(op)  # read now: a collective registered later counts
        return tuple(described.algorithms) if described else ()
    if app == "mpi":
        described = ops.COLLECTIVES.get(op)
        return tuple(described.mpi.tuned) if described and described.mpi else ()
    if app == "gloo":
        return GLOO_ALGORITHMS
    return TOOLS if app == "perftest" else ()


# key -> (the only app that takes it, what to say to the others)
ONLY = {"tools": ("perftest", "only perftest runs take `tools`"),
        "transport": ("mpi", "only mpi runs choose a transport"),
        "compression": ("rxelab", "only rxelab runs compress"),
        **{key: ("rxelab", "only rxelab runs take it") for key in RXELAB_ONLY}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _RunFields(_Strict):
    """One [[runs]] table (the library's options are added below, as _RunDoc). Fields are
    checked in this order, so a cross-field rule sees the app and op above it, when they are
    valid (when not, their own error says enough) and every problem of a run is found in one
    pass."""

    app: Annotated[Literal[APPS], Field(description=f"must be one of {', '.join(APPS)}")]
    op: Annotated[str, Field(description=f"must be one of {', '.join(OPS)}")] = "allgather"
    algorithms: _list(str, f"must be a non-empty list of at most {MAX_ENTRIES} algorithm names",
                      optional=True) = None
    tools: _list(Literal[TOOLS], f"must be a non-empty list from {', '.join(TOOLS)}",
                 optional=True) = None
    nodes: _wholes("nodes") = [2]
    sizes: _wholes("sizes")
    stages: _whole("stages") = 10
    warmup: _whole("warmup") = 1
    transport: Annotated[_list(Literal[TRANSPORTS], f"must be one of {', '.join(TRANSPORTS)} or "
                               "a list of them", optional=True),
                         BeforeValidator(lambda v: [v] if isinstance(v, str) else v)] = None
    sample_load: Annotated[bool, Field(description="must be true or false")] = False
    tight: Annotated[bool, Field(description="must be true or false")] = False
    netem: _list(Annotated[Any, AfterValidator(_impairment)],
                 f"must be a non-empty list of at most {MAX_ENTRIES} tables, e.g. "
                 "[{}, {loss = 1.0}]") = [{}]
    mtu: _wholes("mtu", optional=True) = None
    timeout_s: _whole("timeout_s", optional=True) = None
    ranks_per_node: _whole("ranks_per_node", optional=True) = None
    pairs: _wholes("pairs", optional=True) = None
    compression: _list(Literal[codecs.NAMES], f"must be a non-empty list from "
                       f"{', '.join(codecs.NAMES)}", optional=True) = None
    data: _list(Literal[ops.PATTERNS], f"must be a non-empty list from {', '.join(ops.PATTERNS)}",
                optional=True) = None

    @field_validator("op")
    @classmethod
    def _op_known(cls, op: str, info: ValidationInfo) -> str:
        known = tuple(ops.COLLECTIVES)
        if info.data.get("app") in ("rxelab", "mpi", "gloo") and op not in known:
            raise _bad(f"must be one of {', '.join(known)}, not {_short(op)}")
        if info.data.get("app") == "mpi" and ops.COLLECTIVES[op].mpi is None:
            raise _bad(f"{op} has no MPI counterpart (its description names none)")
        if info.data.get("app") == "gloo" and ops.COLLECTIVES[op].gloo is None:
            raise _bad(f"{op} has no Gloo counterpart in torch 1.13 (its description names none)")
        return op

    @field_validator("algorithms")
    @classmethod
    def _algorithms_fit(cls, names: list[str], info: ValidationInfo) -> list[str]:
        if info.data.get("app") == "perftest":
            raise _bad("perftest runs take `tools`")
        allowed = _algorithms(info.data.get("app"), info.data.get("op"))
        if allowed and not set(names or ()) <= set(allowed):
            raise _bad(f"must be a non-empty list from {', '.join(allowed)}, not {_short(names)}")
        return names

    @field_validator(*ONLY, check_fields=False)
    @classmethod
    def _only_one_app(cls, value: Any, info: ValidationInfo) -> Any:
        app, refusal = ONLY[str(info.field_name)]
        if info.data.get("app") not in (None, app):
            raise _bad(refusal)
        return value

    @field_validator("tight", "data")
    @classmethod
    def _collectives_only(cls, value: Any, info: ValidationInfo) -> Any:
        if value and info.data.get("app") == "perftest":
            why = "runs its own loop" if info.field_name == "tight" else "moves its own bytes"
            raise _bad(f"perftest {why}: only rxelab, mpi and gloo runs take `{info.field_name}`")
        return value

    @field_validator("compression")
    @classmethod
    def _codec_fits(cls, names: list[str], info: ValidationInfo) -> list[str]:
        described = ops.COLLECTIVES.get(info.data.get("op") or "")
        lossy = [n for n in names if n != codecs.NONE and codecs.CODECS[n].lossy]
        if described is not None and lossy and (not described.reduces or
                                                described.dtype not in codecs.LOSSY_DTYPES):
            raise _bad(f"{', '.join(lossy)} round values: only for allreduce and reduce_scatter "
                       f"(float sums), not {described.name}")
        return names

    @field_validator("nodes")
    @classmethod
    def _one_link(cls, nodes: list[int], info: ValidationInfo) -> list[int]:
        if info.data.get("app") == "perftest" and set(nodes) != {2}:
            raise _bad("perftest measures one link: nodes = [2]")
        return nodes

    @field_validator("pairs")
    @classmethod
    def _sequential_only(cls, pairs: list[int], info: ValidationInfo) -> list[int]:
        app, op = info.data.get("app"), info.data.get("op")
        if app is None or op is None:  # their own errors say enough
            return pairs
        names = info.data.get("algorithms") or _algorithms(app, op)
        if (app != "rxelab" or op not in ("alltoall", "allgather")
                or set(names) != {"sequential"}):
            raise _bad("only rxelab's sequential alltoall and allgather take pairs")
        return pairs


def _option(o: library.Option) -> Any:
    if o.kind is int:
        return _whole(o.name, optional=True)
    return Annotated[float | None, Field(ge=o.low, le=o.high, allow_inf_nan=False,
                                         description=f"must be a number from {o.low} to {o.high}")]


def _span(low: int | float, high: int | float, whole: bool = True) -> Any:
    kind = "a whole number" if whole else "a number"
    return Annotated[int if whole else float, Field(ge=low, le=high, description=(
        f"must be from {low} to {high} ({kind})"))]


class _Event(_Strict):
    step: _span(1, 100_000)
    kill: _span(0, 64 * 8 - 1) | None = None
    partition: _span(1, 64) | None = None
    join: _span(1, 64) | None = None

    @model_validator(mode="after")
    def _one_action(self) -> "_Event":
        if sum(x is not None for x in (self.kill, self.partition, self.join)) != 1:
            raise _bad("an event does one thing: kill = rank, partition = node or join = node")
        return self


class _ElasticDoc(_Strict):
    nodes: _span(2, 64) = 3
    ranks_per_node: _span(1, 8) = 2
    steps: _span(2, 100_000) = 40
    size: _span(4, 1 << 30) = 65536
    admit_every: _span(1, 100_000) = 5
    pause: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False,
                                  description="must be from 0 to 10 seconds")] = 0.0
    timeout_s: _span(10, 604_800) = 900
    mpi: Annotated[bool, Field(strict=True, description="must be true or false")] = True
    events: Annotated[list[_Event], Field(min_length=1, max_length=16, description=(
        "must be a list of 1 to 16 events"))]

    @model_validator(mode="after")
    def _possible(self) -> "_ElasticDoc":
        if self.size % 4:
            raise _bad("size must be a multiple of 4 (float32)")
        ranks = self.nodes * self.ranks_per_node
        steps = [e.step for e in self.events]
        if steps != sorted(steps) or steps[-1] >= self.steps:
            raise _bad(f"events must come in order of their steps, all before step {self.steps}")
        cut: dict[int, int] = {}  # node -> the step it is cut off at
        killed: set[int] = set()
        for e in self.events:
            if e.kill is not None and not 0 <= e.kill < ranks:
                raise _bad(f"kill = {e.kill}: a rank from 0 to {ranks - 1}")
            if e.join is not None and 0 in killed:
                raise _bad(f"join at step {e.step}: rank 0, the newcomers' rendezvous, is "
                           "killed before it")
            if e.kill is not None:
                if e.kill in killed:
                    raise _bad(f"kill = {e.kill}: that rank is killed twice")
                killed.add(e.kill)
                if e.kill // self.ranks_per_node + 1 in cut:
                    raise _bad(f"kill = {e.kill}: its node is cut off by then")
            if e.partition is not None:
                if e.partition in cut:
                    raise _bad(f"partition = {e.partition}: that node is cut off twice")
                cut[e.partition] = e.step
            if e.join is not None:
                if e.join in cut:
                    raise _bad(f"join = {e.join}: that node is cut off by then (a newcomer "
                               "there could not reach the rendezvous)")
                if not any(k % self.admit_every == 0 for k in range(e.step, self.steps)):
                    raise _bad(f"join at step {e.step}: no admit point (every "
                               f"{self.admit_every} steps) comes after it before step "
                               f"{self.steps}")
            node = e.partition if e.partition is not None else e.join
            if node is not None and not (1 < node <= self.nodes if e.partition else
                                         1 <= node <= self.nodes):
                raise _bad(f"node {node}: from {2 if e.partition else 1} to {self.nodes} "
                           "(node 1 holds rank 0, the newcomers' rendezvous)")
        return self


_RunDoc = create_model("_RunDoc", __base__=_RunFields,
                       **{o.name: (_option(o), None) for o in library.OPTIONS})


class _SpecDoc(_Strict):
    name: Annotated[str, Field(pattern=NAME, description=(
        "must be a plain name (it names the results directory): a letter or digit, then up to 63 "
        "letters, digits, '.', '_' or '-'"))]
    description: Annotated[str, Field(max_length=2000, description=(
        "must be text of at most 2000 characters"))] = ""
    rounds: _whole("rounds") = 1
    launcher: Annotated[Literal[LAUNCHERS], Field(description=(
        f"must be one of {', '.join(LAUNCHERS)}"))] = "ssh"
    runs: _list(_RunDoc, f"must be a non-empty list of at most {MAX_ENTRIES} [[runs]] tables",
                optional=True) = None
    elastic: _ElasticDoc | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> "_SpecDoc":
        if (self.runs is None) == (self.elastic is None):
            raise _bad("a spec has either [[runs]] or one [elastic] table")
        if self.elastic is not None and self.rounds != 1:
            raise _bad("an elastic scenario runs once: rounds = 1")
        if self.elastic is not None and self.launcher != "ssh":
            raise _bad("an elastic scenario starts its own ranks (and newcomers) over SSH: "
                       "launcher = \"srun\" is for [[runs]]")
        return self


KEYS = set(_RunDoc.model_fields)


def _where(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """Which part of the document an error is about: a list of numbers or names is one field
    (runs[0].sizes), a run and an impairment are each their own (runs[1], runs[1].netem[2]),
    and so is an elastic event's field (elastic.events[0].kill)."""
    if loc[:1] == ("elastic",):
        return loc[:4]
    return loc[:4] if loc[2:3] == ("netem",) else loc[:3]


def _field(where: tuple[str | int, ...]) -> FieldInfo:
    """The model field an error is about; the document or a run is a table, not a field."""
    if len(where) == 1:
        return _SpecDoc.model_fields[str(where[0])]
    if where[0] == "elastic":
        return (_ElasticDoc.model_fields[str(where[1])] if len(where) == 2 else
                _Event.model_fields[str(where[3])] if len(where) == 4 else FieldInfo())
    return _RunDoc.model_fields[str(where[2])] if len(where) > 2 else FieldInfo()


def _problem(err: Any, doc: Any) -> str:
    """One line of a SpecError: where, then what is allowed there and what was found."""
    where = _where(err["loc"])
    if err["type"] == "extra_forbidden":
        return f"{spell(where[:-1])}: unknown key {_short(where[-1])}"
    if err["type"] == "spec":
        return f"{spell(where)}: {err['ctx']['what']}"
    what = _field(where).description or "must be a table"
    if err["type"] == "missing":
        return f"{spell(where)}: missing; {what}"
    for part in where:
        doc = doc[part]
    return f"{spell(where)}: {what}, not {_short(doc)}"


def _listing(lines: list[str]) -> str:
    """Every problem once; of a file broken everywhere, enough to start with."""
    lines = [line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "..."
             for line in dict.fromkeys(lines)]
    more = [f"... and {len(lines) - MAX_PROBLEMS} more"] if len(lines) > MAX_PROBLEMS else []
    return "\n  ".join(lines[:MAX_PROBLEMS] + more)


def _run(r: _RunDoc) -> Run:
    """A checked [[runs]] table with its defaults filled in."""
    if r.app == "perftest":
        names = r.tools or ["ib_write_bw"]
    else:
        names = r.algorithms or (["mpi-default"] if r.app == "mpi" else
                                 list(GLOO_ALGORITHMS) if r.app == "gloo"
                                 else list(ops.COLLECTIVES[r.op].algorithms))
    return Run(r.app, r.op if r.app != "perftest" else "link", tuple(names), tuple(r.nodes),
               tuple(r.sizes), r.stages, r.warmup,
               tuple(r.transport or TRANSPORTS) if r.app == "mpi" else (None,), r.sample_load,
               tuple(dict(imp) for imp in r.netem), tuple(r.mtu or (None,)), r.timeout_s,
               tuple((k, getattr(r, k)) for k in RXELAB_ONLY if getattr(r, k) is not None),
               tuple(r.pairs or (None,)), r.tight, tuple(r.data or (None,)),
               tuple(r.compression or (None,)))


def parse(doc: dict[str, Any], source: str = "spec") -> Spec:
    """The spec a TOML document describes. Every problem is found before anything runs and all
    are listed in one SpecError, so a spec is fixed in one go."""
    try:
        checked = _SpecDoc.model_validate(doc)
    except ValidationError as err:
        problems = _listing([_problem(e, doc) for e in err.errors(include_url=False)])
        raise SpecError(f"{source} is not a valid experiment spec:\n  {problems}") from None
    return Spec(checked.name, checked.description, tuple(_run(r) for r in checked.runs or ()),
                source, checked.rounds,
                checked.elastic.model_dump(exclude_none=True) if checked.elastic else None,
                checked.launcher)


# --- the file ------------------------------------------------------------------------------

def find(name_or_path: str) -> Path:
    """A .toml path as given (load says what is wrong with it), else the shipped spec of that
    name."""
    path = Path(name_or_path)
    if path.suffix == ".toml":
        return path
    candidate = SPECS / f"{name_or_path}.toml"
    if candidate.is_file():
        return candidate
    known = ", ".join(sorted(p.stem for p in SPECS.glob("*.toml")))
    raise SpecError(f"no experiment spec {name_or_path!r} (shipped: {known}; or give a .toml path)")


def _document(path: Path) -> dict[str, Any]:
    """The TOML in a file: anything else is a one-line SpecError, never a traceback."""
    try:
        return documents.load(path, tomllib.loads, "TOML", MAX_BYTES)  # type: ignore[no-any-return]
    except documents.DocumentError as err:
        raise SpecError(f"{path}: {err}") from None


def load(name_or_path: str) -> Spec:
    path = find(name_or_path)
    return parse(_document(path), str(path))

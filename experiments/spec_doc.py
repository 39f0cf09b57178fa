"""An experiment spec's document as written (experiments/spec.py describes the format): its
vocabulary and ranges, and the pydantic models that check a TOML document against them.

A field's description is the message for any problem with its value; the cross-field rules
raise their own (bad). Either way experiments.spec's SpecError names the field."""

import reprlib
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from rxelab import codecs, ops
from rxelab import settings as library

from experiments import netem
from infra import settings as lab_settings

App = Literal["rxelab", "mpi", "gloo", "perftest"]
APPS: tuple[str, ...] = get_args(App)
GLOO_ALGORITHMS = ("gloo-default",)  # Gloo picks its own; the label names the contender's row
OPS = tuple(ops.COLLECTIVES)


def spoken(names: list[str] | tuple[str, ...]) -> str:
    """a, b and c."""
    return " and ".join(filter(None, (", ".join(names[:-1]), *names[-1:])))


def lossy_fits(c: ops.Collective) -> bool:
    """Whether a lossy codec may code its test data: a float sum."""
    return c.reduces and c.dtype in codecs.LOSSY_DTYPES


LOSSY_OPS = tuple(c.name for c in ops.COLLECTIVES.values() if lossy_fits(c))
# perftest's tools by their names (rxelab.perftest says each one's command; a test holds the
# two lists equal): ib_write_bw_bidir is `ib_write_bw -b`
Tool = Literal["ib_write_bw", "ib_write_bw_bidir", "ib_send_bw", "ib_send_lat"]
TOOLS: tuple[str, ...] = get_args(Tool)
Transport = Literal["ucx", "tcp"]
TRANSPORTS: tuple[str, ...] = get_args(Transport)
Launcher = Literal["ssh", "srun"]
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
# The library's names, read now. Pydantic checks a value against a Literal of them; mypy, which
# cannot spell a Literal from a tuple, sees a str.
if TYPE_CHECKING:
    CodecName = str
    Pattern = str
else:
    CodecName = Literal[codecs.NAMES]
    Pattern = Literal[ops.PATTERNS]
# rxelab runs take every option of init(), under its own name and in its own range
LIBRARY = {o.name: (o.low, o.high) for o in library.OPTIONS}
RXELAB_ONLY = {"ranks_per_node": (1, 8), **LIBRARY}
MTU_RANGE = lab_settings.BY_NAME["MTU"].bounds  # what a lab's data network can be set to
# Whole numbers' ranges: what the lab can do, far below where a deadline or a buffer overflows.
BOUNDS = {"nodes": (1, 64), "sizes": (0, 1 << 30), "stages": (1, 10_000_000), "rounds": (1, 20),
          "warmup": (0, 1_000_000), "timeout_s": (10, 604_800), "mtu": MTU_RANGE,
          "pairs": (1, 64 * 8 * (64 * 8 - 1) // 2), "busy_neighbours": (0, 63), **RXELAB_ONLY}
MAX_ENTRIES = 64  # of every list
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"  # pydantic's regex: $ is the very end, no newline


def short(value: Any) -> str:
    return reprlib.repr(value)


def bad(what: str) -> PydanticCustomError:
    """A cross-field rule's own message (SpecError shows it as it is)."""
    return PydanticCustomError("spec", "{what}", {"what": what})


# --- the fields' constraints, each with its message ----------------------------------------

def _whole(key: str) -> Any:
    low, high = BOUNDS[key]
    return Field(ge=low, le=high, description=f"must be from {low} to {high} (a whole number)")


def _within(key: str) -> Any:
    """One of a list's whole numbers (the list's own message says what is wrong)."""
    low, high = BOUNDS[key]
    return Field(ge=low, le=high)


def _entries(what: str) -> Any:
    return Field(min_length=1, max_length=MAX_ENTRIES, description=what)


def _wholes(key: str) -> Any:
    low, high = BOUNDS[key]
    return _entries(f"must be from {low} to {high} (a non-empty list of at most {MAX_ENTRIES} "
                    "whole numbers)")


def _span(low: int, high: int) -> Any:
    return Field(ge=low, le=high, description=f"must be from {low} to {high} (a whole number)")


def _listed(value: Any) -> Any:
    """One name stands for a list of it."""
    return [value] if isinstance(value, str) else value


def _impairment(imp: Any) -> Any:
    """netem.py's own rules, so a spec and the runner agree on what an impairment is."""
    if found := netem.problems(imp):
        raise bad("; ".join(found))
    return imp


def algorithms(app: str | None, op: str | None) -> tuple[str, ...]:
    """What a run of `app` may run for `op`; () when either is not known."""
    if app == "rxelab":
        described = ops.COLLECTIVES.get(op or "")  # read now: one registered later counts
        return tuple(described.algorithms) if described else ()
    if app == "mpi":
        described = ops.COLLECTIVES.get(op or "")
        return tuple(described.mpi.tuned) if described and described.mpi else ()
    if app == "gloo":
        return GLOO_ALGORITHMS
    return TOOLS if app == "perftest" else ()


# key -> (the only app that takes it, what to say to the others)
ONLY = {"tools": ("perftest", "only perftest runs take `tools`"),
        "transport": ("mpi", "only mpi runs choose a transport"),
        "compression": ("rxelab", "only rxelab runs compress"),
        **{k: ("rxelab", "only rxelab runs take it") for k in (*RXELAB_ONLY, "busy_neighbours")}}


# --- the models ----------------------------------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RunFields(_Strict):
    """One [[runs]] table (the library's options are added below, as RunDoc). Fields are
    checked in this order, so a cross-field rule sees the app and op above it, when they are
    valid (when not, their own error says enough) and every problem of a run is found in one
    pass."""

    app: Annotated[App, Field(description=f"must be one of {', '.join(APPS)}")]
    op: Annotated[str, Field(description=f"must be one of {', '.join(OPS)}")] = "allgather"
    algorithms: Annotated[list[str] | None, _entries(
        f"must be a non-empty list of at most {MAX_ENTRIES} algorithm names")] = None
    tools: Annotated[list[Tool] | None, _entries(
        f"must be a non-empty list from {', '.join(TOOLS)}")] = None
    nodes: Annotated[list[Annotated[int, _within("nodes")]], _wholes("nodes")] = [2]
    sizes: Annotated[list[Annotated[int, _within("sizes")]], _wholes("sizes")]
    stages: Annotated[int, _whole("stages")] = 10
    warmup: Annotated[int, _whole("warmup")] = 1
    transport: Annotated[list[Transport] | None, _entries(
        f"must be one of {', '.join(TRANSPORTS)} or a list of them"), BeforeValidator(_listed)] = None
    sample_load: Annotated[bool, Field(description="must be true or false")] = False
    tight: Annotated[bool, Field(description="must be true or false")] = False
    busy_neighbours: Annotated[int, _whole("busy_neighbours")] = 0
    netem: Annotated[list[Annotated[Any, AfterValidator(_impairment)]], _entries(
        f"must be a non-empty list of at most {MAX_ENTRIES} tables, e.g. [{{}}, {{loss = 1.0}}]")] = [{}]
    mtu: Annotated[list[Annotated[int, _within("mtu")]] | None, _wholes("mtu")] = None
    timeout_s: Annotated[int | None, _whole("timeout_s")] = None
    ranks_per_node: Annotated[int | None, _whole("ranks_per_node")] = None
    pairs: Annotated[list[Annotated[int, _within("pairs")]] | None, _wholes("pairs")] = None
    compression: Annotated[list[CodecName] | None, _entries(
        f"must be a non-empty list from {', '.join(codecs.NAMES)}")] = None
    data: Annotated[list[Pattern] | None, _entries(
        f"must be a non-empty list from {', '.join(ops.PATTERNS)}")] = None

    @field_validator("op")
    @classmethod
    def _op_known(cls, op: str, info: ValidationInfo) -> str:
        known = tuple(ops.COLLECTIVES)
        if info.data.get("app") in ("rxelab", "mpi", "gloo") and op not in known:
            raise bad(f"must be one of {', '.join(known)}, not {short(op)}")
        if info.data.get("app") == "mpi" and ops.COLLECTIVES[op].mpi is None:
            raise bad(f"{op} has no MPI counterpart (its description names none)")
        if info.data.get("app") == "gloo" and ops.COLLECTIVES[op].gloo is None:
            raise bad(f"{op} has no Gloo counterpart {ops.COLLECTIVES[op].no_gloo} (its "
                      "description names none)")
        return op

    @field_validator("algorithms")
    @classmethod
    def _algorithms_fit(cls, names: list[str], info: ValidationInfo) -> list[str]:
        if info.data.get("app") == "perftest":
            raise bad("perftest runs take `tools`")
        allowed = algorithms(info.data.get("app"), info.data.get("op"))
        if allowed and not set(names or ()) <= set(allowed):
            raise bad(f"must be a non-empty list from {', '.join(allowed)}, not {short(names)}")
        return names

    @field_validator(*ONLY, check_fields=False)
    @classmethod
    def _only_one_app(cls, value: Any, info: ValidationInfo) -> Any:
        app, refusal = ONLY[str(info.field_name)]
        if info.data.get("app") not in (None, app):
            raise bad(refusal)
        return value

    @field_validator("tight", "data")
    @classmethod
    def _collectives_only(cls, value: Any, info: ValidationInfo) -> Any:
        if value and info.data.get("app") == "perftest":
            why = "runs its own loop" if info.field_name == "tight" else "moves its own bytes"
            raise bad(f"perftest {why}: only rxelab, mpi and gloo runs take `{info.field_name}`")
        return value

    @field_validator("compression")
    @classmethod
    def _codec_fits(cls, names: list[str], info: ValidationInfo) -> list[str]:
        described = ops.COLLECTIVES.get(info.data.get("op") or "")
        lossy = [n for n in names if n != codecs.NONE and codecs.CODECS[n].lossy]
        if described is not None and lossy and not lossy_fits(described):
            raise bad(f"{', '.join(lossy)} round values: only for {spoken(LOSSY_OPS)} "
                      f"(float sums), not {described.name}")
        return names

    @field_validator("nodes")
    @classmethod
    def _one_link(cls, nodes: list[int], info: ValidationInfo) -> list[int]:
        if info.data.get("app") == "perftest" and not set(nodes) <= {1, 2}:
            raise bad("perftest measures one link: nodes = [2] (or [1]: rxe's loopback on one node)")
        return nodes

    @field_validator("pairs")
    @classmethod
    def _sequential_only(cls, pairs: list[int], info: ValidationInfo) -> list[int]:
        app, op = info.data.get("app"), info.data.get("op")
        if app is None or op is None:  # their own errors say enough
            return pairs
        names = info.data.get("algorithms") or algorithms(app, op)
        described = ops.COLLECTIVES.get(op)
        if app != "rxelab" or described is None or not described.windowed \
                or not set(names) <= set(described.windowed):
            windowed = [c for c in ops.COLLECTIVES.values() if c.windowed]
            kinds = spoken(sorted({a for c in windowed for a in c.windowed}))
            raise bad(f"only rxelab's {kinds} {spoken([c.name for c in windowed])} take pairs")
        return pairs


def _option(o: library.Option) -> Any:
    """init()'s option `o` as a run's field: its type with its range and message."""
    if o.kind is int:
        return Annotated[int | None, _whole(o.name)]
    return Annotated[float | None, Field(ge=o.low, le=o.high, allow_inf_nan=False,
                                         description=f"must be a number from {o.low} to {o.high}")]


# A [[runs]] table: RunFields and init()'s options, each an optional field of its own name. The
# options are made here, from the library's list, so mypy knows a RunDoc as a RunFields (and
# the options are read by name).
if TYPE_CHECKING:
    RunDoc = RunFields
else:
    _OPTION_FIELDS = {o.name: (_option(o), None) for o in library.OPTIONS}
    RunDoc = create_model("RunDoc", __base__=RunFields, **_OPTION_FIELDS)


class Event(_Strict):
    step: Annotated[int, _span(1, 100_000)]
    kill: Annotated[int, _span(0, 64 * 8 - 1)] | None = None
    partition: Annotated[int, _span(1, 64)] | None = None
    join: Annotated[int, _span(1, 64)] | None = None

    @model_validator(mode="after")
    def _one_action(self) -> "Event":
        if sum(x is not None for x in (self.kill, self.partition, self.join)) != 1:
            raise bad("an event does one thing: kill = rank, partition = node or join = node")
        return self


class ElasticDoc(_Strict):
    nodes: Annotated[int, _span(2, 64)] = 3
    ranks_per_node: Annotated[int, _span(1, 8)] = 2
    steps: Annotated[int, _span(2, 100_000)] = 40
    size: Annotated[int, _span(4, 1 << 30)] = 65536
    admit_every: Annotated[int, _span(1, 100_000)] = 5
    pause: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False,
                                  description="must be from 0 to 10 seconds")] = 0.0
    timeout_s: Annotated[int, _span(10, 604_800)] = 900
    mpi: Annotated[bool, Field(strict=True, description="must be true or false")] = True
    events: Annotated[list[Event], Field(min_length=1, max_length=16, description=(
        "must be a list of 1 to 16 events"))]

    @model_validator(mode="after")
    def _possible(self) -> "ElasticDoc":
        if self.size % 4:
            raise bad("size must be a multiple of 4 (float32)")
        ranks = self.nodes * self.ranks_per_node
        steps = [e.step for e in self.events]
        if steps != sorted(steps) or steps[-1] >= self.steps:
            raise bad(f"events must come in order of their steps, all before step {self.steps}")
        cut: dict[int, int] = {}  # node -> the step it is cut off at
        killed: set[int] = set()
        for e in self.events:
            if e.kill is not None and not 0 <= e.kill < ranks:
                raise bad(f"kill = {e.kill}: a rank from 0 to {ranks - 1}")
            if e.join is not None and 0 in killed:
                raise bad(f"join at step {e.step}: rank 0, the newcomers' rendezvous, is "
                          "killed before it")
            if e.kill is not None:
                if e.kill in killed:
                    raise bad(f"kill = {e.kill}: that rank is killed twice")
                killed.add(e.kill)
                if e.kill // self.ranks_per_node + 1 in cut:
                    raise bad(f"kill = {e.kill}: its node is cut off by then")
            if e.partition is not None:
                if e.partition in cut:
                    raise bad(f"partition = {e.partition}: that node is cut off twice")
                cut[e.partition] = e.step
            if e.join is not None:
                if e.join in cut:
                    raise bad(f"join = {e.join}: that node is cut off by then (a newcomer "
                              "there could not reach the rendezvous)")
                if not any(k % self.admit_every == 0 for k in range(e.step, self.steps)):
                    raise bad(f"join at step {e.step}: no admit point (every "
                              f"{self.admit_every} steps) comes after it before step "
                              f"{self.steps}")
            node = e.partition if e.partition is not None else e.join
            if node is not None and not (1 < node <= self.nodes if e.partition else
                                         1 <= node <= self.nodes):
                raise bad(f"node {node}: from {2 if e.partition else 1} to {self.nodes} "
                          "(node 1 holds rank 0, the newcomers' rendezvous)")
        return self


DDP_HOOKS = ("none", "fp16", "bf16")  # apps/ddp_train.py's --hooks


class DdpDoc(_Strict):
    """apps/ddp_train.py on the nodes, once per bucket size (experiments/ddp.py)."""

    nodes: Annotated[int, _span(2, 64)] = 3
    width: Annotated[int, _span(16, 8192)] = 768
    depth: Annotated[int, _span(2, 32)] = 4
    batch: Annotated[int, _span(1, 4096)] = 16
    steps: Annotated[int, _span(1, 10_000)] = 4
    warmup: Annotated[int, _span(1, 1000)] = 2
    rounds: Annotated[int, _span(1, 20)] = 3
    bucket_mb: Annotated[list[Annotated[float, Field(gt=0, le=1024, allow_inf_nan=False)]],
                         Field(min_length=1, max_length=16, description=(
                             "must be a list of 1 to 16 bucket caps in MB, above 0 and at most "
                             "1024"))] = [25.0]
    hooks: Annotated[list[Literal["none", "fp16", "bf16"]], Field(
        min_length=1, max_length=3, description=(
            f"must be a list of DDP hooks, of {', '.join(DDP_HOOKS)}"))] = ["none"]
    codec: Annotated[bool, Field(strict=True, description="must be true or false")] = False
    wraps: Annotated[list[Literal["fsdp", "fsdp2"]], Field(max_length=2, description=(
        "must be a list of sharded variants beside DDP's, of fsdp, fsdp2"))] = []
    timeout_s: Annotated[int, _span(10, 604_800)] = 3600

    @model_validator(mode="after")
    def _distinct(self) -> "DdpDoc":
        if any(len(set(v)) != len(v) for v in (self.hooks, self.bucket_mb, self.wraps)):
            raise bad("hooks, bucket_mb and wraps each name a value once")
        return self


class SpecDoc(_Strict):
    name: Annotated[str, Field(pattern=NAME, description=(
        "must be a plain name (it names the results directory): a letter or digit, then up to 63 "
        "letters, digits, '.', '_' or '-'"))]
    description: Annotated[str, Field(max_length=2000, description=(
        "must be text of at most 2000 characters"))] = ""
    rounds: Annotated[int, _whole("rounds")] = 1
    launcher: Annotated[Launcher, Field(description=(
        f"must be one of {', '.join(LAUNCHERS)}"))] = "ssh"
    runs: Annotated[list[RunDoc] | None, _entries(
        f"must be a non-empty list of at most {MAX_ENTRIES} [[runs]] tables")] = None
    elastic: ElasticDoc | None = None
    ddp: DdpDoc | None = None
    include: Annotated[list[Annotated[str, Field(pattern=NAME)]] | None, Field(
        min_length=1, max_length=8, description="must be a list of 1 to 8 shipped specs' names")] = None

    @model_validator(mode="after")
    def _one_kind(self) -> "SpecDoc":
        if [self.runs, self.elastic, self.ddp].count(None) != 2:
            raise bad("a spec has either [[runs]], one [elastic] table or one [ddp] table")
        if self.include is not None and (self.runs is None or len(set(self.include)) < len(self.include)):
            raise bad("include adds [[runs]] to a spec's own, each spec once: a spec of [[runs]] only")
        if self.ddp is not None and (self.rounds != 1 or self.launcher != "ssh"):
            raise bad("a [ddp] scenario alternates its own rounds (ddp.rounds) and starts its "
                      "ranks with our launcher: leave rounds and launcher out")
        if self.elastic is not None and self.rounds != 1:
            raise bad("an elastic scenario runs once: rounds = 1")
        if self.elastic is not None and self.launcher != "ssh":
            raise bad("an elastic scenario starts its own ranks (and newcomers) over SSH: "
                      "launcher = \"srun\" is for [[runs]]")
        return self


KEYS = set(RunDoc.model_fields)

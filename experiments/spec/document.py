"""An experiment spec's document as written (experiments/spec/__init__.py describes the format): the
pydantic models that check a TOML document, a [[runs]] table's fields and the spec around
them; the vocabulary and ranges they use are experiments/spec/fields.py's, the scenarios
experiments/spec/scenarios.py's.

A field's description is the message for any problem with its value; the cross-field rules
raise their own (bad). Either way experiments.spec's SpecError names the field."""

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from rxelab import codecs, ops
from rxelab import settings as library
from rxelab.bench import HAND_LOOP, HAND_MAX

from experiments.spec.fields import (
    APP_TRANSPORTS,
    APPS,
    LAUNCHERS,
    LOSSY_OPS,
    MAX_ENTRIES,
    NAME,
    ONLY,
    OPS,
    TOOLS,
    TRANSPORTS,
    App,
    CodecName,
    Launcher,
    Pattern,
    Strict,
    Tool,
    Transport,
    algorithms,
    bad,
    entries,
    impairment,
    listed,
    lossy_fits,
    short,
    spoken,
    whole,
    wholes,
    within,
)
from experiments.spec.scenarios import DdpDoc, ElasticDoc


class RunFields(Strict):
    """One [[runs]] table (the library's options are added below, as RunDoc). Fields are
    checked in this order, so a cross-field rule sees the app and op above it, when they are
    valid (when not, their own error says enough) and every problem of a run is found in one
    pass."""

    app: Annotated[App, Field(description=f"must be one of {', '.join(APPS)}")]
    op: Annotated[str, Field(description=f"must be one of {', '.join(OPS)}")] = "allgather"
    algorithms: Annotated[list[str] | None, entries(
        f"must be a non-empty list of at most {MAX_ENTRIES} algorithm names")] = None
    tools: Annotated[list[Tool] | None, entries(
        f"must be a non-empty list from {', '.join(TOOLS)}")] = None
    nodes: Annotated[list[Annotated[int, within("nodes")]], wholes("nodes")] = [2]
    sizes: Annotated[list[Annotated[int, within("sizes")]], wholes("sizes")]
    stages: Annotated[int, whole("stages")] = 10
    warmup: Annotated[int, whole("warmup")] = 1
    transport: Annotated[list[Transport] | None, entries(
        f"must be one of {', '.join(TRANSPORTS)} or a list of them"), BeforeValidator(listed)] = None
    sample_load: Annotated[bool, Field(description="must be true or false")] = False
    tight: Annotated[bool, Field(description="must be true or false")] = False
    busy_neighbours: Annotated[int, whole("busy_neighbours")] = 0
    netem: Annotated[list[Annotated[Any, AfterValidator(impairment)]], entries(
        f"must be a non-empty list of at most {MAX_ENTRIES} tables, e.g. [{{}}, {{loss = 1.0}}]")] = [{}]
    mtu: Annotated[list[Annotated[int, within("mtu")]] | None, wholes("mtu")] = None
    timeout_s: Annotated[int | None, whole("timeout_s")] = None
    ranks_per_node: Annotated[int | None, whole("ranks_per_node")] = None
    pairs: Annotated[list[Annotated[int, within("pairs")]] | None, wholes("pairs")] = None
    compression: Annotated[list[CodecName] | None, entries(
        f"must be a non-empty list from {', '.join(codecs.NAMES)}")] = None
    data: Annotated[list[Pattern] | None, entries(
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

    @field_validator("sizes")
    @classmethod
    def _hand_loop_sizes(cls, sizes: list[int], info: ValidationInfo) -> list[int]:
        if HAND_LOOP in (info.data.get("algorithms") or ()) \
                and not all(0 < s <= HAND_MAX for s in sizes):
            raise bad(f"the {HAND_LOOP} moves blocks of 1 to {HAND_MAX} bytes (one eager slot), "
                      f"not {short(sizes)}")
        return sizes

    @field_validator("transport")
    @classmethod
    def _transport_fits(cls, names: list[str], info: ValidationInfo) -> list[str]:
        app = info.data.get("app")
        allowed = APP_TRANSPORTS.get(app or "")
        if allowed is None:
            raise bad("only mpi and rxelab runs choose a transport")
        wrong = [n for n in names if n not in allowed]
        if wrong:
            raise bad(f"{app} runs over {' or '.join(allowed)}, not {', '.join(wrong)}")
        if HAND_LOOP in (info.data.get("algorithms") or ()) and set(names) - {"verbs"}:
            raise bad(f"the {HAND_LOOP} is pyverbs by hand: transport = [\"verbs\"] only")
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
        if HAND_LOOP in (info.data.get("algorithms") or ()) and set(names) - {codecs.NONE}:
            raise bad(f"the {HAND_LOOP} sends blocks as they are: compression = [\"none\"] only")
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
        return Annotated[int | None, whole(o.name)]
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


class SpecDoc(Strict):
    name: Annotated[str, Field(pattern=NAME, description=(
        "must be a plain name (it names the results directory): a letter or digit, then up to 63 "
        "letters, digits, '.', '_' or '-'"))]
    description: Annotated[str, Field(max_length=2000, description=(
        "must be text of at most 2000 characters"))] = ""
    rounds: Annotated[int, whole("rounds")] = 1
    launcher: Annotated[Launcher, Field(description=(
        f"must be one of {', '.join(LAUNCHERS)}"))] = "ssh"
    runs: Annotated[list[RunDoc] | None, entries(
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

"""An experiment spec's vocabulary (apps, ops, tools, transports, launchers, the library's
options) and its ranges, and the pydantic constraints its models build fields from
(experiments/spec/document.py, experiments/spec/scenarios.py): each field's description is the
message for any problem with its value, so every range is said once, here."""

import reprlib
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError
from rxelab import codecs, ops
from rxelab import settings as library
from rxelab.bench import HAND_LOOP, HAND_OPS

from experiments.spec import netem
from infra import lab_settings

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
Transport = Literal["ucx", "tcp", "verbs", "quic"]
TRANSPORTS: tuple[str, ...] = get_args(Transport)
# what each app's `transport` means, its default first: Open MPI's (UCX on the RDMA device, or
# TCP), and the library's own (rxelab.settings.TRANSPORTS that this version opens)
APP_TRANSPORTS = {"mpi": ("ucx", "tcp"), "rxelab": ("verbs", "tcp", "quic")}
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
MAX_NODES = 64
MAX_RANKS_PER_NODE = 8
MAX_RANKS = MAX_NODES * MAX_RANKS_PER_NODE
RXELAB_ONLY = {"ranks_per_node": (1, MAX_RANKS_PER_NODE), **LIBRARY}
MTU_RANGE = lab_settings.BY_NAME["MTU"].bounds  # what a lab's data network can be set to
# Whole numbers' ranges: what the lab can do, far below where a deadline or a buffer overflows.
BOUNDS = {"nodes": (1, MAX_NODES), "sizes": (0, 1 << 30), "stages": (1, 10_000_000),
          "rounds": (1, 20), "warmup": (0, 1_000_000), "timeout_s": (10, 604_800),
          "mtu": MTU_RANGE, "pairs": (1, MAX_RANKS * (MAX_RANKS - 1) // 2),
          "busy_neighbours": (0, MAX_NODES - 1), **RXELAB_ONLY}
MAX_ENTRIES = 64  # of every list
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"  # pydantic's regex: $ is the very end, no newline


def short(value: Any) -> str:
    return reprlib.repr(value)


def bad(what: str) -> PydanticCustomError:
    """A cross-field rule's own message (SpecError shows it as it is)."""
    return PydanticCustomError("spec", "{what}", {"what": what})


# --- the fields' constraints, each with its message ----------------------------------------

def whole(key: str) -> Any:
    low, high = BOUNDS[key]
    return Field(ge=low, le=high, description=f"must be from {low} to {high} (a whole number)")


def within(key: str) -> Any:
    """One of a list's whole numbers (the list's own message says what is wrong)."""
    low, high = BOUNDS[key]
    return Field(ge=low, le=high)


def entries(what: str) -> Any:
    return Field(min_length=1, max_length=MAX_ENTRIES, description=what)


def wholes(key: str) -> Any:
    low, high = BOUNDS[key]
    return entries(f"must be from {low} to {high} (a non-empty list of at most {MAX_ENTRIES} "
                    "whole numbers)")


def span(low: int, high: int) -> Any:
    return Field(ge=low, le=high, description=f"must be from {low} to {high} (a whole number)")


def listed(value: Any) -> Any:
    """One name stands for a list of it."""
    return [value] if isinstance(value, str) else value


def impairment(imp: Any) -> Any:
    """netem.py's own rules, so a spec and the runner agree on what an impairment is. A
    profile's name ("rtt-50ms+loss-0.1") becomes its table."""
    if isinstance(imp, str):
        try:
            imp = netem.profile(imp)
        except ValueError as err:
            raise bad(str(err)) from None
    if found := netem.problems(imp):
        raise bad("; ".join(found))
    return imp


def algorithms(app: str | None, op: str | None) -> tuple[str, ...]:
    """What a run of `app` may run for `op`; () when either is not known."""
    if app == "rxelab":
        described = ops.COLLECTIVES.get(op or "")  # read now: one registered later counts
        floor = (HAND_LOOP,) if op in HAND_OPS else ()  # the hand-written loop (rxelab.handloop)
        return (*described.algorithms, *floor) if described else ()
    if app == "mpi":
        described = ops.COLLECTIVES.get(op or "")
        return tuple(described.mpi.tuned) if described and described.mpi else ()
    if app == "gloo":
        return GLOO_ALGORITHMS
    return TOOLS if app == "perftest" else ()


# key -> (the only app that takes it, what to say to the others)
ONLY = {"tools": ("perftest", "only perftest runs take `tools`"),
        "compression": ("rxelab", "only rxelab runs compress"),
        **{k: ("rxelab", "only rxelab runs take it") for k in (*RXELAB_ONLY, "busy_neighbours")}}


# --- the models' base ----------------------------------------------------------------------------

class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

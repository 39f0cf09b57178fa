"""What a run records: a line of its records.jsonl per case and round (`Record`: the case, where
and how it ran, what came of it), with the summary its app printed (`Summary`) or, of a case
that ran out of time, its last progress (`Partial`); and a line of load.jsonl per node of a
case that sampled its load (`Load`). The runner writes them; the report, `fab validate` and
`fab calibrate` read them (experiments.report passes them on to experiments/simulation).

A key is in a line's JSON exactly where the runner set it (`to_json` dumps the keys that were
set, as the dicts before did), so records keep the shape they always had. A line of another
version reads: a key it lacks takes its default, a key this version does not know is kept
(extra="allow"), and a figure that is not a number reads as none (it came from a remote
host: never a traceback over it)."""

from __future__ import annotations

import json
from typing import Annotated, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainValidator, ValidationError

from experiments.spec import Case, netem


def _number(value: object) -> float | None:
    """A figure as it came (an int stays an int), or None for anything that is not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _numbers(value: object) -> list[float] | None:
    """A list's numbers, or None for what is not a list."""
    if not isinstance(value, list):
        return None
    return [x for x in value if _number(x) is not None]


def _said(value: object) -> object:
    """An empty table says nothing: none."""
    return value if value != {} else None


Number = Annotated[float | None, PlainValidator(_number)]
Numbers = Annotated[list[float] | None, PlainValidator(_numbers)]


class Line(BaseModel):
    """A line of a run's files: its JSON holds the keys that were set, no others."""

    model_config = ConfigDict(extra="allow")

    def to_json(self) -> str:
        return json.dumps(self.model_dump(exclude_unset=True))

    @classmethod
    def from_json(cls, line: str) -> Self:
        return cls.model_validate(json.loads(line))


class Summary(Line):
    """An app's summary line (apps/stages.py's report; perftest's, commands.parse_perftest)."""

    record: str = "summary"
    app: str | None = None
    op: str | None = None
    algorithm: str | None = None
    ok: bool = False  # every rank's data verified
    ranks: int | None = None
    tight: bool = False  # the calls went back to back
    total_seconds: Number = None
    avg_stage_us: Number = None  # per call, the slowest rank's
    min_stage_us: Number = None
    max_stage_us: Number = None
    wrong: int | None = None  # bytes that did not verify
    peak_pinned: int | None = None
    peak_inflight: int | None = None
    compression_ratio: Number = None
    codec_ms_per_MiB: Number = None
    wire_bytes_per_call: Number = None
    node_busy: Numbers = None  # the share of its node's CPUs each rank saw busy
    bw_MBps: Number = None  # perftest's bandwidth tools
    lat_us: Number = None  # perftest's latency tool
    iterations: int | None = None


class Partial(Line):
    """The last progress line of a case that ran out of time: the stages it finished."""

    record: str = "progress"
    app: str | None = None
    stages_done: int = 0
    seconds: float = 0.0


class Record(Case):
    """One case in one round, as it ran: a line of records.jsonl."""

    model_config = ConfigDict(frozen=False)

    case: int = 0  # the case's number in its spec
    round: int = 0
    netem_label: str | None = None
    hosts: list[str] = []
    launcher: str | None = None  # how its ranks started
    busy_hosts: list[str] | None = None  # the nodes that ran a CPU loop beside it
    status: str = ""  # ok, wrong, failed, timeout or skipped
    error: str | None = None
    stage_seconds: list[float] | None = None
    partial: Annotated[Partial | None, BeforeValidator(_said)] = None
    summary: Annotated[Summary | None, BeforeValidator(_said)] = None
    after_summary: str | None = None  # how a job that printed its figures then ended badly
    wall_seconds: float = 0.0
    busy_left: list[str] | None = None  # busy neighbours' loops that may still run
    active_mtu: int | None = None  # the RoCE path MTU of its first node
    rxe: dict[str, dict[str, int]] = {}  # per node: what its RDMA counters moved

    def to_json(self) -> str:
        """The keys that were set, its number and round first (as a reader looks for them)."""
        said = self.model_dump(exclude_unset=True)
        return json.dumps({k: said.pop(k) for k in ("case", "round") if k in said} | said)

    @classmethod
    def of(cls, case: Case, index: int, rnd: int, hosts: list[str], launcher: str) -> Record:
        """A case as it starts, before anything came of it."""
        return cls.model_validate({"case": index, "round": rnd, **case.model_dump(exclude_unset=True),
                                   "netem_label": netem.label(case.netem), "hosts": hosts,
                                   "launcher": launcher})


class Sample(Line):
    """One reading of a node's load (apps/load_sampler.py): cumulative counters at time t."""

    t: float
    tx_bytes: int | None = None
    rx_bytes: int | None = None
    sent_pkts: int | None = None
    rcvd_pkts: int | None = None


class Load(Line):
    """A node's load samples during a case (`sample_load`): a line of load.jsonl."""

    case: int
    node: str
    samples: list[Sample] = []


class NotARecord(ValueError):
    """A line of records.jsonl that is no record of any version; says what it lacks, as a
    KeyError would ("'app'")."""


def read_records(text: str) -> list[Record]:
    """The records of a records.jsonl's text, blank lines left out. A line that is no JSON raises
    json's ValueError; one that is JSON but no record, NotARecord."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(Record.from_json(line))
        except ValidationError as err:
            first = err.errors()[0]
            where = repr(".".join(str(x) for x in first["loc"]) or "anything")
            raise NotARecord(where if first["type"] == "missing"
                             else f"{where} as it should be ({first['msg']})") from None
    return out

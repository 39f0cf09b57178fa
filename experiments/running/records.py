"""What a run records: a line of its records.jsonl per case and round (`Record`: the case, where
and how it ran, what came of it), with the summary its app printed (`Summary`) or, of a case
that ran out of time, its last progress (`Partial`); and a line of load.jsonl per node of a
case that sampled its load (`Load`); and the run's environment.json (`Environment`: what the
nodes said of themselves and how the run went). The runner writes them; the report, `fab
validate` and `fab calibrate` read them (experiments.report passes them on to
experiments/simulation).

A key is in a line's JSON exactly where the runner set it (`to_json` dumps the keys that were
set, as the dicts before did), so records keep the shape they always had. A line of another
version reads: a key it lacks takes its default, a key this version does not know is kept
(extra="allow"), and a figure that is not a number reads as none (it came from a remote
host: never a traceback over it)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.model_dump(exclude_unset=True), indent=indent)

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
    cpu_user_us: Number = None  # rank 0's process, per timed call (apps/stages.cpu_per_call)
    cpu_sys_us: Number = None
    bw_MBps: Number = None  # perftest's bandwidth tools
    lat_us: Number = None  # perftest's latency tool
    iterations: int | None = None


class Stage(Line):
    """An app's line for one stage (the slowest rank's time)."""

    record: str = "stage"
    seconds: float


class Partial(Line):
    """The last progress line of a case that ran out of time: the stages it finished."""

    record: str = "progress"
    app: str | None = None
    stages_done: int = 0
    seconds: float = 0.0


class Record(Case):
    """One case in one round, as it ran: a line of records.jsonl. Only its app is a must: a
    line made by hand (or by a tool) that says less reads, what it leaves out empty."""

    model_config = ConfigDict(frozen=False)

    op: str = ""
    algorithm: str = ""
    nodes: int = 0
    size: int = 0
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

    def read_output(self, lines: Sequence[Mapping[str, object]]) -> Summary | None:
        """What the case's app printed (apps.stages.parse_output's lines): the time of each
        stage, and its summary, or, where it printed none, its last progress."""
        summary = next((Summary.model_validate(x) for x in reversed(lines)
                        if x.get("record") == "summary"), None)
        stages = [Stage.model_validate(x).seconds for x in lines if x.get("record") == "stage"]
        if stages:
            self.stage_seconds = stages
        progress = [x for x in lines if x.get("record") == "progress"]
        if summary is None and progress:
            self.partial = Partial.model_validate(progress[-1])
        return summary

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


# ---- environment.json: what the nodes said, kept as they said it ---------------------------
def _kept(*kinds: type) -> PlainValidator:
    """A value as it came where it is of one of `kinds` (a bool is no number), else none: a node
    may say anything, and a report says "unknown" of it rather than fail."""
    def keep(value: object) -> object:
        if isinstance(value, bool) and bool not in kinds:
            return None
        return value if isinstance(value, kinds) else None
    return PlainValidator(keep)


def _table(value: object) -> dict[str, object]:
    """A table of what was said, by name (versions, packages, settings, per node); {} for what
    is no table."""
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def _names(value: object) -> list[str]:
    return [x for x in value if isinstance(x, str)] if isinstance(value, list) else []


def _hosts(value: object) -> dict[str, object] | None:
    """Each node's own account (a table each); None where the run named no nodes."""
    return {str(k): v for k, v in value.items() if isinstance(v, dict)} \
        if isinstance(value, dict) else None


Said = Annotated[str | None, _kept(str)]
Count = Annotated[int | None, _kept(int)]
Time = Annotated[float | None, _kept(int, float)]
Mtu = Annotated[int | str | None, _kept(int, str)]  # "?" where a node did not say
Table = Annotated[dict[str, object], PlainValidator(_table)]


class HostSaid(Line):
    """What one node said of itself (experiments.running.about)."""

    kernel: Said = None
    virtualization: Said = None
    open_mpi: Said = None
    torch: Said = None  # the gloo contender's; said as None where the node has none
    cpus: Count = None
    rdma_device: Said = None


class Environment(Line):
    """A run's environment.json: the runner's own facts (spec, includes, run id, launcher, when
    it started and finished, whether it completed, the data path it found) and what the nodes
    said of themselves (experiments.running.about.environment). Every key may be missing (runs
    of older versions) or odd (a node says anything): it then reads as none."""

    spec: Said = None
    includes: Annotated[list[str], PlainValidator(_names)] = []
    started: Time = None
    finished: Time = None
    complete: Annotated[bool | None, _kept(bool)] = None
    run_id: Said = None
    launcher: Said = None
    nodes: Count = None
    kernel: Said = None
    virtualization: Said = None  # systemd-detect-virt on the first node
    accel: Said = None  # tcg, kvm, none (bare metal) or another hypervisor
    versions: Table = {}
    packages: Table = {}
    active_mtu: Mtu = None  # the RoCE path MTU
    mtu: Mtu = None  # active_mtu's name in runs before it had that one
    netdev_mtu: Mtu = None  # the data NIC's
    ucx_settings: Table = {}
    hosts: Annotated[dict[str, HostSaid] | None, BeforeValidator(_hosts)] = None
    lab_accel: Said = None
    image: Said = None
    lab_host_cpus: Count = None  # the machine whose cores the lab's VMs share
    netdevs: Table = {}
    data_network: Said = None
    rdma_devices: Table = {}
    slurm_nodes: Table = {}

    @classmethod
    def read(cls, text: str) -> Environment:
        """environment.json's text (json's ValueError where it is no JSON); what is no JSON
        object says nothing."""
        said = json.loads(text)
        return cls.model_validate(said if isinstance(said, dict) else {})

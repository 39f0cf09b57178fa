"""What the scenarios write, a line each: elastic.jsonl (`ElasticRecord`, one per contender, by
experiments/running/elastic_scenario.py) and ddp.jsonl (`DdpRecord`, one per variant and bucket
cap or per job that failed or was skipped, by experiments/running/ddp_scenario.py); the report
(experiments/report/elastic.py, ddp.py, plots.py) and `fab run` read them back by attribute.

Like a run's records (records.py), a line keeps its shape: `to_json` writes exactly the keys
that were set, keys a model does not know (the apps' own) are kept (extra="allow"), and the
keys a line may lack read as none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Self

from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    field_serializer,
    model_serializer,
    model_validator,
)

from experiments.spec.scenarios import ElasticDoc


class Line(BaseModel):
    """A JSON object of a scenario's: the keys it was given, no others, on the way out."""

    model_config = ConfigDict(extra="allow")
    _order: tuple[str, ...] = PrivateAttr(default=())  # its keys in the order it was given them

    @model_validator(mode="wrap")
    @classmethod
    def _keep_order(cls, data: object, handler: ModelWrapValidatorHandler[Self]) -> Self:
        got = handler(data)
        if isinstance(data, dict):
            got._order = tuple(data)
        return got

    @model_serializer(mode="wrap")
    def _in_order(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """Its keys in the order it was given them (a line written as it was read, key for
        key), not the order the model declares them."""
        out: dict[str, object] = handler(self)
        rank = {k: i for i, k in enumerate(self._order)}
        return dict(sorted(out.items(), key=lambda kv: rank.get(kv[0], len(rank))))

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_unset=True))

    @classmethod
    def from_json(cls, line: str) -> Self:
        return cls.model_validate(json.loads(line))

    @classmethod
    def load(cls, path: Path) -> list[Self]:
        """The lines of a .jsonl file, or none where there is no such file."""
        if not path.exists():
            return []
        return [cls.from_json(x) for x in path.read_text().splitlines() if x.strip()]


class ElasticEvent(Line):
    """A JSON line of apps/elastic_train.py's ("record": "elastic"), with the host's time of
    arrival; the keys the report reads typed, the rest as the app said them."""

    event: str
    id: int | None = None
    step: int | None = None
    size: int | None = None
    seconds: float | None = None
    generation: int | None = None
    params: str | None = None
    error: str | None = None
    detect_s: float | None = None
    agree_s: float | None = None
    build_s: float | None = None
    lost: list[int] | None = None
    arrived: float | None = None


class Action(Line):
    """What the scenario did from outside: a node cut off (partition), a newcomer started on one
    (join), a NIC brought back (heal, no step)."""

    kind: str
    node: str
    step: int | None = None
    time: float
    ok: bool = True
    error: str | None = None


class JobEnd(Line):
    """How a job (or a newcomer's launcher) ended: its exit code, or "timeout" where it did not
    end by its deadline; when; the end of its output."""

    exit: int | str | None = None
    ended: float | None = None
    tail: str = ""


class ElasticRecord(Line):
    """A line of elastic.jsonl: one contender's job (rxelab's, Open MPI's), how it ended (as
    JobEnd's), what it said, what was done to it and the [elastic] table it ran."""

    contender: str
    started: float
    exit: int | str | None = None
    ended: float | None = None
    tail: str = ""
    actions: list[Action] = []
    newcomers: list[JobEnd] = []
    events: list[ElasticEvent] = []
    spec: ElasticDoc

    @field_serializer("spec")
    def _spec(self, spec: ElasticDoc) -> object:
        return spec.model_dump(exclude_none=True)  # every key, as the spec gave it


class DdpRecord(Line):
    """A line of ddp.jsonl: a variant's figures at a bucket cap (status "ok": apps/ddp_train.py's
    JSON line; bucket_mb none for FSDP's, which shard), or a job that "failed" or a variant or
    job "skipped", with why (error). A line of the app's own has no status."""

    bucket_mb: float | None = None
    status: str | None = None
    exit: int | str | None = None
    error: str | None = None
    variant: str | None = None
    backend: str | None = None
    wrap: str | None = None
    skipped: str | None = None
    reference: str | None = None
    ranks: int | None = None
    params: int | None = None
    steps: int | None = None
    rounds: int | None = None
    bucket_bytes: list[int] = []
    bucket_ms: dict[str, float] = {}
    step_ms: float = 0.0
    step_ms_min: float = 0.0
    step_ms_max: float = 0.0
    same_on_every_rank: bool = False
    matches: bool | None = None
    max_abs_diff: float = 0.0

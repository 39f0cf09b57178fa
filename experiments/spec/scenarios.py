"""The scenarios a spec may hold instead of [[runs]]: an [elastic] table (ranks killed, nodes
cut off and joining while a job goes on, experiments/running/elastic_scenario.py) and a [ddp] table
(apps/ddp_train.py once per bucket size, experiments/running/ddp_scenario.py)."""

from typing import Annotated, Literal, get_args

from pydantic import Field, model_validator

from experiments.spec.fields import BOUNDS, MAX_NODES, MAX_RANKS, Strict, bad, span


class Event(Strict):
    step: Annotated[int, span(1, 100_000)]
    kill: Annotated[int, span(0, MAX_RANKS - 1)] | None = None
    partition: Annotated[int, span(1, MAX_NODES)] | None = None
    join: Annotated[int, span(1, MAX_NODES)] | None = None

    @model_validator(mode="after")
    def _one_action(self) -> "Event":
        if sum(x is not None for x in (self.kill, self.partition, self.join)) != 1:
            raise bad("an event does one thing: kill = rank, partition = node or join = node")
        return self


class ElasticDoc(Strict):
    nodes: Annotated[int, span(2, MAX_NODES)] = 3
    ranks_per_node: Annotated[int, span(*BOUNDS["ranks_per_node"])] = 2
    steps: Annotated[int, span(2, 100_000)] = 40
    size: Annotated[int, span(4, 1 << 30)] = 65536
    admit_every: Annotated[int, span(1, 100_000)] = 5
    pause: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False,
                                  description="must be from 0 to 10 seconds")] = 0.0
    timeout_s: Annotated[int, span(*BOUNDS["timeout_s"])] = 900
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


Hook = Literal["none", "fp16", "bf16"]  # apps/ddp_train.py's --hooks (a test holds them equal)
Wrap = Literal["fsdp", "fsdp2"]  # apps/sharded.py's, beside DDP's own
DDP_HOOKS: tuple[str, ...] = get_args(Hook)
WRAPS: tuple[str, ...] = get_args(Wrap)


class DdpDoc(Strict):
    """apps/ddp_train.py on the nodes, once per bucket size (experiments/running/ddp_scenario.py)."""

    nodes: Annotated[int, span(2, MAX_NODES)] = 3
    width: Annotated[int, span(16, 8192)] = 768
    depth: Annotated[int, span(2, 32)] = 4
    batch: Annotated[int, span(1, 4096)] = 16
    steps: Annotated[int, span(1, 10_000)] = 4
    warmup: Annotated[int, span(1, 1000)] = 2
    rounds: Annotated[int, span(*BOUNDS["rounds"])] = 3
    bucket_mb: Annotated[list[Annotated[float, Field(gt=0, le=1024, allow_inf_nan=False)]],
                         Field(min_length=1, max_length=16, description=(
                             "must be a list of 1 to 16 bucket caps in MB, above 0 and at most "
                             "1024"))] = [25.0]
    hooks: Annotated[list[Hook], Field(
        min_length=1, max_length=len(DDP_HOOKS), description=(
            f"must be a list of DDP hooks, of {', '.join(DDP_HOOKS)}"))] = ["none"]
    codec: Annotated[bool, Field(strict=True, description="must be true or false")] = False
    wraps: Annotated[list[Wrap], Field(max_length=len(WRAPS), description=(
        f"must be a list of sharded variants beside DDP's, of {', '.join(WRAPS)}"))] = []
    timeout_s: Annotated[int, span(*BOUNDS["timeout_s"])] = 3600

    @model_validator(mode="after")
    def _distinct(self) -> "DdpDoc":
        if any(len(set(v)) != len(v) for v in (self.hooks, self.bucket_mb, self.wraps)):
            raise bad("hooks, bucket_mb and wraps each name a value once")
        return self

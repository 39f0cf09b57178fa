"""Experiment specs: TOML files that say what to run, checked strictly before anything runs.

    name = "smoke"            # a plain name (it names the results directory): a letter or
                              #   digit, then up to 63 letters, digits, '.', '_' or '-'
    description = "..."       # at most 2000 characters
    rounds = 1                # every case runs this many times, all cases once per round
                              #   (A, B, A, B, ...); the report gives each case's median, 1..20
    launcher = "ssh"          # how a case's ranks start: ssh (ours, or mpirun, over SSH) or
                              #   srun (Slurm starts them: srun, srun --mpi=pmix for MPI;
                              #   perftest pairs start over SSH either way); [[runs]] only
    include = ["calibrate"]   # shipped specs (experiments/specs) whose [[runs]] run first in
                              #   every round of this one's, so both meet the same lab state
                              #   (this spec's rounds and launcher apply); [[runs]] only, an
                              #   included spec includes none, 64 runs at most in all
    [[runs]]                  # 1 to 64 runs
    app = "rxelab"            # rxelab | mpi | gloo | perftest (gloo: torch.distributed's Gloo
                              #   over TCP, on a lab built with EXTRAS=torch; skipped, and said
                              #   so, where the nodes have no torch)
    op = "allgather"          # {ops}
    algorithms = ["star"]     # rxelab: the library's, or hand-loop (all-to-all and allgather up to
                              # 64 KiB: rxelab.handloop, the floor); mpi: {mpi_labels}
                              #   (forced through Open MPI's coll_tuned); gloo: gloo-default
    tools = ["ib_write_bw"]   # perftest: ib_write_bw | ib_write_bw_bidir | ib_send_bw | ib_send_lat
    nodes = [2, 3]            # how many nodes take part (1 rank each), 1..64 (perftest: 2, or
                              #   1: a pair on one node, over rxe's loopback)
    sizes = [1024, 65536]     # bytes as the op counts them, 0..1073741824 (1 GiB)
    stages = 10               # repetitions (perftest: iterations), 1..10000000
    warmup = 1                # 0..1000000
    transport = ["ucx", "tcp"]  # mpi: Open MPI over UCX on the RDMA device, and/or over TCP;
                              #   rxelab: "verbs" (the default), "tcp" (rxelab-tcp), "quic" (rxelab-quic)
    sample_load = false       # sample each node's data NIC counters during the run
    tight = false             # rxelab, mpi, gloo: the calls back to back on the same data, timed as
                              #   the slowest rank's span (apps' --tight), not stage by stage
    busy_neighbours = 1       # this many nodes after the case's each run a CPU loop while it
                              #   runs, 0..63 (a busy machine: `fab calibrate` fits a rank's
                              #   wake-up on it); the spec takes them too; not with launcher =
                              #   "srun" (a Slurm cluster's other nodes are other jobs')
    netem = [{}, {loss = 1}]  # impairments of the data NICs, one case each (experiments/spec/netem.py)
    mtu = [1500, 9000]        # data NIC MTU for the case, {mtu_low}..{mtu_high} (default: as provisioned)
    timeout_s = 300           # a case's deadline, 10..604800 (default: grows with the work)
    ranks_per_node = 2        # rxelab: ranks on each node (default 1), 1..8
    pairs = [1, 2, 15]        # rxelab sequential: at most this many pairs at once, a case each,
                              #   1..130816 (every pair of 64 nodes x 8 ranks)
    compression = ["none", "zstd"]  # rxelab: how rendezvous blocks travel, a case each: none,
                              #   lz4, zstd; fp16, bf16 for float sums only ({lossy_ops})
    data = ["zeros", "random"]  # rxelab, mpi, gloo: what the buffers hold, a case each: pattern
                              #   (default), zeros, sparse (1 in 100 set), random

An rxelab run also takes every option of init() (rxelab.settings), under its own name:
{options}

Instead of [[runs]], a spec may describe one elastic scenario (apps/elastic_train.py under
rxelab, then the same loop under Open MPI over UCX; experiments/running/elastic_scenario.py):

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

Or one DDP scenario (apps/ddp_train.py: the same model trained with DistributedDataParallel
under rxelab and Gloo, alternated rounds inside one job, once per bucket size; needs a lab
built with EXTRAS=torch; experiments/running/ddp_scenario.py):

    [ddp]
    nodes = 3                 # 2..64
    width = 768               # the MLP's hidden width, 16..8192 (768, depth 4: 1.4 M parameters)
    depth = 4                 # linear layers, 2..32
    batch = 16                # samples per rank per step, 1..4096
    steps = 4                 # timed steps per round, 1..10000
    warmup = 2                # untimed steps first, 1..1000
    rounds = 3                # alternated rounds (rxelab, gloo, rxelab, gloo, ...), 1..20
    bucket_mb = [1, 4, 25]    # DDP's bucket cap (its first bucket's too), a job each
    hooks = ["none", "fp16"]  # DDP's own hooks, each a variant per backend: none, fp16, bf16
    codec = false             # one more variant: rxelab's own fp16 codec on the wire
    wraps = ["fsdp"]          # the model sharded, a variant per backend: fsdp, fsdp2 (on CPU, torch > 2.6)
    timeout_s = 3600          # each job's deadline, 10..604800

A list-valued key (nodes, sizes, algorithms, tools, transport, netem, mtu, pairs, compression,
data) holds 1 to 64
values and makes one case per value. Numbers are whole numbers (not true/false, not 1.0). An
unknown key or an impossible value is an error that names the file, the run and the key; the
file itself must be UTF-8 TOML of at most 1 MiB.
"""

import tomllib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from rxelab import ops
from rxelab import settings as library

from experiments import did_you_mean
from experiments.spec.cases import Case, Run, Spec, contender, ranks
from experiments.spec.document import KEYS, RunDoc, SpecDoc
from experiments.spec.fields import (
    APP_TRANSPORTS,
    APPS,
    BOUNDS,
    GLOO_ALGORITHMS,
    LAUNCHERS,
    LIBRARY,
    LOSSY_OPS,
    MAX_ENTRIES,
    MTU_RANGE,
    NAME,
    ONLY,
    OPS,
    RXELAB_ONLY,
    TOOLS,
    TRANSPORTS,
    short,
)
from experiments.spec.scenarios import DdpDoc, ElasticDoc, Event
from infra import documents
from infra.documents import spell

__all__ = ["APPS", "APP_TRANSPORTS", "BOUNDS", "GLOO_ALGORITHMS", "KEYS", "LAUNCHERS", "LIBRARY",
           "MAX_BYTES",
           "MAX_ENTRIES", "MTU_RANGE", "NAME", "ONLY", "OPS",
           "RXELAB_ONLY", "SPECS", "TOOLS", "TRANSPORTS", "Case", "Run", "Spec",
           "SpecError", "contender", "find", "launcher_problem", "load", "parse", "ranks"]

__doc__ = __doc__.replace("{options}", "\n".join(  # type: ignore[union-attr]
    f"    {o.name} = {library.show(o.default)}".ljust(30) + f"# {o.meaning}, {o.low}..{o.high}"
    + (" (the same on every rank)" if o.shared else "") for o in library.OPTIONS)).replace(
    "{mtu_low}..{mtu_high}", "{}..{}".format(*MTU_RANGE)).replace(
    "{ops}", " | ".join(ops.COLLECTIVES) + " (rxelab.ops' registry)").replace(
    "{mpi_labels}", "|".join(dict.fromkeys(a for c in ops.COLLECTIVES.values() if c.mpi
                                           for a in c.mpi.tuned))).replace(
    "{lossy_ops}", ", ".join(LOSSY_OPS))
SPECS = Path(__file__).resolve().parent.parent / "specs"
MAX_BYTES = documents.MAX_BYTES
MAX_PROBLEMS, MAX_LINE = 40, 300  # what an error shows of a broken file


class SpecError(Exception):
    pass


# --- a broken document's problems, each named by where it is ---------------------------------

def _where(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """Which part of the document an error is about: a list of numbers or names is one field
    (runs[0].sizes), a run and an impairment are each their own (runs[1], runs[1].netem[2]),
    and so is an elastic event's field (elastic.events[0].kill)."""
    if loc[:1] == ("elastic",):
        return loc[:4]
    if loc[:1] == ("ddp",):
        return loc[:2]
    return loc[:4] if loc[2:3] == ("netem",) else loc[:3]


def _field(where: tuple[str | int, ...]) -> FieldInfo:
    """The model field an error is about; the document or a run is a table, not a field."""
    if len(where) == 1:
        return SpecDoc.model_fields[str(where[0])]
    if where[0] == "ddp":
        return DdpDoc.model_fields[str(where[1])] if len(where) == 2 else FieldInfo()
    if where[0] == "elastic":
        return (ElasticDoc.model_fields[str(where[1])] if len(where) == 2 else
                Event.model_fields[str(where[3])] if len(where) == 4 else FieldInfo())
    return RunDoc.model_fields[str(where[2])] if len(where) > 2 else FieldInfo()


def _problem(err: Any, doc: Any) -> str:
    """One line of a SpecError: where, then what is allowed there and what was found."""
    where = _where(err["loc"])
    if err["type"] == "extra_forbidden":
        return (f"{spell(where[:-1])}: unknown key {short(where[-1])}"
                + did_you_mean.unknown_key(SpecDoc, tuple(err["loc"])))
    if err["type"] == "spec":
        return f"{spell(where)}: {err['ctx']['what']}"
    what = _field(where).description or "must be a table"
    if err["type"] == "missing":
        return f"{spell(where)}: missing; {what}"
    for part in where:
        doc = doc[part]
    return f"{spell(where)}: {what}, not {short(doc)}"


def _listing(lines: list[str]) -> str:
    """Every problem once; of a file broken everywhere, enough to start with."""
    lines = [line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "..."
             for line in dict.fromkeys(lines)]
    more = [f"... and {len(lines) - MAX_PROBLEMS} more"] if len(lines) > MAX_PROBLEMS else []
    return "\n  ".join(lines[:MAX_PROBLEMS] + more)


def _run(r: RunDoc) -> Run:
    """A checked [[runs]] table with its defaults filled in."""
    names: Sequence[str]
    if r.app == "perftest":
        names = r.tools or ["ib_write_bw"]
    else:
        names = r.algorithms or (["mpi-default"] if r.app == "mpi" else
                                 list(GLOO_ALGORITHMS) if r.app == "gloo"
                                 else list(ops.COLLECTIVES[r.op].algorithms))
    return Run(r.app, r.op if r.app != "perftest" else "link", tuple(names), tuple(r.nodes),
               tuple(r.sizes), r.stages, r.warmup,
               tuple(r.transport or APP_TRANSPORTS["mpi"]) if r.app == "mpi"
               else tuple(r.transport or (None,)), r.sample_load,
               tuple(dict(imp) for imp in r.netem), tuple(r.mtu or (None,)), r.timeout_s,
               tuple((k, getattr(r, k)) for k in RXELAB_ONLY if getattr(r, k) is not None),
               tuple(r.pairs or (None,)), r.tight, tuple(r.data or (None,)),
               tuple(r.compression or (None,)), busy_neighbours=r.busy_neighbours)


def parse(doc: dict[str, Any], source: str = "spec", folder: Path = SPECS) -> Spec:
    """The spec a TOML document describes. Every problem is found before anything runs and all
    are listed in one SpecError, so a spec is fixed in one go."""
    try:
        checked = SpecDoc.model_validate(doc)
    except ValidationError as err:
        problems = _listing([_problem(e, doc) for e in err.errors(include_url=False)])
        raise SpecError(f"{source} is not a valid experiment spec:\n  {problems}") from None
    names = checked.include or []
    runs = tuple(replace(r, included=name) for name in names
                 for r in _included(name, source, folder).runs) \
        + tuple(_run(r) for r in checked.runs or ())
    if len(runs) > MAX_ENTRIES:
        raise SpecError(f"{source}: {len(runs)} [[runs]] with those it includes: at most "
                        f"{MAX_ENTRIES}")
    crowded = [r for r in runs if max(r.nodes) + r.busy_neighbours > BOUNDS["nodes"][1]]
    if crowded:
        raise SpecError(f"{source}: nodes {max(crowded[0].nodes)} and busy_neighbours "
                        f"{crowded[0].busy_neighbours}: at most {BOUNDS['nodes'][1]} nodes in all")
    got = Spec(checked.name, checked.description, runs, source, checked.rounds,
               checked.elastic, checked.launcher, checked.ddp)
    problem = launcher_problem(got, got.launcher)
    if problem:
        raise SpecError(f"{source}: {problem}")
    return got


def launcher_problem(s: Spec, launcher: str) -> str | None:
    """Why a spec cannot run under a launcher, its own or one given on the command line (None:
    it can). Under srun a scenario's own ranks would start over SSH beside Slurm's, and a busy
    neighbour's loop would load a node of another job."""
    if launcher != "srun":
        return None
    if s.elastic is not None or s.ddp is not None:
        return (f"spec {s.name} is a scenario ([elastic] or [ddp]): it starts its own ranks "
                "over SSH, not through srun")
    if any(r.busy_neighbours for r in s.runs):
        return (f"spec {s.name} has busy_neighbours (its own or an included spec's), which load "
                "nodes beside a case's, and under launcher = \"srun\" those are other jobs': "
                "run it with launcher = \"ssh\" on nodes of your own")
    return None


def _included(name: str, source: str, folder: Path) -> Spec:
    """A shipped spec whose runs another's `include` names: one level deep, [[runs]] only
    (its own rounds and launcher give way to the including spec's)."""
    path = folder / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.toml")))
        raise SpecError(f"{source}: include names no shipped spec {name!r} (shipped: {known})")
    doc = _document(path)
    if "include" in doc or "runs" not in doc:  # before parsing it: no spec includes itself
        raise SpecError(f"{source}: include {name!r}: a spec of [[runs]] that includes none")
    return parse(doc, str(path), folder)


# --- the file ------------------------------------------------------------------------------

def find(name_or_path: str, folder: Path = SPECS, what: str = "experiment spec") -> Path:
    """A .toml path as given (load says what is wrong with it), else the shipped spec of that
    name in `folder`."""
    path = Path(name_or_path)
    if path.suffix == ".toml":
        return path
    candidate = folder / f"{name_or_path}.toml"
    if candidate.is_file():
        return candidate
    known = ", ".join(sorted(p.stem for p in folder.glob("*.toml")))
    raise SpecError(f"no {what} {name_or_path!r} (shipped: {known}; or give a .toml path)")


def _document(path: Path) -> dict[str, Any]:
    """The TOML in a file: anything else is a one-line SpecError, never a traceback."""
    try:
        return documents.load(path, tomllib.loads, "TOML", MAX_BYTES)  # type: ignore[no-any-return]
    except documents.DocumentError as err:
        raise SpecError(f"{path}: {err}") from None


def load(name_or_path: str) -> Spec:
    path = find(name_or_path)
    return parse(_document(path), str(path))

"""Experiment specs: TOML files that say what to run, checked strictly before anything runs.

    name = "smoke"
    description = "..."
    [[runs]]
    app = "rxelab"            # rxelab | mpi | perftest
    op = "allgather"          # allgather | alltoall            (rxelab, mpi)
    algorithms = ["star"]     # rxelab: the library's; mpi: mpi-default|mpi-linear|mpi-pairwise|
                              #   mpi-ring|mpi-bruck (forced through Open MPI's coll_tuned)
    tools = ["ib_write_bw"]   # perftest: ib_write_bw | ib_send_bw | ib_send_lat
    nodes = [2, 3]            # how many nodes take part (1 rank each)
    sizes = [1024, 65536]     # bytes per peer
    stages = 10               # repetitions (perftest: iterations)
    warmup = 1
    transport = "tcp"         # mpi: tcp | ucx
    sample_load = false       # sample each node's data NIC counters during the run

An unknown key or an impossible value is an error that names the file, the run and the key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECS = Path(__file__).resolve().parent / "specs"
APPS = ("rxelab", "mpi", "perftest")
OPS = ("allgather", "alltoall")
RXELAB_ALGORITHMS = {"allgather": ("star", "ring", "sequential"),
                     "alltoall": ("sequential", "pairwise", "parallel")}
# Open MPI coll_tuned algorithm numbers (ompi/mca/coll/tuned): what each label forces.
MPI_ALGORITHMS = {
    "allgather": {"mpi-default": None, "mpi-linear": 1, "mpi-bruck": 2, "mpi-ring": 4},
    "alltoall": {"mpi-default": None, "mpi-linear": 1, "mpi-pairwise": 2, "mpi-bruck": 3},
}
TOOLS = ("ib_write_bw", "ib_send_bw", "ib_send_lat")
TRANSPORTS = ("tcp", "ucx")
KEYS = {"app", "op", "algorithms", "tools", "nodes", "sizes", "stages", "warmup", "transport",
        "sample_load"}


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
    transport: str
    sample_load: bool

    def cases(self) -> list[dict[str, Any]]:
        """One case per (nodes, algorithm or tool, size), in a stable order."""
        return [{"app": self.app, "op": self.op, "algorithm": a, "nodes": n, "size": s,
                 "stages": self.stages, "warmup": self.warmup, "transport": self.transport,
                 "sample_load": self.sample_load}
                for n in self.nodes for a in self.algorithms for s in self.sizes]


@dataclass(frozen=True)
class Spec:
    name: str
    description: str
    runs: tuple[Run, ...]
    source: str

    def cases(self) -> list[dict[str, Any]]:
        return [c for r in self.runs for c in r.cases()]

    @property
    def max_nodes(self) -> int:
        return max(n for r in self.runs for n in r.nodes)


def find(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.exists():
        return path
    candidate = SPECS / f"{name_or_path}.toml"
    if candidate.exists():
        return candidate
    known = ", ".join(sorted(p.stem for p in SPECS.glob("*.toml")))
    raise SpecError(f"no experiment spec {name_or_path!r} (shipped: {known}; or give a .toml path)")


def load(name_or_path: str) -> Spec:
    path = find(name_or_path)
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{path}: not valid TOML: {err}") from None
    return parse(doc, str(path))


Complain = Callable[[str, str], None]


def _ints(r: dict[str, Any], w: str, bad: Complain, key: str, low: int,
          default: list[int] | None = None) -> tuple[int, ...]:
    value = r.get(key, default)
    if not isinstance(value, list) or not value or any(
            isinstance(v, bool) or not isinstance(v, int) or v < low for v in value):
        bad(f"{w}.{key}", f"must be a non-empty list of whole numbers >= {low}")
        return ()
    return tuple(value)


def _one(r: dict[str, Any], w: str, bad: Complain, key: str, low: int, default: int) -> int:
    value = r.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        bad(f"{w}.{key}", f"must be a whole number >= {low}, not {value!r}")
        return default
    return value


def parse(doc: dict[str, Any], source: str = "spec") -> Spec:
    problems: list[str] = []

    def bad(where: str, what: str) -> None:
        problems.append(f"{where}: {what}")

    for key in sorted(doc.keys() - {"name", "description", "runs"}):
        bad("top level", f"unknown key {key!r}")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        bad("name", "must be a non-empty string")
    runs_doc = doc.get("runs")
    if not isinstance(runs_doc, list) or not runs_doc:
        bad("runs", "must be a non-empty list of [[runs]] tables")
        runs_doc = []
    runs = []
    for i, r in enumerate(runs_doc):
        w = f"runs[{i}]"
        if not isinstance(r, dict):
            bad(w, "must be a table")
            continue
        for key in sorted(r.keys() - KEYS):
            bad(w, f"unknown key {key!r}")
        app = r.get("app")
        if app not in APPS:
            bad(f"{w}.app", f"must be one of {', '.join(APPS)}, not {app!r}")
            continue
        op = r.get("op", "allgather")
        if app != "perftest" and op not in OPS:
            bad(f"{w}.op", f"must be one of {', '.join(OPS)}, not {op!r}")
            continue

        if app == "rxelab":
            allowed: tuple[str, ...] = RXELAB_ALGORITHMS[op]
            names = r.get("algorithms", list(allowed))
            key = "algorithms"
        elif app == "mpi":
            allowed = tuple(MPI_ALGORITHMS[op])
            names = r.get("algorithms", ["mpi-default"])
            key = "algorithms"
        else:
            allowed = TOOLS
            names = r.get("tools", ["ib_write_bw"])
            key = "tools"
        if not isinstance(names, list) or not names or any(n not in allowed for n in names):
            bad(f"{w}.{key}", f"must be a non-empty list from {', '.join(allowed)}, not {names!r}")
            names = []
        if app == "perftest" and "algorithms" in r:
            bad(f"{w}.algorithms", "perftest runs take `tools`")
        if app != "perftest" and "tools" in r:
            bad(f"{w}.tools", "only perftest runs take `tools`")
        nodes = _ints(r, w, bad, "nodes", 1, [2])
        if app == "perftest" and any(n != 2 for n in nodes):
            bad(f"{w}.nodes", "perftest measures one link: nodes = [2]")
        transport = r.get("transport", "tcp")
        if transport not in TRANSPORTS:
            bad(f"{w}.transport", f"must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
        if app != "mpi" and "transport" in r:
            bad(f"{w}.transport", "only mpi runs choose a transport")
        sample = r.get("sample_load", False)
        if not isinstance(sample, bool):
            bad(f"{w}.sample_load", "must be true or false")
        runs.append(Run(app, op if app != "perftest" else "link", tuple(names), nodes,
                        _ints(r, w, bad, "sizes", 0), _one(r, w, bad, "stages", 1, 10),
                        _one(r, w, bad, "warmup", 0, 1), transport, bool(sample)))
    if problems:
        raise SpecError(f"{source} is not a valid experiment spec:\n  " + "\n  ".join(problems))
    return Spec(str(name), str(doc.get("description", "")), tuple(runs), source)

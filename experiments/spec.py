"""Experiment specs: TOML files that say what to run, checked strictly before anything runs.

    name = "smoke"
    description = "..."
    [[runs]]
    app = "rxelab"            # rxelab | mpi | perftest
    op = "allgather"          # allgather | alltoall | allreduce | reduce_scatter | bcast
    algorithms = ["star"]     # rxelab: the library's; mpi: mpi-default|mpi-linear|mpi-pairwise|
                              #   mpi-ring|mpi-bruck (forced through Open MPI's coll_tuned)
    tools = ["ib_write_bw"]   # perftest: ib_write_bw | ib_send_bw | ib_send_lat
    nodes = [2, 3]            # how many nodes take part (1 rank each)
    sizes = [1024, 65536]     # bytes per peer
    stages = 10               # repetitions (perftest: iterations)
    warmup = 1
    transport = ["ucx", "tcp"]  # mpi: Open MPI over UCX on the RDMA device, and/or over TCP
    sample_load = false       # sample each node's data NIC counters during the run
    netem = [{}, {loss = 1}]  # impairments of the data NICs, one case each (experiments/netem.py)
    mtu = [1500, 9000]        # data NIC MTU for the case (default: as provisioned)
    timeout_s = 300           # a case's deadline (default: grows with the work)
    qp_timeout = 14           # rxelab: RC ACK timeout exponent (4.096 us * 2^n), 1..31
    retry_cnt = 7             # rxelab: RC retransmissions before an error, 0..7
    eager_limit = 0           # rxelab: blocks up to this many bytes go eagerly (0: never)
    ranks_per_node = 2        # rxelab: ranks on each node (default 1)
    pairs = [1, 2, 15]        # rxelab sequential: at most this many pairs at once, a case each

A list-valued key (transport, netem, mtu) makes one case per value. An unknown key or an
impossible value is an error that names the file, the run and the key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rxelab import ops

from experiments import netem

SPECS = Path(__file__).resolve().parent / "specs"
APPS = ("rxelab", "mpi", "perftest")
OPS = tuple(ops.COLLECTIVES)
RXELAB_ALGORITHMS = {name: c.algorithms for name, c in ops.COLLECTIVES.items()}
# Open MPI coll_tuned algorithm numbers (ompi/mca/coll/tuned): what each label forces.
MPI_ALGORITHMS = {
    "allgather": {"mpi-default": None, "mpi-linear": 1, "mpi-bruck": 2, "mpi-ring": 4},
    "alltoall": {"mpi-default": None, "mpi-linear": 1, "mpi-pairwise": 2, "mpi-bruck": 3},
    "allreduce": {"mpi-default": None, "mpi-recursive-doubling": 3, "mpi-ring": 4},
    "reduce_scatter": {"mpi-default": None},
    "bcast": {"mpi-default": None, "mpi-binomial": 6},
}
TOOLS = ("ib_write_bw", "ib_send_bw", "ib_send_lat")
TRANSPORTS = ("ucx", "tcp")
KEYS = {"app", "op", "algorithms", "tools", "nodes", "sizes", "stages", "warmup", "transport",
        "sample_load", "netem", "mtu", "timeout_s", "qp_timeout", "retry_cnt", "eager_limit",
        "ranks_per_node", "pairs"}
RXELAB_ONLY = {"qp_timeout": (1, 31), "retry_cnt": (0, 7), "eager_limit": (0, 65536),
               "ranks_per_node": (1, 8)}
MTU_RANGE = (1280, 9000)


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
    options: tuple[tuple[str, int], ...] = ()  # rxelab: qp_timeout, retry_cnt, ...
    pairs: tuple[int | None, ...] = (None,)

    def cases(self) -> list[dict[str, Any]]:
        """One case per (nodes, mtu, impairment, transport, algorithm or tool, size), in a
        stable order."""
        return [{"app": self.app, "op": self.op, "algorithm": a, "nodes": n, "size": s,
                 "stages": self.stages, "warmup": self.warmup, "transport": t,
                 "sample_load": self.sample_load, "netem": dict(imp), "mtu": mtu,
                 "timeout_s": self.timeout_s, **dict(self.options),
                 **({"pairs": k} if k is not None else {})}
                for n in self.nodes for mtu in self.mtus for imp in self.netem
                for t in self.transports for a in self.algorithms for k in self.pairs
                for s in self.sizes]


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


def contender(case: dict[str, Any]) -> str:
    """Who ran a case: rxelab, mpi-ucx, mpi-tcp or perftest (what a reader compares); an
    rxelab run with its own eager limit says so (rxelab-eager0: rendezvous only)."""
    if case["app"] == "mpi":
        return f"mpi-{case['transport']}"
    if case["app"] == "rxelab" and case.get("eager_limit") is not None:
        return f"rxelab-eager{case['eager_limit']}"
    return str(case["app"])


def ranks(case: dict[str, Any]) -> int:
    return int(case["nodes"]) * int(case.get("ranks_per_node") or 1)


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
        transports: tuple[str | None, ...] = (None,)
        if app == "mpi":
            value = r.get("transport", list(TRANSPORTS))
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list) or not value or any(t not in TRANSPORTS for t in value):
                bad(f"{w}.transport", f"must be one of {', '.join(TRANSPORTS)} or a list of them, "
                                      f"not {r.get('transport')!r}")
            else:
                transports = tuple(value)
        elif "transport" in r:
            bad(f"{w}.transport", "only mpi runs choose a transport")
        sample = r.get("sample_load", False)
        if not isinstance(sample, bool):
            bad(f"{w}.sample_load", "must be true or false")
        impairments = r.get("netem", [{}])
        if not isinstance(impairments, list) or not impairments:
            bad(f"{w}.netem", "must be a non-empty list of tables, e.g. [{}, {loss = 1.0}]")
            impairments = [{}]
        for k, imp in enumerate(impairments):
            for problem in netem.problems(imp):
                bad(f"{w}.netem[{k}]", problem)
        mtus: tuple[int | None, ...] = (None,)
        if "mtu" in r:
            mtus = _ints(r, w, bad, "mtu", MTU_RANGE[0])
            if any(m > MTU_RANGE[1] for m in mtus):
                bad(f"{w}.mtu", f"must be from {MTU_RANGE[0]} to {MTU_RANGE[1]}")
        timeout = _one(r, w, bad, "timeout_s", 10, 0) if "timeout_s" in r else None
        options = []
        for key, (low, high) in RXELAB_ONLY.items():
            if key in r:
                if app != "rxelab":
                    bad(f"{w}.{key}", "only rxelab runs take it")
                elif _one(r, w, bad, key, low, low) > high:
                    bad(f"{w}.{key}", f"must be from {low} to {high}")
                else:
                    options.append((key, r[key]))
        pairs: tuple[int | None, ...] = (None,)
        if "pairs" in r:
            if app != "rxelab" or any(a != "sequential" for a in names) \
                    or op not in ("alltoall", "allgather"):
                bad(f"{w}.pairs", "only rxelab's sequential alltoall and allgather take pairs")
            else:
                pairs = _ints(r, w, bad, "pairs", 1)
        runs.append(Run(app, op if app != "perftest" else "link", tuple(names), nodes,
                        _ints(r, w, bad, "sizes", 0), _one(r, w, bad, "stages", 1, 10),
                        _one(r, w, bad, "warmup", 0, 1), transports, bool(sample),
                        tuple(dict(i) for i in impairments if isinstance(i, dict)) or ({},),
                        mtus or (None,), timeout, tuple(options), pairs or (None,)))
    if problems:
        raise SpecError(f"{source} is not a valid experiment spec:\n  " + "\n  ".join(problems))
    return Spec(str(name), str(doc.get("description", "")), tuple(runs), source)

"""A simulation spec (experiments/simulations/*.toml): which collectives, algorithms, pair
windows and SMPI MPI algorithms to simulate, at which numbers of ranks and sizes, on which
platform, with which cost profile. Checked whole before anything runs: a bad value is one
SpecError that names it.

    name = "scale"
    description = "..."
    profile = "lab"                # a profile `fab calibrate` wrote (results/profiles/NAME.json)
                                   # or a .json path; none: round placeholder costs, said so
    [[runs]]
    collective = "alltoall"
    algorithms = ["sequential", "pairwise", "parallel"]
    pairs = [1, 4]                 # windows of the windowed algorithms (sequential)
    mpi = ["mpi-bruck"]            # the description's MPI labels, run by SMPI
    ranks = [8, 64, 1024]
    sizes = [1024, 1048576]        # the description's unit, as the benchmark's
    platform = "cluster"           # lab, cluster, fat-tree, torus
    oversubscription = 4           # fat-tree
    ranks_per_node = 2             # lab: ranks on each VM (default 1)
    bandwidth = 12.5e9             # bytes/s per link (lab: a byte costs each VM 1/bandwidth);
                                   #   default: the profile's
    latency = 1e-6                 # seconds host to host; default: the profile's
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from rxelab import ops

from experiments import did_you_mean
from experiments import spec as experiment_spec
from experiments.simulation.platforms import KINDS
from experiments.spec import SpecError
from infra import documents
from infra.config import REPO

SPECS = REPO / "experiments" / "simulations"
PROFILES = REPO / "results" / "profiles"
MAX_BYTES = 1 << 20
MAX_RANKS = 4096
MAX_CASES = 5000
MAX_BUFFER = (2 << 30) - 1  # bytes of one rank's buffer (size x p): MPI's int displacements


class Run(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    collective: str
    algorithms: list[str] = Field(default_factory=list)
    pairs: list[int] = Field(default_factory=lambda: [1])
    mpi: list[str] = Field(default_factory=list)
    ranks: list[int] = Field(min_length=1)
    sizes: list[int] = Field(min_length=1)
    platform: Literal["lab", "cluster", "fat-tree", "torus"] = "cluster"
    oversubscription: int = Field(1, ge=1, le=32)
    ranks_per_node: int = Field(1, ge=1, le=64)
    bandwidth: float | None = Field(None, gt=0, allow_inf_nan=False)
    latency: float | None = Field(None, gt=0, allow_inf_nan=False)
    calls: int = Field(1, ge=1, le=100)

    @model_validator(mode="after")
    def _known(self) -> Run:
        c = ops.COLLECTIVES.get(self.collective)
        if c is None:
            raise ValueError(f"collective {self.collective!r}: one of {', '.join(ops.COLLECTIVES)}")
        unknown = [a for a in self.algorithms if a not in c.algorithms]
        if unknown:
            raise ValueError(f"{self.collective} has no algorithm {', '.join(unknown)} (it has "
                             f"{', '.join(c.algorithms)})")
        labels = c.mpi.smpi if c.mpi is not None else {}
        unknown = [m for m in self.mpi if m not in labels]
        if unknown:
            raise ValueError(f"{self.collective} has no MPI label {', '.join(unknown)} (it has "
                             f"{', '.join(labels) or 'none'})")
        if self.ranks_per_node != 1 and self.platform != "lab":
            raise ValueError("ranks_per_node places ranks on the lab's VMs: the platform is "
                             f"{self.platform}")
        if not self.algorithms and not self.mpi:
            raise ValueError("a run simulates algorithms, mpi labels, or both: it names none")
        if any(not 1 <= k <= MAX_RANKS * MAX_RANKS for k in self.pairs):
            raise ValueError(f"pairs {self.pairs}: each at least 1")
        if self.pairs != [1] and not set(self.algorithms) & set(c.windowed):
            raise ValueError(f"pairs sets the window of {', '.join(c.windowed) or 'no algorithm'}"
                             f" of {self.collective}: the run names none")
        if any(not 2 <= n <= MAX_RANKS for n in self.ranks):
            raise ValueError(f"ranks {self.ranks}: each from 2 to {MAX_RANKS}")
        item = np.dtype(c.dtype).itemsize
        bad = [s for s in self.sizes if s < 0 or s % item or s > 1 << 30]
        if bad:
            raise ValueError(f"sizes {bad}: {self.collective} moves {c.dtype}: whole elements of "
                             f"{item} bytes, up to 1 GiB")
        # a recording allocates (and never writes) a rank's buffers: size x p at most
        if max(self.sizes) * max(self.ranks) > MAX_BUFFER:
            raise ValueError(f"sizes up to {max(self.sizes)} B at {max(self.ranks)} ranks: a "
                             f"rank's buffer would pass 2 GiB")
        return self


class Document(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    description: str = ""
    profile: str | None = None
    runs: list[Run] = Field(min_length=1)


@dataclass(frozen=True)
class Case:
    """One simulation: an rxelab algorithm (with its window) or an SMPI MPI label."""

    collective: str
    algorithm: str
    source: str  # "rxelab" or "smpi"
    pairs: int
    ranks: int
    size: int
    platform: str
    oversubscription: int
    bandwidth: float | None
    latency: float | None
    calls: int
    per_node: int = 1  # lab: ranks per VM

    def label(self) -> str:
        window = f" pairs={self.pairs}" if self.pairs != 1 else ""
        per = f" ({self.per_node} per VM)" if self.per_node != 1 else ""
        return (f"{self.collective}/{self.algorithm}{window} p={self.ranks}{per} {self.size} B "
                f"on {self.platform}")


@dataclass(frozen=True)
class Spec:
    name: str
    description: str
    profile: str | None
    source: Path
    cases: tuple[Case, ...]


def find(name_or_path: str) -> Path:
    return experiment_spec.find(name_or_path, SPECS, "simulation spec")


def load(name_or_path: str) -> Spec:
    path = find(name_or_path)
    try:
        raw = documents.load(path, tomllib.loads, "TOML", MAX_BYTES)
    except documents.DocumentError as err:
        raise SpecError(f"{path}: {err}") from None
    return parse(raw, path)


def parse(raw: Any, path: Path) -> Spec:
    try:
        doc = Document.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "spec"
        hint = did_you_mean.unknown_key(Document, tuple(first["loc"])) \
            if first["type"] == "extra_forbidden" else ""
        raise SpecError(f"{path}: {where}: {first['msg']}{hint}") from None
    cases = []
    for run in doc.runs:
        c = ops.COLLECTIVES[run.collective]
        common = dict(platform=run.platform, oversubscription=run.oversubscription,
                      bandwidth=run.bandwidth, latency=run.latency, calls=run.calls,
                      per_node=run.ranks_per_node)
        for n in run.ranks:
            for size in run.sizes:
                for algorithm in run.algorithms:
                    for k in (run.pairs if algorithm in c.windowed else [1]):
                        cases.append(Case(run.collective, algorithm, "rxelab", k, n, size,
                                          **common))  # type: ignore[arg-type]
                for label in run.mpi:
                    cases.append(Case(run.collective, label, "smpi", 1, n, size,
                                      **common))  # type: ignore[arg-type]
    if len(cases) > MAX_CASES:
        raise SpecError(f"{path}: {len(cases)} cases: at most {MAX_CASES}")
    return Spec(doc.name, doc.description, doc.profile, path, tuple(dict.fromkeys(cases)))


def profile_path(name: str) -> Path:
    """A profile by name (results/profiles/NAME.json) or as a .json path."""
    path = Path(name)
    return path if path.suffix == ".json" else PROFILES / f"{name}.json"


__all__ = ["KINDS", "Case", "Spec", "SpecError", "find", "load", "parse", "profile_path"]

"""What the torch backend takes beside torch's own arguments: an algorithm per collective, the
compression, the library's settings (rxelab.settings), the transport and the RDMA device, and
whether calls overlap with the caller's work. They come from
init_process_group(..., pg_options=rxelab.torch.Options(...)); what that leaves unset comes
from the environment, for programs that cannot be changed: RXELAB_ALGORITHMS
("allreduce=ring,alltoall=pairwise"), RXELAB_COMPRESSION, RXELAB_TRANSPORT, RXELAB_DEVICE,
RXELAB_TORCH_OVERLAP (0 or 1) and each setting's own variable (RXELAB_EAGER_LIMIT, ...,
declared with the setting).

Pure Python: no torch, no pyverbs (the checks run before anything is opened).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rxelab import codecs, ops, settings, transports
from rxelab.errors import ConfigError

ENV_ALGORITHMS = settings.ENV_PREFIX + "ALGORITHMS"
ENV_COMPRESSION = settings.ENV_PREFIX + "COMPRESSION"
ENV_DEVICE = settings.DEVICE_ENV
ENV_OVERLAP = settings.ENV_PREFIX + "TORCH_OVERLAP"


@dataclass(frozen=True)
class Options:
    """algorithms: described collective -> algorithm (rxelab.ops; alltoallv takes alltoall's
    unless named itself); compression: a codec of rxelab.codecs; settings: init()'s options
    by name; device: the RDMA device (None: the one the library finds); overlap: a call
    returns at once and completes while the caller works on (None: True). False: every call
    completes before it returns, so callbacks chained on its future run in the caller's
    thread - what a DDP communication hook whose callback starts another collective
    (PowerSGD) needs for every rank to start them in the same order. transport: what the
    calls run over (rxelab.transports; None: RXELAB_TRANSPORT, else verbs)."""

    algorithms: Mapping[str, str] = field(default_factory=dict)
    compression: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    device: str | None = None
    overlap: bool | None = None
    transport: str | None = None

    def checked(self) -> Options:
        """The same options, every value checked (a ConfigError names the wrong one)."""
        if not isinstance(self.algorithms, Mapping) or not isinstance(self.settings, Mapping):
            raise ConfigError("Options.algorithms and Options.settings are mappings by name")
        for name, algorithm in self.algorithms.items():
            described = ops.COLLECTIVES.get(name)
            if described is None:
                raise ConfigError(f"no collective {name!r} to choose an algorithm for",
                                  hint=f"choose for {', '.join(ops.COLLECTIVES)}")
            if algorithm not in described.algorithms:
                raise ConfigError(f"{name} has no algorithm {algorithm!r}",
                                  hint=f"{name} has {', '.join(described.algorithms)}")
        settings.resolve(self.settings)
        codecs.lookup(self.compression)
        if self.device is not None and (not isinstance(self.device, str) or not self.device):
            raise ConfigError(f"device={self.device!r} must be an RDMA device's name")
        if self.overlap is not None and not isinstance(self.overlap, bool):
            raise ConfigError(f"overlap={self.overlap!r} must be True or False")
        if self.transport is not None:
            transports.choose(self.transport)
        return self

    @property
    def overlapping(self) -> bool:
        return self.overlap is not False

    def algorithm(self, collective: str) -> str | None:
        """The algorithm chosen for a described collective (None: its default)."""
        if collective in self.algorithms:
            return self.algorithms[collective]
        if collective == "alltoallv":
            return self.algorithms.get("alltoall")
        return None

    def opening(self) -> dict[str, Any]:
        """init()'s keyword arguments for the communicator these options describe."""
        return {**self.settings, "compression": self.compression, "device": self.device,
                "transport": self.transport}


def parse_algorithms(raw: str, source: str = ENV_ALGORITHMS) -> dict[str, str]:
    """"allreduce=ring,alltoall=pairwise" as a mapping (checked by Options.checked)."""
    chosen: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, algorithm = item.partition("=")
        if not sep or not name.strip() or not algorithm.strip():
            raise ConfigError(f"{source}={raw!r}: each item is collective=algorithm",
                              hint="e.g. allreduce=ring,alltoall=pairwise")
        chosen[name.strip()] = algorithm.strip()
    return chosen


def resolve(given: Options | None, env: Mapping[str, str]) -> Options:
    """The backend's options: what pg_options says, the environment for the rest, checked."""
    if given is not None and not isinstance(given, Options):
        raise ConfigError(f"pg_options of the rxelab backend must be rxelab.torch.Options, not "
                          f"{type(given).__name__}")
    given = given or Options()
    try:
        from_env = Options(parse_algorithms(env.get(ENV_ALGORITHMS, "")),
                           env.get(ENV_COMPRESSION) or None, settings.from_environ(env),
                           env.get(ENV_DEVICE) or None, parse_overlap(env.get(ENV_OVERLAP)),
                           env.get(settings.TRANSPORT_ENV) or None).checked()
    except ConfigError as err:
        raise ConfigError(f"the environment: {err}") from None
    return Options({**from_env.algorithms, **given.algorithms},
                   given.compression if given.compression is not None else from_env.compression,
                   {**from_env.settings, **given.settings},
                   given.device if given.device is not None else from_env.device,
                   given.overlap if given.overlap is not None else from_env.overlap,
                   given.transport if given.transport is not None else from_env.transport).checked()


def parse_overlap(raw: str | None) -> bool | None:
    if raw is None or raw == "":
        return None
    if raw not in ("0", "1"):
        raise ConfigError(f"{ENV_OVERLAP}={raw!r}: 1 (calls overlap the caller's work) or 0 (each "
                          "completes before it returns)")
    return raw == "1"

"""Every option of init(), declared once: its type, range, default and meaning. init() checks
what it is given against this table; the benchmark, the self-test and the demo app take their
flags from it; experiment specs take the same names as keys; docs/library.md's table is this
table (a test keeps them equal); and the options every rank must agree on travel in each rank's
hello, so a job whose ranks disagree fails at init naming the option, not later with an RDMA
error nobody can read.

Pure Python: experiments read it on the host.
"""

from __future__ import annotations

import argparse
import math
import numbers
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rxelab.errors import ConfigError


@dataclass(frozen=True)
class Option:
    name: str
    kind: type  # int or float
    default: int | float
    low: int | float
    high: int | float
    meaning: str
    shared: bool = False  # every rank must have the same value

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        """Its environment variable, where the caller's code cannot be changed to pass it
        (rxelab.torch reads these: init_process_group has no room for them)."""
        return ENV_PREFIX + self.name.upper()

    def check(self, value: Any) -> int | float:
        """value as this option's type, or a ConfigError naming the option and its range."""
        if isinstance(value, bool):
            raise self._bad(value)
        try:
            if self.kind is int:
                number: int | float = operator.index(value)  # numpy integers too; no floats
            elif isinstance(value, numbers.Real):  # numpy floats too; no strings
                number = float(value)
            else:
                raise TypeError
        except (TypeError, ValueError, OverflowError):
            raise self._bad(value) from None
        if isinstance(number, float) and not math.isfinite(number):
            raise self._bad(value)
        if not self.low <= number <= self.high:
            raise self._bad(value)
        return number

    def _bad(self, value: Any) -> ConfigError:
        kind = "a whole number" if self.kind is int else "a number"
        return ConfigError(f"{self.name}={value!r}: {self.meaning}; {kind} from {show(self.low)} "
                           f"to {show(self.high)}")


def show(value: int | float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


OPTIONS: tuple[Option, ...] = (
    Option("timeout", float, 60.0, 0.01, 86400.0,
           "seconds a wait may pass without a single completion before it gives up"),
    Option("eager_limit", int, 65536, 0, 65536,
           "blocks up to this many bytes are copied through slots (eager); larger ones go by "
           "rendezvous (0: always rendezvous)", shared=True),
    Option("chunk", int, 1 << 20, 1, 1 << 30, "bytes per RDMA write of a rendezvous message",
           shared=True),
    Option("window", int, 4 << 20, 1, 1 << 30,
           "bytes of one rendezvous message in flight at most", shared=True),
    Option("slots", int, 16, 2, 4096,
           "receive and send slots per peer (control messages and eager blocks), each as large "
           "as the eager limit", shared=True),
    Option("send_depth", int, 128, 2, 16384, "work requests in flight towards one peer"),
    Option("pin_limit", int, 1 << 30, 1 << 16, 1 << 44,
           "bytes of caller memory the registration cache may keep pinned"),
    Option("qp_timeout", int, 16, 1, 31,
           "RC acknowledgement timeout exponent: 4.096 us * 2^n before a retransmission"),
    Option("retry_cnt", int, 7, 0, 7, "RC retransmissions before a work request fails"),
    Option("spin_us", int, 0, 0, 100_000,
           "microseconds a waiting rank polls for a completion before it sleeps on the "
           "completion channel (0: sleeps at the first empty poll)"),
)
BY_NAME = {o.name: o for o in OPTIONS}
SHARED = tuple(o.name for o in OPTIONS if o.shared)


ENV_PREFIX = "RXELAB_"


def from_environ(env: Mapping[str, str]) -> dict[str, int | float]:
    """The options the environment sets (RXELAB_EAGER_LIMIT=4096 ...), each checked and
    named by its variable when it is wrong."""
    found: dict[str, int | float] = {}
    for o in OPTIONS:
        raw = env.get(o.env, "").strip()
        if not raw:
            continue
        try:
            value: int | float = o.kind(raw)
        except ValueError:
            raise ConfigError(f"{o.env}={raw!r}: {o.meaning}; not a "
                              f"{'whole number' if o.kind is int else 'number'}") from None
        try:
            found[o.name] = o.check(value)
        except ConfigError as err:
            raise ConfigError(f"{o.env}: {err}") from None
    return found


def resolve(given: Mapping[str, Any]) -> dict[str, int | float]:
    """Every option's value: what was given (checked), else its default."""
    unknown = sorted(given.keys() - BY_NAME.keys())
    if unknown:
        raise ConfigError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}",
                          hint=f"init() takes {', '.join(BY_NAME)}")
    return {o.name: o.check(given[o.name]) if o.name in given else o.default for o in OPTIONS}


CODEC = "compression"  # init(compression=): in the hello as its codec's id (rxelab.codecs)
TRANSPORT = "transport"  # init(transport=): in the hello as its index in TRANSPORTS
TRANSPORTS = ("verbs", "tcp", "quic")  # rxelab.transports opens them; their order is the wire's
TRANSPORT_ENV = "RXELAB_TRANSPORT"  # init()'s default, where transport= is not given
# init()'s device=, port=, gid_index= where they are not given: the RDMA device (tcp and quic:
# the address to listen on), its port and the port's GID index (verbs only)
DEVICE_ENV = "RXELAB_DEVICE"
IB_PORT_ENV = "RXELAB_IB_PORT"
GID_INDEX_ENV = "RXELAB_GID_INDEX"
CONGESTION_ENV = "RXELAB_CONGESTION"  # quic's congestion control (each sender its own)
CONGESTIONS = ("reno", "cubic")  # what aioquic 1.2 to 1.7 offers (no BBR); the first is the default
LOG_LEVEL_ENV = "RXELAB_LOG_LEVEL"  # the library's log to stderr from this level on (rxelab.logs)
LOG_LEVELS = ("debug", "info", "warning", "error")  # RXELAB_LOG_LEVEL's words, in any case
DEBUG_ENV = "RXELAB_DEBUG"  # 1: RXELAB_LOG_LEVEL=debug, as NCCL_DEBUG=INFO is NCCL's switch


def disagreement(mine: Mapping[str, Any], theirs: Mapping[str, Any], who: int | str,
                 codec_names: Mapping[int, str] | None = None) -> str | None:
    """The first shared option on which `who` (a rank, or "the newcomer") differs from this
    rank 0, said (the communicator's codec too, by name, where the hello carries it)."""
    who = f"rank {who}" if isinstance(who, int) else who
    if CODEC in mine and theirs.get(CODEC) != mine[CODEC]:
        names = codec_names or {}
        said = [names.get(x, repr(x)) if isinstance(x, int) else repr(x)
                for x in (theirs.get(CODEC), mine[CODEC])]
        return (f"{who} has compression={said[0]}, rank 0 has compression={said[1]}: "
                f"every rank must use the same compression")
    if TRANSPORT in mine and theirs.get(TRANSPORT) != mine[TRANSPORT]:
        said = [TRANSPORTS[x] if isinstance(x, int) and 0 <= x < len(TRANSPORTS) else repr(x)
                for x in (theirs.get(TRANSPORT), mine[TRANSPORT])]
        return (f"{who} has transport={said[0]}, rank 0 has transport={said[1]}: "
                f"every rank must use the same transport")
    for name in SHARED:
        if theirs.get(name) != mine.get(name):
            return (f"{who} has {name}={theirs.get(name)!r}, rank 0 has "
                    f"{name}={mine.get(name)!r}: every rank must use the same {name}")
    return None


def add_flags(parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None,
              defaults: Mapping[str, Any] | None = None) -> None:
    """The options as command-line flags (--eager-limit ...); unset ones stay None, so the
    library's own defaults (or `defaults`) apply."""
    for o in OPTIONS:
        if names is None or o.name in names:
            default = (defaults or {}).get(o.name)
            shown = show(o.default if default is None else default)
            parser.add_argument(o.flag, dest=o.name, type=o.kind, default=default, metavar="N",
                                help=f"{o.meaning} (default {shown})")


def from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The options a command line set, for init(**...)."""
    return {o.name: getattr(args, o.name) for o in OPTIONS
            if getattr(args, o.name, None) is not None}


def markdown_table() -> str:
    """docs/library.md's table of init() options, exactly (a test keeps that page equal to it)."""
    rows = ["| option | default | range | meaning |", "| --- | --- | --- | --- |"]
    for o in OPTIONS:
        agree = " Every rank must give the same value." if o.shared else ""
        rows.append(f"| `{o.name}` | {show(o.default)} | {show(o.low)}..{show(o.high)} | "
                    f"{o.meaning}.{agree} |")
    return "\n".join(rows)

"""Where a job's ranks run, as rxelab-launch is told: --hosts, a list in Slurm's hostlist
syntax (`node[1-3,7],gpu[01-04]-ib`: what a cluster's users already type), or --hostfile, a
file as mpirun's (one host a line, `slots=N` its ranks), so a job moves between launchers
with its host list unchanged.

Every name is checked before it goes anywhere: a host name reaches ssh as one word of its
argv, and a name that starts with '-' would be read as an option, so only DNS names and IP
addresses pass. A bad line is named by its file and number, never guessed at.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rxelab import hostlist
from rxelab.bootstrap import MAX_RANKS
from rxelab.errors import ConfigError

MAX_BYTES = 1 << 22  # a host file is one short line a host, and no more than MAX_RANKS of them
# a DNS name, an /etc/hosts or ~/.ssh/config alias (`_` allowed); never a leading '-' or '.'
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_SLOTS = re.compile(r"0*([1-9][0-9]*)")


@dataclass(frozen=True)
class HostSlots:
    """A host and how many of the job's ranks run on it."""

    host: str
    slots: int


@dataclass(frozen=True)
class Seat:
    """Where one rank runs: its host, and its place among that host's ranks (LOCAL_RANK)."""

    host: str
    local_rank: int


def check_host(name: str) -> str:
    """The name, if it is a host name or an IP address (no zone index: Python takes any text
    after '%'); a ConfigError in words otherwise."""
    if _HOST.fullmatch(name):
        return name
    try:
        if "%" not in name:
            return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    raise ConfigError(f"{name[:80]!r} is not a host name (letters, digits, '.', '_', '-', "
                      "starting with a letter or digit) or an IP address")


def names(text: str) -> list[str]:
    """Every host a list names, in order: Slurm's hostlist syntax, and IPv6 addresses among its
    items (Slurm's syntax has no room for their colons)."""
    out: list[str] = []
    for item in hostlist.items(text):
        if "@" in item:
            user, _, host = item.rpartition("@")
            raise ConfigError(f"{item[:80]!r}: a user goes in ~/.ssh/config (Host {host[:40]}, "
                              f"User {user[:40]}), not in the host list")
        out.extend([item] if ":" in item else hostlist.expand(item))
        if len(out) > MAX_RANKS:
            raise ConfigError(f"{text[:80]!r} names more than the {MAX_RANKS} hosts a job can "
                              "have (one rank each at least)")
    return [check_host(name) for name in out]


def from_hostlist(text: str, per_host: int) -> list[HostSlots]:
    """--hosts: `per_host` ranks on each host of the list."""
    hosts = [HostSlots(name, per_host) for name in names(text)]
    if len(hosts) * per_host > MAX_RANKS:
        raise ConfigError(f"{len(hosts)} hosts x {per_host} ranks is more than the {MAX_RANKS} "
                          "ranks rxelab supports")
    return hosts


def read_hostfile(path: str, per_host: int) -> list[HostSlots]:
    """--hostfile: a line is `HOSTS [slots=N]`, HOSTS a hostlist whose every host gets N ranks
    (`per_host` without slots=); '#' starts a comment; blank lines are skipped."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{path}: more than {MAX_BYTES >> 20} MiB; a host file is one host a "
                          "line")
    try:
        text = data.decode()
    except UnicodeDecodeError as err:
        number = data[:err.start].count(b"\n") + 1
        raise ConfigError(f"{path} line {number}: not UTF-8 text") from None
    hosts: list[HostSlots] = []
    world = 0
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            slots = _slots(words[1:], per_host)
            more = [HostSlots(name, slots) for name in names(words[0])]
        except ConfigError as err:
            raise ConfigError(f"{path} line {number}: {err}") from None
        world += len(more) * slots
        if world > MAX_RANKS:
            raise ConfigError(f"{path} line {number}: the job passes the {MAX_RANKS} ranks rxelab "
                              "supports")
        hosts += more
    if not hosts:
        raise ConfigError(f"{path} names no host")
    return hosts


def _slots(options: list[str], per_host: int) -> int:
    """A line's ranks per host: its `slots=N`, else `per_host`."""
    slots = None
    for option in options:
        key, equals, value = option.partition("=")
        if key != "slots" or not equals:
            raise ConfigError(f"{option[:40]!r} is not slots=N (the only setting a line takes)")
        if slots is not None:
            raise ConfigError("slots= given twice")
        m = _SLOTS.fullmatch(value)
        if not m:
            raise ConfigError(f"slots={value[:20]} is not a positive integer")
        if len(m.group(1)) > len(str(MAX_RANKS)) or int(m.group(1)) > MAX_RANKS:
            raise ConfigError(f"slots={value[:20]} is more than the {MAX_RANKS} ranks rxelab "
                              "supports")
        slots = int(m.group(1))
    return per_host if slots is None else slots


def seats(hosts: Sequence[HostSlots]) -> list[Seat]:
    """Each rank's seat, rank by rank: host after host, as many as its slots. A host named
    twice takes ranks at each place, its local ranks counting on."""
    taken: Counter[str] = Counter()
    out: list[Seat] = []
    for entry in hosts:
        for _ in range(entry.slots):
            out.append(Seat(entry.host, taken[entry.host]))
            taken[entry.host] += 1
    return out

"""Every argument a communicator call takes beside its buffers, checked in one place before
anything is posted: a bad one is a ConfigError that names it, never a TypeError from deep
inside (or, worse, a plan found under the wrong key)."""

from __future__ import annotations

import operator
from typing import Any

from rxelab import ops
from rxelab.errors import ConfigError


def whole(value: Any, what: str) -> int:
    """An integer argument (numpy's too), or a ConfigError naming it."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}={value!r} must be a whole number")
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"{what}={value!r} must be a whole number") from None


def immediate(value: Any) -> int:
    """A write's immediate value: a whole number of 24 bits (the rest of the tag is ours)."""
    value = whole(value, "imm")
    if not 0 <= value < 1 << 24:
        raise ConfigError(f"imm={value} is outside 0..2^24-1")
    return value


def names(**given: Any) -> None:
    """Names (algorithm=, op=) are strings: anything else is said before it reaches a plan's
    key (where a list would be a TypeError: unhashable)."""
    for what, value in given.items():
        if not isinstance(value, str):
            raise ConfigError(f"{what}={value!r} must be a name (a string)")


def whole_numbers(counts: Any, size: int, name: str) -> list[int]:
    """Counts as Python ints: lists, tuples or numpy arrays of integers (np.bincount's too)."""
    try:
        values = [operator.index(c) for c in counts]
    except TypeError:
        values = []
    if len(values) != size or any(c < 0 for c in values):
        raise ConfigError(f"{name} must hold {size} whole numbers >= 0")
    return values


def peer(value: Any, rank: int, size: int) -> int:
    """Another rank of the communicator."""
    value = whole(value, "peer")
    if not 0 <= value < size or value == rank:
        raise ConfigError(f"peer {value!r} is not another rank of 0..{size - 1}")
    return value


def nbytes(value: Any) -> int:
    value = whole(value, "nbytes")
    if value < 0:
        raise ConfigError(f"nbytes={value} must be 0 or more")
    return value


def window(algorithm: str, pairs: Any, size: int, windowed: tuple[str, ...] = ("sequential",)) -> int:
    """The sequential schedule's window: how many pairs exchange at once (of the algorithms
    in `windowed`, a description's)."""
    pairs = whole(pairs, "pairs")
    if pairs < 1:
        raise ConfigError(f"pairs={pairs!r}: at least one pair must be able to exchange")
    if pairs != 1 and algorithm not in windowed:
        raise ConfigError(f"pairs= sets the {' and '.join(windowed)} schedule's window, not "
                          f"{algorithm}'s")
    return min(pairs, max(1, size * (size - 1) // 2))


def algorithm(c: ops.Collective, chosen: Any) -> str:
    """The algorithm a call asked for (None: its description's default), as a name; whether
    the collective has it is said when its plan is made (rxelab.ops.runner)."""
    chosen = c.default if chosen is None else chosen
    names(algorithm=chosen)
    return str(chosen)


def arguments(c: ops.Collective, chosen: str, given: dict[str, Any], rank: int,
              size: int) -> dict[str, Any]:
    """The extra arguments the description takes, checked; anything else is refused."""
    unknown = sorted(given.keys() - set(c.takes))
    if unknown:
        raise ConfigError(f"{c.name} takes no {', '.join(unknown)}")
    out: dict[str, Any] = {}
    if "pairs" in c.takes:
        out["window"] = window(chosen, given.get("pairs", 1), size, c.windowed)
    if "root" in c.takes:
        root = whole(given.get("root", 0), "root")
        if not 0 <= root < size:
            raise ConfigError(f"root {root!r} is not a rank of 0..{size - 1}")
        out["root"] = root
    if "op" in c.takes:
        names(op=given.get("op", "sum"))
        out["op"] = given.get("op", "sum")
    if "send_counts" in c.takes:
        missing = [k for k in ("send_counts", "recv_counts") if k not in given]
        if missing:
            raise ConfigError(f"{c.name} needs {' and '.join(missing)}")
        for k in ("send_counts", "recv_counts"):
            out[k] = tuple(whole_numbers(given[k], size, k))
    return out

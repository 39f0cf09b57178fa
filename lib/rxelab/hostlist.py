"""Slurm's hostlist syntax, as `scontrol show hostnames` expands it: `node[1-3,7]`,
`gpu[01-04]-ib`, `rack[1-2]-n[1-2]` (every combination, in order), several of them separated
by commas. Slurm sets no MASTER_ADDR: rank 0's host is the first name of the step's list.

Pure Python: no scontrol needed (a compute node may lack it), and every input is checked:
a malformed list is a ConfigError naming it, never a guess.
"""

from __future__ import annotations

import re

from rxelab.errors import ConfigError

MAX_HOSTS = 1 << 16
_NAME = re.compile(r"[A-Za-z0-9._-]*")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def expand(text: str) -> list[str]:
    """Every host name of a hostlist, in order."""
    out: list[str] = []
    for item in items(text):
        out.extend(_expand_one(item, text))
        if len(out) > MAX_HOSTS:
            raise ConfigError(f"hostlist {text[:80]!r} names more than {MAX_HOSTS} hosts")
    if not out:
        raise ConfigError(f"hostlist {text[:80]!r} names no host")
    return out


def first(text: str) -> str:
    """The first host of a hostlist (what rank 0 runs on under srun's block and cyclic
    distributions), without expanding the rest."""
    return _first_of(items(text)[0], text)


def items(text: str) -> list[str]:
    """The list's items, unexpanded (`a,b[1-2]`: `a` and `b[1-2]`): commas outside brackets
    separate them."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
            if depth > 1:
                raise ConfigError(f"hostlist {text[:80]!r}: brackets inside brackets")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"hostlist {text[:80]!r}: a ']' without its '['")
        elif c == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    if depth:
        raise ConfigError(f"hostlist {text[:80]!r}: a '[' without its ']'")
    out.append(text[start:])
    if any(not item for item in out):
        raise ConfigError(f"hostlist {text[:80]!r}: an empty name")
    return out


def _parts(item: str, text: str) -> list[str | list[str]]:
    """An item as literal pieces and bracket groups (each group: its numbers, padded)."""
    parts: list[str | list[str]] = []
    for piece in re.split(r"(\[[^\]]*\])", item):
        if piece.startswith("["):
            parts.append(_numbers(piece[1:-1], text))
        elif piece:
            if not _NAME.fullmatch(piece):
                raise ConfigError(f"hostlist {text[:80]!r}: {piece[:40]!r} is not a host name")
            parts.append(piece)
    return parts


def _numbers(group: str, text: str) -> list[str]:
    out: list[str] = []
    for spec in group.split(","):
        m = _RANGE.fullmatch(spec)
        if not m:
            raise ConfigError(f"hostlist {text[:80]!r}: [{group[:40]}] is not a list of numbers "
                              "and ranges")
        lo_text, hi_text = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo or hi - lo >= MAX_HOSTS:
            raise ConfigError(f"hostlist {text[:80]!r}: the range {spec} is backwards or too long")
        width = len(lo_text) if lo_text.startswith("0") and len(lo_text) > 1 else 0
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def _expand_one(item: str, text: str) -> list[str]:
    names = [""]
    for part in _parts(item, text):
        if isinstance(part, str):
            names = [n + part for n in names]
        else:
            names = [n + x for n in names for x in part]
            if len(names) > MAX_HOSTS:
                raise ConfigError(f"hostlist {text[:80]!r} names more than {MAX_HOSTS} hosts")
    return names


def _first_of(item: str, text: str) -> str:
    return "".join(p if isinstance(p, str) else p[0] for p in _parts(item, text))

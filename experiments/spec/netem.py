"""Impairments of the data network (loss, delay, jitter, reorder, duplicate, rate), as Linux
netem applies them on each node's data NIC. The host kernel has no netem, the guests do: the
runner applies an impairment inside every node of a case before it starts and removes it
after, also when the case fails or is interrupted.

An impairment is a small table in a spec: {loss = 1.0, delay_ms = 1, jitter_ms = 2,
reorder = 5}. Percentages are of packets; an empty table is the unimpaired network.

Or a profile a reader can name, "rtt-50ms+loss-0.1": terms joined by "+", each a link's
property as a network engineer states it (PROFILE_TERMS). netem delays what a node sends, on
every node, so a round trip crosses two delays: rtt-50ms is delay_ms = 25 on each NIC.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

Impairment = Mapping[str, float]  # a spec's table: {loss = 1.0, delay_ms = 1}; {}: none

# key -> (netem word, unit, lowest, highest)
KEYS: dict[str, tuple[str, str, float, float]] = {
    "loss": ("loss", "%", 0, 100),
    "delay_ms": ("delay", "ms", 0, 60_000),
    "jitter_ms": ("", "ms", 0, 60_000),  # netem: the second value after delay
    "reorder": ("reorder", "%", 0, 100),
    "duplicate": ("duplicate", "%", 0, 100),
    "rate_mbit": ("rate", "mbit", 0.001, 100_000),
}


# a profile's terms: name -> (the table's key, its unit in the name, factor to the key's value)
PROFILE_TERMS: dict[str, tuple[str, str, float]] = {
    "rtt": ("delay_ms", "ms", 0.5),  # a round trip crosses two nodes' delays
    "jitter": ("jitter_ms", "ms", 1.0),
    "loss": ("loss", "", 1.0),  # percent of packets, on every NIC
    "rate": ("rate_mbit", "mbit", 1.0),
}
_TERM = re.compile(r"([a-z]+)-([0-9]+(?:\.[0-9]+)?)([a-z]*)")


def profile(name: str) -> dict[str, float]:
    """A named profile's table: "rtt-50ms+loss-0.1" -> {delay_ms: 25, loss: 0.1}; "none" ->
    {}. ValueError naming the term it cannot read."""
    if name == "none":
        return {}
    out: dict[str, float] = {}
    for term in name.split("+"):
        m = _TERM.fullmatch(term)
        known = m is not None and m.group(1) in PROFILE_TERMS
        if m is None or not known or PROFILE_TERMS[m.group(1)][1] != m.group(3):
            forms = ", ".join(f"{t}-<n>{unit}" for t, (_, unit, _) in PROFILE_TERMS.items())
            raise ValueError(f"profile {name!r}: cannot read {term!r} (terms: {forms}, joined "
                             "by +; or none)")
        key, _, factor = PROFILE_TERMS[m.group(1)]
        if key in out:
            raise ValueError(f"profile {name!r}: {m.group(1)} twice")
        out[key] = float(m.group(2)) * factor
    return out


def problems(imp: Any) -> list[str]:
    """What is wrong with one impairment table; empty when it is usable."""
    if not isinstance(imp, dict):
        return [f"must be a table like {{loss = 1.0}}, not {imp!r}"]
    out = [f"unknown key {k!r} (known: {', '.join(KEYS)})" for k in sorted(imp.keys() - KEYS.keys())]
    for key, value in imp.items():
        if key not in KEYS:
            continue
        _, _, low, high = KEYS[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            out.append(f"{key} must be a number from {low:g} to {high:g}, not {value!r}")
    if not imp.get("delay_ms") and (imp.get("jitter_ms") or imp.get("reorder")):
        out.append("jitter_ms and reorder need a delay_ms (netem reorders by delaying the others)")
    return out


def _num(value: float) -> str:
    return f"{value:g}"


def netem_args(imp: Impairment) -> list[str]:
    """The arguments after `tc qdisc replace dev X root`; [] for the unimpaired network."""
    if not any(imp.values()):
        return []
    args = ["netem"]
    if imp.get("delay_ms"):
        args += ["delay", f"{_num(imp['delay_ms'])}ms"]
        if imp.get("jitter_ms"):
            args.append(f"{_num(imp['jitter_ms'])}ms")
    for key in ("loss", "reorder", "duplicate"):
        if imp.get(key):
            args += [KEYS[key][0], f"{_num(imp[key])}%"]
    if imp.get("rate_mbit"):
        args += ["rate", f"{_num(imp['rate_mbit'])}mbit"]
    return args


def label(imp: Impairment) -> str:
    """A short human name: 'none', 'loss 1%', 'loss 1%, delay 1±2 ms, reorder 5%'."""
    if not any(imp.values()):
        return "none"
    parts = []
    if imp.get("loss"):
        parts.append(f"loss {_num(imp['loss'])}%")
    if imp.get("delay_ms"):
        jitter = f"±{_num(imp['jitter_ms'])}" if imp.get("jitter_ms") else ""
        parts.append(f"delay {_num(imp['delay_ms'])}{jitter} ms")
    for key in ("reorder", "duplicate"):
        if imp.get(key):
            parts.append(f"{key} {_num(imp[key])}%")
    if imp.get("rate_mbit"):
        parts.append(f"rate {_num(imp['rate_mbit'])} Mbit/s")
    return ", ".join(parts)


def apply_command(netdev: str, imp: Impairment, handle: str) -> str:
    """Shell for one node: put the impairment on `netdev` (a word or a "$nd" expression) as
    the root qdisc under `handle` (the run's own: what it removes later, and nothing else).
    The caller makes sure the root qdisc it replaces is the kernel's default."""
    return f"sudo -n tc qdisc replace dev {netdev} root handle {handle}: {shlex.join(netem_args(imp))}"


def clear_command(netdev: str, handle: str, tc: str = "/sbin/tc") -> str:
    """Shell for one node: remove the netem under `handle` if it is the root qdisc (the kernel
    puts its default back), leave any other qdisc alone, and say `netem_ours absent` once ours
    is gone (or was never there) - `present` if it could not be removed."""
    show = f'{tc} qdisc show dev {netdev} root'
    ours = f'*"qdisc netem {handle}: root"*'
    return (f'case "$({show})" in {ours}) sudo -n tc qdisc del dev {netdev} root;; esac; '
            f'case "$({show})" in {ours}) echo "netem_ours present";; *) echo "netem_ours absent";; esac')

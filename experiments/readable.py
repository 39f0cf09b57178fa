"""Sizes and times as a person reads them, in every line a run prints and every table or figure
of a report: shared by running, report and simulation, so it imports none of them (nor
matplotlib, which a runner does not need)."""

from __future__ import annotations

import math


def size_text(n: float) -> str:
    """Bytes as a person reads them: 1 KiB, 64 KiB, 1 MiB, 1.5 KiB, 1.001 KiB, 1023 KiB, 100 B."""
    n = int(n)
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.4g} {unit}"
    return f"{n} B"


def ms_text(us: float | None) -> str:
    """Microseconds as milliseconds with three significant figures (1.23, 12.3, 123, 1234)."""
    if us is None or not math.isfinite(us):
        return "-"
    ms = us / 1e3
    for limit, digits in ((99.95, 0), (9.995, 1), (0.9995, 2)):
        if abs(ms) >= limit:
            return f"{ms:.{digits}f}"
    return f"{ms:.3g}"

"""The numerical pieces of a calibration, apart from what is fitted: lines through measured
points, the solve of a replay that grows with one cost (affine, or by pieces), and a
nondecreasing fit of sizes measured out of order (costs only grow with size)."""

from __future__ import annotations

from typing import Any

from experiments.simulation.costs import Segment

PROBE = 1e-3  # seconds: the second point of the affine solve
SOLVE_ROUNDS = 12  # secant steps of a solve at most (a wake shared by how many VMs want the
# cores has more pieces: 8 came to 1e-3 of the made-up lab's wake)
PROBES = 4  # doublings of the probe while a replay does not grow
LAST = 1 << 62  # the last segment's bound: any size


class CalibrationError(ValueError):
    pass


def interpolated(points: list[tuple[int, float]]) -> tuple[Segment, ...]:
    """Segments through (size, seconds) points, linear between them and on past the last."""
    segments = [Segment(points[0][0], points[0][1], 0.0)]
    slope = 0.0
    for (s0, c0), (s1, c1) in zip(points, points[1:], strict=False):
        slope = (c1 - c0) / (s1 - s0)
        segments.append(Segment(s1, c1 - slope * s1, slope))
    last = points[-1]
    segments.append(Segment(LAST, last[1] - slope * last[0], slope))
    return tuple(segments)


def solve(measured: float, at: Any) -> tuple[float, float]:
    """x >= 0 for which at(x), nondecreasing in x, comes nearest `measured`; and what at(x)
    then is. A replay is affine in one cost (the first step lands on it: three replays), or
    affine by pieces where a cost spent beside a wait is hidden until it outlasts the wait:
    then secant steps from the last two replays (bisection where those two are level), at
    most SOLVE_ROUNDS, and the nearest replay seen. The probe doubles while the replay does
    not grow (a wait longer than PROBE hides the cost there), up to PROBE * 2**PROBES. A
    replay need not be quite monotone (a longer wake can move another rank's wake-up to an
    instant where fewer VMs want the cores): the steps still end, and the nearest replay seen
    is what is kept."""
    x0, y0 = 0.0, at(0.0)
    if measured <= y0:
        return 0.0, y0
    x1, y1 = PROBE, at(PROBE)
    for _ in range(PROBES):
        if y1 > y0:
            break
        x1 *= 2
        y1 = at(x1)
    if y1 <= y0:
        raise CalibrationError("a replay did not grow with the cost being fitted")
    best = min((x0, y0), (x1, y1), key=lambda p: abs(p[1] - measured))
    tolerance = max(1e-6 * measured, 1e-12)
    for _ in range(SOLVE_ROUNDS):
        if abs(best[1] - measured) <= tolerance:
            break
        if y1 > y0:
            x = max(0.0, x1 + (measured - y1) * (x1 - x0) / (y1 - y0))
        else:  # level: halve towards the measured side
            x = (x0 + x1) / 2 if y1 >= measured else 2 * max(x0, x1)
        if x in (x0, x1):
            break
        y = at(x)
        if abs(y - measured) < abs(best[1] - measured):
            best = (x, y)
        x0, y0, x1, y1 = x1, y1, x, y
    return best


def isotonic(values: list[float]) -> list[float]:
    """The nondecreasing sequence nearest `values` in least squares: adjacent values out of
    order are pooled to their mean (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def out_of_order(pooled: list[float], values: list[float]) -> list[tuple[int, int]]:
    """(first, last) index of each run that isotonic() pooled."""
    runs, i = [], 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1] == pooled[i]:
            j += 1
        if j > i and any(values[k] != pooled[i] for k in range(i, j + 1)):
            runs.append((i, j))
        i = j + 1
    return runs

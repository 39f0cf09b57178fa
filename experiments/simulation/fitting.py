"""The numerical pieces of a calibration, apart from what is fitted: lines through measured
points, the solve of a replay that is affine in one cost, and a nondecreasing fit of sizes
measured out of order (costs only grow with size)."""

from __future__ import annotations

from typing import Any

from experiments.simulation.costs import Segment

PROBE = 1e-3  # seconds: the second point of the affine solve
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
    """x >= 0 for which at(x), affine in x, equals `measured`; and what at(x) then is."""
    zero, probe = at(0.0), at(PROBE)
    slope = (probe - zero) / PROBE
    if slope <= 0:
        raise CalibrationError("a replay did not grow with the cost being fitted")
    x = max(0.0, (measured - zero) / slope)
    return x, at(x)


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

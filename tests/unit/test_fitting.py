"""The numerical pieces of a calibration (experiments/simulation/fitting.py) on functions
made up here: the solve of a replay that grows with one cost, and the nondecreasing fit of
sizes measured out of order."""

from __future__ import annotations

import pytest

from experiments.simulation import fitting


def test_solve_steps_past_a_cost_hidden_beside_a_wait():
    """A replay affine by pieces (a cost hidden until it outlasts a wait): the solve lands on
    the measured time all the same, where one affine step would not; a wait longer than the
    probe too (the probe doubles)."""
    x, then = fitting.solve(5e-3, lambda x: 1e-3 + max(x / 2, 1e-3) + x / 2)
    assert x == pytest.approx(4e-3, rel=1e-6) and then == pytest.approx(5e-3, rel=1e-6)
    x, then = fitting.solve(20e-3, lambda x: 1e-3 + max(x / 2, 5e-3) + x / 2)
    assert x == pytest.approx(19e-3, rel=1e-6) and then == pytest.approx(20e-3, rel=1e-6)


@pytest.mark.parametrize(("a", "b", "target"), [(2.6e-4, 0.37, 2.62e-4), (1e-5, 4.2, 3.3e-3),
                                                (7.7e-4, 1.9, 9.1e-4)])
def test_solve_of_a_replay_rounded_to_its_printed_digits_stays_near(a, b, target):
    """Replays print their times rounded: level or jagged steps must not carry the solve off
    (a secant through two equal times once doubled it); it returns the nearest it saw."""
    def rounded(x):
        return round((a + b * x) * 4, 8) / 4
    x, then = fitting.solve(target, rounded)
    assert x == pytest.approx((target - a) / b, abs=1e-8 / b)
    assert then == pytest.approx(target, abs=1e-8)


def test_solve_of_a_time_below_the_replay_at_no_cost_is_no_cost():
    calls = []
    assert fitting.solve(0.5e-3, lambda x: calls.append(x) or 1e-3 + 2 * x) == (0.0, 1e-3)
    assert calls == [0.0]
    with pytest.raises(fitting.CalibrationError, match="did not grow"):
        fitting.solve(2e-3, lambda x: 1e-3)


def test_sizes_measured_out_of_order_are_fitted_to_their_pooled_median():
    assert fitting.isotonic([3.0, 2.5, 1.8, 2.0, 2.3, 4.9]) == pytest.approx(
        [2.32, 2.32, 2.32, 2.32, 2.32, 4.9])
    assert fitting.isotonic([1.0, 2.0, 2.0, 3.0]) == [1.0, 2.0, 2.0, 3.0]
    values = [3.0, 2.5, 1.8, 2.0, 2.3, 4.9, 4.0]
    assert fitting.out_of_order(fitting.isotonic(values), values) == [(0, 4), (5, 6)]

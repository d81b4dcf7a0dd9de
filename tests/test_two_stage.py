"""Stein's two-stage size and interval (``prereg.descriptive.two_stage_size``,
``two_stage_interval``), which size and read the never-slower table's rows
(``benchmarks/never_slower.py``): the t quantile against scipy, the coverage and the half-width by
simulation, and the one-stage case against the plain Student-t interval."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prereg.descriptive import mean_interval, two_stage_interval, two_stage_size


def test_the_size_is_steins_formula_with_scipys_quantile():
    """n = max(n0, ceil((t s0 / h)^2)), with t from scipy.stats.t.ppf and s0 from statistics.stdev."""
    import statistics

    from scipy import stats

    rng = random.Random(7)
    for n0 in (5, 10, 20):
        pilot = [rng.gauss(0, 0.012) for _ in range(n0)]
        for h in (0.002, 0.0045, 0.01):
            want = max(n0, math.ceil((stats.t.ppf(0.975, n0 - 1) * statistics.stdev(pilot) / h) ** 2))
            assert two_stage_size(pilot, h) == want
            assert two_stage_size(pilot, h, cap=want - 1) == max(n0, want - 1)


@given(st.lists(st.floats(-1, 1), min_size=2, max_size=30), st.sampled_from([0.9, 0.95, 0.99]))
def test_one_stage_is_the_plain_t_interval(values, level):
    """With no second stage (n == n0) the two-stage interval is :func:`mean_interval`, bit for bit."""
    a = two_stage_interval(values, len(values), level)
    b = mean_interval(values, level)
    assert (a.estimate, a.low, a.high, a.df, a.n) == (b.estimate, b.low, b.high, b.df, b.n)


def test_coverage_and_half_width_by_simulation():
    """4,000 two-stage samples of normal values (pilot of 10, target half-width 0.0045, sd drawn
    from 0.005-0.03): the 95% interval covers the mean inside the binomial band (3 standard errors:
    0.95 -/+ 0.0103), and its half-width is at most the target in every sample."""
    rng = random.Random(20261207)
    h, n0, reps, covered = 0.0045, 10, 4000, 0
    for _ in range(reps):
        sd, mu = rng.uniform(0.005, 0.03), rng.uniform(-0.01, 0.01)
        pilot = [rng.gauss(mu, sd) for _ in range(n0)]
        n = two_stage_size(pilot, h)
        ci = two_stage_interval(pilot + [rng.gauss(mu, sd) for _ in range(n - n0)], n0)
        assert (ci.high - ci.low) / 2 <= h * (1 + 1e-12)
        covered += ci.low <= mu <= ci.high
    band = 3 * math.sqrt(0.95 * 0.05 / reps)
    assert abs(covered / reps - 0.95) <= band, covered / reps


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: two_stage_size([0.1], 0.01), "at least two"),
        (lambda: two_stage_size([0.1, 0.2], 0.0), "half_width must be positive"),
        (lambda: two_stage_size([0.1, float("nan")], 0.01), "pilot"),
        (lambda: two_stage_interval([0.1, 0.2, 0.3], 4), "the pilot must hold 2 to 3"),
        (lambda: two_stage_interval([0.1, 0.2, 0.3], 1), "the pilot must hold 2 to 3"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()

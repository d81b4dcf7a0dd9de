"""The lockstep model's order cells against statsmodels' OLS with sum coding, and the carry-over
against a carry-over of known size planted in step times.

The reference: ``statsmodels.formula.api.ols("d ~ C(build, Sum) * C(step, Sum)")`` on the same per-pair
log ratios (R: ``lm(d ~ build * step)`` with ``contr.sum``). patsy's Sum coding drops the last level
in sorted order ("candidate"), so its column for a factor is +1 for "baseline": each main effect and
the interaction keep their size, the main effects change sign.
"""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest
import statsmodels.formula.api as sm
from hypothesis import given, settings
from hypothesis import strategies as st

from prereg.carryover import blocks, carry_over, cells_mean, follows, order_cells

ROLES = ("baseline", "candidate")


def pairs_of(seed: int, n: int) -> list[dict]:
    """``n`` lockstep pairs with random times and order effects, the four cells filled unevenly (the
    first four pairs one of each, the rest drawn)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        first = ROLES[i % 2] if i < 4 else rng.choice(ROLES)
        steps_first = ROLES[(i // 2) % 2] if i < 4 else rng.choice(ROLES)
        b = math.exp(rng.gauss(0, 0.1))
        d = 0.02 + 0.01 * (first == "candidate") - 0.004 * (steps_first == "candidate") + rng.gauss(0, 0.01)
        out.append(
            {
                "first": first,
                "steps_first": steps_first,
                "baseline_training_cpu_s": b,
                "candidate_training_cpu_s": b * math.exp(d),
            }
        )
    return out


@pytest.mark.parametrize("seed,n", [(0, 8), (1, 13), (2, 40), (3, 81)])
def test_order_cells_are_statsmodels_ols_with_sum_coding(seed, n):
    pairs = pairs_of(seed, n)
    mine = order_cells(pairs, "training_cpu_s", 0.95)
    df = pd.DataFrame(
        {
            "d": [math.log(p["candidate_training_cpu_s"] / p["baseline_training_cpu_s"]) for p in pairs],
            "build": [p["first"] for p in pairs],
            "step": [p["steps_first"] for p in pairs],
        }
    )
    fit = sm.ols("d ~ C(build, Sum) * C(step, Sum)", df).fit()
    ci = fit.conf_int(0.05)
    names = {
        "effect": ("Intercept", 1),
        "built_first": ("C(build, Sum)[S.baseline]", -1),
        "steps_first": ("C(step, Sum)[S.baseline]", -1),
        "interaction": ("C(build, Sum)[S.baseline]:C(step, Sum)[S.baseline]", 1),
    }
    assert mine is not None and mine["df"] == int(fit.df_resid) == n - 4
    for ours, (theirs, sign) in names.items():
        assert mine[ours]["estimate"] == pytest.approx(sign * fit.params[theirs], abs=1e-12), ours
        assert mine["se"] == pytest.approx(fit.bse[theirs], rel=1e-9), ours
        lo, hi = sorted(sign * ci.loc[theirs])
        assert mine[ours]["lo"] == pytest.approx(lo, abs=1e-9) and mine[ours]["hi"] == pytest.approx(
            hi, abs=1e-9
        )


def test_cells_mean_refuses_an_empty_cell_and_no_degree_of_freedom():
    with pytest.raises(ValueError, match="all four"):
        cells_mean([0.1, 0.2, 0.3, 0.4, 0.5], [(1, 1), (1, -1), (-1, 1), (-1, 1), (1, 1)])
    with pytest.raises(ValueError, match="five pairs"):
        cells_mean([0.1, 0.2, 0.3, 0.4], [(1, 1), (1, -1), (-1, 1), (-1, -1)])
    assert order_cells(pairs_of(0, 8)[:4], "training_cpu_s", 0.95) is None


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.integers(1, 60))
def test_follows_is_the_order_blocks_runs(steps, block_steps):
    """Each arm's flags against the interleaved sequence :func:`blocks` gives, step by step."""
    seq = [arm for arm, n in blocks(steps, block_steps) for _ in range(n)]
    assert seq.count(0) == seq.count(1) == steps
    want: tuple[list, list] = ([], [])
    for i, arm in enumerate(seq):
        want[arm].append(None if i == 0 else seq[i - 1] != arm)
    assert follows(steps, block_steps) == want


def test_blocks_is_abba():
    assert list(blocks(3, 1)) == [(0, 1), (1, 1), (1, 1), (0, 1), (0, 1), (1, 1)]
    assert list(blocks(5, 2)) == [(0, 2), (1, 2), (1, 2), (0, 2), (0, 1), (1, 1)]


@pytest.mark.parametrize("block_steps", [1, 3, 10])
def test_a_planted_carry_over_is_recovered(block_steps):
    """Step times whose every step after the partner's block costs ``exp(c)`` more (c known, the
    candidate's larger): the carry-over reads c per arm, and the difference, up to the noise."""
    rng = random.Random(block_steps)
    steps, warmup = 60, 4
    c = {"baseline": 0.01, "candidate": 0.03}
    pairs = []
    for i in range(12):
        steps_first = ROLES[i % 2]
        pair = {}
        for role in ROLES:
            arm = 0 if role == steps_first else 1
            after = follows(steps, block_steps)[arm]
            times = [round(3000 * math.exp((c[role] if f else 0.0) + rng.gauss(0, 0.002))) for f in after]
            pair[role] = {
                "spec": {"steps": steps, "steps_first": role == steps_first, "warmup_steps": warmup},
                "step_times": {"wall_us": times, "cpu_us": times},
            }
        pairs.append(pair)
    out = carry_over(pairs, block_steps, 0.95)
    assert out is not None
    for clock in ("wall", "CPU"):
        got = out[clock]
        assert got["pairs"] == 12
        for role in ROLES:
            assert got[role]["lo"] <= c[role] <= got[role]["hi"], (clock, role, got[role])
            assert got[role]["estimate"] == pytest.approx(c[role], abs=0.002)
        diff = got["candidate_less_baseline"]
        assert diff["lo"] <= 0.02 <= diff["hi"]

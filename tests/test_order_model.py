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
from prereg.descriptive import Rows

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
    mine = order_cells(Rows(pairs, 0.95), "training_cpu_s")
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
    assert order_cells(Rows(pairs_of(0, 8)[:4], 0.95), "training_cpu_s") is None


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
    out = carry_over(Rows(pairs, 0.95), block_steps)
    assert out is not None
    for clock in ("wall", "CPU"):
        got = out[clock]
        assert got["pairs"] == 12
        for role in ROLES:
            assert got[role]["lo"] <= c[role] <= got[role]["hi"], (clock, role, got[role])
            assert got[role]["estimate"] == pytest.approx(c[role], abs=0.002)
        diff = got["candidate_less_baseline"]
        assert diff["lo"] <= 0.02 <= diff["hi"]


# -- turns, the balanced order and the after-own estimand --------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 80), st.integers(1, 20))
def test_turns_join_an_arms_consecutive_blocks_and_keep_the_order(steps, block_steps):
    """:func:`turns` runs the same steps in the same order as :func:`blocks`, an arm never taking
    two turns in a row."""
    from prereg.carryover import turns

    got = list(turns(steps, block_steps))
    assert [a for a, n in got for _ in range(n)] == [
        a for a, n in blocks(steps, block_steps) for _ in range(n)
    ]
    assert all(a != b for (a, _), (b, _) in zip(got, got[1:]))


@pytest.mark.parametrize("steps", [40, 41, 200, 201])
def test_abba_at_blocks_of_one_is_balanced_for_first_order_carry_over(steps):
    """Each arm's step follows its own step and its partner's equally often (to one step at the
    end), as a Williams-type crossover sequence does: the after-own estimand has half the steps."""
    for arm in (0, 1):
        after = [f for f in follows(steps, 1)[arm] if f is not None]
        assert abs(after.count(True) - after.count(False)) <= 1, (steps, arm)


def _carry_pair(rng: random.Random, steps: int, lam: dict, tau: float, steps_first: str) -> dict:
    """One lockstep pair's step times: a base step of 3 ms, the candidate ``exp(tau)`` longer, and
    a step after the partner's ``exp(lam[role])`` longer (first-order carry-over)."""
    pair = {}
    for role in ROLES:
        arm = 0 if role == steps_first else 1
        after = follows(steps, 1)[arm]
        t = [
            round(
                3000
                * math.exp(
                    (tau if role == "candidate" else 0) + (lam[role] if f else 0) + rng.gauss(0, 0.003)
                )
            )
            for f in after
        ]
        pair[role] = (t, after)
    return pair


def test_the_after_own_estimand_removes_a_carry_over_the_whole_ratio_keeps():
    """A cache-heavy candidate's step evicts what its partner's next step needs: the baseline's
    steps after the candidate's cost ``lam_b`` more. The ratio of whole times reads the direct effect
    less about half of ``lam_b - lam_c``; the after-own means read the direct effect ``tau``."""
    from prereg.carryover import own_step_means

    rng = random.Random(7)
    tau, lam = 0.06, {"baseline": 0.04, "candidate": 0.005}
    whole, own = [], []
    for i in range(40):
        pair = _carry_pair(rng, 200, lam, tau, ROLES[i % 2])
        (tb, ab), (tc, ac) = pair["baseline"], pair["candidate"]
        whole.append(math.log(sum(tc[10:]) / sum(tb[10:])))
        own.append(math.log(own_step_means(tc, ac, 10) / own_step_means(tb, ab, 10)))
    mean = lambda x: sum(x) / len(x)  # noqa: E731
    assert mean(own) == pytest.approx(tau, abs=0.002)
    assert mean(whole) == pytest.approx(tau - (lam["baseline"] - lam["candidate"]) / 2, abs=0.003)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_after_own_ratio_is_statsmodels_per_step_fixed_effects_fit(seed):
    """The after-own log ratio of a pair is the model's: statsmodels' OLS of the step times on arm,
    the previous step's arm and their interaction (``t ~ C(role) * C(after)``, each pair on its own,
    timed steps after the first), its fitted means for each arm after its own step."""
    from prereg.carryover import own_step_means

    rng = random.Random(seed)
    for i in range(4):
        pair = _carry_pair(rng, 120, {"baseline": 0.03, "candidate": 0.01}, 0.05, ROLES[i % 2])
        rows = [
            {"t": t, "role": role, "after": "partner" if f else "own"}
            for role in ROLES
            for k, (t, f) in enumerate(zip(*pair[role]))
            if k >= 10 and f is not None
        ]
        fit = sm.ols("t ~ C(role) * C(after)", data=pd.DataFrame(rows)).fit()
        cell = pd.DataFrame({"role": list(ROLES), "after": ["own", "own"]})
        mb, mc = fit.predict(cell)
        got = math.log(own_step_means(*pair["candidate"], 10) / own_step_means(*pair["baseline"], 10))
        assert got == pytest.approx(math.log(mc / mb), rel=1e-9)

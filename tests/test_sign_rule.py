"""The sign rule (``test: sign``), the robust rule for skewed differences: the exact sign test of the
median against scipy's ``binomtest``, its order-statistic interval against scipy's binomial quantiles
and as the test's inversion, its decisions in the analysis and the audit alike (the one core), its
mirror under relabelling, and its protocol key, on inputs drawn at random."""

from __future__ import annotations

import math
import random

import pytest
from conftest import completeness, harness, tiny_protocol
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from test_decisions import COMPLETE

from prereg import decisions as D
from prereg.ranks import binomial_upper, median_bounds, sign_test

values = st.lists(
    st.one_of(st.floats(-5, 5, allow_nan=False), st.sampled_from([0.0, 0.5, -0.5])), min_size=1, max_size=60
)


@settings(max_examples=300, deadline=None)
@given(values, st.sampled_from([-0.5, 0.0, 0.25]), st.booleans())
def test_sign_test_matches_scipy_binomtest(v, bound, upper):
    n, k, p = sign_test(v, None if upper else bound, bound if upper else None)
    k_ref = sum(x < bound for x in v) if upper else sum(x > bound for x in v)  # ties count against
    ref = stats.binomtest(k_ref, n, 0.5, alternative="greater").pvalue
    assert (n, k) == (len(v), k_ref)
    assert math.isclose(p, ref, rel_tol=1e-12, abs_tol=1e-300), (p, ref)


@settings(max_examples=200, deadline=None)
@given(values, st.floats(-1, 1), st.floats(0.05, 2))
def test_equivalence_takes_the_larger_p(v, centre, half):
    lo, hi = centre - half, centre + half
    p = sign_test(v, lo, hi)[2]
    assert p == max(sign_test(v, lo, None)[2], sign_test(v, None, hi)[2])


@settings(max_examples=200, deadline=None)
@given(values, st.sampled_from([0.05, 0.025, 0.0125, 0.01, 0.2]))
def test_median_interval_is_the_inversion_of_the_test_and_matches_scipy(v, alpha):
    low, high = median_bounds(v, alpha)
    n, s = len(v), sorted(v)
    # scipy: the largest j with P(B <= j - 1) < alpha, B ~ Bin(n, 1/2)
    js = [j for j in range(1, n + 1) if stats.binom.cdf(j - 1, n, 0.5) < alpha * (1 - 1e-12)]
    if not js:
        assert (low, high) == (None, None)
    else:
        j = max(js)
        assert (low, high) == (s[j - 1], s[n - j])
    # the inversion: the test of "median > lo" establishes exactly for lo below the lower end
    for lo in sorted(set(v)) + [min(v) - 1, max(v) + 1]:
        assert (sign_test(v, lo, None)[2] < alpha) == (low is not None and lo < low)


def test_binomial_tail_is_exact_at_large_n():
    assert binomial_upper(1000, 0) == 1.0 and binomial_upper(1000, 1001) == 0.0
    assert math.isclose(binomial_upper(1000, 550), stats.binom.sf(549, 1000, 0.5), rel_tol=1e-12)
    assert binomial_upper(5, 5) == 1 / 32  # the smallest p at n = 5: below 0.05


def test_sign_test_controls_error_for_a_median_zero_stall_mixture():
    # the case: usually faster, sometimes a large stall; median 0 (the sign rule's null edge)
    rng = random.Random(5)

    def draw():
        return (4.0 if rng.random() < 0.05 else 0.0) + rng.gauss(0.0, 0.3)

    grid = sorted(draw() for _ in range(200_001))
    med = grid[100_000]
    rejections = sum(sign_test([draw() - med for _ in range(12)], None, 0.0)[2] < 0.05 for _ in range(4000))
    # exact level at n = 12: P(B >= 10) = 0.0193; MC SE about 0.0022
    assert rejections / 4000 < 0.0193 + 4 * math.sqrt(0.0193 * 0.98 / 4000)


def sign_spec(**h):
    base = {
        "id": "H1",
        "study": "s",
        "config": "c",
        "endpoint": "training_time",
        "estimand": "relative_reduction",
        "type": "superiority",
        "better": "lower",
        "margin": 0.0,
        "test": "sign",
    }
    return {"procedure": "holm", "family_alpha": 0.05, "min_pairs": 3, "tests": [{**base, **h}]}


def pairs(ratios, swap=False):
    out = []
    for i, r in enumerate(ratios):
        b, c = 10.0 + i, (10.0 + i) * r
        if swap:
            b, c = c, b
        out.append(
            {
                "unit": f"u{i}",
                "order": 2 * i,
                "first": "baseline" if i % 2 == 0 else "candidate",
                "baseline_training_s": b,
                "candidate_training_s": c,
            }
        )
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.5, 2.0), min_size=3, max_size=30),
    st.sampled_from(["superiority", "non_inferiority", "equivalence"]),
    st.sampled_from([0.0, 1.0, 5.0]),
)
def test_sign_decisions_mirror_and_agree_across_estimands(ratios, kind, margin):
    if kind != "superiority" and margin == 0.0:
        margin = 5.0
    done = completeness(COMPLETE)
    got = {}
    for est in ("relative_reduction", "log_ratio"):
        m = margin if est == "relative_reduction" else -math.log1p(-margin / 100)
        d = D.decide(sign_spec(estimand=est, type=kind, margin=m), {("s", "c"): pairs(ratios)}, done)[0]
        got[est] = d
        assert d.test is not None and d.test["method"] == "sign"
    a, b = got["relative_reduction"], got["log_ratio"]
    assert a.status == b.status
    if kind == "superiority":  # the same region on the log scale: the same count and p
        assert a.test["p_value"] == b.test["p_value"]
        if b.low is not None:
            assert math.isclose(a.low, 100 * (1 - math.exp(b.high)), rel_tol=1e-12, abs_tol=1e-12)
    # the mirror: the arms swapped and better flipped give the same decision
    mirror = D.decide(
        sign_spec(estimand="log_ratio", type=kind, better="higher", margin=m),
        {("s", "c"): pairs(ratios, swap=True)},
        done,
    )[0]
    assert mirror.status == b.status and mirror.test["p_value"] == b.test["p_value"]


def test_sign_rule_establishes_what_the_t_rule_cannot_on_a_stalling_candidate():
    # 11 pairs 5% faster, one stall at 3x: the mean log ratio is not shown below 0, the median is
    ratios = [0.95] * 11 + [3.0]
    done = completeness(COMPLETE)
    t = D.decide(
        {**sign_spec(), "tests": [{**sign_spec()["tests"][0], "test": "t"}]},
        {("s", "c"): pairs(ratios)},
        done,
    )
    s = D.decide(sign_spec(), {("s", "c"): pairs(ratios)}, done)[0]
    assert t[0].status == "not established"
    assert s.status == "established" and s.test["statistic"] == 11 and s.test["p_value"] == 13 / 4096
    assert "sign test of the median, 11 of 12 pairs favourable" in s.text
    assert math.isclose(s.estimate, 5.0, rel_tol=1e-12) and s.low is not None


def test_too_few_pairs_for_the_level_says_unbounded():
    d = D.decide(sign_spec(), {("s", "c"): pairs([0.9, 0.9, 0.9, 0.9])}, completeness(COMPLETE))[0]
    assert d.status == "not established" and d.test["p_value"] == 1 / 16 and d.low is None
    assert "interval for the median unbounded (too few pairs for the level)" in d.text


@pytest.mark.parametrize(
    "edit, message",
    [
        ("      test: wilcoxon\n", "'wilcoxon' is not one of"),
        ("      test: sign\n      period_adjusted: true\n", "the sign test has no period adjustment"),
    ],
)
def test_the_test_key_is_checked_at_plan_time(repo, edit, message):
    text = tiny_protocol().replace("      better: lower\n", "      better: lower\n" + edit, 1)
    p = repo / "protocols" / "tiny.yaml"
    p.write_text(text)
    r = harness(repo, "plan", str(p))
    line = next(i + 1 for i, s in enumerate(text.splitlines()) if s.startswith("      test:"))
    assert r.returncode == 2 and message in r.stderr and f"{p}:" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    if "wilcoxon" in edit:
        assert f"{p}:{line}" in r.stderr

"""Preregistered decisions (one standard-library implementation, ``prereg/``, which the analysis
and the audit both call): every test against scipy, the multiplicity procedures, censoring,
degenerate data and the order diagnostics."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from conftest import completeness
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from prereg import decisions as D
from prereg.descriptive import Rows
from prereg.order import crossover, drift
from prereg.ranks import signed_rank, worst_rank_differences
from prereg.ttests import period_adjusted, t_test


def make_pairs(n, effect=0.0, noise=0.05, seed=0, period=0.0, bpb_diff=0.0, unreached=()):
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        first = "baseline" if i % 2 == 0 else "candidate"
        b = math.exp(rng.gauss(0, 0.1))
        c = b * math.exp(effect + rng.gauss(0, noise) + (period if first == "baseline" else -period))
        bpb = 3.0 + rng.gauss(0, 0.05)
        pairs.append(
            {
                "unit": f"u{i:03d}",
                "order": 2 * i,
                "first": first,
                "baseline_training_s": b,
                "candidate_training_s": c,
                "baseline_time_to_target_s": None if (i, "b") in unreached else b * 0.7,
                "candidate_time_to_target_s": None if (i, "c") in unreached else c * 0.7,
                "baseline_total_s": b + 1,
                "candidate_total_s": c + 1,
                "baseline_test_bpb": bpb,
                "candidate_test_bpb": bpb + bpb_diff + rng.gauss(0, 0.002),
                "baseline_peak_memory_bytes": 1e8,
                "candidate_peak_memory_bytes": 1e8,
            }
        )
    return pairs


H_SPEED = {
    "id": "H1",
    "study": "s",
    "config": "c",
    "endpoint": "training_time",
    "estimand": "log_ratio",
    "type": "superiority",
    "margin": 0.0,
    "better": "lower",
    "censoring": None,
    "period_adjusted": False,
}
H_QUAL = {
    "id": "H2",
    "study": "s",
    "config": "c",
    "endpoint": "test_bpb",
    "estimand": "difference",
    "type": "non_inferiority",
    "margin": 0.01,
    "better": "lower",
    "censoring": None,
    "period_adjusted": False,
}
H_TTT = {
    "id": "H0",
    "study": "s",
    "config": "c",
    "endpoint": "time_to_target",
    "estimand": "log_ratio",
    "type": "superiority",
    "margin": 0.0,
    "better": "lower",
    "censoring": "worst_rank",
    "period_adjusted": False,
}
COMPLETE = {"complete": True, "budget_stop": False, "missing_runs": 0, "planned_runs": 0}


def spec(*tests, procedure="fixed_sequence", alpha=0.01, min_pairs=3):
    return {"procedure": procedure, "family_alpha": alpha, "min_pairs": min_pairs, "tests": list(tests)}


def test_t_tests_against_scipy():
    rng = random.Random(1)
    v = [rng.gauss(-0.05, 0.04) for _ in range(12)]
    sup = t_test(v, -1, "superiority", 0.0)  # candidate better when lower: H1 mean < 0
    assert sup.p_value == pytest.approx(stats.ttest_1samp(v, 0.0, alternative="less").pvalue, rel=1e-10)
    ni = t_test(v, -1, "non_inferiority", 0.02)  # H1: mean < 0.02
    assert ni.p_value == pytest.approx(stats.ttest_1samp(v, 0.02, alternative="less").pvalue, rel=1e-10)
    eq = t_test(v, -1, "equivalence", 0.1)
    tost = max(
        stats.ttest_1samp(v, -0.1, alternative="greater").pvalue,
        stats.ttest_1samp(v, 0.1, alternative="less").pvalue,
    )
    assert eq.p_value == pytest.approx(tost, rel=1e-10)
    from prereg.hypotheses import bounds
    from prereg.ttests import sign

    assert sign("lower") == -1 and sign("higher") == 1  # on the test scale (c - b or ln c - ln b)
    rr = {"estimand": "relative_reduction", "better": "lower", "type": "superiority", "margin": 10.0}
    assert bounds(rr)[0] is None and bounds(rr)[1] == pytest.approx(math.log(0.9), rel=1e-15)  # 10% faster


@pytest.mark.parametrize(
    "d",
    [
        [0.3, -0.1, 0.25, 0.4, -0.05, 0.12, 0.33, 0.07],  # exact (no ties): scipy's exact method
        [0.3, -0.1, 0.3, 0.4, -0.05, 0.12, 0.0, 0.07, 0.4, 0.4],  # ties and a zero: exact conditional
        [2.0, 2.0, 2.0, 2.0],  # 4 pairs all censored on one arm
        [float(x) for x in range(1, 61)],  # n > 50: still exact (scipy's exact method)
    ],
)
def test_signed_rank_against_scipy_and_enumeration(d):
    mine = signed_rank(d, 1)
    nz = [x for x in d if x != 0]
    if len(set(abs(x) for x in nz)) == len(nz):
        ref = stats.wilcoxon(d, alternative="greater", zero_method="wilcox", method="exact").pvalue
    else:  # every sign pattern of scipy's average ranks, counted
        ranks = stats.rankdata([abs(x) for x in nz])
        t = sum(r for r, x in zip(ranks, nz) if x > 0)
        tot = [
            sum(r for r, sg in zip(ranks, signs) if sg) for signs in itertools.product((0, 1), repeat=len(nz))
        ]
        ref = sum(x >= t - 1e-9 for x in tot) / 2 ** len(nz)
    assert mine.p_value == pytest.approx(ref, rel=1e-12)
    if d == [2.0] * 4:
        assert (
            mine.p_value == 1 / 16
        )  # the smallest p four pairs can give (the normal approximation said 0.0228)


def test_signed_rank_ties_are_rounding_tolerant():
    # magnitudes equal but for the last bits tie; a mirror image gives the mirror p
    d = [math.log(1.1 * b) - math.log(b) for b in (3, 7, 11, 13, 17, 19, 23, 1000, 1e5)] + [0.2, -0.3]
    assert len(set(abs(x) for x in d[:9])) == 4  # they differ in their last bits
    r = signed_rank(d, -1)
    assert r.p_value == signed_rank([-x for x in d], 1).p_value
    assert r.statistic == signed_rank([0.0953] * 9 + [0.2, -0.3], -1).statistic


def test_period_adjusted_equals_the_two_sample_crossover():
    pairs = make_pairs(12, effect=-0.1, period=0.08, seed=3)
    v = [math.log(p["candidate_training_s"] / p["baseline_training_s"]) for p in pairs]
    first = [p["first"] for p in pairs]
    res = period_adjusted(v, first, -1, "superiority", 0.0)
    ab = [x for x, f in zip(v, first) if f == "baseline"]
    ba = [x for x, f in zip(v, first) if f != "baseline"]
    t = stats.ttest_ind(ab, ba, equal_var=True)  # same pooled standard error, twice the estimate
    assert res.standard_error == pytest.approx(
        abs((sum(ab) / len(ab) - sum(ba) / len(ba)) / t.statistic) / 2, rel=1e-10
    )
    plain = t_test(v, -1, "superiority", 0.0)
    assert res.standard_error < plain.standard_error  # the period effect no longer inflates the variance
    c = crossover(Rows(pairs, 0.95))
    assert c["period"]["low"] < 0.08 < c["period"]["high"]


def test_worst_rank_counts_unreached_against_its_arm():
    # every reached pair favours the candidate slightly, but the candidate misses the target twice
    pairs = make_pairs(10, effect=-0.02, noise=0.001, unreached={(1, "c"), (4, "c")})
    d = worst_rank_differences(
        [p["baseline_time_to_target_s"] for p in pairs], [p["candidate_time_to_target_s"] for p in pairs]
    )
    assert d[1] == d[4] > max(abs(x) for i, x in enumerate(d) if i not in (1, 4))
    res = D.decide(spec(H_TTT), {("s", "c"): pairs}, completeness(COMPLETE))[0]
    assert res.unreached == {"baseline": 0, "candidate": 2, "both": 0}
    assert res.test["method"] == "signed-rank" and res.status == "not established"
    # dropping the unreached pairs (the old "exclude" rule) would have hidden both misses
    reached = [p for i, p in enumerate(pairs) if i not in (1, 4)]
    assert D.decide(spec(H_TTT), {("s", "c"): reached}, completeness(COMPLETE))[0].status == "established"


def test_fixed_sequence_and_holm():
    good = make_pairs(12, effect=-0.2, seed=5)
    flat = make_pairs(12, effect=0.0, seed=6)
    seq = D.decide(
        spec({**H_SPEED, "config": "flat", "id": "A"}, {**H_SPEED, "id": "B"}),
        {("s", "flat"): flat, ("s", "c"): good},
        completeness(COMPLETE),
    )
    assert seq[0].status == "not established"
    assert seq[1].status == "not reached" and "failed prerequisite in the hierarchy: A" in seq[1].reason
    holm = D.decide(
        spec({**H_SPEED, "config": "flat", "id": "A"}, {**H_SPEED, "id": "B"}, procedure="holm", alpha=0.05),
        {("s", "flat"): flat, ("s", "c"): good},
        completeness(COMPLETE),
    )
    assert holm[1].status == "established" and holm[1].alpha == 0.025  # smallest p first, at alpha / 2
    assert holm[0].alpha == 0.05


def test_degenerate_and_incomplete_are_not_reached():
    pairs = make_pairs(6)
    for p in pairs:
        p["candidate_test_bpb"] = p["baseline_test_bpb"]  # bitwise-identical arms
    r = D.decide(spec(H_QUAL), {("s", "c"): pairs}, completeness(COMPLETE))[0]
    assert r.status == "not reached" and r.reason.startswith("every pair identical: in all") and r.low is None
    r = D.decide(spec(H_SPEED, min_pairs=10), {("s", "c"): make_pairs(4)}, completeness(COMPLETE))[0]
    assert r.status == "not reached" and "too few pairs: 4" in r.reason
    inc = {"complete": False, "budget_stop": False, "missing_runs": 2, "planned_runs": 10}
    r = D.decide(spec(H_SPEED), {("s", "c"): make_pairs(12, effect=-0.3)}, completeness(inc))[0]
    assert r.status == "not reached" and r.reason.startswith("incomplete")


@pytest.mark.parametrize("procedure", ["fixed_sequence", "holm"])
def test_every_decision_rule_is_exercised(procedure):
    pairs = {
        ("s", "c"): make_pairs(14, effect=-0.05, bpb_diff=0.001, seed=9, unreached={(2, "b"), (3, "c")}),
        ("s", "d"): make_pairs(14, effect=0.01, seed=10),
    }
    tests = [
        H_TTT,
        H_SPEED,
        H_QUAL,
        {**H_SPEED, "id": "H4", "config": "d", "type": "equivalence", "margin": 0.05},
        {**H_SPEED, "id": "H5", "period_adjusted": True},
        {**H_SPEED, "id": "H6", "endpoint": "time_to_target", "censoring": "restricted_mean"},
        {**H_SPEED, "id": "H7", "estimand": "relative_reduction", "margin": 2.0},
        {
            **H_SPEED,
            "id": "H8",
            "estimand": "relative_reduction",
            "type": "equivalence",
            "margin": 10.0,
            "period_adjusted": True,
        },
        {
            **H_SPEED,
            "id": "H9",
            "endpoint": "time_to_target",
            "censoring": "restricted_mean",
            "restriction_s": 0.8,
        },
        {**H_TTT, "id": "H10", "estimand": "relative_reduction", "better": "higher"},
    ]
    sp = spec(*tests, procedure=procedure, alpha=0.05)
    mine = [d.as_dict() for d in D.decide(sp, pairs, completeness(COMPLETE))]
    assert [d["id"] for d in mine if d["test"] is None] == []  # every rule was exercised
    failed = [{"unit": "x", "failed": "candidate"}, {"unit": "y", "failed": "baseline"}]
    for h in tests:
        sens = D.sensitivity(h, pairs[("s", h["config"])], failed)
        assert sens is not None and 0.0 < sens["p_value"] <= 1.0, h["id"]


def test_drift_slope_against_scipy():
    pairs = make_pairs(15, seed=11)
    for i, p in enumerate(pairs):
        p["candidate_training_s"] *= math.exp(0.004 * i)
    d = drift(Rows(pairs, 0.95))
    x = [p["order"] for p in pairs]
    y = [math.log(p["candidate_training_s"] / p["baseline_training_s"]) for p in pairs]
    ref = stats.linregress(x, y)
    assert d["slope"] == pytest.approx(ref.slope, rel=1e-10) and d["standard_error"] == pytest.approx(
        ref.stderr, rel=1e-9
    )
    assert d["p_value"] == pytest.approx(ref.pvalue, rel=1e-8)


def test_per_device_effects_and_heterogeneity():
    from prereg.order import by_device

    pairs = make_pairs(12, effect=-0.1, seed=12)
    for i, p in enumerate(pairs):
        p["device"] = "mac-a / Apple M5 Pro" if i % 3 else "box / NVIDIA H200"
        if i % 3 == 0:
            p["candidate_training_s"] *= 1.05  # the candidate gains less on this device
    d = by_device(Rows(pairs, 0.95))
    assert [r["device"] for r in d["devices"]] == ["box / NVIDIA H200", "mac-a / Apple M5 Pro"]
    groups = [
        [math.log(p["candidate_training_s"] / p["baseline_training_s"]) for p in pairs if p["device"] == g]
        for g in ("box / NVIDIA H200", "mac-a / Apple M5 Pro")
    ]
    ref = stats.f_oneway(*groups)
    assert d["heterogeneity"]["F"] == pytest.approx(ref.statistic, rel=1e-10)
    assert d["heterogeneity"]["p_value"] == pytest.approx(ref.pvalue, rel=1e-8)
    assert by_device(Rows([dict(p, device="one") for p in pairs], 0.95)) is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([-3.0, -2.0, -1.5, -1.0, 0.0, 1.0, 1.5, 2.0, 3.0]), min_size=1, max_size=11),
    st.sampled_from([1, -1]),
)
def test_signed_rank_exact_conditional_equals_enumeration(d, s):
    """Heavy ties and zeros: the exact conditional p is the share of sign patterns with T+ at least the observed."""
    nz = [s * x for x in d if x != 0]
    mine = signed_rank(d, s)
    if not nz:
        assert mine.p_value == 1.0
        return
    ranks = stats.rankdata([abs(x) for x in nz])
    t = sum(r for r, x in zip(ranks, nz) if x > 0)
    tot = [sum(r for r, sg in zip(ranks, signs) if sg) for signs in itertools.product((0, 1), repeat=len(nz))]
    assert mine.p_value == pytest.approx(sum(x >= t - 1e-9 for x in tot) / 2 ** len(nz), rel=1e-12)
    assert mine.statistic == pytest.approx(t)


def test_the_family_is_typed_once_and_refuses_unknown_keys():
    from prereg.hypotheses import Family, Hypothesis

    fam = Family.of(spec(H_SPEED, H_QUAL, procedure="holm", alpha=0.05))
    assert (
        fam.tests == (Hypothesis.of(H_SPEED), Hypothesis.of(H_QUAL)) and not fam.decide_time_after_budget_stop
    )
    pairs = {("s", "c"): make_pairs(12, effect=-0.2, seed=5)}
    as_dict = D.decide(spec(H_SPEED, H_QUAL, procedure="holm", alpha=0.05), pairs, completeness(COMPLETE))
    assert D.decide(fam, pairs, completeness(COMPLETE)) == as_dict
    with pytest.raises(ValueError, match="hypotheses: unknown keys looks"):
        Family.of({**spec(H_SPEED), "looks": 2})


def test_a_pair_is_typed_and_decides_as_its_row():
    from prereg.hypotheses import Pair, typed_pairs

    rows = make_pairs(12, effect=-0.2, seed=5)
    pairs = typed_pairs(rows)
    assert all(isinstance(p, Pair) for p in pairs) and pairs[0].unit == rows[0]["unit"]
    assert pairs[0].log_ratio() == math.log(rows[0]["candidate_training_s"] / rows[0]["baseline_training_s"])
    by_row = D.decide(spec(H_SPEED, H_TTT, H_QUAL), {("s", "c"): rows}, completeness(COMPLETE))
    assert D.decide(spec(H_SPEED, H_TTT, H_QUAL), {("s", "c"): pairs}, completeness(COMPLETE)) == by_row
    assert crossover(Rows(pairs, 0.95)) == crossover(Rows(rows, 0.95)) and drift(Rows(pairs, 0.95)) == drift(
        Rows(rows, 0.95)
    )
    with pytest.raises(ValueError, match="unknown keys baseline_training_seconds"):
        Pair.of({**rows[0], "baseline_training_seconds": 1.0})

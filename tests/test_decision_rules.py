"""The rules no estimand, relabelling or rounding may flip (issue 22): each reproduction of the issue's
table, the mirror decision under relabelling on random datasets, the sensitivity analysis' types and
margins, budget stops, and the protocol keys, in the analysis and the stdlib audit alike."""

from __future__ import annotations

import math
import random

import pytest
from conftest import completeness, harness, synthetic_record, tiny_protocol
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_decisions import COMPLETE, H_SPEED, H_TTT, make_pairs, spec

from analysis.power import aa_noise, pairs_needed_region, plan, power, power_region, sd_upper
from prereg import decisions as D
from prereg.hypotheses import bounds
from prereg.ttests import t_test


def both(sp, pairs_of, done=COMPLETE):
    """The decisions (one implementation, which the analysis and the audit both call), as their JSON."""
    return [d.as_dict() for d in D.decide(sp, pairs_of, completeness(done))]


def ttt_pairs(b, c, bt=None, ct=None):
    out = []
    for i, (x, y) in enumerate(zip(b, c)):
        out.append(
            {
                "unit": f"u{i}",
                "order": 2 * i,
                "first": "baseline" if i % 2 == 0 else "candidate",
                "baseline_time_to_target_s": x,
                "candidate_time_to_target_s": y,
                "baseline_training_s": (bt or [10.0] * len(b))[i],
                "candidate_training_s": (ct or [10.0] * len(b))[i],
            }
        )
    return out


def test_worst_rank_direction_does_not_depend_on_the_estimand():
    rng = random.Random(3)
    base = [5 + rng.random() for _ in range(10)]
    slower = ttt_pairs(base, [x * 1.2 * math.exp(rng.gauss(0, 0.01)) for x in base])
    faster = ttt_pairs(base, [x * 0.8 * math.exp(rng.gauss(0, 0.01)) for x in base])
    for est in ("relative_reduction", "log_ratio", "difference"):
        h = {**H_TTT, "estimand": est}
        assert (
            both(spec(h), {("s", "c"): slower})[0]["status"] == "not established"
        )  # was "established", p = 0.00098
        fast = both(spec(h), {("s", "c"): faster})[0]
        assert fast["status"] == "established" and fast["test"]["p_value"] == 1 / 2**10
        assert fast["estimate_of"].startswith("median ln(c/b) of the 10 pairs") and fast["estimate"] < 0


def test_restricted_mean_uses_one_restriction_for_both_arms():
    # the candidate never reaches the target but runs 20% faster per step
    rng = random.Random(4)
    bt = [10 * math.exp(rng.gauss(0, 0.02)) for _ in range(12)]
    reach = [0.7 * x * math.exp(rng.gauss(0, 0.02)) for x in bt]
    pairs = ttt_pairs(reach, [None] * 12, bt, [0.8 * x for x in bt])
    h = {**H_TTT, "censoring": "restricted_mean"}
    r = both(spec(h), {("s", "c"): pairs})[0]
    assert r["status"] == "not established" and r["estimate"] > 0  # the candidate's restricted time is longer
    # min(T, tau), tau the shorter training time: the baseline 0.7 b, the candidate 0.8 b
    assert r["test"]["estimate"] == pytest.approx(
        sum(math.log(0.8 * x) - math.log(y) for x, y in zip(bt, reach)) / 12, rel=1e-12
    )
    # a declared restriction the candidate did not train for is unknown, not imputed
    r = both(spec({**h, "restriction_s": 9.0}), {("s", "c"): pairs})[0]
    assert r["status"] == "not reached" and "less than the restriction 9 s" in r["reason"]


def test_rounding_spread_is_zero_spread():
    b = [3.0, 7.0, 11.0, 13.0, 17.0, 19.0, 23.0, 1000.0, 1e5]
    pairs = make_pairs(9)
    for p, x in zip(pairs, b):
        p["baseline_training_s"], p["candidate_training_s"] = x, 1.1 * x
    v = [math.log(1.1 * x) - math.log(x) for x in b]
    assert len(set(v)) > 1  # the log ratios differ in their last bits
    for est in ("log_ratio", "relative_reduction"):
        r = both(spec({**H_SPEED, "estimand": est, "better": "higher"}), {("s", "c"): pairs})[0]
        assert r["status"] == "not reached" and r["reason"].startswith("zero spread")  # was p = 9.5e-63


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -1.0])
@pytest.mark.parametrize(
    "endpoint, key",
    [("test_bpb", "test_bpb"), ("training_time", "training_s"), ("time_to_target", "time_to_target_s")],
)
def test_null_or_non_finite_endpoint_is_not_reached(bad, endpoint, key):
    if endpoint == "time_to_target" and bad is None:
        return  # None is "not reached the target" there, a valid outcome
    pairs = make_pairs(8, effect=-0.2)
    pairs[3][f"candidate_{key}"] = bad
    h = {
        **H_SPEED,
        "endpoint": endpoint,
        "estimand": "difference" if endpoint == "test_bpb" else "log_ratio",
        "censoring": "worst_rank" if endpoint == "time_to_target" else None,
    }
    if bad == -1.0 and endpoint == "test_bpb":
        return  # a negative difference endpoint is a number
    r = both(spec(h), {("s", "c"): pairs})[0]
    assert r["status"] == "not reached" and r["reason"].startswith("pair u003: the candidate's " + key), r[
        "reason"
    ]


def relabel(pairs):
    out = []
    for p in pairs:
        q = dict(p, first="candidate" if p["first"] == "baseline" else "baseline")
        for k in list(p):
            if k.startswith("baseline_"):
                q[k], q["candidate_" + k[9:]] = p["candidate_" + k[9:]], p[k]
        out.append(q)
    return out


def mirror_margin(h):
    """The same claim with the arms swapped: 'better' flips; a relative margin is relative to the other arm,
    so it becomes the margin whose ratio bound is the negated log bound."""
    m, flipped = h["margin"], "higher" if h["better"] == "lower" else "lower"
    if h["estimand"] == "relative_reduction" and m:
        bound = next(x for x in bounds(h) if x is not None)
        up = (flipped == "lower") == (h["type"] == "superiority")
        m = (-100 if up else 100) * math.expm1(-bound)
    return {**h, "better": flipped, "margin": m}


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 2**32),
    st.sampled_from(["superiority", "non_inferiority", "equivalence"]),
    st.sampled_from(["log_ratio", "relative_reduction", "difference"]),
    st.booleans(),
    st.booleans(),
    st.floats(-0.15, 0.15),
    st.sampled_from([0.0, 0.02, 0.05]),
)
def test_relabelling_gives_the_mirror_decision(seed, kind, est, period, lower, effect, margin):
    """Swap the arms and flip ``better``: the same decision with the same p (random datasets)."""
    if kind != "superiority" and margin == 0:
        margin = 0.03
    if est == "relative_reduction":
        margin *= 100
    assume(
        not (est == "relative_reduction" and kind == "equivalence")
    )  # +-d% of the baseline has no mirror +-d'%
    pairs = make_pairs(9, effect=effect, noise=0.05, seed=seed % 10_000)
    h = {
        **H_SPEED,
        "type": kind,
        "margin": margin,
        "estimand": est,
        "period_adjusted": period,
        "better": "lower" if lower else "higher",
    }
    a = both(spec(h, alpha=0.05), {("s", "c"): pairs})[0]
    b = both(spec(mirror_margin(h), alpha=0.05), {("s", "c"): relabel(pairs)})[0]
    if est != "relative_reduction" or margin == 0:
        assert a["status"] == b["status"] and a["test"]["p_value"] == b["test"]["p_value"]
        assert a["test"]["estimate"] == -b["test"]["estimate"]
    else:  # the mirrored relative margin is the same ratio bound up to rounding
        assert a["test"]["p_value"] == pytest.approx(b["test"]["p_value"], rel=1e-9, abs=1e-300)
        if abs(a["test"]["p_value"] - 0.05) > 1e-9:
            assert a["status"] == b["status"]


def test_equivalent_estimands_decide_alike():
    for seed in range(40):
        pairs = make_pairs(10, effect=random.Random(seed).uniform(-0.1, 0.1), seed=seed)
        for kind, d in (("superiority", 0.0), ("superiority", 5.0), ("non_inferiority", 5.0)):
            rr = both(
                spec({**H_SPEED, "estimand": "relative_reduction", "type": kind, "margin": d}),
                {("s", "c"): pairs},
            )
            lm = -math.log1p(-d / 100) if kind == "superiority" else math.log1p(d / 100)
            lr = both(
                spec({**H_SPEED, "estimand": "log_ratio", "type": kind, "margin": lm}), {("s", "c"): pairs}
            )
            assert rr[0]["status"] == lr[0]["status"]
            assert rr[0]["test"]["p_value"] == pytest.approx(lr[0]["test"]["p_value"], rel=1e-9)
            # the reduction interval is 1 - exp of the log ratio's
            assert rr[0]["low"] == pytest.approx(-100 * math.expm1(lr[0]["high"]), rel=1e-12)


def test_relative_reduction_under_an_aa_null():
    # the mean of per-pair reductions is biased by about -100 sd^2 / 2 (Jensen: -0.245% at sd 0.07);
    # 100 (1 - exp(mean log ratio)) is median-unbiased, and its mean bias is n times smaller
    rng = random.Random(5)
    new, old = [], []
    for _ in range(2000):
        pairs = make_pairs(12, noise=0.07, seed=rng.randrange(10**6))
        h = {**H_SPEED, "estimand": "relative_reduction", "type": "equivalence", "margin": 50.0}
        new.append(D.decide(spec(h), {("s", "c"): pairs}, completeness(COMPLETE))[0].estimate)
        old.append(sum(100 * (1 - p["candidate_training_s"] / p["baseline_training_s"]) for p in pairs) / 12)
    assert sum(old) / 2000 == pytest.approx(-0.245, abs=0.05)
    assert abs(sum(new) / 2000) < 0.06 and abs(sorted(new)[1000]) < 0.1


def test_sensitivity_honours_type_and_margin():
    pairs = make_pairs(12, effect=0.0, noise=0.02, seed=8, bpb_diff=0.0)
    failed = [{"unit": "x", "failed": "candidate"}]
    q = {
        "id": "Q",
        "study": "s",
        "config": "c",
        "endpoint": "test_bpb",
        "estimand": "difference",
        "type": "non_inferiority",
        "margin": 0.05,
        "better": "lower",
        "censoring": None,
        "period_adjusted": False,
    }
    ni = D.sensitivity(q, pairs, failed)
    sup = D.sensitivity({**q, "type": "superiority", "margin": 0.0}, pairs, failed)
    eq = D.sensitivity({**q, "type": "equivalence"}, pairs, failed)
    assert (
        ni["p_value"] < 0.02 < 0.2 < sup["p_value"]
    )  # at the margin, every pair is far inside; at 0 they are not
    assert "both bounds" in eq["method"] and eq["p_value"] >= ni["p_value"]


@pytest.mark.parametrize("allowed", [False, True])
def test_budget_stop_decides_time_only_if_preregistered(allowed):
    stop = {"complete": False, "budget_stop": True, "missing_runs": 4, "planned_runs": 20}
    q = {
        "id": "Q",
        "study": "s",
        "config": "c",
        "endpoint": "test_bpb",
        "estimand": "difference",
        "type": "non_inferiority",
        "margin": 0.05,
        "better": "lower",
        "censoring": None,
        "period_adjusted": False,
    }
    sp = {**spec(H_SPEED, q, procedure="holm", alpha=0.05), "decide_time_after_budget_stop": allowed}
    r = both(sp, {("s", "c"): make_pairs(12, effect=-0.3)}, stop)
    assert r[1]["status"] == "established" and r[1]["text"].startswith("(study stopped by its budget rule) ")
    if allowed:
        assert r[0]["status"] == "established" and "the stop depended on run times" in r[0]["text"]
    else:
        assert r[0]["status"] == "not reached" and "depends on run times" in r[0]["reason"]


def test_tost_power_uses_both_one_sided_tests():
    assert power(30, 0.05, 0.025, "equivalence", 0.03, 0.02) == pytest.approx(0.1835, abs=5e-5)  # was 0.9991
    # by simulation of the decision rule itself
    rng = random.Random(6)
    hits = sum(
        t_test([rng.gauss(0.02, 0.05) for _ in range(30)], 1, "equivalence", 0.03).p_value < 0.025
        for _ in range(4000)
    )
    assert abs(hits / 4000 - 0.1835) < 4 * math.sqrt(0.1835 * 0.8165 / 4000)


def aa_records(identical: bool, n: int = 10) -> list:
    rng = random.Random(7)
    proto = {
        "studies": [
            {
                "name": "p",
                "design": "paired",
                "arms": ["native", "native"],
                "configs": ["c"],
                "seeds": list(range(n)),
            }
        ]
    }
    out = []
    for i in range(n):
        b = 100 * math.exp(rng.gauss(0, 0.05))
        for role in ("baseline", "candidate"):
            t = b if identical or role == "baseline" else b * math.exp(rng.gauss(0, 0.03))
            out.append(
                synthetic_record(
                    {"design": "paired", "study": "p", "config": "c", "unit": f"u{i}", "role": role},
                    protocol=proto,
                    test_bpb=3.0,
                    timings={"training_s": t},
                )
            )
    return out


@pytest.mark.parametrize("identical", [True, False])
def test_power_in_the_estimands_own_units(identical):
    """relative_reduction plans exactly as log_ratio with the converted margin (was 3 pairs for bitwise A/A arms)."""
    recs = aa_records(identical)
    tgt = lambda est, m: {  # noqa: E731
        "hypotheses": {
            "procedure": "fixed_sequence",
            "family_alpha": 0.025,
            "min_pairs": 3,
            "tests": [
                {
                    "id": "H",
                    "study": "p",
                    "config": "c",
                    "endpoint": "training_time",
                    "estimand": est,
                    "type": "non_inferiority",
                    "margin": m,
                    "better": "lower",
                }
            ],
        },
        "studies": [{"name": "p", "design": "paired", "seeds": [0] * 50}],
    }
    rr = plan(recs, tgt("relative_reduction", 2.0), {})[0]
    lr = plan(recs, tgt("log_ratio", math.log1p(0.02)), {})[0]
    assert rr.sd == lr.sd and rr.n80 == lr.n80 and rr.n80_upper == lr.n80_upper and rr.n80 > 10
    sd = aa_noise(recs, "training_time", "relative_reduction")["c"].sd
    assert rr.n80 == pairs_needed_region(sd, 0.025, (None, math.log1p(0.02)), 0.0, 0.8)
    assert rr.n80_upper >= rr.n80 and rr.sd_upper > rr.sd
    assert (
        rr.detectable_at_planned is not None and rr.detectable_at_planned < 0
    )  # a slowdown NI still detects


def test_upper_limit_sample_size_reaches_power_with_its_confidence():
    # pilots of 6 pairs from a true sd of 1: the plan at the 80% UCL reaches 80% power in >= 80% of pilots
    rng = random.Random(9)
    reached = 0
    for _ in range(300):
        x = [rng.gauss(0, 1) for _ in range(6)]
        m = sum(x) / 6
        sd = math.sqrt(sum((v - m) ** 2 for v in x) / 5)
        n = pairs_needed_region(sd_upper(sd, 6, 0.8), 0.025, (0.5, None), 1.2, 0.8)
        reached += power_region(n, 1.0, 0.025, (0.5, None), 1.2) >= 0.8
    assert reached / 300 > 0.8 - 3 * math.sqrt(0.16 / 300)


@pytest.mark.parametrize(
    "edit, needle, message",
    [
        (
            ("      better: lower\n", "      better: lower\n      restriction_s: 5\n"),
            "restriction_s",
            "restriction_s is the restriction time of censoring: restricted_mean",
        ),
        (
            (
                "      estimand: difference\n      type: non_inferiority\n      margin: 0.01\n",
                "      estimand: relative_reduction\n      type: non_inferiority\n      margin: 100\n",
            ),
            "margin: 100",
            "a relative_reduction margin is a percentage below 100",
        ),
        (
            ("  min_pairs: 3\n", "  min_pairs: 3\n  decide_time_after_budget_stop: maybe\n"),
            "decide_time_after_budget_stop",
            "'decide_time_after_budget_stop' must be bool",
        ),
    ],
)
def test_protocol_keys_name_file_key_line(repo, edit, needle, message):
    text = tiny_protocol().replace(*edit)
    if "relative_reduction" in text:
        text = text.replace("endpoint: test_bpb", "endpoint: training_time")
    p = repo / "protocols" / "tiny.yaml"
    p.write_text(text)
    r = harness(repo, "plan", str(p))
    line = next(i + 1 for i, s in enumerate(text.splitlines()) if needle in s)
    assert r.returncode == 2 and message in r.stderr and f"{p}:{line}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from(["worst_rank", "restricted_mean"]),
    st.booleans(),
    st.sets(st.tuples(st.integers(0, 9), st.sampled_from("bc")), max_size=6),
    st.floats(-0.2, 0.2),
)
def test_relabelling_mirrors_time_to_target(seed, censoring, lower, unreached, effect):
    """Worst-rank scores and restricted times are symmetric in the arms: the mirror decision, the same p."""
    pairs = make_pairs(10, effect=effect, noise=0.05, seed=seed, unreached=unreached)
    h = {**H_TTT, "censoring": censoring, "better": "lower" if lower else "higher"}
    a = both(spec(h, alpha=0.05), {("s", "c"): pairs})[0]
    b = both(spec(mirror_margin(h), alpha=0.05), {("s", "c"): relabel(pairs)})[0]
    assert (a["status"], a["reason"] is None) == (b["status"], b["reason"] is None)
    if a["test"] is not None:
        assert (
            a["test"]["p_value"] == b["test"]["p_value"] and a["test"]["statistic"] == b["test"]["statistic"]
        )


def test_descriptive_endpoints_skip_null_values():
    from prereg.descriptive import endpoint as descriptive_endpoint

    b, c = [1.0, 2.0, None, 4.0, float("nan"), 3.0], [1.1, 2.1, 3.0, 3.9, 5.0, 2.8]
    for est in ("difference", "relative_reduction"):
        mine = descriptive_endpoint(b, c, 0.9, est).as_dict()
        assert mine["pairs"] == 4 and mine["invalid_pairs"] == 2 and mine["interval"] is not None

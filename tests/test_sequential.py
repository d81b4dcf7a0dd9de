"""Group-sequential designs (issue 34): the boundaries against Jennison & Turnbull's published
constants and a simulation of the canonical process, the family's decisions look by look (Holm and
fixed sequence by the graphical approach, futility, the stop), and the protocol's ``sequential``
block refused at plan time and by the audit's reader of the tag, naming file, key and line."""

from __future__ import annotations

import math
import random

import pytest
from conftest import harness, tiny_protocol

from prereg.hypotheses import Family
from prereg.looks import run_looks, sequential_decisions
from prereg.protocol.read import protocol_from_text
from prereg.sequential import boundaries, crossing, nominal_levels, spent, upper_tail


def _constant(K: int, shape) -> float:  # noqa: ANN001
    """The constant c with one-sided crossing probability 0.025 for bounds c * shape(k), found by
    scipy's brentq to 1e-10 (a dozen evaluations of the recursion, where bisection took 40 for
    the same three decimals the table gives)."""
    from scipy.optimize import brentq

    t = [k / K for k in range(1, K + 1)]
    return brentq(
        lambda c: crossing(t, [c * shape(k, K) for k in range(1, K + 1)]).total - 0.025, 1.5, 5.0, xtol=1e-10
    )


@pytest.mark.parametrize(
    "K, pocock, obrien_fleming",
    # Jennison & Turnbull (2000), Group Sequential Methods with Applications to Clinical Trials,
    # Table 2.1 (C_P) and Table 2.3 (C_B), two-sided alpha 0.05 (one-sided 0.025 per side)
    [(2, 2.178, 1.977), (3, 2.289, 2.004), (4, 2.361, 2.024), (5, 2.413, 2.040)],
)
def test_the_recursion_reproduces_jennison_and_turnbulls_constants(K, pocock, obrien_fleming):
    assert round(_constant(K, lambda k, K: 1.0), 3) == pocock
    assert round(_constant(K, lambda k, K: math.sqrt(K / k)), 3) == obrien_fleming


@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock"])
@pytest.mark.parametrize("times", [[0.5, 1.0], [1 / 3, 2 / 3, 1.0], [0.25, 0.6, 1.0]])
def test_spending_boundaries_spend_what_the_function_says(spending, times):
    c = boundaries(times, 0.025, spending)
    # the first look in closed form, the crossings equal to the spending increments
    assert c[0] == pytest.approx(-_ppf(spent(spending, 0.025, times[0])), abs=1e-9)
    at = crossing(times, c).at
    prev = 0.0
    for t, p in zip(times, at):
        assert p == pytest.approx(spent(spending, 0.025, t) - prev, abs=2e-9)
        prev = spent(spending, 0.025, t)
    assert sum(at) == pytest.approx(0.025, abs=5e-9)


def _ppf(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def test_lan_demets_obrien_fleming_bounds_for_three_equal_looks():
    # gsDesign's sfLDOF for k = 3, alpha = 0.025 (test.type = 1) prints 3.7103, 2.5114, 1.9930
    assert [round(x, 4) for x in boundaries([1 / 3, 2 / 3, 1.0], 0.025, "obrien_fleming")] == [
        3.7103,
        2.5114,
        1.9930,
    ]


def test_boundaries_hold_their_level_in_a_simulation_of_the_canonical_process():
    rng = random.Random(11)
    times = [0.3, 0.7, 1.0]
    for spending in ("obrien_fleming", "pocock"):
        c = boundaries(times, 0.05, spending)
        hits, n = 0, 40000
        for _ in range(n):
            s, prev = 0.0, 0.0
            for t, b in zip(times, c):
                s += rng.gauss(0.0, math.sqrt(t - prev))
                prev = t
                if s / math.sqrt(t) >= b:
                    hits += 1
                    break
        assert abs(hits / n - 0.05) < 4 * math.sqrt(0.05 * 0.95 / n), (spending, hits / n)


def test_power_under_a_drift_matches_simulation():
    rng = random.Random(3)
    times, theta = [0.5, 1.0], 2.5
    c = boundaries(times, 0.025, "obrien_fleming")
    at = crossing(times, c, theta).at
    hits1 = hits = 0
    n = 40000
    for _ in range(n):
        s1 = rng.gauss(theta * 0.5, math.sqrt(0.5))
        if s1 / math.sqrt(0.5) >= c[0]:
            hits1 += 1
            hits += 1
            continue
        if (s1 + rng.gauss(theta * 0.5, math.sqrt(0.5))) >= c[1]:
            hits += 1
    assert abs(hits1 / n - at[0]) < 4 * math.sqrt(0.25 / n)
    assert abs(hits / n - sum(at)) < 4 * math.sqrt(0.25 / n)


def family(*tests, procedure="holm", looks=(4, 8, 12), spending="obrien_fleming", futility_z=None):
    return Family.of(
        {
            "procedure": procedure,
            "family_alpha": 0.05,
            "min_pairs": 3,
            "sequential": {"looks": list(looks), "spending": spending, "futility_z": futility_z},
            "tests": [
                {
                    "id": t,
                    "study": "s",
                    "config": c,
                    "endpoint": "training_time",
                    "estimand": "log_ratio",
                    "type": "superiority",
                    "better": "lower",
                }
                for t, c in tests
            ],
        }
    )


def pairs(effect: float, n: int = 12, sd: float = 0.02, seed: int = 0, config: str = "c") -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        b = 10.0
        out.append(
            {
                "unit": f"s.{config}.pair{i:03d}",
                "first": "baseline" if i % 2 else "candidate",
                "baseline_training_s": b,
                "candidate_training_s": b * math.exp(effect + rng.gauss(0, sd)),
            }
        )
    return out


def test_a_clear_effect_stops_at_the_first_look():
    fam = family(("H1", "c"))
    looks = run_looks(fam, {("s", "c"): pairs(-0.2)}, 3, "sign")
    assert len(looks) == 1 and looks[0].stop == "efficacy" and looks[0].established == ("H1",)
    # the nominal level of look 1 of 3 at the family's alpha
    assert looks[0].nominal["H1"] == pytest.approx(nominal_levels([4, 8, 12], 0.05, "obrien_fleming")[0])


def test_no_effect_runs_to_the_last_look_and_is_not_established():
    fam = family(("H1", "c"))
    looks = run_looks(fam, {("s", "c"): pairs(0.0, sd=0.05)}, 3, "sign")
    assert [lk.stop for lk in looks] == [None, None, "final"] and not looks[-1].established


def test_futility_stops_early_without_changing_the_efficacy_levels():
    with_fut = run_looks(family(("H1", "c"), futility_z=0.0), {("s", "c"): pairs(0.1)}, 3, "sign")
    without = run_looks(family(("H1", "c")), {("s", "c"): pairs(0.1)}, 3, "sign")
    assert with_fut[-1].stop == "futility" and with_fut[-1].look == 1
    assert with_fut[0].nominal == without[0].nominal  # non-binding: the boundaries ignore futility


def test_holm_passes_an_established_hypothesis_level_on():
    fam = family(("H1", "c"), ("H2", "d"))
    data = {("s", "c"): pairs(-0.3), ("s", "d"): pairs(-0.004, sd=0.01, seed=4, config="d")}
    looks = run_looks(fam, data, 3, "sign")
    assert "H1" in looks[0].established
    first = nominal_levels([4, 8, 12], 0.025, "obrien_fleming")
    full = nominal_levels([4, 8, 12], 0.05, "obrien_fleming")
    # H2 is tested at the whole alpha once H1 is established (its level share went from 1/2 to 1)
    assert looks[0].level["H2"] == pytest.approx(0.05)
    assert looks[0].nominal["H2"] == pytest.approx(full[0]) and full[0] > first[0]


def test_fixed_sequence_tests_the_second_only_after_the_first():
    fam = family(("H1", "c"), ("H2", "d"), procedure="fixed_sequence")
    data = {("s", "c"): pairs(0.0, sd=0.05), ("s", "d"): pairs(-0.3, config="d")}
    looks = run_looks(fam, data, 3, "sign")
    assert all(lk.nominal["H2"] == 0.0 for lk in looks) and not looks[-1].established


def test_decisions_say_the_look_and_a_study_cut_between_looks_is_not_reached():
    from prereg.attempts import Completeness

    fam = family(("H1", "c"))
    done = Completeness(24, 10, 14, False, False, "INCOMPLETE")
    looks = run_looks(fam, {("s", "c"): pairs(0.0, sd=0.05)}, 1, "sign")
    d = sequential_decisions(fam, {("s", "c"): pairs(0.0, sd=0.05)}, done, looks)[0]
    assert d.status == "not reached" and "the next look, at 8 pairs, was not reached" in d.text
    looks = run_looks(fam, {("s", "c"): pairs(-0.2)}, 3, "sign")
    d = sequential_decisions(fam, {("s", "c"): pairs(-0.2)}, done, looks)[0]
    assert d.status == "established" and d.text.startswith("(look 1 of 3, 4 pairs, obrien_fleming spending")
    assert d.level == pytest.approx(1 - 2 * looks[0].nominal["H1"])  # the repeated confidence interval's


def test_upper_tail_is_accurate_far_out():
    assert upper_tail(10.0) == pytest.approx(7.619853024160527e-24, rel=1e-12)


@pytest.mark.parametrize(
    "block, needle, message",
    [
        (
            "{looks: [3, 6], spending: linear}",
            "spending: linear",
            "'linear' is not one of obrien_fleming, pocock",
        ),
        (
            "{looks: [3, 5], spending: pocock}",
            "looks: [3, 5]",
            "the last look is the planned number of pairs",
        ),
        ("{looks: [4, 3, 6], spending: pocock}", "looks: [4, 3, 6]", "at least two increasing pair counts"),
        ("{looks: [3, 6], spending: pocock, futility_z: low}", "futility_z", "a finite z value"),
    ],
)
def test_the_sequential_block_is_refused_at_plan_time_and_by_the_audit(repo, block, needle, message):
    text = tiny_protocol().replace("  min_pairs: 3\n", f"  min_pairs: 3\n  sequential: {block}\n")
    text = text.replace("seeds: [1, 2]", "seeds: [1, 2, 3, 4, 5, 6]")
    p = repo / "protocols" / "tiny.yaml"
    p.write_text(text)
    r = harness(repo, "plan", str(p))
    line = next(i + 1 for i, s in enumerate(text.splitlines()) if "sequential:" in s)
    assert r.returncode == 2 and message in r.stderr and f"{p}:{line}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    with pytest.raises(ValueError, match="sequential"):
        protocol_from_text(text.encode(), "protocols/tiny.yaml")


def test_identical_pairs_at_a_look_are_decided_by_the_sign_test_not_by_identity():
    fam = Family.of(
        {
            "procedure": "holm",
            "family_alpha": 0.05,
            "min_pairs": 3,
            "sequential": {"looks": [3, 10, 30], "spending": "obrien_fleming"},
            "tests": [
                {
                    "id": "M",
                    "study": "s",
                    "config": "c",
                    "endpoint": "peak_memory",
                    "estimand": "difference",
                    "type": "non_inferiority",
                    "margin": 0.5,
                    "better": "lower",
                }
            ],
        }
    )
    same = [
        {"unit": f"s.c.pair{i:03d}", "baseline_peak_memory_bytes": 5.0, "candidate_peak_memory_bytes": 5.0}
        for i in range(30)
    ]
    looks = run_looks(fam, {("s", "c"): same}, 3, "zero")
    first = looks[0].tests["M"]
    assert first is not None and first.method == "sign" and first.p_value == 1 / 8
    assert "M" not in looks[0].established  # identity's p = 0 would have crossed at 3 pairs


def test_a_fixed_sequence_hypothesis_no_alpha_reached_is_not_reached():
    from prereg.attempts import Completeness

    fam = family(("H1", "c"), ("H2", "d"), procedure="fixed_sequence")
    data = {("s", "c"): pairs(0.0, sd=0.05), ("s", "d"): pairs(-0.3, config="d")}
    looks = run_looks(fam, data, 3, "sign")
    done = Completeness(48, 48, 0, True, False, "complete")
    d2 = sequential_decisions(fam, data, done, looks)[1]
    assert d2.status == "not reached" and "no alpha reached it" in (d2.reason or "")


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"min_pairs": 5}, "below the family's min_pairs 5"),
        ({"two_studies": True}, "a sequential design's hypotheses name one study"),
    ],
)
def test_the_core_refuses_what_a_sequential_family_cannot_do(spec, message):
    tests = [
        {
            "id": f"H{j}",
            "study": "s" if j == 1 or not spec.get("two_studies") else "t",
            "config": "c",
            "endpoint": "training_time",
            "estimand": "log_ratio",
            "type": "superiority",
            "better": "lower",
        }
        for j in (1, 2)
    ]
    with pytest.raises(ValueError, match=message):
        Family.of(
            {
                "procedure": "holm",
                "family_alpha": 0.05,
                "min_pairs": spec.get("min_pairs", 3),
                "sequential": {"looks": [4, 8], "spending": "pocock"},
                "tests": tests,
            }
        )


def test_the_sign_rule_refuses_worst_rank_scores():
    from prereg.hypotheses import rule_problems

    h = {
        "id": "T",
        "endpoint": "time_to_target",
        "estimand": "log_ratio",
        "type": "superiority",
        "better": "lower",
        "censoring": "worst_rank",
        "test": "sign",
    }
    assert rule_problems(h)[0][0] == "test" and "restricted_mean" in rule_problems(h)[0][1]

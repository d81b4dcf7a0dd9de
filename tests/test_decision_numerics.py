"""The decisions' numerics under a hostile review: rounding-level spreads (period-adjusted too), zero-spread
tolerances that follow the inputs' rounding, the signed-rank test above 50 scores, TOST power where the
SD's density is narrow, decisions with p within ulps of alpha, extreme magnitudes, and damaged endpoints
in the summary; in the analysis and the stdlib audit alike. R references: ``tests/fixtures/r_reference.json``
(each case quotes its R command; ``Rscript tests/fixtures/r_reference.R > tests/fixtures/r_reference.json``)."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import time
from pathlib import Path

import pytest
from conftest import ROOT, completeness, git, harness, harness_in_process, record_dicts, tiny_protocol, typed
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from analysis.power import pairs_needed_region, power_region
from prereg import decisions as D
from prereg.ranks import EXACT_MAX_N, signed_rank, upper_tail_count
from prereg.recompute import compare, recompute
from prereg.tdist import t_critical
from prereg.ttests import CRITICAL_MARGIN, critical_t

CASES = json.loads((ROOT / "tests" / "fixtures" / "r_reference.json").read_text())["cases"]
DONE = {"complete": True, "budget_stop": False, "missing_runs": 0, "planned_runs": 0}


def case(name):
    c = CASES[name]
    return {k: v[0] if len(v) == 1 else v for k, v in c["inputs"].items()}, c["value"]


def H(**kw):
    return {
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
        **kw,
    }


def P(b, c, key):
    return [
        {
            "unit": f"u{i}",
            "first": "baseline" if i % 2 == 0 else "candidate",
            f"baseline_{key}": x,
            f"candidate_{key}": y,
        }
        for i, (x, y) in enumerate(zip(b, c))
    ]


def both(h, pairs, alpha=0.05):
    """The decision (one implementation, which the analysis and the audit both call), as its JSON."""
    sp = {"procedure": "fixed_sequence", "family_alpha": alpha, "min_pairs": 3, "tests": [h]}
    return D.decide(sp, {("s", "c"): pairs}, completeness(DONE))[0].as_dict()


B6 = [3.0, 7.0, 11.0, 13.0, 17.0, 19.0]


# -- 1. period adjustment at rounding level ---------------------------------------------------------------


def test_period_adjusted_rounding_spread_is_zero_spread():
    inp, (est, se) = case("period_adjusted_proportional")  # R lm: SE 7.2e-17, a rounding-level fit
    assert inp["b"] == B6 and se < 1e-15
    c = [x * k for x, k in zip(B6, inp["k"])]
    r = both(H(better="higher", period_adjusted=True), P(B6, c, "training_s"))
    assert r["status"] == "not reached" and r["reason"].startswith(
        "zero spread within each order group"
    )  # was p 3.8e-58
    assert r["test"] is None
    # the same data without the adjustment have a real spread: the plain t test decides
    plain = both(H(better="higher"), P(B6, c, "training_s"))
    assert plain["status"] == "not established" and plain["test"]["standard_error"] > 0.01


def test_period_adjusted_zero_within_group_spread_is_not_a_crash():
    inp, (est, se) = case("period_adjusted_exact_zero")  # R: SE 0 ("essentially perfect fit")
    assert se == 0
    h = H(
        endpoint="test_bpb", estimand="difference", type="non_inferiority", margin=0.01, period_adjusted=True
    )
    r = both(h, P([3.0] * 4, [3.0 + d for d in inp["d"]], "test_bpb"))  # was ZeroDivisionError in both
    assert r["status"] == "not reached" and r["reason"].startswith("zero spread within each order group")


# -- 2. the zero-spread tolerance follows the inputs' rounding -----------------------------------------------


@pytest.mark.parametrize("k", [0.9999999, 0.9, 1.1, 1.5, 1 + 1e-12, 1e-3, 37.0])
def test_proportional_data_are_zero_spread_whatever_the_ratio(k):
    c = [x * k for x in B6]
    for est in ("log_ratio", "relative_reduction"):
        r = both(H(estimand=est, better="higher"), P(B6, c, "training_s"))
        assert r["status"] == "not reached" and r["reason"].startswith("zero spread"), (
            k,
            r,
        )  # k=0.9999999: p 4e-36


@pytest.mark.parametrize("k", [1e-7, 0.5, 3.0, -2.5, 1e4])
def test_shifted_data_are_zero_spread_whatever_the_shift(k):
    b = [3.0, 2.75, 3.5, 3.125, 2.9, 3.3]
    r = both(
        H(endpoint="test_bpb", estimand="difference", better="higher"), P(b, [x + k for x in b], "test_bpb")
    )
    assert r["status"] == "not reached" and r["reason"].startswith("zero spread"), (k, r)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(1e-3, 1e6), min_size=3, max_size=12), st.floats(1e-3, 1e3))
def test_any_proportional_data_are_zero_spread(b, k):
    c = [x * k for x in b]
    r = both(H(), P(b, c, "training_s"))
    assert r["status"] == "not reached" and (
        r["reason"].startswith("zero spread") or r["reason"].startswith("every pair identical")
    ), r


def test_real_spread_just_above_rounding_is_decided():
    # relative noise of 1e-11 on the candidate's times: far above rounding (1e-16), so a test is made
    c = [x * 0.9 * (1 + 1e-11 * (-1) ** i * (i + 1)) for i, x in enumerate(B6)]
    r = both(H(), P(B6, c, "training_s"))
    assert r["status"] == "established" and r["test"]["standard_error"] > 0


# -- 3. the signed-rank test above 50 scores ---------------------------------------------------------------


def test_worst_rank_51_pairs_is_exact_not_anti_conservative():
    (_, (p_binom,)), (_, (p_dp,)), (_, (p_r,)) = (
        case("signed_rank_worst_rank_51"),
        case("signed_rank_worst_rank_51_dp"),
        case("signed_rank_worst_rank_51_r_corrected"),
    )
    k = 34  # 34 pairs where only the baseline missed the target, 17 where only the candidate did
    pairs = P([None] * k + [5.0] * (51 - k), [5.0] * k + [None] * (51 - k), "time_to_target_s")
    r = both(H(endpoint="time_to_target", censoring="worst_rank"), pairs, alpha=0.01)
    assert r["status"] == "not established"  # was established, p = 0.008645 (normal approximation)
    assert r["test"]["p_value"] == pytest.approx(p_binom, rel=1e-12) == pytest.approx(p_dp, rel=1e-13)
    assert (
        p_r < 0.01 < r["test"]["p_value"]
    )  # R's continuity-corrected approximation is anti-conservative here
    r35 = both(
        H(endpoint="time_to_target", censoring="worst_rank"),
        P([None] * 35 + [5.0] * 16, [5.0] * 35 + [None] * 16, "time_to_target_s"),
        alpha=0.01,
    )
    assert r35["status"] == "established"
    assert r35["test"]["p_value"] == pytest.approx(stats.binom.sf(34, 51, 0.5), rel=1e-12)


@pytest.mark.parametrize(
    "name", ["signed_rank_exact_60_ties", "signed_rank_exact_300_ties", "signed_rank_worst_rank_51_dp"]
)
def test_exact_signed_rank_above_50_against_r(name):
    inp, (p,) = case(name)
    mine = signed_rank(inp["d"], 1)
    assert mine.exact and mine.p_value == pytest.approx(p, rel=1e-12)


def test_above_the_exact_limit_the_bound_is_conservative():
    inp, (p,) = case("signed_rank_exact_320")  # 319 non-zero scores, exact p by R's recursion
    mine = signed_rank(inp["d"], 1)
    assert not mine.exact and mine.n > EXACT_MAX_N and p <= mine.p_value < 1e-30
    # the bound is never below the exact tail, whatever the tie pattern (exact tails from the recursion)
    for d in ([float(x % 37 + 1) for x in range(320)], [1.0] * 200 + [-1.0] * 150, list(range(-100, 240))):
        nz = [x for x in d if x != 0]
        ranks = stats.rankdata([abs(x) for x in nz])
        exact = upper_tail_count(
            [round(2 * r) for r in ranks], round(2 * sum(r for r, x in zip(ranks, nz) if x > 0))
        )
        assert signed_rank(d, 1).p_value >= exact / 2 ** len(nz)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=11), st.integers(-3, 100))
def test_tail_count_equals_enumeration(doubled, t2):
    brute = sum(
        1
        for s in itertools.product((0, 1), repeat=len(doubled))
        if sum(r for r, b in zip(doubled, s) if b) >= t2
    )
    assert upper_tail_count(doubled, t2) == brute


def test_exact_signed_rank_is_fast_at_its_limit():
    d = [float(x) for x in range(1, EXACT_MAX_N + 1)]
    d[::2] = [-x for x in d[::2]]  # p near 1/2: the widest truncation
    t0 = time.perf_counter()
    r = signed_rank(d, 1)
    assert r.exact and 0.3 < r.p_value < 0.7 and time.perf_counter() - t0 < 10
    assert r.p_value == pytest.approx(
        stats.wilcoxon(d, alternative="greater", method="exact").pvalue, rel=1e-12
    )


# -- 4. exact TOST power where the SD's density is narrow ---------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "power_tost_narrow_sd",
        "power_tost_large_df",
        "power_tost_620",
        "power_tost_619",
        "power_tost_400",
        "power_tost_3000",
        "power_tost_small_n",
    ],
)
def test_tost_power_against_r_integrate(name):
    inp, (p,) = case(name)
    mine = power_region(inp["n"], inp["sd"], inp["alpha"], (inp["lo"], inp["hi"]), inp["mu"])
    assert mine == pytest.approx(min(p, 1.0), rel=1e-9)  # was 2.2e-28 and 0.0 for the first two


def test_tost_sample_size_where_the_density_is_narrow():
    # R: power 0.799656 at 619 pairs, 0.800219 at 620 (power_tost_619 / power_tost_620)
    assert pairs_needed_region(0.01, 0.05, (-1.0, 1.0), 0.999, 0.8) == 620  # was None


# -- 5. p within ulps of alpha: one critical value for both implementations ------------------------------------


@pytest.mark.parametrize("alpha, name", [(0.05, "qt_upper_05"), (0.01, "qt_upper_01")])
def test_critical_value_against_r(alpha, name):
    inp, qs = case(name)
    for df, q in zip(inp["df"], qs):
        mine = critical_t(alpha, df)
        assert mine == t_critical(alpha, df) and mine == pytest.approx(q, rel=1e-14)
        assert mine * (1 + CRITICAL_MARGIN) > q * (1 + 1e-14)  # the margin covers the quantile's error
    # df 2 in closed form: P(T > t) = (1 - t / sqrt(t^2 + 2)) / 2, so t = sqrt(2 x^2 / (1 - x^2)), x = 1 - 2 alpha
    from fractions import Fraction

    x = 1 - 2 * Fraction(alpha)
    exact = math.sqrt(2 * x * x / (1 - x * x))
    assert abs(critical_t(alpha, 2) - exact) <= 8 * math.ulp(exact)


def test_the_reviewers_case_is_not_established_in_both():
    _, (p_r,) = case("pt_review_case")  # R: 0.05000000000000004 > alpha
    c = [0.6858544608470483, 1.6858544608470483, 2.6858544608470485]
    r = both(H(endpoint="test_bpb", estimand="difference", better="higher"), P([0.0] * 3, c, "test_bpb"))
    assert (
        r["status"] == "not established" and p_r > 0.05
    )  # the audit said established, p 0.04999999999999999


@pytest.mark.parametrize("df", [2, 3, 4, 5, 9, 20])
@pytest.mark.parametrize("alpha", [0.05, 0.01, 0.025, 0.05 / 3])
def test_decisions_agree_when_t_is_within_ulps_of_the_critical_value(df, alpha):
    n = df + 1
    offsets = [float(i) for i in range(n)]  # c - b = x + i: sd and se do not depend on x
    m0 = math.fsum(offsets) / n
    se = math.sqrt(math.fsum((v - m0) ** 2 for v in offsets) / (n - 1) / n)
    h = H(endpoint="test_bpb", estimand="difference", better="higher")
    seen = set()
    for target in (
        critical_t(alpha, df),
        critical_t(alpha, df) * (1 + CRITICAL_MARGIN),
        float(stats.t.isf(alpha, df)),
    ):
        x = target * se - m0
        for _ in range(40):
            x = math.nextafter(x, -math.inf)
        for _ in range(80):
            x = math.nextafter(x, math.inf)
            r = both(
                h, P([0.0] * n, [x + v for v in offsets], "test_bpb"), alpha
            )  # the audit agrees on every field
            t = r["test"]["statistic"]
            assert (r["status"] == "established") == (t > critical_t(alpha, df) * (1 + CRITICAL_MARGIN))
            if r["status"] == "established":
                assert float(stats.t.sf(t, df)) < alpha  # never established on a true p at or above alpha
            elif float(stats.t.sf(t, df)) < alpha * (1 - 1e-10):
                pytest.fail(f"t {t!r} with p {stats.t.sf(t, df)!r} not established")
            seen.add(r["status"])
    assert seen == {"established", "not established"}


def test_the_critical_value_is_computed_once_per_level_and_df():
    """t_critical is kept per (alpha, df): asked again it answers without a second bisection, with
    the bits the bisection gives (the uncached function, called here directly)."""
    t_critical.cache_clear()
    first = t_critical(0.05 / 3, 7)
    assert t_critical(0.05 / 3, 7) == first == t_critical.__wrapped__(0.05 / 3, 7)
    assert t_critical(0.05 / 3, 8) != first
    info = t_critical.cache_info()
    assert (info.hits, info.misses) == (1, 2)


# -- 6. extreme magnitudes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "c, word",
    [
        ([1e-200, 2e-200, 3e-200], "underflow"),
        ([5e-324, 1e-323, 1.5e-323], "underflow"),
        ([1e200, 2e200, 3e200], "overflow"),
        ([1e300, -1e300, 1e300], "overflow"),
    ],
)
@pytest.mark.parametrize("period", [False, True])
def test_extreme_magnitudes_are_not_reached_with_the_reason(c, word, period):
    b = [0.0] * 4
    c = c + [c[0] * 3]
    r = both(
        H(endpoint="test_bpb", estimand="difference", better="higher", period_adjusted=period),
        P(b, c, "test_bpb"),
    )
    assert (
        r["status"] == "not reached" and r["reason"].startswith("extreme magnitudes") and word in r["reason"]
    ), r


# -- 7. damaged endpoints in the summary, end to end ------------------------------------------------------------

PROTO = "protocols/tiny.yaml"


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny study at four seeds, run to the end by ``harness run``'s own code in this process
    (conftest's ``harness_in_process``: the real model trained, as under its launcher): its records feed
    the summary checks; test_harness_report_on_a_damaged_record reports a copy through the CLI."""
    r = tmp_path_factory.mktemp("numerics") / "study"
    (r / "protocols").mkdir(parents=True)
    for sub in ("configs",):
        shutil.copytree(ROOT / sub, r / sub, ignore=shutil.ignore_patterns("__pycache__"))
    (r / ".gitignore").write_text("runs/\n__pycache__/\n")
    (r / PROTO).write_text(tiny_protocol(steps=6).replace("seeds: [1, 2]", "seeds: [1, 2, 3, 4]"))
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "test@example.invalid")
    git(r, "config", "user.name", "Test")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "study")
    run = harness_in_process(r, "run", PROTO, "--quiet")
    assert run.returncode == 0, run.stdout + run.stderr
    return r


@pytest.fixture(scope="module")
def records(study: Path) -> list[dict]:

    return record_dicts(study / "records" / "tiny")


@pytest.mark.parametrize("bad", [None, 0.0, float("nan"), float("inf")])
def test_summary_skips_and_names_a_damaged_training_time(records, bad):
    import copy

    from prereg.formats.summary import derive, records_json

    recs = copy.deepcopy(records)
    for r in recs:
        r["protocol"]["hypotheses"]["tests"] = [
            {
                "id": "S",
                "study": "pairs",
                "config": "tiny_conv",
                "endpoint": "training_time",
                "estimand": "log_ratio",
                "type": "superiority",
                "margin": 0.0,
                "better": "lower",
                "censoring": None,
                "period_adjusted": False,
            }
        ]
    victim = next(r for r in recs if r["status"] == "ok" and r["spec"]["role"] == "candidate")
    victim["timings"]["training_s"] = bad
    s = derive(typed(recs)).to_json()  # was TypeError / ValueError before any decision
    entry = s["studies"][0]["configs"][0]
    assert entry["pairs_used"] == 4
    assert entry["training_time"]["invalid_pairs"] == 1 and entry["training_time"]["pairs"] == 3
    assert entry["training_time"]["log_ratio"]["n"] == 3
    assert sum(p["time_reduction_pct"] is None for p in entry["pairs"]) == 1
    assert sum(entry["counts"][k] for k in ("faster", "slower", "ties")) == 3
    d = s["hypotheses"]["decisions"][0]
    assert d["status"] == "not reached"
    assert d["reason"].startswith(f"pair {victim['spec']['unit']}: the candidate's training_s is")
    mine = recompute(records_json(typed(recs)))  # as the files hold them: a NaN is written null
    problems: list[str] = []
    for key in ("hypotheses", "studies"):
        compare(key, mine[key], s[key], problems, "damaged")
    assert not problems, problems


@pytest.mark.parametrize("c", [[1e-200, 2e-200, 3e-200, 5e-200], [1e200, 2e200, 3e200, 5e200]])
def test_descriptive_interval_of_extreme_magnitudes_is_omitted(c):
    from prereg.descriptive import endpoint as descriptive_endpoint

    mine = descriptive_endpoint(
        [0.0] * 4, c, 0.9, "difference"
    ).as_dict()  # was OverflowError for 1e200 (squares), before any decision
    assert mine["pairs"] == 4 and mine["interval"] is None


def test_identical_values_keep_their_degenerate_interval():
    from prereg.descriptive import endpoint as descriptive_endpoint

    mine = descriptive_endpoint(
        [3.0, 3.5, 2.5], [3.0, 3.5, 2.5], 0.9, "difference"
    ).as_dict()  # bitwise-equal BPB of A/A pairs
    assert mine["interval"]["low"] == mine["interval"]["high"] == 0.0


def test_harness_report_on_a_damaged_record(study, tmp_path):
    # a record edited and resealed (the audit's ledger check would flag it; the report must still not crash)
    from harness.ledger import write_manifest
    from prereg.formats.record import canonical, read_entry, record_files, seal

    r = tmp_path / "copy"
    shutil.copytree(study, r, symlinks=True)
    recs_dir = r / "records" / "tiny"
    path = next(
        p
        for p in sorted(record_files(recs_dir))
        if read_entry(p)["status"] == "ok" and read_entry(p)["spec"]["role"] == "candidate"
    )
    rec = read_entry(path)
    rec["timings"]["training_s"] = None
    path.write_text(canonical(seal(rec)).decode() + "\n")
    recs = record_dicts(recs_dir)
    head = {"seq": recs[-1]["ledger"]["seq"], "sha256": recs[-1]["sha256"]}
    write_manifest(recs_dir, r, [r / PROTO], recs[0]["protocol"], head)
    out = harness(r, "report", PROTO, "--quiet")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout + out.stderr  # was a TypeError
    pub = harness(r, "publish", PROTO)  # the study page lists every pair too
    assert pub.returncode == 0 and "Traceback" not in pub.stderr, pub.stdout + pub.stderr
    summary = json.loads((recs_dir / "summary.json").read_text())
    entry = summary["studies"][0]["configs"][0]
    assert entry["training_time"]["invalid_pairs"] == 1 and entry["training_time"]["log_ratio"]["n"] == 3


IDENTITY_CASES = [
    # (hypothesis, endpoint key, status under the identity rule)
    (
        H(endpoint="test_bpb", estimand="difference", type="non_inferiority", margin=0.01),
        "test_bpb",
        "established",
    ),
    (
        H(endpoint="test_bpb", estimand="difference", type="equivalence", margin=0.01),
        "test_bpb",
        "established",
    ),
    (H(estimand="relative_reduction", type="non_inferiority", margin=2.0), "training_s", "established"),
    (H(estimand="log_ratio", type="equivalence", margin=0.05, better="higher"), "training_s", "established"),
    (H(), "training_s", "not established"),  # superiority at 0: a tie favours nobody
    (H(type="superiority", margin=0.01, estimand="difference"), "training_s", "not established"),
    (
        H(endpoint="time_to_target", censoring="worst_rank", estimand="log_ratio"),
        "time_to_target_s",
        "not established",
    ),
]


@pytest.mark.parametrize(("h", "key", "status"), IDENTITY_CASES)
def test_identical_arms_are_decided_by_identity_in_schema_4_and_not_reached_before(h, key, status):
    """Every pair's difference exactly 0 (values drawn once, the same in both arms): under the
    identity rule (records of schema 4) 0 lies inside a non-inferiority or equivalence region at a
    positive margin, so the hypothesis holds ("established: every pair identical", p = 0); no
    superiority holds (p = 1). Under the rule earlier records were tagged with it is not reached."""
    values = [3.25, 1.5, 2.75, 4.0, 2.0]
    pairs = P(values, values, key)
    sp = {"procedure": "holm", "family_alpha": 0.05, "min_pairs": 3, "tests": [h]}
    new = D.decide(sp, {("s", "c"): pairs}, completeness(DONE), identity="zero")[0].as_dict()
    assert new["status"] == status and new["test"]["method"] == "identity"
    assert f"{status}: every pair identical" in new["text"]
    shown = f"every pair identical: in all 5 pairs the two arms gave the same {h['endpoint']}, bit for bit"
    assert new["reason"] == f"{shown}: the identity rule (records of schema 4)"
    assert new["test"]["p_value"] == (0.0 if status == "established" else 1.0)
    old = D.decide(sp, {("s", "c"): pairs}, completeness(DONE))[0].as_dict()
    # the same words say what was shown under the earlier rule, which decides nothing (no failure)
    assert old["status"] == "not reached" and old["reason"].startswith(f"{shown}; shown, not tested")
    assert "shown, not tested" in old["reason"] and shown in new["text"] and shown in old["text"]
    # one pair off by the smallest step: a spread again, tested as before, never by identity
    nudged = P(values, [*values[:-1], math.nextafter(values[-1], 10.0)], key)
    other = D.decide(sp, {("s", "c"): nudged}, completeness(DONE), identity="zero")[0].as_dict()
    assert (other["test"] or {}).get("method") != "identity"


@pytest.mark.parametrize(("h", "key", "status"), IDENTITY_CASES)
@pytest.mark.parametrize("n", [3, 5, 6, 7, 10])
def test_identical_arms_are_decided_by_the_exact_sign_test_from_schema_5(h, key, status, n):
    """Schema 5 on: every pair identical inside the region is the sign test's n of n favourable,
    p = 2^-n (scipy's exact binomial test, one-sided), established only when that is below alpha
    (0.05: from 5 pairs); outside the region (superiority) p = 1 as under identity."""
    values = [3.25, 1.5, 2.75, 4.0, 2.0, 1.25, 5.5, 0.75, 2.5, 3.0][:n]
    pairs = P(values, values, key)
    sp = {"procedure": "holm", "family_alpha": 0.05, "min_pairs": 3, "tests": [h]}
    got = D.decide(sp, {("s", "c"): pairs}, completeness(DONE), identity="sign")[0].as_dict()
    if status == "established":
        p = stats.binomtest(n, n, 0.5, alternative="greater").pvalue
        assert got["test"]["method"] == "sign" and got["test"]["p_value"] == p == 2.0**-n
        assert got["status"] == ("established" if p < 0.05 else "not established")
        assert (
            got["reason"].endswith(D.IDENTICAL_BY_SIGN)
            and got["reason"].startswith("every pair identical: in all")
            and f"{n} of {n} pairs favourable" in got["text"]
        )
    else:
        assert got["status"] == "not established" and got["test"]["p_value"] == 1.0


def test_the_summary_uses_the_identity_rule_of_the_records_schema(records):
    """The tiny study's quality hypothesis (BPB bitwise identical in every pair): schema 5 records
    decide it by the exact sign test (p = 2^-n); the same records read as schema 4 establish it by
    identity (p = 0), and as schema 3 keep the rule before it (not reached); a set mixing 4 and 5
    is analysed under its oldest record's rule."""
    from prereg.formats.summary import records_json

    rows = records_json(typed(records))
    mine = recompute(rows)["hypotheses"]["decisions"][0]
    from prereg.formats.record import SCHEMA_VERSION

    assert {r["schema_version"] for r in rows} == {SCHEMA_VERSION} and SCHEMA_VERSION >= 5, (
        mine
    )  # 5's rule on
    assert mine["test"]["method"] == "sign" and mine["reason"].endswith(D.IDENTICAL_BY_SIGN)
    assert mine["test"]["p_value"] == 2.0 ** -mine["test"]["n"]
    four = recompute([{**r, "schema_version": 4} for r in rows])["hypotheses"]["decisions"][0]
    assert four["status"] == "established" and four["test"]["p_value"] == 0.0
    assert "every pair identical" in four["text"]
    mixed = recompute([{**r, "schema_version": 4 if i == 0 else 5} for i, r in enumerate(rows)])
    assert mixed["hypotheses"]["decisions"][0]["test"]["method"] == "identity"
    old = recompute([{**r, "schema_version": 3} for r in rows])
    assert old["hypotheses"]["decisions"][0]["status"] == "not reached"


def test_the_identity_simulation_shows_p0_erring_and_the_sign_test_at_its_level():
    """benchmarks/coverage.py --identity, small: test-BPB non-inferiority (margin 0.01, alpha 0.01)
    with 2% of pairs diverging by +0.5 BPB (a mean at the margin) is established at 3 pairs by
    identity's p = 0 whenever the pairs agree (0.98^3 = 94%), by the sign test never; with half the
    pairs diverging (the sign test's null) the sign test errs at most at its level, 2^-7 at 7 pairs."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("coverage_bench", ROOT / "benchmarks" / "coverage.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = argparse.Namespace(
        studies=400, sweep_pairs=[3, 7], alpha=0.01, margin=0.01, diverge=0.02, jump=0.5, seed=3
    )
    rows = {(r["diverge"], r["pairs"]): r for r in mod.identity_sweep(args)["rows"]}
    three = rows[(0.02, 3)]
    assert three["established_identity_p0"] == three["all_identical"] > 0.88
    assert three["established_sign"] == 0.0
    assert rows[(0.5, 3)]["established_sign"] == 0.0 and rows[(0.5, 3)]["established_identity_p0"] > 0.05
    assert rows[(0.5, 7)]["established_sign"] <= 0.01 + 3 * math.sqrt(0.01 * 0.99 / 400)


def test_the_median_claim_holds_where_the_mean_claim_errs_at_cpu3_s_size():
    """benchmarks/coverage.py --identity at 120 pairs, alpha 0.05 / 13 (docs/decisions.md, "The
    quality claim of new protocols"): with 2% of pairs diverging by +0.5 BPB the mean claim is
    established exactly when all pairs agree (an error: the mean is at the margin), the median
    claim (test: sign) always (its median is 0); with half diverging the median claim is at its
    null edge and errs at most at its level."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("coverage_bench", ROOT / "benchmarks" / "coverage.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = argparse.Namespace(
        studies=60, sweep_pairs=[120], alpha=0.05 / 13, margin=0.01, diverge=0.02, jump=0.5, seed=5
    )
    rows = {r["diverge"]: r for r in mod.identity_sweep(args)["rows"]}
    two = rows[0.02]
    assert two["established_sign"] == two["established_identity_p0"] == two["all_identical"]
    assert two["established_median_claim"] == 1.0
    assert rows[0.5]["established_median_claim"] <= 0.05

"""Power planning from A/A pilot pairs, and the coverage simulation at reduced size."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys

import pytest
from conftest import ROOT, synthetic_record
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from analysis.power import aa_noise, pairs_needed, plan, power, skewness


def records(aa: bool, n: int = 8, sd: float = 0.04, seed: int = 0, planted: dict | None = None) -> list:
    rng = random.Random(seed)
    proto = {
        "studies": [
            {
                "name": "p",
                "design": "paired",
                "arms": ["native", "native" if aa else "cotangent"],
                "configs": ["c"],
                "seeds": list(range(n)),
                **({"planted": planted} if planted else {}),
            }
        ]
    }
    out = []
    for i in range(n):
        b = math.exp(rng.gauss(0, 0.1))
        for role, t in (("baseline", b), ("candidate", b * math.exp(rng.gauss(0, sd)))):
            out.append(
                synthetic_record(
                    {"design": "paired", "study": "p", "config": "c", "unit": f"u{i}", "role": role},
                    protocol=proto,
                    test_bpb=3.0 + 0.1 * i,
                    timings={"training_s": t, "time_to_target_s": t},
                )
            )
    return out


def test_noise_comes_from_aa_pairs_only():
    assert (
        aa_noise(records(aa=False), "training_time", "log_ratio") == {}
    )  # a candidate's outcome is never read
    # a planted pair has one arm twice too, but its candidate carries a known cost: not A/A
    assert aa_noise(records(aa=True, planted={"kind": "spin", "us": 50}), "training_time", "log_ratio") == {}
    noise = aa_noise(records(aa=True), "training_time", "log_ratio")["c"]
    assert noise.pairs == 8 and 0.01 < noise.sd < 0.1 and not noise.identical
    q = aa_noise(records(aa=True), "test_bpb", "difference")["c"]  # A/A BPB is bitwise identical
    assert q.identical and q.sd == pytest.approx(stats.tstd([3.0 + 0.1 * i for i in range(8)]) * math.sqrt(2))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False), min_size=3, max_size=60))
def test_pilot_skewness_is_scipys_unbiased_skew(v):
    """``skewness`` against ``scipy.stats.skew(bias=False)`` (adjusted Fisher-Pearson G1)."""
    mine = skewness(v)
    spread = max(v) - min(v)
    if spread <= 1e-6 * max(1.0, max(abs(x) for x in v)):  # (near) constant: no spread to skew
        return
    ref = float(stats.skew(v, bias=False))
    assert mine is not None and math.isclose(mine, ref, rel_tol=1e-7, abs_tol=1e-7)


def test_plan_reports_the_pilots_skewness_and_flags_it():
    noise = aa_noise(records(aa=True), "training_time", "log_ratio")["c"]
    assert noise.skewness is not None and abs(noise.skewness) < 3
    assert skewness([1.0, 1.0, 1.0]) is None and skewness([1.0, 2.0]) is None
    assert aa_noise(records(aa=True), "test_bpb", "difference")["c"].skewness is None  # identical A/A


def test_pairs_needed_matches_the_normal_approximation():
    sd, alpha, margin = 0.07, 0.0025, 0.01  # the seed study's quality noise and v5's level and margin
    n = pairs_needed(sd, alpha, "non_inferiority", margin, 0.0, 0.8)
    z = (stats.norm.ppf(1 - alpha) + stats.norm.ppf(0.8)) * sd / margin
    assert abs(n - z**2) / z**2 < 0.05 and n > 400  # hundreds of pairs, as the issue computed
    assert (
        power(n, sd, alpha, "non_inferiority", margin, 0.0)
        >= 0.8
        > power(n - 1, sd, alpha, "non_inferiority", margin, 0.0)
    )
    assert pairs_needed(sd, alpha, "superiority", 0.0, 0.0, 0.8, cap=2000) is None  # no effect: no n


def test_plan_for_a_target_protocol():
    target = {
        "hypotheses": {
            "procedure": "holm",
            "family_alpha": 0.01,
            "min_pairs": 3,
            "tests": [
                {
                    "id": "H1",
                    "study": "p",
                    "config": "c",
                    "endpoint": "training_time",
                    "estimand": "log_ratio",
                    "type": "superiority",
                    "margin": 0.0,
                    "better": "lower",
                }
            ],
        },
        "studies": [{"name": "p", "design": "paired", "seeds": list(range(12))}],
    }
    rows = plan(records(aa=True), target, {"H1": 0.05})
    assert len(rows) == 1 and rows[0].alpha == 0.01 and rows[0].planned_pairs == 12
    from analysis.power import legend, table_rows

    assert rows[0].skewness is not None and "skew (A/A)" in table_rows(rows)[0]
    assert "benchmarks/coverage.py --noise-sweep" in legend(rows)
    assert rows[0].n80 is not None and rows[0].n80 <= rows[0].n90


@pytest.mark.long
def test_coverage_simulation_reduced(tmp_path):
    out = tmp_path / "cov.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "coverage.py"),
            "--studies",
            "400",
            "--pairs",
            "12",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert 0.9 < res["coverage_period_adjusted"] < 0.99 and res["coverage_plain"] > 0.93
    assert all(v < 0.08 for v in res["type_I_error"].values())
    assert res["full_budget_mean_bias_log"] < 0  # counting a miss at the budget flatters the arm that misses
    assert "| coverage, period-adjusted interval |" in r.stdout


@pytest.mark.long
def test_noise_sweep_shows_the_t_rule_under_skew(tmp_path):
    """``coverage.py --noise-sweep`` at reduced size: near nominal under normal noise, the
    "faster" tail inflated and coverage lost under log-normal (skewness about 6) noise."""
    out = tmp_path / "sweep.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "coverage.py"),
            "--noise-sweep",
            "--studies",
            "800",
            "--sweep-pairs",
            "5",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    rows = {row["noise"]: row for row in json.loads(out.read_text())["rows"]}
    normal, logn = rows["normal"], rows["lognormal (sigma 1)"]
    assert 0.93 < normal["coverage"] < 0.97 and normal["type_I_lower"] < 0.045
    assert logn["coverage"] < 0.88 and logn["type_I_lower"] > 0.12 and logn["type_I_upper"] < 0.01
    assert 5.5 < logn["skewness"] < 6.5 and "| lognormal (sigma 1) |" in r.stdout
    # the skew-corrected candidates shrink the inflated tail on the log-normal, without removing it
    assert all(logn[k]["down"] < logn["type_I_lower"] for k in ("johnson", "hall"))


@pytest.mark.process
def test_harness_power_cli_on_a_real_pilot(repo):
    """A tiny A/A pilot run through the CLI, then ``harness power``: plug-in and upper-limit figures in the
    target's own units, and which one the target's origins cite."""
    from conftest import harness, tiny_protocol

    pilot = (
        tiny_protocol(id="pilot", steps=6)
        .replace("arms: [native, cotangent]", "arms: [native, native]")
        .replace("seeds: [1, 2]", "seeds: [1, 2, 3, 4]")
    )
    target = (
        tiny_protocol(id="target")
        .replace("seeds: [1, 2]", "seeds: [1, 2, 3, 4, 5, 6]")
        .replace(
            "      endpoint: test_bpb\n      estimand: difference\n      type: non_inferiority\n      margin: 0.01\n",
            "      endpoint: training_time\n      estimand: relative_reduction\n      type: non_inferiority\n"
            "      margin: 5\n",
        )
        .replace(
            "order_seed: 1\n",
            'order_seed: 1\norigins:\n  seeds: "harness power: the pairs '
            "at the sd's 80% upper confidence limit\"\n",
        )
    )
    (repo / "protocols" / "pilot.yaml").write_text(pilot)
    (repo / "protocols" / "target.yaml").write_text(target)
    r = harness(repo, "run", "protocols/pilot.yaml", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    r = harness(repo, "power", "protocols/pilot.yaml", "--target", "protocols/target.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "training_time (relative_reduction)" in r.stdout and "n 80% at sd 80% UCL" in r.stdout
    assert "origins.seeds cites the figure at the sd's upper confidence limit" in r.stdout
    j = harness(repo, "power", "protocols/pilot.yaml", "--target", "protocols/target.yaml", "--json")
    row = json.loads(j.stdout)[0]
    assert (
        row["pilot_pairs"] == 4
        and row["sd_upper"] > row["sd"] > 0
        and row["estimand"] == "relative_reduction"
    )
    assert row["n80_upper"] is None or row["n80"] is None or row["n80_upper"] >= row["n80"]


@pytest.mark.parametrize("n", [3, 4, 6, 10, 30])
@pytest.mark.parametrize("alpha", [0.05, 0.025, 0.005])
def test_the_detectable_effect_has_exactly_the_target_power(n, alpha):
    """The planned-size detectable effect is the noncentral-t root, not the (t_a + t_0.8) shortcut
    (whose power is 0.784 at n = 4, alpha 0.025): the power at it is 0.8 to 1e-9."""
    from analysis.power import detectable_shift, power

    d = detectable_shift(n, 0.37, alpha)
    assert abs(power(n, 0.37, alpha, "superiority", 0.0, d) - 0.8) < 1e-9
    assert detectable_shift(n, 0.0, alpha) == 0.0


@pytest.mark.parametrize(
    "args, needle",
    [
        ((5, 0.0, 0.05), "positive finite standard deviation"),
        ((5, float("nan"), 0.05), "positive finite standard deviation"),
        ((1, 1.0, 0.05), "n >= 2"),
        ((5, 1.0, 0.6), "alpha in (0, 0.5)"),
    ],
)
def test_power_refuses_what_has_no_power(args, needle):
    from analysis.power import power

    with pytest.raises(ValueError, match=re.escape(needle)):
        power(*args, "superiority", 0.0, 0.1)


def _aa_records(values, first=None, ttt=None):
    """A/A pilot records whose per-pair log ratios are ``values`` (candidate first where ``first`` says)."""
    proto = {
        "studies": [
            {"name": "p", "design": "paired", "arms": ["native", "native"], "configs": ["c"], "seeds": []}
        ]
    }
    out = []
    for i, v in enumerate(values):
        cand_first = bool(first and first[i])
        for role, t in (("baseline", 10.0), ("candidate", 10.0 * math.exp(v))):
            pos = (role == "candidate") == cand_first
            timings = {"training_s": t, "time_to_target_s": t * 0.5}
            if ttt is not None and ttt[i] == role:
                timings["time_to_target_s"] = None  # this arm missed the target
            out.append(
                synthetic_record(
                    {
                        "design": "paired",
                        "study": "p",
                        "config": "c",
                        "unit": f"u{i:03d}",
                        "role": role,
                        "position": 0 if pos else 1,
                    },
                    protocol=proto,
                    timings=timings,
                )
            )
    return out


def test_sign_power_matches_simulation_of_the_sign_test():
    from analysis.power import beyond_bounds, sign_critical, sign_power
    from prereg.ranks import sign_test

    rng = random.Random(4)
    pilot = tuple(math.exp(rng.gauss(0, 1)) - 1.0 for _ in range(30))  # skewed, like stalls
    region, mean, n, alpha = (None, 0.0), -0.4, 25, 0.025
    p = beyond_bounds(pilot, region, mean)[0]
    # the sign test on Bernoulli(p) signs, simulated, against the binomial power
    hits = sum(
        sign_test([-1.0 if rng.random() < p else 1.0 for _ in range(n)], None, 0.0)[2] < alpha
        for _ in range(20000)
    )
    assert abs(hits / 20000 - sign_power(n, pilot, alpha, region, mean)) < 4 * math.sqrt(0.25 / 20000)
    # the critical count against scipy's binomial
    for m in (3, 5, 12, 40):
        c = sign_critical(m, alpha)
        ok = [k for k in range(m + 1) if stats.binom.sf(k - 1, m, 0.5) < alpha]
        assert c == (min(ok) if ok else None)


def test_planning_reads_the_rule_the_hypothesis_declares():
    from analysis.power import data_rule

    rng = random.Random(2)
    skewed = [0.3 * (math.exp(rng.gauss(0, 1)) - 1.6) for _ in range(20)]
    target = {
        "studies": [{"name": "s", "design": "paired", "seeds": list(range(30)), "configs": ["c"]}],
        "hypotheses": {
            "procedure": "fixed_sequence",
            "family_alpha": 0.025,
            "min_pairs": 3,
            "tests": [
                {
                    "id": h,
                    "study": "s",
                    "config": "c",
                    "endpoint": "training_time",
                    "estimand": "log_ratio",
                    "type": "superiority",
                    "better": "lower",
                    "margin": 0.0,
                    **({"test": "sign"} if h == "sign" else {}),
                }
                for h in ("t", "sign")
            ],
        },
    }
    rows = {r.id: r for r in plan(_aa_records(skewed), target, {"t": 0.2, "sign": 0.2})}
    assert rows["t"].rule == "t" and rows["sign"].rule == "sign"
    assert rows["t"].data_rule == data_rule(rows["t"].skewness) == "sign"  # |G1| > 1 calls for sign
    assert rows["sign"].n80 != rows["t"].n80 and math.isnan(rows["sign"].half_width_at_planned)
    assert data_rule(0.3) == "t" and data_rule(None) == "t" and data_rule(-1.5) == "sign"


def test_period_adjusted_planning_uses_the_pooled_within_order_sd():
    rng = random.Random(6)
    first = [i % 2 == 1 for i in range(16)]
    # a period effect of +-0.2: the plain sd carries it, the period-adjusted test does not
    vals = [(0.2 if f else -0.2) + rng.gauss(0, 0.02) for f in first]
    recs = _aa_records(vals, first)
    plain = aa_noise(recs, "training_time", "log_ratio")["c"]
    h = {
        "id": "h",
        "study": "p",
        "config": "c",
        "endpoint": "training_time",
        "estimand": "log_ratio",
        "type": "superiority",
        "better": "lower",
        "period_adjusted": True,
    }
    adj = aa_noise(recs, "training_time", "log_ratio", None, h)["c"]
    groups = [[v for v, f in zip(vals, first) if f == g] for g in (False, True)]
    pooled = math.sqrt(sum(stats.tvar(g) * (len(g) - 1) for g in groups) / (len(vals) - 2))
    assert adj.sd == pytest.approx(pooled, rel=1e-12) and plain.sd > 5 * adj.sd


def test_censored_planning_counts_the_pilots_unreached_targets():
    vals = [0.0] * 10
    missed = [None] * 10
    missed[2], missed[7] = "candidate", "baseline"
    recs = _aa_records(vals, ttt=missed)
    h = {
        "id": "h",
        "study": "p",
        "config": "c",
        "endpoint": "time_to_target",
        "estimand": "log_ratio",
        "type": "superiority",
        "better": "lower",
        "censoring": "restricted_mean",
    }
    with_censoring = aa_noise(recs, "time_to_target", "log_ratio", None, h)["c"]
    both_reached = aa_noise(recs, "time_to_target", "log_ratio")["c"]
    assert with_censoring.pairs == 10 and both_reached.pairs == 8
    # the two unreached arms count at the restriction (the training time, 2x the reached time)
    assert sorted(with_censoring.values)[0] == pytest.approx(-math.log(2)) and both_reached.identical


def test_a_sequential_target_is_planned_with_its_looks():
    from analysis.power import sequential_figures

    rng = random.Random(8)
    vals = [rng.gauss(0, 0.05) for _ in range(12)]
    h = {
        "id": "H",
        "study": "s",
        "config": "c",
        "endpoint": "training_time",
        "estimand": "log_ratio",
        "type": "superiority",
        "better": "lower",
        "margin": 0.0,
    }
    target = {
        "studies": [{"name": "s", "design": "paired", "seeds": list(range(30)), "configs": ["c"]}],
        "hypotheses": {
            "procedure": "fixed_sequence",
            "family_alpha": 0.025,
            "min_pairs": 3,
            "sequential": {"looks": [10, 20, 30], "spending": "obrien_fleming"},
            "tests": [h],
        },
    }
    (row,) = plan(_aa_records(vals), target, {"H": 3.0})
    assert row.sequential is not None
    seq = row.sequential
    # the fixed design's exact t power is the ceiling; the sequential design spends some of it
    assert seq.power_at_planned <= row.power_at_planned + 0.02 and seq.expected_pairs < 30
    assert 29 < seq.expected_pairs_null <= 30 and seq.max_pairs_80 is not None
    # the expected pairs against a simulation of the canonical process at the same drift
    figures = sequential_figures(row.sd, 0.025, (None, 0.0), -0.03, (10, 20, 30), "obrien_fleming")
    assert figures is not None
    from prereg.sequential import boundaries

    c = boundaries([1 / 3, 2 / 3, 1.0], 0.025, "obrien_fleming")
    theta = 0.03 * math.sqrt(30) / row.sd
    used, n = 0.0, 20000
    for _ in range(n):
        s, prev, stop = 0.0, 0.0, 30
        for t, b, m in zip([1 / 3, 2 / 3, 1.0], c, (10, 20, 30)):
            s += rng.gauss(theta * (t - prev), math.sqrt(t - prev))
            prev = t
            if s / math.sqrt(t) >= b:
                stop = m
                break
        used += stop
    assert abs(used / n - figures.expected_pairs) < 0.15


def test_the_calibration_bias_is_the_target_designs_on_the_hypothesis_clock():
    """Each hypothesis gets the planted rows of its own design (block size) and clock, never another's."""
    from analysis.power import calibration_bias

    def row(block, clock, kind, bias, pairs=8, truth=2.0, ref=False):
        return {
            "config": "c",
            "block_steps": block,
            "clock": clock,
            "kind": kind,
            "plant": f"{kind} plant",
            "pairs": pairs,
            "truth": truth,
            "bias": bias,
            "bias_lo": bias - 0.1,
            "bias_hi": bias + 0.1,
            **({"reference": True} if ref else {}),
        }

    planted = [
        row(1, "wall", "spin", 0.15, pairs=80),
        row(1, "wall", "spin", -0.30),
        row(1, "CPU", "spin", 0.06, pairs=80),
        row(10, "CPU", "spin", 0.50, pairs=80),
        row(1, "CPU", "matmul", -0.24),
        row(50, "CPU", "matmul", 0.0, ref=True),
    ]

    def target(block, endpoint):
        return {
            "studies": [
                {"name": "s", "design": "paired", **({"lockstep": {"block_steps": block}} if block else {})}
            ],
            "hypotheses": {"tests": [{"id": "h", "study": "s", "config": "c", "endpoint": endpoint}]},
        }

    wall = calibration_bias(planted, target(1, "training_time"))["h"]
    assert wall.startswith("spin of +2.00: +0.15 (+0.05 to +0.25), 80 pairs") and "-0.30" in wall
    cpu = calibration_bias(planted, target(1, "training_cpu_time"))["h"]
    assert "+0.06" in cpu and "+0.50" not in cpu and "matmul plant (cache-heavy): -0.24" in cpu
    assert "not measured" in calibration_bias(planted, target(None, "training_time"))["h"]
    assert "not measured" in calibration_bias(planted, target(50, "training_time"))["h"]  # a reference only
    assert "not a time" in calibration_bias(planted, target(1, "test_bpb"))["h"]


@pytest.mark.parametrize(
    ("k", "per", "shift", "kind"), [(3, 6, 0.45, "superiority"), (6, 4, 0.25, "equivalence")]
)
def test_a_replicated_target_is_planned_as_the_replicate_model_decides(k, per, shift, kind):
    """With ``df = k - 1``, the planned power is the rejection rate of the core's own decision
    (``prereg.hypotheses.test_of``, method t-replicates) on simulated replicated studies with no
    spread between replicates: within 3 Monte-Carlo standard errors (4000 studies)."""
    import numpy as np

    from analysis.power import power_region
    from prereg.hypotheses import Hypothesis, Pair, bounds, test_of

    sd, alpha, n = 1.0, 0.025, k * per
    margin = 0.0 if kind == "superiority" else 0.6
    h = Hypothesis.of(
        {
            "id": "H",
            "study": "s",
            "config": "c",
            "endpoint": "training_time",
            "estimand": "difference",
            "type": kind,
            "better": "lower",
            "margin": margin,
        }
    )
    mean = -shift if kind == "superiority" else 0.0
    planned = power_region(n, sd, alpha, bounds(h), mean, df=k - 1)
    rng = np.random.default_rng(47)
    hits, studies = 0, 4000
    for _ in range(studies):
        d = rng.normal(mean, sd, n)
        pairs = [
            Pair(
                unit=f"u{i}", baseline_training_s=10.0, candidate_training_s=10.0 + x, replicate=1 + i // per
            )
            for i, x in enumerate(d)
        ]
        got, why, _ = test_of(h, pairs, 2, replicated=True)
        assert why is None and got.method == "t-replicates" and got.df == k - 1
        hits += got.p_value < alpha
    se = math.sqrt(planned * (1 - planned) / studies)
    assert abs(hits / studies - planned) < 3 * se, (hits / studies, planned)
    assert planned < power_region(n, sd, alpha, bounds(h), mean)  # fewer df than the pooled pairs'

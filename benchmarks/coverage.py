"""Coverage and type-I error of the analysis, by simulation of paired studies.

Each simulated study has ``n`` pairs run in the harness's balanced order (half baseline first,
half candidate first, in a seeded shuffle) with per-pair log-time differences

    d_i = tau + period * (+1 if the candidate ran second else -1) + drift * position_i + noise_i,

``noise_i ~ N(0, sd^2)``: the shape of the demo's and the pilots' paired differences (``--sd`` and
``--period`` default to values of that order; ``--from-records DIR`` takes ``sd`` from the A/A
pairs of a records folder). It reports, at the declared levels:

* the actual coverage of the plain paired t interval and of the period-adjusted (two-period
  crossover) interval for ``tau``, and their mean widths;
* the type-I error of each decision rule of :mod:`prereg.decisions` at the edge of its null
  (superiority at ``tau = 0``, non-inferiority at ``tau = -margin`` on the favourable scale,
  equivalence at ``tau = margin``), and of the worst-rank signed-rank rule for time to target
  when both arms miss the target equally often;
* the bias of the old ``full_budget`` imputation (an unreached target counted at the budget) for
  a candidate that truly needs longer than the budget more often than the baseline, against the
  worst-rank rule's type-I error in the same situation.

    python benchmarks/coverage.py --studies 4000 --pairs 12 --json runs/coverage.json

``--noise-sweep`` instead measures the rules under noise that is not normal: for each family of
:data:`NOISES` and each ``n`` of ``--sweep-pairs``, the plain t rule at a mean of 0 (the coverage
of its two-sided interval for the mean and the type-I error of each one-sided superiority test,
both directions: a skewed difference makes the two tails' errors unequal), the sign rule
(``test: sign``) at a median of 0 (its order-statistic interval's coverage and its two one-sided
errors), and each rule's family-wise error over three independent null hypotheses under Holm
(the "faster" direction), with Monte-Carlo standard errors, and each family's skewness estimated
from 400,000 draws (each family's median is exact: :data:`MEDIANS`). Beside the t rule it
evaluates two skew-corrected t statistics from the literature (:func:`skew_corrected`: Johnson
1978, Hall 1992), which no protocol can declare.

    python benchmarks/coverage.py --noise-sweep --studies 4000 --json runs/coverage-noise.json

``--sequential`` simulates group-sequential designs through the core's own look-by-look rule
(:func:`sequential_sweep`): type-I error, power and expected pairs for each spending function,
rule and noise.

    python benchmarks/coverage.py --sequential --studies 4000 --json runs/coverage-sequential.json

``--identity`` measures the rule for a family whose every pair is identical (:func:`identity_sweep`):
a test-BPB non-inferiority hypothesis (margin ``--margin``, one-sided level ``--alpha``) on pairs
that agree bitwise except that a share ``--diverge`` of them diverge by ``--jump`` BPB (the default
2% by +0.5: a mean of exactly the margin, the edge of the null), decided by the core itself
(:func:`prereg.decisions.decide`) under identity's ``p = 0`` (records of schema 4) and the exact
sign test's ``p = 2^-n`` (schema 5 on), for each ``n`` of ``--sweep-pairs``; and, for the sign
test's own null, with half the pairs diverging.

    python benchmarks/coverage.py --identity --studies 4000 --alpha 0.01 --margin 0.01 --sweep-pairs 3 5 7 10
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from scipy import optimize, stats  # noqa: E402

from analysis.power import skewness  # noqa: E402
from prereg.descriptive import mean_interval  # noqa: E402
from prereg.ranks import median_bounds, sign_test, signed_rank, worst_rank_differences  # noqa: E402
from prereg.ttests import period_adjusted, t_test  # noqa: E402


def _lognormal(rng: random.Random) -> float:
    # log-normal with sigma 1, centred and scaled to mean 0, sd 1: skewness (e + 2) sqrt(e - 1) = 6.18
    e = math.e
    return (math.exp(rng.gauss(0.0, 1.0)) - math.sqrt(e)) / math.sqrt((e - 1) * e)


def _stall(rng: random.Random) -> float:
    # usually slightly faster, 5% of the time a stall of 4 sd-units; centred, scaled to sd 1
    q, size, base = 0.05, 4.0, 0.3
    x = (size if rng.random() < q else 0.0) + rng.gauss(0.0, base) - q * size
    return x / math.sqrt(q * (1 - q) * size**2 + base**2)


def _chi2_3(rng: random.Random) -> float:
    return (sum(rng.gauss(0.0, 1.0) ** 2 for _ in range(3)) - 3.0) / math.sqrt(6.0)


def _t2(rng: random.Random) -> float:
    # Student t with 2 df (no finite variance): symmetric, heavy tails; unit scale
    return rng.gauss(0.0, 1.0) / math.sqrt(rng.gammavariate(1.0, 2.0) / 2.0)


def _ties(rng: random.Random) -> float:
    return round(rng.gauss(0.0, 1.0) * 2.0) / 2.0  # normal on a grid of half an sd: many ties


#: Mean-zero noise families (unit sd where it exists), drawn by ``f(rng)``.
NOISES = {
    "normal": lambda rng: rng.gauss(0.0, 1.0),
    "ties (normal on a 0.5 grid)": _ties,
    "t2 (heavy tails)": _t2,
    "chi-square 3 df": _chi2_3,
    "stall mixture (5% stalls)": _stall,
    "lognormal (sigma 1)": _lognormal,
}


def _skewness(draw, rng: random.Random, k: int = 400_000) -> float:  # type: ignore[no-untyped-def]
    g1 = skewness([draw(rng) for _ in range(k)])  # the one home of the statistic (harness power's)
    assert g1 is not None
    return g1


def skew_corrected(d: list[float], mu: float = 0.0) -> dict[str, float] | None:
    """Two skew-corrected t statistics for the mean ``mu`` (candidates for a robust rule, evaluated
    here, not declared by any protocol), each compared with Student's t quantile at ``n - 1``:

    * Johnson (1978, *JASA* 73:536), ``t_J = [(m - mu) + g/(6 s^2 n) + g (m - mu)^2/(3 s^4)] / (s/sqrt n)``
    * Hall (1992, *JRSS B* 54:221), ``t_H = sqrt(n) [u + a u^2/3 + a^2 u^3/27 + a/(6n)]`` with
      ``u = (m - mu)/s``, ``a = g/s^3``; monotone in ``u``, unlike Johnson's.

    ``m`` the mean, ``s`` the sample sd, ``g = n/((n-1)(n-2)) sum (d_i - m)^3``. ``None`` when
    every value is equal.
    """
    n = len(d)
    m = math.fsum(d) / n
    s2 = math.fsum((x - m) ** 2 for x in d) / (n - 1)
    if s2 == 0:
        return None
    s = math.sqrt(s2)
    g = n / ((n - 1) * (n - 2)) * math.fsum((x - m) ** 3 for x in d)
    e = m - mu
    johnson = (e + g / (6 * s2 * n) + g * e * e / (3 * s2 * s2)) / (s / math.sqrt(n))
    u, a = e / s, g / s**3
    hall = math.sqrt(n) * (u + a * u * u / 3 + a * a * u**3 / 27 + a / (6 * n))
    return {"johnson": johnson, "hall": hall}


def _stall_median() -> float:
    """The stall mixture's median, exactly: the root of its CDF minus 1/2 (:func:`_stall`)."""
    q, size, base = 0.05, 4.0, 0.3
    scale = math.sqrt(q * (1 - q) * size**2 + base**2)

    def cdf(x: float) -> float:
        y = x * scale + q * size
        return float((1 - q) * stats.norm.cdf(y / base) + q * stats.norm.cdf((y - size) / base))

    return float(optimize.brentq(lambda x: cdf(x) - 0.5, -5, 5, xtol=1e-14))


CENSOR_AT = float(stats.norm.ppf(0.9))  # the top 10% of a normal censored at its 90th percentile
CENSORED_MEAN = CENSOR_AT * 0.1 - float(stats.norm.pdf(CENSOR_AT))  # E min(Z, c) = c (1 - Phi(c)) - phi(c)


def _censored(rng: random.Random) -> float:
    # a run that hits its limit is seen at the limit: the top 10% of normal noise censored there
    return min(rng.gauss(0.0, 1.0), CENSOR_AT) - CENSORED_MEAN


#: Each family's median (of its mean-zero draw), exactly: the sign rule's null puts the median at 0.
MEDIANS = {
    "normal": 0.0,
    "ties (normal on a 0.5 grid)": 0.0,
    "t2 (heavy tails)": 0.0,
    "censored normal (top 10% at the limit)": -CENSORED_MEAN,
    "chi-square 3 df": (float(stats.chi2.median(3)) - 3.0) / math.sqrt(6.0),
    "stall mixture (5% stalls)": _stall_median(),
    "lognormal (sigma 1)": (1.0 - math.sqrt(math.e)) / math.sqrt((math.e - 1) * math.e),
}
NOISES["censored normal (top 10% at the limit)"] = _censored
NOISES = {k: NOISES[k] for k in MEDIANS}  # the sweep's order


# long: one simulation's table of cases: each design at each noise level, its coverage and width
def noise_sweep(args: argparse.Namespace, sd: float) -> dict[str, object]:
    """Per noise family and ``n``: the plain t rule's coverage of the mean and one-sided type-I errors
    at a mean of 0, the two skew-corrected statistics of :func:`skew_corrected` (coverage: the
    two-sided test at the interval's level does not reject the true mean 0), the sign rule's
    (:func:`prereg.ranks.sign_test`, :func:`~prereg.ranks.median_bounds`) at a
    median of 0, and each rule's family-wise error over three independent null hypotheses under
    Holm at ``--family-alpha`` (the candidate claimed faster: the lower tail)."""
    rng = random.Random(args.seed)
    fam = args.family_alpha
    out: dict[str, object] = {
        "studies": args.studies,
        "level": args.level,
        "alpha": args.alpha,
        "family_alpha": fam,
        "sd": sd,
    }
    rows = []
    tail = (1 - args.level) / 2
    for name, draw in NOISES.items():
        skew = _skewness(draw, random.Random(args.seed + 1)) if name != "t2 (heavy tails)" else float("nan")
        med = sd * MEDIANS[name]
        for n in args.sweep_pairs:
            cover = up = down = 0
            corr = {k: {"cover": 0, "up": 0, "down": 0} for k in ("johnson", "hall")}
            sgn = {"cover": 0, "up": 0, "down": 0}
            fwer = {"t": 0, "sign": 0}
            q1 = float(stats.t.ppf(1 - args.alpha, n - 1))
            q2 = float(stats.t.ppf((1 + args.level) / 2, n - 1))
            for _ in range(args.studies):
                d = [sd * draw(rng) for _ in range(n)]
                m = [x - med for x in d]  # the same draw with its median at 0
                low, high = median_bounds(m, tail)
                sgn["cover"] += low is None or (high is not None and low <= 0.0 <= high)
                sgn["up"] += sign_test(m, 0.0, None)[2] < args.alpha
                sgn["down"] += sign_test(m, None, 0.0)[2] < args.alpha
                others = [[sd * draw(rng) for _ in range(n)] for _ in range(2)]
                fwer["sign"] += (
                    min(sign_test([x - med for x in v], None, 0.0)[2] for v in [d, *others]) < fam / 3
                )
                fwer["t"] += min(_t_lower_p(v) for v in [d, *others]) < fam / 3
                iv = mean_interval(d, args.level)
                cover += iv.low <= 0.0 <= iv.high
                if iv.low == iv.high:  # every value equal (ties, small n): the limit of the t test
                    up += iv.estimate > 0
                    down += iv.estimate < 0
                    for c in corr.values():
                        c["cover"] += iv.estimate == 0
                        c["up"] += iv.estimate > 0
                        c["down"] += iv.estimate < 0
                    continue
                up += t_test(d, 1, "superiority", 0.0).p_value < args.alpha
                down += t_test(d, -1, "superiority", 0.0).p_value < args.alpha
                stat = skew_corrected(d)
                assert stat is not None
                for k, c in corr.items():
                    c["cover"] += abs(stat[k]) <= q2
                    c["up"] += stat[k] > q1
                    c["down"] += stat[k] < -q1
            row: dict[str, object] = {
                "noise": name,
                "skewness": skew,
                "median": MEDIANS[name],
                "pairs": n,
                "coverage": cover / args.studies,
                "type_I_upper": up / args.studies,
                "type_I_lower": down / args.studies,
                "sign": {key: v / args.studies for key, v in sgn.items()},
                "fwer_holm3": {key: v / args.studies for key, v in fwer.items()},
            }
            for k, c in corr.items():
                row[k] = {key: v / args.studies for key, v in c.items()}
            rows.append(row)
    out["rows"] = rows
    return out


# long: one simulation's table of cases: each spending rule at each true effect, its stops and errors
def sequential_sweep(args: argparse.Namespace) -> dict[str, object]:
    """Group-sequential designs by simulation through the core (:func:`prereg.looks.run_looks`):
    per spending function, rule (t, sign) and noise (normal; the stall mixture, its median at 0 for
    the sign rule), the type-I error at no effect and, at an effect of ``--seq-effect`` SDs
    favouring the candidate, the power, with the expected pairs used (the fixed design uses all)."""
    from prereg.hypotheses import Family
    from prereg.looks import run_looks

    looks = args.seq_looks
    rng = random.Random(args.seed)
    rows = []
    for spending in ("obrien_fleming", "pocock"):
        for rule in ("t", "sign"):
            fam = Family.of(
                {
                    "procedure": "fixed_sequence",
                    "family_alpha": args.alpha,
                    "min_pairs": 3,
                    "sequential": {"looks": looks, "spending": spending},
                    "tests": [
                        {
                            "id": "H",
                            "study": "s",
                            "config": "c",
                            "endpoint": "training_time",
                            "estimand": "log_ratio",
                            "type": "superiority",
                            "better": "lower",
                            **({"test": "sign"} if rule == "sign" else {}),
                        }
                    ],
                }
            )
            for noise in ("normal", "stall mixture (5% stalls)"):
                draw = NOISES[noise]
                centre = MEDIANS[noise] if rule == "sign" else 0.0
                for effect in (0.0, args.seq_effect):
                    hits = used = early = 0
                    for _ in range(args.studies):
                        d = [args.sd * (draw(rng) - centre - effect) for _ in range(looks[-1])]
                        pairs = [
                            {
                                "unit": f"s.c.pair{i:03d}",
                                "baseline_training_s": 10.0,
                                "candidate_training_s": 10.0 * math.exp(x),
                            }
                            for i, x in enumerate(d)
                        ]
                        res = run_looks(fam, {("s", "c"): pairs}, len(looks), "sign")
                        hits += bool(res[-1].established)
                        used += res[-1].pairs
                        early += res[-1].look < len(looks)
                    rows.append(
                        {
                            "spending": spending,
                            "rule": rule,
                            "noise": noise,
                            "effect_sd": effect,
                            "established": hits / args.studies,
                            "expected_pairs": used / args.studies,
                            "stopped_early": early / args.studies,
                        }
                    )
    # the family: Holm over two independent null hypotheses (t rule, normal noise), any established
    for spending in ("obrien_fleming", "pocock"):
        tests = [
            {
                "id": f"H{j}",
                "study": "s",
                "config": f"c{j}",
                "endpoint": "training_time",
                "estimand": "log_ratio",
                "type": "superiority",
                "better": "lower",
            }
            for j in (1, 2)
        ]
        fam = Family.of(
            {
                "procedure": "holm",
                "family_alpha": args.alpha,
                "min_pairs": 3,
                "sequential": {"looks": looks, "spending": spending},
                "tests": tests,
            }
        )
        hits = used = early = 0
        for _ in range(args.studies):
            data = {
                ("s", f"c{j}"): [
                    {
                        "unit": f"s.c{j}.pair{i:03d}",
                        "baseline_training_s": 10.0,
                        "candidate_training_s": 10.0 * math.exp(args.sd * rng.gauss(0.0, 1.0)),
                    }
                    for i in range(looks[-1])
                ]
                for j in (1, 2)
            }
            res = run_looks(fam, data, len(looks), "sign")
            hits += bool(res[-1].established)
            used += res[-1].pairs
            early += res[-1].look < len(looks)
        rows.append(
            {
                "spending": spending,
                "rule": "t, Holm over 2 nulls",
                "noise": "normal",
                "effect_sd": 0.0,
                "established": hits / args.studies,
                "expected_pairs": used / args.studies,
                "stopped_early": early / args.studies,
            }
        )
    return {"studies": args.studies, "alpha": args.alpha, "looks": looks, "rows": rows}


def print_sequential(args: argparse.Namespace, res: dict[str, object]) -> int:
    k = args.studies
    print(
        f"{k} simulated studies per cell; looks at {args.seq_looks} pairs; one-sided alpha {args.alpha:g}; "
        f"effect {args.seq_effect:g} SD (favouring the candidate) or 0; MC SE in brackets\n"
    )
    print(
        "| Spending | Rule | Noise | Effect (SD) | Established | Expected pairs | Stopped early |\n"
        "|---|---|---|---|---|---|---|"
    )
    rows = res["rows"]
    assert isinstance(rows, list)
    for r in rows:
        print(
            f"| {r['spending']} | {r['rule']} | {r['noise']} | {r['effect_sd']:g} | {with_se(r['established'], k)} | "
            f"{r['expected_pairs']:.2f} of {args.seq_looks[-1]} | {r['stopped_early']:.3f} |"
        )
    write_json(args.json, res)
    return 0


def _t_lower_p(v: list[float]) -> float:
    """The t rule's p for "the mean is below 0" (1 where every value is equal and not below 0)."""
    if min(v) == max(v):
        return 0.0 if v[0] < 0 else 1.0
    return t_test(v, -1, "superiority", 0.0).p_value


def orders(n: int, rng: random.Random) -> list[str]:
    seq = ["baseline"] * ((n + 1) // 2) + ["candidate"] * (n // 2)
    rng.shuffle(seq)
    return seq


def study(
    n: int, tau: float, sd: float, period: float, drift: float, rng: random.Random
) -> tuple[list[float], list[str]]:
    first = orders(n, rng)
    d = [
        tau + (period if f == "baseline" else -period) + drift * i + rng.gauss(0.0, sd)
        for i, f in enumerate(first)
    ]
    return d, first


def simulate(args: argparse.Namespace, sd: float) -> dict[str, object]:
    rng = random.Random(args.seed)
    n, level, alpha = args.pairs, args.level, args.alpha
    cover_plain = cover_adj = 0
    width_plain = width_adj = 0.0
    t1 = {"superiority": 0, "non_inferiority": 0, "equivalence": 0, "superiority_period_adjusted": 0}
    for _ in range(args.studies):
        d, first = study(n, args.tau, sd, args.period, args.drift, rng)
        iv = mean_interval(d, level)
        cover_plain += iv.low <= args.tau + args.drift * (n - 1) / 2 <= iv.high
        width_plain += iv.high - iv.low
        adj = period_adjusted(d, first, 1, "superiority", 0.0)
        q = float(stats.t.ppf((1 + level) / 2, adj.df))
        centre = args.tau + args.drift * _mean_position(first)
        cover_adj += adj.estimate - q * adj.standard_error <= centre <= adj.estimate + q * adj.standard_error
        width_adj += 2 * q * adj.standard_error
        # rules at the edge of their nulls (favourable direction: larger d, s = +1)
        e0, _ = study(n, 0.0, sd, args.period, 0.0, rng)
        t1["superiority"] += t_test(e0, 1, "superiority", 0.0).p_value < alpha
        t1["superiority_period_adjusted"] += (
            period_adjusted(*study(n, 0.0, sd, args.period, 0.0, rng), 1, "superiority", 0.0).p_value < alpha
        )
        ni, _ = study(n, -args.margin, sd, args.period, 0.0, rng)
        t1["non_inferiority"] += t_test(ni, 1, "non_inferiority", args.margin).p_value < alpha
        eq, _ = study(n, args.margin, sd, args.period, 0.0, rng)
        t1["equivalence"] += t_test(eq, 1, "equivalence", args.margin).p_value < alpha
    out: dict[str, object] = {
        "pairs": n,
        "studies": args.studies,
        "sd": sd,
        "period": args.period,
        "drift": args.drift,
        "level": level,
        "alpha": alpha,
        "coverage_plain": cover_plain / args.studies,
        "coverage_period_adjusted": cover_adj / args.studies,
        "mean_width_plain": width_plain / args.studies,
        "mean_width_period_adjusted": width_adj / args.studies,
        "type_I_error": {k: v / args.studies for k, v in t1.items()},
    }
    out.update(censoring(args, sd, rng))
    return out


def _mean_position(first: list[str]) -> float:
    """The plain mean of positions; the period-adjusted estimate averages the two sequences' means."""
    ab = [i for i, f in enumerate(first) if f == "baseline"]
    ba = [i for i, f in enumerate(first) if f != "baseline"]
    return (sum(ab) / len(ab) + sum(ba) / len(ba)) / 2


def censoring(args: argparse.Namespace, sd: float, rng: random.Random) -> dict[str, object]:
    """Time to target with a budget: the full_budget imputation's bias and the worst-rank rule's error.

    Both arms have the same median time to target (no true effect on reached times), but the
    candidate misses the budget ``--miss-candidate`` of the time and the baseline
    ``--miss-baseline``: the candidate is truly worse. ``full_budget`` counts a miss at the budget
    (a lower bound of the true time); worst-rank ranks it worse than every reached time.
    """
    n, alpha = args.pairs, args.alpha
    budget = 1.0
    bias = []
    favour_full = favour_worst = 0
    for _ in range(args.studies):
        b_true, c_true = [], []
        for _ in range(n):
            base = math.exp(rng.gauss(math.log(0.7), sd))
            b_true.append(base if rng.random() >= args.miss_baseline else budget * (1.2 + rng.random()))
            c_true.append(
                base * math.exp(rng.gauss(0, sd))
                if rng.random() >= args.miss_candidate
                else budget * (1.2 + rng.random())
            )
        b_obs = [x if x <= budget else None for x in b_true]
        c_obs = [y if y <= budget else None for y in c_true]
        full = [
            math.log((y if y is not None else budget) / (x if x is not None else budget))
            for x, y in zip(b_obs, c_obs)
        ]
        true = [math.log(y / x) for x, y in zip(b_true, c_true)]
        bias.append(sum(full) / n - sum(true) / n)
        # "candidate faster" (s = -1 on log ratios): a false claim here, the candidate is worse
        favour_full += t_test(full, -1, "superiority", 0.0).p_value < alpha if len(set(full)) > 1 else 0
        favour_worst += signed_rank(worst_rank_differences(b_obs, c_obs), -1).p_value < alpha
    return {
        "full_budget_mean_bias_log": sum(bias) / len(bias),
        "false_faster_claims": {
            "full_budget_t": favour_full / args.studies,
            "worst_rank_signed_rank": favour_worst / args.studies,
        },
        "miss_rates": {"baseline": args.miss_baseline, "candidate": args.miss_candidate},
    }


def sd_from_records(directory: Path) -> float:
    from analysis.power import aa_noise
    from prereg.formats.record import load_records

    noise = aa_noise(load_records(directory), "training_time", "log_ratio")
    if not noise:
        raise SystemExit(f"no A/A pairs in {directory}")
    return max(v.sd for v in noise.values())


# long: the script's command line: each mode (identity, noise sweep, sequential) and its printed table
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=4000)
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--sd", type=float, default=0.05, help="sd of per-pair log-time differences")
    ap.add_argument("--from-records", help="take sd from the A/A pairs of this records folder")
    ap.add_argument("--tau", type=float, default=-0.1, help="true log ratio for the coverage part")
    ap.add_argument(
        "--period",
        type=float,
        default=0.03,
        help="period effect: the second run's log time minus the first run's (the whole difference, not "
        "half of it); a pair's c - b moves by +period when the candidate runs second, -period when first",
    )
    ap.add_argument("--drift", type=float, default=0.0, help="per-pair-position drift of the difference")
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--level", type=float, default=0.95)
    ap.add_argument("--alpha", type=float, default=0.025)
    ap.add_argument("--miss-baseline", type=float, default=0.1)
    ap.add_argument("--miss-candidate", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--json")
    ap.add_argument(
        "--noise-sweep", action="store_true", help="the t rule under non-normal noise (see above)"
    )
    ap.add_argument("--sweep-pairs", type=int, nargs="+", default=[3, 5, 10, 20, 50])
    ap.add_argument("--family-alpha", type=float, default=0.05, help="the sweep's Holm family of three")
    ap.add_argument("--sequential", action="store_true", help="group-sequential designs (see above)")
    ap.add_argument("--seq-looks", type=int, nargs="+", default=[10, 20, 30])
    ap.add_argument("--seq-effect", type=float, default=0.6, help="the effect, in noise SDs, for power")
    ap.add_argument("--identity", action="store_true", help="the all-identical rule (see above)")
    ap.add_argument("--diverge", type=float, default=0.02, help="--identity: share of pairs that diverge")
    ap.add_argument("--jump", type=float, default=0.5, help="--identity: how far they diverge, BPB")
    args = ap.parse_args()
    if args.identity:
        return print_identity(args, identity_sweep(args))
    sd = sd_from_records(Path(args.from_records)) if args.from_records else args.sd
    if args.noise_sweep:
        return print_sweep(args, noise_sweep(args, sd))
    if args.sequential:
        return print_sequential(args, sequential_sweep(args))
    res = simulate(args, sd)
    t1 = res["type_I_error"]
    assert isinstance(t1, dict)
    ff = res["false_faster_claims"]
    assert isinstance(ff, dict)
    print(
        f"{args.studies} simulated studies of {args.pairs} pairs; sd {sd:.4g}, period {args.period:g}, drift "
        f"{args.drift:g}; level {args.level:g}, one-sided alpha {args.alpha:g}\n"
    )

    def se(p: float) -> str:
        return with_se(p, args.studies, "MC SE ")

    print("| Quantity | Nominal | Simulated |\n|---|---|---|")
    print(
        f"| coverage, plain paired t interval | {args.level:g} | {se(res['coverage_plain'])}, mean width "
        f"{res['mean_width_plain']:.4g} |"
    )
    print(
        f"| coverage, period-adjusted interval | {args.level:g} | {se(res['coverage_period_adjusted'])}, mean width "
        f"{res['mean_width_period_adjusted']:.4g} |"
    )
    for k, v in t1.items():
        print(f"| type-I error, {k.replace('_', ' ')} | {args.alpha:g} | {se(v)} |")
    print(
        f"| false 'faster' claims, full_budget imputation + t | {args.alpha:g} | {se(ff['full_budget_t'])} |"
    )
    print(
        f"| false 'faster' claims, worst-rank signed-rank | {args.alpha:g} | {se(ff['worst_rank_signed_rank'])} |"
    )
    print(
        f"\nfull_budget imputation: mean bias of the log ratio {res['full_budget_mean_bias_log']:+.4f} (negative: "
        f"flatters the arm that misses the target more often; misses baseline {args.miss_baseline:g}, candidate "
        f"{args.miss_candidate:g})"
    )
    write_json(args.json, res)
    return 0


def _quality_spec(alpha: float, margin: float, test: str | None) -> dict[str, object]:
    """A one-hypothesis family: test-BPB non-inferiority at ``margin``, declared with ``test``."""
    h = {
        "id": "Q",
        "study": "s",
        "config": "c",
        "endpoint": "test_bpb",
        "estimand": "difference",
        "type": "non_inferiority",
        "margin": margin,
        "better": "lower",
    }
    if test is not None:
        h["test"] = test
    return {"procedure": "holm", "family_alpha": alpha, "min_pairs": 3, "tests": [h]}


def identity_sweep(args: argparse.Namespace) -> dict[str, object]:
    """How often each quality rule establishes test-BPB non-inferiority.

    Each study has ``n`` pairs; a pair's baseline BPB is drawn once and its candidate's is the same
    double, except that with probability ``diverge`` it is ``jump`` higher. The mean difference is
    then ``diverge * jump`` (with the defaults the margin itself: the edge of the mean's
    non-inferiority null, where an establishment is an error of a mean claim). The rules are the
    core's (:func:`prereg.decisions.decide`): the mean claim with ``identity`` ``"zero"`` and
    ``"sign"`` (a study not all identical is t-tested by both alike), and the median claim
    (``test: sign`` declared), whose median is 0 at ``diverge < 0.5``: its establishment there is
    no error. At ``diverge = 0.5`` the median is at the edge of its own null, where it is.
    """
    from prereg.attempts import Completeness
    from prereg.decisions import decide

    done = Completeness(
        planned_runs=None, ok_runs=0, missing_runs=0, complete=True, budget_stop=False, text=""
    )
    mean_spec = _quality_spec(args.alpha, args.margin, None)
    median_spec = _quality_spec(args.alpha, args.margin, "sign")
    rng = random.Random(args.seed)
    rows = []
    for share in (args.diverge, 0.5):
        for n in args.sweep_pairs:
            hits = {"zero": 0, "sign": 0, "median": 0}
            identical = 0
            for _ in range(args.studies):
                pairs = []
                for i in range(n):
                    b = 2.0 + rng.random()
                    c = b + args.jump if rng.random() < share else b
                    pairs.append(
                        {"unit": f"s.c.pair{i:03d}", "baseline_test_bpb": b, "candidate_test_bpb": c}
                    )
                identical += all(p["baseline_test_bpb"] == p["candidate_test_bpb"] for p in pairs)
                by = {("s", "c"): pairs}
                for rule in ("zero", "sign"):
                    hits[rule] += decide(mean_spec, by, done, rule)[0].status == "established"
                hits["median"] += decide(median_spec, by, done, "sign")[0].status == "established"
            rows.append(
                {
                    "diverge": share,
                    "pairs": n,
                    "all_identical": identical / args.studies,
                    "established_identity_p0": hits["zero"] / args.studies,
                    "established_sign": hits["sign"] / args.studies,
                    "established_median_claim": hits["median"] / args.studies,
                }
            )
    return {
        "studies": args.studies,
        "alpha": args.alpha,
        "margin": args.margin,
        "jump": args.jump,
        "rows": rows,
    }


def print_identity(args: argparse.Namespace, res: dict[str, object]) -> int:
    rows = res["rows"]
    assert isinstance(rows, list)
    print(
        f"{args.studies} simulated studies per row: test-BPB non-inferiority, margin {args.margin:g}, "
        f"one-sided alpha {args.alpha:g}; a share of the pairs diverges by +{args.jump:g} BPB, the others are "
        "bitwise identical. The share of studies that establish non-inferiority (Monte Carlo SE):\n"
    )
    print(
        "| pairs diverging | pairs | all identical | mean claim, identity p = 0 (schema 4) "
        "| mean claim, exact sign test p = 2^-n (schema 5) | median claim (test: sign) |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {100 * r['diverge']:g}% | {r['pairs']} | {r['all_identical']:.3f} | "
            f"{with_se(r['established_identity_p0'], args.studies)} | {with_se(r['established_sign'], args.studies)} | "
            f"{with_se(r['established_median_claim'], args.studies)} |"
        )
    write_json(args.json, res)
    return 0


def with_se(p: float, studies: int, label: str = "") -> str:
    """A simulated proportion with its Monte Carlo standard error ``sqrt(p (1 - p) / studies)``."""
    return f"{p:.4f} ({label}{math.sqrt(p * (1 - p) / studies):.4f})"


def write_json(path: str | None, res: dict[str, object]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(res, indent=1))


def print_sweep(args: argparse.Namespace, res: dict[str, object]) -> int:
    k = args.studies

    def se(p: float) -> str:
        return with_se(p, k)

    print(
        f"{k} simulated studies per cell; level {args.level:g}, one-sided alpha {args.alpha:g}; the t rule "
        f"and the skew corrections at a mean of 0, the sign rule at a median of 0; family-wise error of "
        f"three null hypotheses under Holm at {args.family_alpha:g} (MC SE in brackets)\n"
    )
    print(
        "| Noise | Skewness | Pairs | t: coverage | t: type-I upper | t: type-I lower "
        "| Johnson: coverage / lower / upper | Hall: coverage / lower / upper "
        "| sign: coverage | sign: type-I upper | sign: type-I lower | FWER (Holm, 3): t | FWER (Holm, 3): sign |"
        "\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = res["rows"]
    assert isinstance(rows, list)
    for r in rows:
        skew = "undefined" if math.isnan(r["skewness"]) else f"{r['skewness']:.2f}"
        j, h, g, f = r["johnson"], r["hall"], r["sign"], r["fwer_holm3"]
        print(
            f"| {r['noise']} | {skew} | {r['pairs']} | {se(r['coverage'])} | {se(r['type_I_upper'])} | "
            f"{se(r['type_I_lower'])} | {j['cover']:.4f} / {j['down']:.4f} / {j['up']:.4f} | "
            f"{h['cover']:.4f} / {h['down']:.4f} / {h['up']:.4f} | {se(g['cover'])} | {se(g['up'])} | "
            f"{se(g['down'])} | {se(f['t'])} | {se(f['sign'])} |"
        )
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

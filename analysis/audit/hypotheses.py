"""The preregistered hypotheses' tests, re-implemented: each hypothesis' per-pair values on its test
scale and its alternative region, t tests on them (period-adjusted too), the signed-rank test of
worst-rank scores, and the reasons a test is not reached. The family's decisions are in
:mod:`.decisions`."""

from __future__ import annotations

import math
import sys

from .descriptive import magnitude_problem, number, per_pair
from .ranks import signed_rank
from .tdist import student_t_sf_signed

ENDPOINT_KEYS = {
    "training_time": "training_s",
    "time_to_target": "time_to_target_s",
    "total_time": "total_s",
    "test_bpb": "test_bpb",
    "peak_memory": "peak_memory_bytes",
}
ROUNDING_ULPS = 16  # analysis.stats.ROUNDING_ULPS


class Unreachable(ValueError):
    pass


def sign(better: str) -> int:
    """+1 when larger test-scale values (``c - b`` or ``ln c - ln b``) favour the candidate."""
    return 1 if better == "higher" else -1


def region(h: dict) -> tuple:
    """``(lo, hi)``: the alternative ``lo < mean < hi`` on the test scale (analysis.ttests.bounds)."""
    d, kind = h["margin"], h["type"]
    if h["estimand"] == "relative_reduction":
        if kind == "equivalence":
            return math.log1p(-d / 100.0), math.log1p(d / 100.0)
        e = d if kind == "superiority" else -d
        return (None, math.log1p(-e / 100.0)) if h["better"] == "lower" else (math.log1p(e / 100.0), None)
    if kind == "equivalence":
        return -d, d
    s = sign(h["better"])
    bound = s * d if kind == "superiority" else -s * d
    return (bound, None) if s > 0 else (None, bound)


def t_result(method: str, n: int, m: float, se: float, df: int, reg: tuple) -> dict:
    lo, hi = reg
    ts = ([(m - lo) / se] if lo is not None else []) + ([(hi - m) / se] if hi is not None else [])
    what = "mean of the per-pair values" if method == "t" else "period-adjusted mean of the per-pair values"
    return {
        "method": method,
        "n": n,
        "estimate": m,
        "standard_error": se,
        "df": df,
        "statistic": min(ts),
        "p_value": max(student_t_sf_signed(t, df) for t in ts),
        "estimate_of": what,
    }


def worst_rank(b: list, c: list) -> list[float]:
    finite = [math.log(y) - math.log(x) for x, y in zip(b, c) if x is not None and y is not None]
    w = 1.0 + 2.0 * max((abs(v) for v in finite), default=0.0)
    out = []
    for x, y in zip(b, c):
        if x is not None and y is not None:
            out.append(math.log(y) - math.log(x))
        elif x is None and y is None:
            out.append(0.0)
        else:
            out.append(w if y is None else -w)
    return out


def checked(p: dict, role: str, key: str, positive: bool) -> float:
    v = p[f"{role}_{key}"]
    if not number(v, positive):
        what = "null" if v is None else f"{v!r}, not a finite{' positive' if positive else ''} number"
        raise Unreachable(f"pair {p.get('unit', '?')}: the {role}'s {key} is {what} in an ok record")
    return float(v)


def hyp_values(h: dict, pairs: list[dict]) -> tuple[list[float], list[float] | None, dict | None]:
    """Per-pair test-scale values, their rounding scales (None for worst-rank scores), unreached counts."""
    key = ENDPOINT_KEYS[h["endpoint"]]
    ratio = h["estimand"] != "difference"
    unreached = None
    if h["endpoint"] == "time_to_target":
        rb = [p[f"baseline_{key}"] for p in pairs]
        rc = [p[f"candidate_{key}"] for p in pairs]
        unreached = {
            "baseline": rb.count(None),
            "candidate": rc.count(None),
            "both": sum(x is None and y is None for x, y in zip(rb, rc)),
        }
        for p in pairs:
            for role in ("baseline", "candidate"):
                if p[f"{role}_{key}"] is not None:
                    checked(p, role, key, True)
        if h["censoring"] == "worst_rank":
            return worst_rank(rb, rc), None, unreached
        b: list[float] = []
        c: list[float] = []
        for p in pairs:  # restricted mean: min(T, tau), one tau per pair for both arms
            train = {r: checked(p, r, "training_s", True) for r in ("baseline", "candidate")}
            tau = h.get("restriction_s") or min(train.values())
            for role, out in (("baseline", b), ("candidate", c)):
                t = p[f"{role}_{key}"]
                if t is None and train[role] < tau:
                    raise Unreachable(
                        f"pair {p.get('unit', '?')}: the {role} missed the target after "
                        f"training {train[role]:.6g} s, less than the restriction {tau:g} s: "
                        "its restricted time is unknown"
                    )
                out.append(tau if t is None else min(float(t), tau))
    else:
        b = [checked(p, "baseline", key, ratio) for p in pairs]
        c = [checked(p, "candidate", key, ratio) for p in pairs]
    if ratio:
        scales = [1.0 + abs(math.log(x)) + abs(math.log(y)) for x, y in zip(b, c)]
    else:
        scales = [abs(x) + abs(y) for x, y in zip(b, c)]
    return per_pair(b, c, h["estimand"]), scales, unreached


def median_of(v: list[float]) -> float | None:
    v = sorted(v)
    if not v:
        return None
    k = len(v) // 2
    return float(v[k]) if len(v) % 2 else (v[k - 1] + v[k]) / 2


def hyp_test(h: dict, pairs: list[dict], min_pairs: int) -> tuple[dict | None, str | None, dict | None]:
    if len(pairs) < min_pairs:
        return None, f"too few pairs: {len(pairs)} of the protocol's min_pairs {min_pairs}", None
    unreached = None
    try:
        values, scales, unreached = hyp_values(h, pairs)
        reg = region(h)
    except Unreachable as e:
        return None, str(e), unreached
    except ValueError:
        return None, f"a relative margin of {h['margin']:g}% has no ratio", unreached
    if scales is None:  # worst-rank scores: time to target, censoring worst_rank
        if all(v == 0.0 for v in values):
            return None, "identical: every pair's difference is exactly 0", unreached
        r = signed_rank(values, sign(h["better"]))
        both = [
            math.log(p["candidate_time_to_target_s"]) - math.log(p["baseline_time_to_target_s"])
            for p in pairs
            if p["baseline_time_to_target_s"] is not None and p["candidate_time_to_target_s"] is not None
        ]
        return (
            {
                "method": "signed-rank",
                "n": r["n"],
                "estimate": median_of(both),
                "standard_error": None,
                "df": 0,
                "statistic": r["statistic"],
                "p_value": r["p_value"],
                "estimate_of": f"median ln(c/b) of the {len(both)} pairs where both arms reached the target",
            },
            None,
            unreached,
        )
    if zero_spread(values, scales):
        if all(v == 0.0 for v in values):
            return None, "identical: every pair's difference is exactly 0", unreached
        return None, ZERO_SPREAD, unreached
    n = len(values)
    if h.get("period_adjusted"):
        first = [p["first"] for p in pairs]
        ab = [v for v, f in zip(values, first) if f == "baseline"]
        ba = [v for v, f in zip(values, first) if f != "baseline"]
        if min(len(ab), len(ba)) < 2:
            return None, "the period-adjusted estimand needs at least two pairs in each order", unreached
        if zero_spread(ab, scales) and zero_spread(ba, scales):
            return None, ZERO_SPREAD_WITHIN, unreached
        why = magnitude_problem([ab, ba])
        if why is not None:
            return None, why, unreached
        m1, m2 = math.fsum(ab) / len(ab), math.fsum(ba) / len(ba)
        sp2 = (math.fsum((x - m1) ** 2 for x in ab) + math.fsum((x - m2) ** 2 for x in ba)) / (n - 2)
        m, se, df, method = (
            (m1 + m2) / 2,
            math.sqrt(sp2 * (1 / len(ab) + 1 / len(ba))) / 2,
            n - 2,
            "t-period-adjusted",
        )
    else:
        why = magnitude_problem([values])
        if why is not None:
            return None, why, unreached
        m = math.fsum(values) / n
        se, df, method = math.sqrt(math.fsum((x - m) ** 2 for x in values) / (n - 1) / n), n - 1, "t"
    if not (se > 0 and math.isfinite(se)):
        return None, f"the standard error is {se!r}: no t statistic", unreached
    return t_result(method, n, m, se, df, reg), None, unreached


ZERO_SPREAD = (
    "zero spread: the per-pair values agree to the rounding of the endpoint values they were "
    "computed from (16 ulps of |b| + |c|, or of 1 + |ln b| + |ln c| for a log ratio)"
)


ZERO_SPREAD_WITHIN = (
    "zero spread within each order group: the period-adjusted standard error is rounding "
    "noise (16 ulps of |b| + |c|, or of 1 + |ln b| + |ln c| for a log ratio)"
)


def zero_spread(values: list[float], scales: list[float]) -> bool:
    """analysis.stats.spread_is_rounding: spread within ROUNDING_ULPS ulps of the inputs' magnitude."""
    return max(values) - min(values) <= ROUNDING_ULPS * sys.float_info.epsilon * max(scales)

#!/usr/bin/env python3
"""Public audit of the Cotangent study's records, with the Python standard library alone.

Usage: ``python analysis/public_audit.py [RECORDS_DIR ...]`` (default: every folder under
``records/`` that holds a MANIFEST). Runs as ``python -I -S analysis/public_audit.py`` too.

It checks, for each records folder:

1. every record's own sha256 (over its canonical JSON without the ``sha256`` field);
2. the MANIFEST: every record file listed with its sha256, no file missing or unlisted, and every
   source file's sha256 against the file in this checkout;
3. every record names the protocol sha256 of the protocol file in this checkout;
4. where git is available and the protocol is preregistered: its tag exists, points at the
   commit the records name, and was created before the earliest record started;
5. ``summary.json``: its own sha256, and every interval, count and decision in it, recomputed
   here from the records with an independent implementation (relative tolerance 1e-9).

It does not run training and does not check the weight files (they stay local); it says so.
Exit status 0 only if everything matched; otherwise 1, naming each file, field and value.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from fractions import Fraction

REL_TOL = 1e-9
RECORD_SUFFIX = ".record.json"


# ------------------------------------------------------------------------------------------
# Student-t quantile
# ------------------------------------------------------------------------------------------

_BERNOULLI = (1.0 / 12, -1.0 / 360, 1.0 / 1260, -1.0 / 1680, 1.0 / 1188, -691.0 / 360360, 1.0 / 156)


def _stirling_tail(z: float) -> float:
    """sum_k B_2k / (2k (2k-1) z^(2k-1)) for large z."""
    zz = z * z
    term = 1.0 / z
    total = 0.0
    for c in _BERNOULLI:
        total += c * term
        term /= zz
    return total


def log_gamma_ratio(a: float, b: float) -> float:
    """ln Gamma(a + b) - ln Gamma(a), accurate when a is large (no cancellation of two lgammas)."""
    if a < 10.0:
        return math.lgamma(a + b) - math.lgamma(a)
    return (a - 0.5) * math.log1p(b / a) + b * math.log(a + b) - b + _stirling_tail(a + b) - _stirling_tail(a)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the incomplete beta (modified Lentz; Press et al., Numerical Recipes, 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = tiny if abs(d) < tiny else d
    d = 1.0 / d
    h = d
    for m in range(1, 100000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = tiny if abs(d) < tiny else d
        c = 1.0 + aa / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = tiny if abs(d) < tiny else d
        c = 1.0 + aa / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            return h
    raise ArithmeticError("incomplete beta continued fraction did not converge")


def betainc_reg(a: float, b: float, x: float, one_minus_x: float) -> float:
    """Regularised incomplete beta I_x(a, b); ``one_minus_x`` passed separately for accuracy."""
    if x <= 0.0:
        return 0.0
    if one_minus_x <= 0.0:
        return 1.0
    # ln B(a, b) = lgamma(b) - (lgamma(a + b) - lgamma(a)), computed without cancellation.
    big, small = (a, b) if a >= b else (b, a)
    ln_beta = math.lgamma(small) - log_gamma_ratio(big, small)
    ln_front = a * math.log(x) + b * math.log(one_minus_x) - ln_beta
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln_front) * _betacf(b, a, one_minus_x) / b


def student_t_sf(t: float, df: float) -> float:
    """P(T > t) for t >= 0: 0.5 I_{df/(df+t^2)}(df/2, 1/2)."""
    t2 = t * t
    return 0.5 * betainc_reg(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))


def student_t_ppf(q: float, df: float) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom.

    Method: the survival function through the regularised incomplete beta function,
    ``P(T > t) = I_{df/(df+t^2)}(df/2, 1/2) / 2`` (Abramowitz & Stegun 26.7.1 and 26.5.27), with
    the continued fraction of Numerical Recipes (Press et al., 3rd ed., 6.4) and a log-beta that
    avoids cancelling two large log-gammas; inverted by bisection to machine precision.
    Symmetric: ``ppf(q) = -ppf(1 - q)``.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -student_t_ppf(1.0 - q, df)
    return t_critical(1.0 - q, df)


def t_critical(alpha: float, df: float) -> float:
    """The t value ``q > 0`` with ``P(T > q) = alpha`` (``alpha < 0.5``): bisection to adjacent doubles.

    The decisions' critical value, in the audit and in ``analysis.ttests.critical_t`` alike (the same
    function): a t test establishes its hypothesis when its statistic exceeds it. Taking ``alpha``
    itself, not ``1 - (1 - alpha)``, keeps the ulps that subtraction would lose.
    """
    lo, hi = 0.0, 1.0
    while student_t_sf(hi, df) > alpha:
        lo, hi = hi, hi * 2.0
    for _ in range(2000):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if student_t_sf(mid, df) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


# ------------------------------------------------------------------------------------------
# Statistics, re-implemented
# ------------------------------------------------------------------------------------------


def interval(values: list[float], level: float, estimand: str) -> dict:
    """Student-t interval of the mean; ``relative_reduction``: ``100 (1 - exp)`` of the log ratio's."""
    n = len(values)
    m = math.fsum(values) / n
    var = math.fsum((x - m) ** 2 for x in values) / (n - 1)
    se = math.sqrt(var / n)
    t = student_t_ppf((1.0 + level) / 2.0, n - 1)
    out = {"estimand": estimand, "estimate": m, "low": m - t * se, "high": m + t * se, "df": n - 1, "n": n,
           "standard_error": se, "level": level, "ratio": None, "ratio_low": None, "ratio_high": None}
    if estimand in ("log_ratio", "relative_reduction"):
        out.update(ratio=math.exp(m), ratio_low=math.exp(m - t * se), ratio_high=math.exp(m + t * se))
    if estimand == "relative_reduction":
        out.update(estimate=pct(m), low=pct(m + t * se), high=pct(m - t * se))
    return out


def pct(log_ratio: float) -> float:
    return -100.0 * math.expm1(log_ratio)


def per_pair(b: list[float], c: list[float], estimand: str) -> list[float]:
    """``c - b``, else ``ln c - ln b`` (both ratio estimands are computed on the log ratio)."""
    if estimand == "difference":
        return [y - x for x, y in zip(b, c)]
    return [math.log(y) - math.log(x) for x, y in zip(b, c)]


def paired(b: list[float], c: list[float], level: float, estimand: str) -> dict | None:
    """The descriptive interval; None under two pairs or where squares underflow or overflow a double."""
    if len(b) < 2 or magnitude_problem([per_pair(b, c, estimand)]) is not None:
        return None
    return interval(per_pair(b, c, estimand), level, estimand)


def number(x: object, positive: bool) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and (x > 0 or not positive)


def endpoint(b0: list, c0: list, level: float, estimand: str) -> dict:
    ok = [(x, y) for x, y in zip(b0, c0) if number(x, estimand != "difference") and number(y, estimand != "difference")]
    b, c = [x for x, _ in ok], [y for _, y in ok]
    return {"pairs": len(b), "invalid_pairs": len(b0) - len(b), "baseline_mean": math.fsum(b) / len(b) if b else None,
            "candidate_mean": math.fsum(c) / len(c) if c else None, "interval": paired(b, c, level, estimand)}


def peak(r: dict) -> float | None:
    mem = r.get("memory") or {}
    key = mem.get("primary")
    return float(mem[key]) if key and mem.get(key) is not None else None


def params_of(units: dict) -> int | None:
    for arms in units.values():
        for r in arms.values():
            if r.get("parameters") is not None:
                return int(r["parameters"])
    return None


def two_groups(a: list[float], b: list[float], level: float, half: bool) -> dict:
    n1, n2 = len(a), len(b)
    m1, m2 = math.fsum(a) / n1, math.fsum(b) / n2
    ss1, ss2 = math.fsum((v - m1) ** 2 for v in a), math.fsum((v - m2) ** 2 for v in b)
    df = n1 + n2 - 2
    k = 0.5 if half else 1.0
    est = k * (m1 - m2)
    se = k * math.sqrt((ss1 + ss2) / df * (1 / n1 + 1 / n2))
    q = student_t_ppf((1 + level) / 2, df)
    p = 2 * student_t_sf(abs(est / se), df) if se > 0 else (1.0 if est == 0 else 0.0)
    return {"estimate": est, "standard_error": se, "low": est - q * se, "high": est + q * se, "df": df,
            "level": level, "p_value": p, "n": [n1, n2]}


def crossover(pairs: list[dict], level: float) -> dict | None:
    ab = [p for p in pairs if p["first"] == "baseline"]
    ba = [p for p in pairs if p["first"] != "baseline"]
    if len(ab) < 2 or len(ba) < 2:
        return None
    d = lambda p: math.log(p["candidate_training_s"] / p["baseline_training_s"])  # noqa: E731
    s = lambda p: math.log(p["candidate_training_s"]) + math.log(p["baseline_training_s"])  # noqa: E731
    return {"period": two_groups([d(p) for p in ab], [d(p) for p in ba], level, True),
            "carryover": two_groups([s(p) for p in ab], [s(p) for p in ba], level, False)}


def drift(pairs: list[dict], level: float) -> dict | None:
    if len(pairs) < 3:
        return None
    x = [float(p["order"]) for p in pairs]
    y = [math.log(p["candidate_training_s"] / p["baseline_training_s"]) for p in pairs]
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    sxx = math.fsum((a - mx) ** 2 for a in x)
    if sxx == 0:
        return None
    b1 = math.fsum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
    b0 = my - b1 * mx
    df = len(x) - 2
    se = math.sqrt(math.fsum((b - b0 - b1 * a) ** 2 for a, b in zip(x, y)) / df / sxx)
    q = student_t_ppf((1 + level) / 2, df)
    p = 2 * student_t_sf(abs(b1 / se), df) if se > 0 else (1.0 if b1 == 0 else 0.0)
    return {"slope": b1, "intercept": b0, "standard_error": se, "low": b1 - q * se, "high": b1 + q * se,
            "df": df, "level": level, "p_value": p, "points": [[a, b] for a, b in zip(x, y)]}


def by_device(pairs: list[dict], level: float) -> dict | None:
    groups: dict = {}
    for p in pairs:
        groups.setdefault(p["device"], []).append(math.log(p["candidate_training_s"] / p["baseline_training_s"]))
    if len(groups) < 2:
        return None
    rows = []
    for dev in sorted(groups):
        v = groups[dev]
        m = math.fsum(v) / len(v)
        row = {"device": dev, "pairs": len(v), "estimate": m, "low": None, "high": None}
        if len(v) >= 2:
            se = math.sqrt(math.fsum((x - m) ** 2 for x in v) / (len(v) - 1) / len(v))
            q = student_t_ppf((1 + level) / 2, len(v) - 1)
            row.update(low=m - q * se, high=m + q * se)
        rows.append(row)
    allv = [x for v in groups.values() for x in v]
    grand = math.fsum(allv) / len(allv)
    k, n = len(groups), len(allv)
    ssb = math.fsum(len(v) * (math.fsum(v) / len(v) - grand) ** 2 for v in groups.values())
    ssw = math.fsum(math.fsum((x - math.fsum(v) / len(v)) ** 2 for x in v) for v in groups.values())
    het = None
    if n > k and ssw > 0:
        f = (ssb / (k - 1)) / (ssw / (n - k))
        d1, d2 = k - 1, n - k
        het = {"F": f, "df": [d1, d2], "p_value": betainc_reg(d2 / 2, d1 / 2, d2 / (d2 + d1 * f), d1 * f / (d2 + d1 * f))}
    return {"devices": rows, "heterogeneity": het}


def positions(blocks: list[dict], level: float) -> list[dict] | None:
    if len(blocks) < 2:
        return None
    out = []
    for pos in range(len(CELLS)):
        res = []
        for b in blocks:
            logs = {c: math.log(b[f"{c}_training_s"]) for c in CELLS}
            res.append(logs[b["order"][pos]] - math.fsum(logs.values()) / len(CELLS))
        m = math.fsum(res) / len(res)
        se = math.sqrt(math.fsum((v - m) ** 2 for v in res) / (len(res) - 1) / len(res))
        q = student_t_ppf((1 + level) / 2, len(res) - 1)
        out.append({"position": pos + 1, "estimate": m, "standard_error": se, "low": m - q * se, "high": m + q * se,
                    "df": len(res) - 1, "level": level})
    return out


# -- decisions ----------------------------------------------------------------------------------

ENDPOINT_KEYS = {"training_time": "training_s", "time_to_target": "time_to_target_s", "total_time": "total_s",
                 "test_bpb": "test_bpb", "peak_memory": "peak_memory_bytes"}


TIME_ENDPOINTS = ("training_time", "time_to_target", "total_time")
ROUNDING_REL_TOL = 1e-9  # analysis.stats.ROUNDING_REL_TOL
ROUNDING_ULPS = 16  # analysis.stats.ROUNDING_ULPS
EXACT_MAX_N = 300  # analysis.ranks.EXACT_MAX_N


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
    return {"method": method, "n": n, "estimate": m, "standard_error": se, "df": df, "statistic": min(ts),
            "p_value": max(student_t_sf_signed(t, df) for t in ts), "estimate_of": what}


def student_t_sf_signed(t: float, df: float) -> float:
    return student_t_sf(t, df) if t >= 0 else 1.0 - student_t_sf(-t, df)


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


def signed_rank(d: list[float], s: int) -> dict:
    """T+ and its one-sided p: exact conditional null (ties included) up to EXACT_MAX_N, else Hoeffding."""
    tol = ROUNDING_REL_TOL * max((abs(x) for x in d), default=0.0)
    nz = [s * x for x in d if abs(x) > tol]
    n = len(nz)
    if n == 0:
        return {"n": 0, "statistic": 0.0, "p_value": 1.0}
    mags = [abs(x) for x in nz]
    order = sorted(range(n), key=lambda i: mags[i])
    ranks = [0.0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and mags[order[j + 1]] - mags[order[i]] <= tol:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    t_plus = math.fsum(r for r, x in zip(ranks, nz) if x > 0)
    if n <= EXACT_MAX_N:
        p = tail_count([int(round(2 * r)) for r in ranks], int(round(2 * t_plus))) / 2**n
    else:  # Hoeffding's bound: conservative
        u = t_plus - math.fsum(ranks) / 2.0
        p = 1.0 if u <= 0 else min(1.0, math.exp(-2.0 * u * u / math.fsum(r * r for r in ranks)))
    return {"n": n, "statistic": t_plus, "p_value": p}


def tail_count(doubled: list[int], t2: int) -> int:
    """Sign patterns with doubled T+ >= t2: truncated generating function prod (1 + x^r), packed in an int."""
    n, total = len(doubled), sum(doubled)
    if t2 <= 0:
        return 1 << n
    if t2 > total:
        return 0
    k, complement = total - t2, False  # by symmetry, #(S >= t2) = #(S <= total - t2)
    if k > t2 - 1:
        k, complement = t2 - 1, True
    bits = n + 1
    mask = (1 << (bits * (k + 1))) - 1
    poly = 1
    for r in sorted(doubled):
        if r > k:
            break
        poly = (poly + (poly << (r * bits))) & mask
    digits = k + 1
    while digits > 1:
        half = (digits + 1) // 2
        poly = (poly & ((1 << (half * bits)) - 1)) + (poly >> (half * bits))
        digits = half
    return (1 << n) - poly if complement else poly


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
        unreached = {"baseline": rb.count(None), "candidate": rc.count(None),
                     "both": sum(x is None and y is None for x, y in zip(rb, rc))}
        for p in pairs:
            for role in ("baseline", "candidate"):
                if p[f"{role}_{key}"] is not None:
                    checked(p, role, key, True)
        if h["censoring"] == "worst_rank":
            return worst_rank(rb, rc), None, unreached
        b, c = [], []
        for p in pairs:  # restricted mean: min(T, tau), one tau per pair for both arms
            train = {r: checked(p, r, "training_s", True) for r in ("baseline", "candidate")}
            tau = h.get("restriction_s") or min(train.values())
            for role, out in (("baseline", b), ("candidate", c)):
                t = p[f"{role}_{key}"]
                if t is None and train[role] < tau:
                    raise Unreachable(f"pair {p.get('unit', '?')}: the {role} missed the target after training "
                                      f"{train[role]:.6g} s, less than the restriction {tau:g} s: its restricted "
                                      "time is unknown")
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
    if h["endpoint"] == "time_to_target" and h["censoring"] == "worst_rank":
        if all(v == 0.0 for v in values):
            return None, "identical: every pair's difference is exactly 0", unreached
        r = signed_rank(values, sign(h["better"]))
        both = [math.log(p["candidate_time_to_target_s"]) - math.log(p["baseline_time_to_target_s"]) for p in pairs
                if p["baseline_time_to_target_s"] is not None and p["candidate_time_to_target_s"] is not None]
        return {"method": "signed-rank", "n": r["n"], "estimate": median_of(both), "standard_error": None, "df": 0,
                "statistic": r["statistic"], "p_value": r["p_value"],
                "estimate_of": f"median ln(c/b) of the {len(both)} pairs where both arms reached the target"}, \
            None, unreached
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
        m, se, df, method = (m1 + m2) / 2, math.sqrt(sp2 * (1 / len(ab) + 1 / len(ba))) / 2, n - 2, "t-period-adjusted"
    else:
        why = magnitude_problem([values])
        if why is not None:
            return None, why, unreached
        m = math.fsum(values) / n
        se, df, method = math.sqrt(math.fsum((x - m) ** 2 for x in values) / (n - 1) / n), n - 1, "t"
    if not (se > 0 and math.isfinite(se)):
        return None, f"the standard error is {se!r}: no t statistic", unreached
    return t_result(method, n, m, se, df, reg), None, unreached


ZERO_SPREAD = ("zero spread: the per-pair values agree to the rounding of the endpoint values they were computed "
               "from (16 ulps of |b| + |c|, or of 1 + |ln b| + |ln c| for a log ratio)")
ZERO_SPREAD_WITHIN = ("zero spread within each order group: the period-adjusted standard error is rounding noise "
                      "(16 ulps of |b| + |c|, or of 1 + |ln b| + |ln c| for a log ratio)")


def zero_spread(values: list[float], scales: list[float]) -> bool:
    """analysis.stats.spread_is_rounding: spread within ROUNDING_ULPS ulps of the inputs' magnitude."""
    return max(values) - min(values) <= ROUNDING_ULPS * sys.float_info.epsilon * max(scales)


def magnitude_problem(groups: list[list[float]]) -> str | None:
    """analysis.ttests.magnitude_problem: deviations whose squares a double cannot hold."""
    top = max(abs(x) for g in groups for x in g)
    if top > 1e150:
        return f"extreme magnitudes: per-pair values up to {top:.3g}, beyond 1e+150, whose squares overflow a double"
    dev = max(abs(x - math.fsum(g) / len(g)) for g in groups for x in g)
    if 0 < dev < 1e-150:
        return (f"extreme magnitudes: the per-pair values deviate from their mean by at most {dev:.3g}, below "
                "1e-150, whose squares underflow a double")
    return None


def passes(t: dict, alpha: float) -> bool:
    """analysis.ttests.passes: t > t_critical(alpha, df) (1 + 1e-12) for t tests, p < alpha for ranks."""
    if t["method"] == "signed-rank":
        return t["p_value"] < alpha
    return t["statistic"] > t_critical(alpha, t["df"]) * (1.0 + 1e-12)


def gate(h: dict, spec: dict, done: dict) -> str | None:
    if done.get("complete") is False and not done.get("budget_stop"):
        return f"incomplete: {done['missing_runs']} of {done['planned_runs']} planned runs have no ok record"
    if done.get("budget_stop") and h["endpoint"] in TIME_ENDPOINTS and not spec.get("decide_time_after_budget_stop"):
        return ("stopped by the budget rule, which depends on run times, this endpoint's outcome; the protocol did not "
                "preregister deciding time endpoints after such a stop (decide_time_after_budget_stop)")
    return None


def decide(spec: dict, pairs_of: dict, done: dict) -> list[dict]:
    tests, alpha = spec["tests"], spec["family_alpha"]
    results = []
    for h in tests:
        why = gate(h, spec, done)
        if why is not None:
            results.append((h, None, why, None))
        else:
            results.append((h, *hyp_test(h, pairs_of.get((h["study"], h["config"]), []), spec["min_pairs"])))
    used: dict = {}
    status: dict = {}
    if spec["procedure"] == "fixed_sequence":
        failed = None
        for h, t, why, _ in results:
            if failed is not None:
                status[h["id"]], used[h["id"]] = ("not reached", f"a failed prerequisite in the hierarchy: {failed}"), None
            elif t is None:
                status[h["id"]], used[h["id"]], failed = ("not reached", why), alpha, h["id"]
            else:
                used[h["id"]] = alpha
                ok = passes(t, alpha)
                status[h["id"]] = ("established" if ok else "not established", None)
                failed = None if ok else h["id"]
    else:
        m = len(tests)
        order = sorted(range(m), key=lambda i: (results[i][1]["p_value"] if results[i][1] else 1.0, i))
        stopped = False
        for k, i in enumerate(order):
            h, t, why, _ = results[i]
            used[h["id"]] = alpha / (m - k)
            if t is None:
                status[h["id"]] = ("not reached", why)
                stopped = True
            elif stopped:
                status[h["id"]] = ("not established", "Holm's procedure stopped at an earlier hypothesis")
            else:
                ok = passes(t, used[h["id"]])
                status[h["id"]] = ("established" if ok else "not established", None)
                stopped = not ok
    out = []
    for h, t, _why, unreached in results:
        st, reason = status[h["id"]]
        a = used[h["id"]]
        low = high = level = estimate = estimate_of = None
        rank = t is not None and t["method"] == "signed-rank"
        rr = h["estimand"] == "relative_reduction" and not rank
        if t is not None:
            estimate = pct(t["estimate"]) if rr else t["estimate"]
            estimate_of = t["estimate_of"] if rank else h["estimand"]
            if h.get("censoring") == "restricted_mean":
                tau = f"{h['restriction_s']:g} s" if h.get("restriction_s") else "the pair's shorter training time"
                estimate_of = f"{h['estimand']} of the restricted times min(T, tau), tau = {tau}"
        if t is not None and a is not None and not rank:
            level = 1.0 - 2.0 * a
            q = t_critical(a, t["df"])
            low, high = t["estimate"] - q * t["standard_error"], t["estimate"] + q * t["standard_error"]
            if rr:
                low, high = pct(high), pct(low)
        out.append({"id": h["id"], "study": h["study"], "config": h["config"], "endpoint": h["endpoint"],
                    "estimand": h["estimand"], "type": h["type"], "margin": h["margin"], "better": h["better"],
                    "status": st, "reason": reason, "alpha": a, "test": t, "estimate": estimate,
                    "estimate_of": estimate_of, "low": low, "high": high, "level": level,
                    "unreached": unreached, "text": decision_text(h, st, reason, t, a, low, high, done)})
    return out


def decision_text(h: dict, status: str, reason, t, a, low, high, done: dict) -> str:
    what = {"superiority": "superiority", "non_inferiority": f"non-inferiority (margin {h['margin']:g})",
            "equivalence": f"equivalence (margin {h['margin']:g})"}[h["type"]]
    head = f"{h['id']}: {what} of {h['endpoint']} ({h['estimand']}, {h['better']} is better)"
    if t is None:
        return f"{head}: not reached ({reason})"
    stats = f"p = {t['p_value']:.3g} against alpha {a:.3g}" if a is not None else f"p = {t['p_value']:.3g}"
    if low is not None:
        stats += f"; {100 * (1 - 2 * a):.4g}% interval {low:+.5g} to {high:+.5g}"
    verdict = status if reason is None else f"{status} ({reason})"
    prefix = ""
    if done.get("budget_stop"):
        prefix = "(study stopped by its budget rule; the stop depended on run times, this endpoint's outcome) " \
            if h["endpoint"] in TIME_ENDPOINTS else "(study stopped by its budget rule) "
    return f"{prefix}{head}: {verdict}; {stats}"


def sensitivity(h: dict, pairs: list[dict], failed: list[dict]) -> dict | None:
    """Signed-rank tests of the distances from the hypothesis' bound(s), a failed arm adverse to itself."""
    if not failed:
        return None
    try:
        values = hyp_values(h, pairs)[0] if pairs else []
        lo, hi = region(h)
    except ValueError:
        return None
    s = sign(h["better"])
    parts = []
    for bound, k in ((lo, 1), (hi, -1)):
        if bound is None:
            continue
        dist = [k * (v - bound) for v in values]
        w = 1.0 + 2.0 * max((abs(x) for x in dist), default=0.0)
        dist += [(-s if f["failed"] == "candidate" else s) * k * w for f in failed]
        parts.append(signed_rank(dist, 1))
    worst = max(parts, key=lambda r: r["p_value"])
    return {"pairs_with_a_failed_arm": len(failed), "failed_candidate": sum(f["failed"] == "candidate" for f in failed),
            "n": worst["n"], "statistic": worst["statistic"], "p_value": worst["p_value"],
            "method": "signed-rank of the distances from the hypothesis' bound"
                      + (" (both bounds, the larger p)" if len(parts) == 2 else "")
                      + "; a failed arm ranks worse than every observed pair"}


# -- the summary ----------------------------------------------------------------------------------


def final_attempts(records: list[dict]) -> dict:
    out: dict = {}
    for r in records:
        rid = r["spec"]["run_id"]
        if rid not in out or r["attempt"] > out[rid]["attempt"]:
            out[rid] = r
    return out


def recompute(records: list[dict]) -> dict:
    """The summary, from the records, by the rules stated in analysis/summary.py."""
    proto = records[0]["protocol"]
    ok: dict = {}
    seen: dict = {}
    for r in sorted(records, key=lambda x: x["attempt"]):
        s = r["spec"]
        seen.setdefault((s["study"], s["config"]), set()).add(s["unit"])
        if r["status"] == "ok":
            ok.setdefault((s["study"], s["config"]), {}).setdefault(s["unit"], {})[s["role"]] = r
    exclusions: list = []
    done = completeness(records)
    studies = []
    pairs_of: dict = {}
    for st in proto["studies"]:
        entries = []
        level = st["interval_level"]
        for config in st["configs"]:
            units = {u: ok.get((st["name"], config), {}).get(u, {}) for u in sorted(seen.get((st["name"], config), set()))}
            if not units:
                continue
            if st["design"] == "paired":
                entry = _paired(st, config, units, level, exclusions)
                pairs_of[(st["name"], config)] = entry["pairs"]
            else:
                entry = _factorial(config, units, level, exclusions)
            entries.append(entry)
        studies.append({"name": st["name"], "design": st["design"], "configs": entries})
    spec = proto.get("hypotheses") or {"descriptive": "these records predate preregistered hypotheses"}
    if "descriptive" in spec:
        hyp = {"descriptive": spec["descriptive"]}
    else:
        failed = failed_pairs(records)
        decisions = []
        for d in decide(spec, pairs_of, done):
            h = next(t for t in spec["tests"] if t["id"] == d["id"])
            d["sensitivity"] = sensitivity(h, pairs_of.get((d["study"], d["config"]), []),
                                           failed.get((d["study"], d["config"]), []))
            decisions.append(d)
        hyp = {"procedure": spec["procedure"], "family_alpha": spec["family_alpha"], "min_pairs": spec["min_pairs"],
               "decisions": decisions}
    status = [r["status"] for r in records]
    rows = []
    for r in records:
        s, t = r["spec"], r.get("timings") or {}
        rows.append({"run_id": s["run_id"], "attempt": r["attempt"], "status": r["status"], "reason": r.get("reason"),
                     "study": s["study"], "config": s["config"], "arm": s["arm"], "role": s["role"], "seed": s["seed"],
                     "unit": s["unit"], "position": s["position"], "order": s["order"],
                     "training_s": t.get("training_s"), "time_to_target_s": t.get("time_to_target_s"),
                     "total_s": t.get("total_s"), "device_s": t.get("device_s"), "val_bpb": r.get("val_bpb"),
                     "test_bpb": r.get("test_bpb"), "peak_memory_bytes": peak(r)})
    rows.sort(key=lambda x: (x["order"], x["attempt"]))
    return {
        "schema_version": 4, "protocol": proto, "completeness": done, "hypotheses": hyp,
        "flow": flow(records, studies, proto),
        "records": {"files": len(records), "ok": status.count("ok"), "failed": status.count("failed"),
                    "interrupted": status.count("interrupted"),
                    "device_seconds": math.fsum((r.get("timings") or {}).get("device_s") or 0.0 for r in records)},
        "exclusions": sorted(exclusions, key=lambda e: e["unit"]), "studies": studies, "runs": rows,
    }


def flow(records: list[dict], studies: list[dict], proto: dict) -> list[dict]:
    rows: dict = {}
    for st in proto["studies"]:
        roles = (("baseline", st["arms"][0]), ("candidate", st["arms"][1])) if st["design"] == "paired" else \
            tuple((c, c) for c in CELLS)
        for config in st["configs"]:
            for role, arm in roles:
                rows[(st["name"], config, role)] = {
                    "study": st["name"], "config": config, "role": role, "arm": arm,
                    "planned": len(st["seeds"]) if "seeds" in st else None, "started": 0, "ok": 0, "failed": 0,
                    "interrupted_attempts": 0, "analysed": 0}
    attempts: dict = {}
    for r in records:
        attempts.setdefault(r["spec"]["run_id"], []).append(r["status"])
    used = {x["unit"] for st in studies for c in st["configs"] for x in c.get("pairs", c.get("blocks", []))}
    for r in final_attempts(records).values():
        s = r["spec"]
        row = rows[(s["study"], s["config"], s["role"])]
        row["started"] += 1
        row["interrupted_attempts"] += attempts[s["run_id"]].count("interrupted")
        row["ok"] += r["status"] == "ok"
        row["failed"] += r["status"] == "failed"
        row["analysed"] += int(s["unit"] in used and r["status"] == "ok")
    for row in rows.values():
        row["missing"] = None if row["planned"] is None else row["planned"] - row["ok"]
        row["excluded"] = row["ok"] - row["analysed"]
    return list(rows.values())


def failed_pairs(records: list[dict]) -> dict:
    by_unit: dict = {}
    for r in final_attempts(records).values():
        if r["spec"]["design"] == "paired":
            by_unit.setdefault(r["spec"]["unit"], {})[r["spec"]["role"]] = r
    out: dict = {}
    for unit in sorted(by_unit):
        arms = by_unit[unit]
        st = sorted((role, r["status"]) for role, r in arms.items())
        if len(st) == 2 and sorted(x for _, x in st) == ["failed", "ok"]:
            spec = next(iter(arms.values()))["spec"]
            out.setdefault((spec["study"], spec["config"]), []).append(
                {"unit": unit, "failed": next(role for role, x in st if x == "failed")})
    return out


def completeness(records: list[dict]) -> dict:
    """Planned runs (seeds x configurations x 2 or 4) against ok runs; the budget rule's verdict."""
    proto = records[0]["protocol"]
    ok_ids = {r["spec"]["run_id"] for r in records if r["status"] == "ok"}
    planned, unit_sizes = 0, []
    for st in proto["studies"]:
        if "seeds" not in st:
            return {"planned_runs": None, "ok_runs": len(ok_ids), "missing_runs": None, "complete": None,
                    "budget_stop": None, "text": "completeness unknown: these records do not list the planned seeds"}
        size = 2 if st["design"] == "paired" else 4
        n = len(st["seeds"]) * len(st["configs"]) * size
        planned += n
        if sum(1 for r in ok_ids if r.split(".", 1)[0] == st["name"]) < n:
            unit_sizes.append(size)
    missing = planned - len(ok_ids)
    spent = math.fsum((r.get("timings") or {}).get("device_s") or 0.0 for r in records)
    ok_s = [(r.get("timings") or {}).get("device_s") or 0.0 for r in records if r["status"] == "ok"]
    budget = proto.get("budget_device_seconds")
    stop = bool(missing and ok_s and budget is not None and spent + min(unit_sizes) * math.fsum(ok_s) / len(ok_s) > budget)
    if missing == 0:
        text = f"complete: all {planned} planned runs have an ok record"
    elif stop:
        text = (f"STOPPED BY THE BUDGET RULE: {missing} of {planned} planned runs have no ok record; "
                f"{spent:.1f} of {budget:g} device seconds spent, and one more unit would exceed the budget; "
                "where it stopped depended on run times, the outcome of every time endpoint")
    else:
        text = f"INCOMPLETE: {missing} of {planned} planned runs have no ok record"
    return {"planned_runs": planned, "ok_runs": len(ok_ids), "missing_runs": missing, "complete": missing == 0,
            "budget_stop": stop, "text": text}


def _paired(st: dict, config: str, units: dict, level: float, exclusions: list) -> dict:
    pairs = []
    for unit in sorted(units):
        arms = units[unit]
        missing = [x for x in ("baseline", "candidate") if x not in arms]
        if missing:
            exclusions.append({"unit": unit, "reason": f"no ok record for {', '.join(missing)}"})
            continue
        b, c = arms["baseline"], arms["candidate"]
        bt, ct = b["timings"], c["timings"]
        pairs.append({
            "unit": unit, "seed": b["spec"]["seed"], "order": min(b["spec"]["order"], c["spec"]["order"]),
            "first": "baseline" if b["spec"]["position"] == 0 else "candidate",
            "device": f"{(b.get('env') or {}).get('host', 'unknown host')} / "
                      f"{(b.get('env') or {}).get('device_name', 'unknown device')}",
            "baseline_training_s": bt["training_s"], "candidate_training_s": ct["training_s"],
            "baseline_time_to_target_s": bt["time_to_target_s"], "candidate_time_to_target_s": ct["time_to_target_s"],
            "baseline_total_s": bt["total_s"], "candidate_total_s": ct["total_s"],
            "baseline_test_bpb": b["test_bpb"], "candidate_test_bpb": c["test_bpb"],
            "baseline_peak_memory_bytes": peak(b), "candidate_peak_memory_bytes": peak(c),
            "time_reduction_pct": 100.0 * (1.0 - ct["training_s"] / bt["training_s"])
            if number(bt["training_s"], True) and number(ct["training_s"], True) else None,
            "test_bpb_difference": c["test_bpb"] - b["test_bpb"]
            if number(b["test_bpb"], False) and number(c["test_bpb"], False) else None,
        })
    col = lambda k: [p[k] for p in pairs]  # noqa: E731
    training = endpoint(col("baseline_training_s"), col("candidate_training_s"), level, "relative_reduction")
    timed = [p for p in pairs if p["time_reduction_pct"] is not None]  # both training times finite and positive
    training["log_ratio"] = paired([p["baseline_training_s"] for p in timed], [p["candidate_training_s"] for p in timed],
                                   level, "log_ratio")
    both = [p for p in pairs if p["baseline_time_to_target_s"] is not None and p["candidate_time_to_target_s"] is not None]
    ttt = endpoint([p["baseline_time_to_target_s"] for p in both], [p["candidate_time_to_target_s"] for p in both],
                   level, "relative_reduction")
    ttt.update(rule="pairs where both arms reached the target",
               unreached={"baseline": sum(p["baseline_time_to_target_s"] is None for p in pairs),
                          "candidate": sum(p["candidate_time_to_target_s"] is None for p in pairs)})
    quality = endpoint(col("baseline_test_bpb"), col("candidate_test_bpb"), level, "difference")
    mb, mc = col("baseline_peak_memory_bytes"), col("candidate_peak_memory_bytes")
    memory = endpoint(mb, mc, level, "relative_reduction") if None not in mb + mc else None
    faster = sum(1 for p in timed if p["candidate_training_s"] < p["baseline_training_s"])
    slower = sum(1 for p in timed if p["candidate_training_s"] > p["baseline_training_s"])
    return {
        "config": config, "design": "paired", "level": level, "parameters": params_of(units),
        "baseline_arm": st["arms"][0], "candidate_arm": st["arms"][1],
        "units_seen": len(units), "pairs_used": len(pairs), "training_time": training, "time_to_target": ttt,
        "total_time": endpoint(col("baseline_total_s"), col("candidate_total_s"), level, "relative_reduction"),
        "test_bpb": quality, "peak_memory": memory,
        "counts": {"faster": faster, "slower": slower, "ties": len(timed) - faster - slower,
                   "worse_test_bpb": sum(1 for p in pairs if (p["test_bpb_difference"] or 0.0) > 0)},
        "order_effects": {"crossover": crossover(timed, level), "drift": drift(timed, level)},
        "by_device": by_device(timed, level), "pairs": pairs,
    }


CELLS = ("native", "bucketed", "packed", "cotangent")


def _factorial(config: str, units: dict, level: float, exclusions: list) -> dict:
    blocks = []
    for unit in sorted(units):
        cells = units[unit]
        missing = [c for c in CELLS if c not in cells]
        if missing:
            exclusions.append({"unit": unit, "reason": f"no ok record for {', '.join(missing)}"})
            continue
        blk = {"unit": unit, "seed": cells["native"]["spec"]["seed"],
               "order": sorted(CELLS, key=lambda c: cells[c]["spec"]["position"])}
        for c in CELLS:
            blk[f"{c}_training_s"] = cells[c]["timings"]["training_s"]
            blk[f"{c}_test_bpb"] = cells[c]["test_bpb"]
        blocks.append(blk)
    means = {c: (math.fsum(b[f"{c}_training_s"] for b in blocks) / len(blocks) if blocks else None) for c in CELLS}
    effects = {}
    if len(blocks) >= 2:
        contrasts: dict = {"bucketed_norms": [], "packed_adamw": [], "interaction": []}
        for b in blocks:
            ln = {c: math.log(b[f"{c}_training_s"]) for c in CELLS}
            contrasts["bucketed_norms"].append(((ln["bucketed"] - ln["native"]) + (ln["cotangent"] - ln["packed"])) / 2)
            contrasts["packed_adamw"].append(((ln["packed"] - ln["native"]) + (ln["cotangent"] - ln["bucketed"])) / 2)
            contrasts["interaction"].append((ln["cotangent"] - ln["packed"]) - (ln["bucketed"] - ln["native"]))
        for name, vals in contrasts.items():
            iv = interval(vals, level, "log_contrast")
            iv.update(reduction_pct=100.0 * (1.0 - math.exp(iv["estimate"])),
                      reduction_low_pct=100.0 * (1.0 - math.exp(iv["high"])),
                      reduction_high_pct=100.0 * (1.0 - math.exp(iv["low"])))
            effects[name] = iv
    return {"config": config, "design": "factorial", "level": level, "units_seen": len(units),
            "parameters": params_of(units), "positions": positions(blocks, level), "blocks_used": len(blocks),
            "cell_mean_training_s": means, "effects": effects, "blocks": blocks}


# ------------------------------------------------------------------------------------------
# The plan, recomputed from the protocol file alone (a YAML subset reader, then harness.plan's rules)
# ------------------------------------------------------------------------------------------


def _strip_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _scalar(text: str) -> object:
    t = text.strip()
    if t[:1] in "\"'" and t[-1:] == t[:1] and len(t) >= 2:
        return json.loads(t) if t[0] == '"' else t[1:-1].replace("''", "'")
    if t in ("true", "True"):
        return True
    if t in ("false", "False"):
        return False
    if t in ("null", "~", ""):
        return None
    for conv in (int, float):
        try:
            return conv(t.replace("_", "")) if conv is int else conv(t)
        except ValueError:
            pass
    return t


def _split_flow(body: str) -> list[str]:
    parts, depth, quote, cur = [], 0, None, ""
    for ch in body:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def _value(text: str) -> object:
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        return [_value(p) for p in _split_flow(t[1:-1])]
    if t.startswith("{") and t.endswith("}"):
        out = {}
        for p in _split_flow(t[1:-1]):
            k, _, v = p.partition(":")
            out[str(_scalar(k))] = _value(v)
        return out
    return _scalar(t)


def yaml_subset(text: str) -> object:
    """The YAML this project's protocols use: block mappings and sequences, flow lists and maps,
    folded (``>``, ``>-``) and literal (``|``, ``|-``) blocks, plain and quoted scalars, comments.
    Anything else raises ValueError (the audit then says it cannot recompute the plan)."""
    raw = text.splitlines()
    lines: list[tuple[int, str, int]] = []  # (indent, content, raw index)
    for n, line in enumerate(raw):
        s = _strip_comment(line)
        if s.strip():
            lines.append((len(s) - len(s.lstrip(" ")), s.strip(), n))

    def block_scalar(style: str, start_raw: int, parent_indent: int) -> tuple[str, int]:
        body: list[str] = []
        n = start_raw + 1
        ind = None
        while n < len(raw):
            line = raw[n]
            if line.strip():
                cur = len(line) - len(line.lstrip(" "))
                if cur <= parent_indent:
                    break
                ind = cur if ind is None else ind
                body.append(line[ind:])
            else:
                body.append("")
            n += 1
        while body and not body[-1]:
            body.pop()
        if style.startswith(">"):
            text_ = " ".join(b.strip() for b in body)
        else:
            text_ = "\n".join(body)
        return text_ + ("" if style.endswith("-") else "\n"), n

    pos = 0

    def parse(indent: int) -> object:
        nonlocal pos
        if pos >= len(lines):
            return None
        if lines[pos][1].startswith("- ") or lines[pos][1] == "-":
            seq = []
            while pos < len(lines) and lines[pos][0] == indent and (lines[pos][1].startswith("- ") or lines[pos][1] == "-"):
                ind, content, n = lines[pos]
                item = content[1:].strip()
                if not item:
                    pos += 1
                    seq.append(parse(lines[pos][0]))
                elif ":" in item and not item.startswith(("[", "{", '"', "'")):
                    # a mapping that starts on the dash line: re-read it at the item's indent
                    lines[pos] = (ind + 2, item, n)
                    seq.append(parse(ind + 2))
                else:
                    seq.append(_value(item))
                    pos += 1
            return seq
        mapping: dict = {}
        while pos < len(lines) and lines[pos][0] == indent:
            ind, content, n = lines[pos]
            key, sep, rest = content.partition(":")
            if not sep or key.startswith("- "):
                raise ValueError(f"line {n + 1}: not a mapping entry: {content!r}")
            key = str(_scalar(key))
            rest = rest.strip()
            if key in mapping:
                raise ValueError(f"line {n + 1}: duplicate key {key!r}")
            if rest in (">", ">-", "|", "|-"):
                mapping[key], end = block_scalar(rest, n, ind)
                pos += 1
                while pos < len(lines) and lines[pos][2] < end:
                    pos += 1
            elif rest:
                mapping[key] = _value(rest)
                pos += 1
            else:
                pos += 1
                if pos < len(lines) and (lines[pos][0] > ind or (lines[pos][0] == ind and lines[pos][1].startswith("- "))):
                    mapping[key] = parse(lines[pos][0])
                else:
                    mapping[key] = None
        return mapping

    doc = parse(lines[0][0]) if lines else None
    if pos != len(lines):
        raise ValueError(f"line {lines[pos][2] + 1}: unexpected indentation")
    return doc


WILLIAMS_4 = ((0, 1, 3, 2), (1, 2, 0, 3), (2, 3, 1, 0), (3, 0, 2, 1))


def plan_from_protocol(doc: dict, protocol_sha: str, config_sha: dict) -> list[dict]:
    """harness.plan.make_plan, re-implemented: balanced pair orders, Williams-balanced blocks."""
    import random

    def rng(*parts: object) -> random.Random:
        return random.Random(":".join(str(p) for p in (doc["order_seed"], *parts)))

    runs: list[dict] = []
    for st in doc["studies"]:
        seeds = st["seeds"]
        if isinstance(seeds, dict):
            seeds = list(range(seeds["base"], seeds["base"] + seeds["count"]))
        target = st["val_target_bpb"]
        targets = {c: float(target[c] if isinstance(target, dict) else target) for c in st["configs"]}
        arms = st.get("arms") or list(CELLS)
        orders = {}
        for config in st["configs"]:
            n = len(seeds)
            if st["design"] == "paired":
                seq = [("baseline", "candidate")] * ((n + 1) // 2) + [("candidate", "baseline")] * (n // 2)
                rng(st["name"], config).shuffle(seq)
            else:
                seq = []
                for g in range(0, n, 4):
                    rows = list(WILLIAMS_4)
                    rng(st["name"], config, g).shuffle(rows)
                    seq.extend(tuple(CELLS[i] for i in row) for row in rows[: min(4, n - g)])
            orders[config] = seq
        for si, seed in enumerate(seeds):
            for config in st["configs"]:
                kind = "pair" if st["design"] == "paired" else "block"
                unit = f"{st['name']}.{config}.{kind}{si:03d}"
                for pos, role in enumerate(orders[config][si]):
                    arm = role if st["design"] == "factorial" else arms[0 if role == "baseline" else 1]
                    runs.append({
                        "run_id": f"{unit}.{role}", "protocol_id": doc["id"], "protocol_sha256": protocol_sha,
                        "study": st["name"], "design": st["design"], "config": config,
                        "config_sha256": config_sha[config], "arm": arm, "role": role, "seed": seed, "unit": unit,
                        "position": pos, "order": len(runs), "steps": st["steps"], "val_every": st["val_every"],
                        "val_target_bpb": targets[config], "corpus": doc["corpus"]["name"] if isinstance(doc["corpus"], dict) else doc["corpus"],
                        "data_dir": doc.get("data_dir"),
                        "device": doc["device"], "compile": doc["compile"], "threads": doc.get("threads"),
                    })
    return runs


# ------------------------------------------------------------------------------------------
# Ledger, freeze and completeness
# ------------------------------------------------------------------------------------------


def record_name(rec: dict) -> str:
    return f"{rec['spec']['run_id']}.a{rec['attempt']}{RECORD_SUFFIX}"


def check_ledger(records: list[dict], manifest: dict, genesis: str, published: tuple[int, str] | None) -> list[str]:
    """The records as one hash chain; returns the breaks, the first one first."""
    out: list[str] = []
    unlinked = [record_name(r) for r in records if "ledger" not in r]
    if unlinked:
        return [f"{len(unlinked)} record(s) have no ledger link (schema 1 records predate the ledger): {unlinked[0]}"]
    by_seq: dict = {}
    for r in records:
        by_seq.setdefault(r["ledger"]["seq"], []).append(r)
    prev = genesis
    for seq in range(1, max(by_seq, default=0) + 1):
        here = by_seq.get(seq, [])
        if not here:
            out.append(f"ledger seq {seq}: no record (deleted, or the chain was cut)")
            prev = None
            continue
        if len(here) > 1:
            out.append(f"ledger seq {seq}: {len(here)} records claim it ({', '.join(record_name(r) for r in here)}): "
                       "inserted")
        r = here[0]
        if prev is not None and r["ledger"]["prev"] != prev:
            out.append(f"ledger seq {seq} ({record_name(r)}): prev {r['ledger']['prev'][:16]} is not the sha256 of "
                       f"the record before it ({prev[:16]}): a record was edited and resealed, inserted, swapped or "
                       "removed before it")
        prev = r["sha256"]
    n = max(by_seq, default=0)
    head = manifest.get("ledger_head")
    if head is not None and (head.get("seq") != n or (n and head.get("sha256") != by_seq[n][0]["sha256"])):
        out.append(f"MANIFEST ledger_head {head} is not the chain's head (seq {n})")
    if published is not None:
        seq, sha = published
        got = by_seq.get(seq)
        if not got or not got[0]["sha256"].startswith(sha):
            out.append(f"published head seq {seq} sha256 {sha[:16]}: the records hold "
                       f"{got[0]['sha256'][:16] if got else 'no record'} at that position: history was rewritten")
    return out


def git_out(root: str, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    except OSError:
        return None
    return r.stdout if r.returncode == 0 else None


def check_freeze(root: str, proto: dict, records: list[dict], plan_sha: str | None) -> tuple[list[str], str]:
    """The tag freezes what the records ran: returns problems and a one-line description."""
    tag = proto.get("tag")
    if not tag:
        return [f"preregistered protocol {proto['id']}: records name no tag"], "no tag"
    kind = git_out(root, "cat-file", "-t", f"refs/tags/{tag}")
    if kind is None:
        return [f"tag {tag} not found in the git repository at {root}"], f"{tag} missing"
    if kind.strip() != "tag":
        return [f"tag {tag} is a lightweight tag (no tag object, no freeze manifest): not made by harness tag"], \
            f"{tag} lightweight"
    problems: list[str] = []
    obj = (git_out(root, "rev-parse", f"refs/tags/{tag}") or "").strip()
    commit = (git_out(root, "rev-parse", f"{tag}^{{commit}}") or "").strip()
    message = git_out(root, "cat-file", "tag", obj) or ""
    _, sep, body = message.partition("freeze-manifest:")
    try:
        m = json.loads(body) if sep else None
    except json.JSONDecodeError:
        m = None
    if m is None:
        return [f"tag {tag}: its message holds no readable freeze manifest"], f"{tag} without manifest"
    freeze = sha256(canonical(m))
    blob = git_out(root, "show", f"{commit}:{proto['path']}")
    tagged_sha = None
    if blob is not None:
        r = subprocess.run(["git", "show", f"{commit}:{proto['path']}"], cwd=root, capture_output=True, check=False)
        tagged_sha = sha256(r.stdout)
    if tagged_sha != proto["sha256"] or m.get("protocol", {}).get("sha256") != proto["sha256"]:
        problems.append(f"tag {tag}: the protocol file at the tag ({proto['path']}, sha256 {str(tagged_sha)[:16]}) is not "
                        f"the protocol the records name ({proto['sha256'][:16]})")
    if plan_sha is not None and m.get("plan", {}).get("sha256") != plan_sha:
        problems.append(f"tag {tag}: the freeze manifest's plan sha256 differs from the plan recomputed from the protocol")
    for r in records:
        p = r["protocol"]
        for field, want in (("tag_commit", commit), ("tag_object", obj), ("freeze_sha256", freeze)):
            if p.get(field) != want:
                problems.append(f"{record_name(r)}: field protocol.{field} = {p.get(field)!r}, the tag's is {want}")
                break
    return problems, f"{tag} (object {obj[:12]}, commit {commit[:12]}, freeze {freeze[:12]})"


def corpus_splits(root: str, corpus: dict) -> tuple[dict | None, list[str]]:
    """The split sha256 values a local corpus's pins imply: the pins themselves for one file per
    split; for one file cut by fractions, recomputed from the file when this checkout has it (the
    cut as in harness.data: split s is bytes floor(n F_<s) to floor(n F_s), F cumulative)."""
    if "file" not in corpus:
        return {s: corpus[s]["sha256"] for s in ("train", "valid", "test")}, []
    path = os.path.join(root, corpus["file"]["path"])
    if not os.path.isfile(path):
        return None, []
    with open(path, "rb") as f:
        data = f.read()
    if sha256(data) != corpus["file"]["sha256"] or len(data) != corpus["file"]["size"]:
        return None, [f"{path}: {len(data)} bytes, sha256 {sha256(data)}; the protocol pins {corpus['file']['size']} "
                      f"bytes, sha256 {corpus['file']['sha256']}"]
    cuts, acc = [0], Fraction(0)
    for s in ("train", "valid", "test"):
        acc += Fraction(repr(float(corpus["split"][s])))
        cuts.append(len(data) * acc.numerator // acc.denominator)
    return {s: sha256(data[cuts[i]:cuts[i + 1]]) for i, s in enumerate(("train", "valid", "test"))}, []


def check_corpus(root: str, proto: dict, records: list[dict]) -> tuple[list[str], str]:
    """Every run read the same bytes; for a local corpus, the bytes its pins imply."""
    seen: dict[str, list[str]] = {}
    for r in records:
        got = (r.get("env") or {}).get("corpus_sha256")
        if got:
            seen.setdefault(json.dumps(got, sort_keys=True), []).append(record_name(r))
    found = []
    if len(seen) > 1:
        found.append(f"records read {len(seen)} different corpora: " + "; ".join(
            f"{v[0]} and {len(v) - 1} more: {k}" for k, v in seen.items()))
    corpus = proto.get("corpus")
    name = corpus["name"] if isinstance(corpus, dict) else corpus
    detail = f"{name}: {sum(map(len, seen.values()))} runs read one set of split hashes"
    if isinstance(corpus, dict):
        want, found_pins = corpus_splits(root, corpus)
        found += found_pins
        if want is not None:
            found += [f"{v[0]}: corpus split hashes {k} differ from the protocol's pins {json.dumps(want, sort_keys=True)}"
                      for k, v in seen.items() if json.loads(k) != want]
            detail += ", the protocol's pins"
        else:
            detail += f" (the pinned file {corpus['file']['path']} is not in this checkout: pins not recomputed)"
    return found, detail


def tally(plan: list[dict], records: list[dict]) -> tuple[list[dict], int, list[str]]:
    """Per (study, configuration, arm): planned, ok, failed, interrupted, missing; and out-of-order runs."""
    by_run: dict = {}
    for r in records:
        by_run.setdefault(r["spec"]["run_id"], []).append(r["status"])
    rows: dict = {}
    missing_total = 0
    for s in plan:
        row = rows.setdefault((s["study"], s["config"], s["arm"]), {"study": s["study"], "config": s["config"],
                                                                    "arm": s["arm"], "planned": 0, "ok": 0,
                                                                    "failed": 0, "interrupted": 0, "missing": 0})
        st = by_run.get(s["run_id"], [])
        row["planned"] += 1
        row["interrupted"] += st.count("interrupted")
        if "ok" in st:
            row["ok"] += 1
        elif "failed" in st:
            row["failed"] += 1
        if "ok" not in st:
            row["missing"] += 1
            missing_total += 1
    order = {s["run_id"]: s["order"] for s in plan}
    flagged, highest = [], -1
    linked = sorted((r for r in records if "ledger" in r and r["attempt"] == 1), key=lambda r: r["ledger"]["seq"])
    for r in linked:
        o = order.get(r["spec"]["run_id"], -1)
        if o < highest:
            flagged.append(f"{r['spec']['run_id']} (plan position {o}) ran after plan position {highest}")
        highest = max(highest, o)
    return list(rows.values()), missing_total, flagged


# ------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def self_hash_ok(obj: dict) -> bool:
    return obj.get("sha256") == sha256(canonical({k: v for k, v in obj.items() if k != "sha256"}))


def compare(path: str, mine: object, theirs: object, problems: list[str], where: str) -> int:
    """Compare recomputed (mine) with stored (theirs); return the number of values compared."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        n = 0
        for k in sorted(set(mine) | set(theirs)):
            if k not in theirs:
                problems.append(f"{where}: field {path}.{k} missing (recomputed {mine[k]!r})")
            elif k not in mine:
                problems.append(f"{where}: field {path}.{k} = {theirs[k]!r} is not derivable from the records")
            else:
                n += compare(f"{path}.{k}", mine[k], theirs[k], problems, where)
        return n
    if isinstance(mine, list) and isinstance(theirs, list):
        if len(mine) != len(theirs):
            problems.append(f"{where}: field {path} has {len(theirs)} entries, recomputed {len(mine)}")
            return 1
        return sum(compare(f"{path}[{i}]", a, b, problems, where) for i, (a, b) in enumerate(zip(mine, theirs)))
    num = (int, float)
    if isinstance(mine, num) and isinstance(theirs, num) and not isinstance(mine, bool) and not isinstance(theirs, bool):
        if not (math.isclose(mine, theirs, rel_tol=REL_TOL, abs_tol=1e-12) or (math.isnan(mine) and math.isnan(theirs))):
            problems.append(f"{where}: field {path} = {theirs!r}, recomputed {mine!r}")
        return 1
    if mine != theirs:
        problems.append(f"{where}: field {path} = {theirs!r}, recomputed {mine!r}")
    return 1


def find_root(start: str, protocol_rel: str) -> str:
    d = os.path.abspath(start)
    while True:
        if os.path.isfile(os.path.join(d, protocol_rel)):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return os.path.abspath(start)
        d = parent


def git_tag(root: str, tag: str) -> tuple[str, str] | None:
    try:
        r = subprocess.run(["git", "for-each-ref", "--format=%(taggerdate:iso-strict) %(*objectname)", f"refs/tags/{tag}"],
                           cwd=root, capture_output=True, text=True, check=False)
    except OSError:
        return None
    if r.returncode != 0 or not r.stdout.strip():
        return None
    created, _, commit = r.stdout.strip().partition(" ")
    return created, commit


def audit_dir(directory: str, rows: list[tuple[str, str, str]], problems: list[str],
              notes: list[str], published: tuple[int, str] | None = None) -> None:
    def row(check: str, ok: bool, detail: str) -> None:
        rows.append((check, directory, ("ok: " if ok else "FAILED: ") + detail))

    def fail(check: str, found: list[str], ok_detail: str) -> None:
        problems.extend(found)
        row(check, not found, found[0] if found else ok_detail)

    manifest_path = os.path.join(directory, "MANIFEST")
    if not os.path.isfile(manifest_path):
        problems.append(f"{manifest_path}: missing")
        row("manifest", False, "MANIFEST missing")
        return
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    files = sorted(n for n in os.listdir(directory) if n.endswith(RECORD_SUFFIX))
    records = []
    bad = 0
    for name in files:
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
            raw = f.read()
        rec = json.loads(raw)
        if rec.get("schema_version") not in (1, 2):
            problems.append(f"{path}: schema_version {rec.get('schema_version')!r} is unknown to this audit")
            bad += 1
            continue
        if not self_hash_ok(rec):
            problems.append(f"{path}: field sha256 = {rec.get('sha256')!r} does not match the record's canonical content")
            bad += 1
        if manifest["records"].get(name) != sha256(raw):
            if name in manifest["records"]:
                problems.append(f"{path}: file sha256 {sha256(raw)} differs from MANIFEST's {manifest['records'][name]}")
            else:
                problems.append(f"{path}: record not listed in MANIFEST")
            bad += 1
        records.append(rec)
    for name in sorted(set(manifest["records"]) - set(files)):
        problems.append(f"{os.path.join(directory, name)}: listed in MANIFEST but missing")
        bad += 1
    row("record hashes + MANIFEST records", bad == 0, f"{len(files)} records, {bad} problems")
    if not records:
        return
    proto = records[0]["protocol"]
    root = find_root(directory, proto["path"])
    bad = 0
    for rel, digest in sorted(manifest["sources"].items()):
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            problems.append(f"{path}: source file listed in MANIFEST is missing from the checkout")
            bad += 1
            continue
        with open(path, "rb") as f:
            actual = sha256(f.read())
        if actual != digest:
            problems.append(f"{path}: source sha256 {actual} differs from MANIFEST's {digest}")
            bad += 1
    row("MANIFEST source files", bad == 0, f"{len(manifest['sources'])} files, {bad} problems")
    # the protocol file in this checkout, and the plan recomputed from it alone
    ppath = os.path.join(root, proto["path"])
    found = []
    plan: list[dict] | None = None
    plan_sha = None
    if not os.path.isfile(ppath):
        found.append(f"{ppath}: protocol file missing")
    else:
        with open(ppath, "rb") as f:
            praw = f.read()
        psha = sha256(praw)
        found += [f"{directory}/{record_name(r)}: field protocol.sha256 = {r['protocol']['sha256']} differs from "
                  f"{ppath} ({psha})" for r in records if r["protocol"]["sha256"] != psha]
        try:
            doc = yaml_subset(praw.decode("utf-8"))
            cdir = os.path.join(root, "configs")
            shas = {}
            for st in doc["studies"]:  # type: ignore[index]
                for c in st["configs"]:
                    with open(os.path.join(cdir, f"{c}.yaml"), "rb") as f:
                        shas[c] = sha256(f.read())
            plan = plan_from_protocol(doc, psha, shas)  # type: ignore[arg-type]
            plan_sha = sha256(canonical(plan))
        except (ValueError, KeyError, TypeError, OSError) as e:
            found.append(f"{ppath}: the plan cannot be recomputed from the protocol ({type(e).__name__}: {e})")
    fail("protocol sha256", found, f"{proto['id']} {proto['sha256'][:16]}...")
    if plan is not None:
        found = []
        by_id = {p["run_id"]: p for p in plan}
        for r in records:
            if r.get("plan_sha256") != plan_sha:
                found.append(f"{record_name(r)}: field plan_sha256 = {r.get('plan_sha256')} differs from the plan "
                             f"recomputed from the protocol ({plan_sha})")
                break
        for r in records:
            want = by_id.get(r["spec"]["run_id"])
            if want is None:
                found.append(f"{record_name(r)}: run {r['spec']['run_id']} is not in the plan")
            elif {k: r["spec"].get(k) for k in want} != want:
                diff = sorted(k for k in want if r["spec"].get(k) != want[k])
                found.append(f"{record_name(r)}: spec differs from the plan in {', '.join(diff)}")
        fail("plan recomputed from the protocol", found, f"{len(plan)} planned runs, sha256 {plan_sha[:16]}...")
    fail("corpus", *check_corpus(root, proto, records))
    genesis = proto.get("freeze_sha256") or proto["sha256"]
    fail("ledger chain", check_ledger(records, manifest, genesis, published),
         f"{len(records)} records linked from {'the freeze manifest' if proto.get('freeze_sha256') else 'the protocol'}")
    if proto.get("preregistered"):
        found, detail = check_freeze(root, proto, records, plan_sha)
        fail("tag freezes the experiment", found, detail)
    else:
        row("tag freezes the experiment", True, "not preregistered: no tag required")
    if plan is not None:
        table, missing, flagged = tally(plan, records)
        for t in table:
            notes.append(f"{directory}: {t['study']} / {t['config']} / {t['arm']}: planned {t['planned']}, ok {t['ok']}, "
                         f"failed {t['failed']}, interrupted {t['interrupted']}, missing {t['missing']}")
        notes.extend(f"{directory}: out of plan order: {x}" for x in flagged)
        if missing:
            notes.append(f"{directory}: INCOMPLETE: {missing} of {len(plan)} planned runs have no ok record")
    spath = os.path.join(directory, "summary.json")
    if not os.path.isfile(spath):
        row("summary.json recomputed", True, "no summary.json (run harness report): nothing to compare")
        return
    with open(spath, encoding="utf-8") as f:
        summary = json.load(f)
    before = len(problems)
    if not self_hash_ok(summary):
        problems.append(f"{spath}: field sha256 = {summary.get('sha256')!r} does not match its content")
    mine = recompute(records)
    theirs = {k: v for k, v in summary.items() if k != "sha256"}
    n = compare("summary", mine, theirs, problems, spath)
    row("summary.json recomputed", len(problems) == before, f"{n} values compared, {len(problems) - before} mismatches")


def main(argv: list[str]) -> int:
    published = None
    if "--head" in argv:
        k = argv.index("--head")
        seq, _, sha = argv[k + 1].partition(":") if k + 1 < len(argv) else ("", "", "")
        if not seq.isdigit() or not sha:
            print("public audit: --head takes SEQ:SHA256 (the ledger head you published)")
            return 2
        published = (int(seq), sha)
        argv = argv[:k] + argv[k + 2:]
    dirs = argv
    if not dirs:
        base = "records"
        dirs = sorted(os.path.join(base, d) for d in os.listdir(base)
                      if os.path.isfile(os.path.join(base, d, "MANIFEST"))) if os.path.isdir(base) else []
        if not dirs:
            print("public audit: no records folders with a MANIFEST under records/ (pass a folder)")
            return 1
    rows: list[tuple[str, str, str]] = []
    problems: list[str] = []
    notes: list[str] = []
    for d in dirs:
        audit_dir(d, rows, problems, notes, published)
    w1 = max(len(r[0]) for r in rows)
    w2 = max(len(r[1]) for r in rows)
    print(f"{'check'.ljust(w1)}  {'records'.ljust(w2)}  result")
    for check, d, result in rows:
        print(f"{check.ljust(w1)}  {d.ljust(w2)}  {result}")
    if notes:
        print("\nPlanned runs and their records:")
        for n in notes:
            print(f"  {n}")
    print("\nThis audit does not run training and does not check weight files (they stay local).")
    if problems:
        print(f"\n{len(problems)} problem(s):")
        for p in problems:
            print(f"- {p}")
        return 1
    incomplete = [n for n in notes if "INCOMPLETE:" in n]
    print("Integrity: everything matched." + (" The study is INCOMPLETE (see above)." if incomplete else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

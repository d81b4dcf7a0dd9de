#!/usr/bin/env python3
"""Public audit of the Cotangent study's records, with the Python standard library alone.

Usage: ``python analysis/public_audit.py [RECORDS_DIR ...] [--head SEQ:SHA256] [--anchor REMOTE]
[--allowed-signers FILE]`` (default: every folder under ``records/`` that holds a MANIFEST).
Runs as ``python -I -S analysis/public_audit.py`` too.

It checks, for each records folder (the threat model: docs/provenance.md):

1. every record's own sha256 (over its canonical JSON without the ``sha256`` field);
2. the MANIFEST: every record file listed with its sha256, no file missing or unlisted, and every
   source file's sha256 against the file in this checkout;
3. the study as the tag defines it: for a preregistered protocol (a tag ``protocol-<id>`` exists,
   or the checkout's file says ``preregistered: true``) the protocol is read from the tagged
   commit (the file whose sha256 the tag's freeze manifest names) with this file's own YAML
   reader, and every copy of its fields in a record (and MANIFEST) must equal it; the plan and
   every statistic are derived from it, never from the records;
4. what ran is what was frozen: each record's commit holds the manifest's frozen trees, its code
   hash is the manifest's, MANIFEST lists the tagged sources, torch and numpy have one version
   per study (what else varies is named);
5. time order, with git's replace objects disabled: the tag was created before the earliest
   record started, and records start after their predecessors in the ledger chain;
6. anchors: ``--head SEQ:SHA256`` (the full sha256) and ``--anchor REMOTE`` (the ledger heads
   ``harness run --anchor`` pushed) must be in the chain; ``--allowed-signers FILE`` verifies the
   tag's signature. Without any anchor the last line says so;
7. the ledger: records and started entries (schema 3: an attempt's ``*.started.json``, appended
   before its worker started) form one hash chain from the freeze manifest; every record that ends
   an attempt links to its started entry; an interrupted record charges no more device seconds
   than the ledger's time from its start to it; started entries with no record are listed as
   interrupted attempts with their start time; each unit is analysed from exactly one unit
   attempt (its latest), and superseded attempts are counted;
8. ``summary.json``: its own sha256, and every interval, count and decision in it, recomputed
   here from the records with an independent implementation (relative tolerance 1e-9).

It does not run training and does not check the weight files (they stay local); it says so.
Exit status 0 only if everything matched; otherwise 1, naming each file, field and value.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from fractions import Fraction

REL_TOL = 1e-9
RECORD_SUFFIX = ".record.json"
STARTED_SUFFIX = ".started.json"
SCHEMAS = (1, 2, 3)


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


def latest_unit(records: list[dict]) -> dict:
    out: dict = {}
    for r in records:
        u = r["spec"]["unit"]
        out[u] = max(out.get(u, 1), r.get("unit_attempt", 1))
    return out


def analysed(records: list[dict]) -> list[dict]:
    """The records of each unit's latest unit attempt (the rest are superseded)."""
    latest = latest_unit(records)
    return [r for r in records if r.get("unit_attempt", 1) == latest[r["spec"]["unit"]]]


def unfinished(records: list[dict], started: list[dict]) -> list[dict]:
    ended = {(r["spec"]["run_id"], r["attempt"]) for r in records}
    return [{"run_id": e["run_id"], "attempt": e["attempt"], "unit_attempt": e.get("unit_attempt", 1),
             "started_at": e["started_at"], "node": e["node"], "seq": e["ledger"]["seq"]}
            for e in sorted(started, key=lambda e: e["ledger"]["seq"]) if (e["run_id"], e["attempt"]) not in ended]


def recompute(records: list[dict], started: list[dict] | None = None) -> dict:
    """The summary, from the records, by the rules stated in analysis/summary.py."""
    proto = records[0]["protocol"]
    ok: dict = {}
    seen: dict = {}
    for r in sorted(analysed(records), key=lambda x: x["attempt"]):
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
    latest = latest_unit(records)
    for r in records:
        s, t = r["spec"], r.get("timings") or {}
        ua = r.get("unit_attempt", 1)
        rows.append({"run_id": s["run_id"], "attempt": r["attempt"], "unit_attempt": ua,
                     "superseded": ua < latest[s["unit"]], "status": r["status"], "reason": r.get("reason"),
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
                    "interrupted": status.count("interrupted"), "superseded": len(records) - len(analysed(records)),
                    "unfinished": unfinished(records, started or []),
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
                    "interrupted_attempts": 0, "superseded_attempts": 0, "analysed": 0}
    attempts: dict = {}
    latest = latest_unit(records)
    for r in records:
        attempts.setdefault(r["spec"]["run_id"], []).append(r["status"])
        s = r["spec"]
        if r.get("unit_attempt", 1) < latest[s["unit"]]:
            rows[(s["study"], s["config"], s["role"])]["superseded_attempts"] += 1
    used = {x["unit"] for st in studies for c in st["configs"] for x in c.get("pairs", c.get("blocks", []))}
    for r in final_attempts(analysed(records)).values():
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
    for r in final_attempts(analysed(records)).values():
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
    ok_ids = {r["spec"]["run_id"] for r in analysed(records) if r["status"] == "ok"}
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
# The protocol, read from its bytes alone (a YAML reader), and the plan recomputed from it
# ------------------------------------------------------------------------------------------

_BOOL = {"yes": True, "Yes": True, "YES": True, "true": True, "True": True, "TRUE": True, "on": True, "On": True,
         "ON": True, "no": False, "No": False, "NO": False, "false": False, "False": False, "FALSE": False,
         "off": False, "Off": False, "OFF": False}
_NULL = ("", "~", "null", "Null", "NULL")
_INT = re.compile(r"[-+]?(?:0b[0-1_]+|0[0-7_]+|(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+)")
_FLOAT = re.compile(r"[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?)")
_SPECIAL = re.compile(r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")
_UNSUPPORTED = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}.*|<<|=")
_ESCAPES = {"0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r",
            "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85", "_": "\xa0", "L": "\u2028",
            "P": "\u2029"}


class YamlError(ValueError):
    """What this reader cannot read, with the 1-based line: ``line N: ...``."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


def _plain(text: str, line: int) -> object:
    """A plain scalar resolved as PyYAML's SafeLoader resolves it (YAML 1.1 core)."""
    t = text.strip()
    if t in _BOOL:
        return _BOOL[t]
    if t in _NULL:
        return None
    if _INT.fullmatch(t):
        s = t.replace("_", "")
        sign = -1 if s[0] == "-" else 1
        s = s.lstrip("+-")
        if s.startswith("0b"):
            return sign * int(s[2:], 2)
        if s.startswith("0x"):
            return sign * int(s[2:], 16)
        if len(s) > 1 and s[0] == "0":
            return sign * int(s, 8)
        return sign * int(s)
    if _FLOAT.fullmatch(t):
        return float(t.replace("_", ""))
    if _SPECIAL.fullmatch(t):
        return float(t.lower().replace(".", ""))
    if _UNSUPPORTED.fullmatch(t) or t[:1] in "&*!%@`|>" or t.startswith(("- ", "? ")) or t in ("-", "?"):
        raise YamlError(line, f"{t!r}: this form (sexagesimal, date, merge, anchor, alias, tag or reserved) "
                              "is not read by the audit; write it as a plain number or quoted string")
    return t


def _fold(parts: list[str]) -> str:
    """Line folding of flow scalars: one line break is a space, each further empty line a newline."""
    out = parts[0]
    empty = 0
    for p in parts[1:]:
        if p == "":
            empty += 1
            continue
        out += ("\n" * empty if empty else " ") + p
        empty = 0
    return out + "\n" * empty if empty else out


def _unescape(s: str, line: int) -> str:
    out, i = [], 0
    while i < len(s):
        ch = s[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = s[i + 1:i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in ("x", "u", "U"):
            n = {"x": 2, "u": 4, "U": 8}[nxt]
            digits = s[i + 2:i + 2 + n]
            if len(digits) != n or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise YamlError(line, f"bad escape \\{nxt}{digits}")
            out.append(chr(int(digits, 16)))
            i += 2 + n
        else:
            raise YamlError(line, f"unknown escape \\{nxt}")
    return "".join(out)


def _quote_end(s: str, i: int) -> int:
    """The index of the quote that closes the quoted scalar opening at ``s[i]`` (``len(s)`` when none):
    ``''`` inside single quotes and a backslash escape inside double quotes do not close it."""
    q = s[i]
    j = i + 1
    while j < len(s):
        if q == "'" and s[j] == "'" and s[j + 1:j + 2] == "'":
            j += 2
            continue
        if q == '"' and s[j] == "\\":
            j += 2
            continue
        if s[j] == q:
            break
        j += 1
    return min(j, len(s))


class _Reader:
    def __init__(self, text: str) -> None:
        if text.startswith("\ufeff"):
            text = text[1:]
        self.raw = text.split("\n")
        if self.raw and self.raw[-1] == "":
            self.raw.pop()
        self.raw = [x[:-1] if x.endswith("\r") else x for x in self.raw]
        self.n = 0  # the current raw line
        self.started = False

    # -- lines -------------------------------------------------------------------------------
    def significant(self) -> int | None:
        """Skip blank and comment lines (and one leading ``---``); the next line's indent, or None."""
        while self.n < len(self.raw):
            line = self.raw[self.n]
            body = line.lstrip(" ")
            if body.strip() and not body.lstrip().startswith("#"):
                if body.startswith("\t"):
                    raise YamlError(self.n + 1, "a tab in indentation")
                if line.rstrip() == "---" and not self.started:
                    self.started = True
                    self.n += 1
                    continue
                if line.startswith(("---", "...")) and line[3:4] in ("", " ", "\t"):
                    raise YamlError(self.n + 1, "a document marker (several YAML documents) is not read")
                self.started = True
                return len(line) - len(body)
            self.n += 1
        return None

    @staticmethod
    def _comment_at(s: str, i: int) -> bool:
        return s[i] == "#" and (i == 0 or s[i - 1] in " \t")

    def _key_split(self, s: str) -> tuple[str, str] | None:
        """``key: rest`` outside quotes and flows, or None when ``s`` is not a mapping entry."""
        if s[:1] in "[{" or s.startswith(("- ", "? ")) or s == "-":
            return None
        if s[:1] in "\"'":
            i = _quote_end(s, 0)
            rest = s[i + 1:]
            stripped = rest.lstrip(" ")
            if stripped.startswith(":") and (stripped[1:2] in ("", " ")):
                return s[:i + 1], stripped[1:]
            return None
        for i, ch in enumerate(s):
            if self._comment_at(s, i):
                return None
            if ch == ":" and (i + 1 == len(s) or s[i + 1] in " \t"):
                return s[:i], s[i + 1:]
        return None

    # -- nodes -------------------------------------------------------------------------------
    def node(self, parent: int) -> object:
        """The node whose lines are indented more than ``parent`` (None when there is none)."""
        ind = self.significant()
        if ind is None or ind <= parent:
            return None
        return self.block(ind)

    def block(self, ind: int) -> object:
        s = self.raw[self.n][ind:]
        if s.startswith("- ") or s.rstrip() == "-":
            return self.sequence(ind)
        if self._key_split(s) is not None:
            return self.mapping(ind)
        return self.inline(s, ind - 1, ind)

    def _entry(self, ind: int) -> str | None:
        """The next significant line from column ``ind`` when it is indented exactly ``ind`` (else
        ``None``: the block ended); a deeper line there is an error."""
        at = self.significant()
        if at is None or at != ind:
            if at is not None and at > ind:
                raise YamlError(self.n + 1, "unexpected indentation")
            return None
        return self.raw[self.n][ind:]

    def sequence(self, ind: int) -> list:
        out: list = []
        while True:
            s = self._entry(ind)
            if s is None:
                return out
            if not (s.startswith("- ") or s.rstrip() == "-"):
                return out
            item = s[1:]
            inner = len(item) - len(item.lstrip(" "))
            item = item.lstrip(" ")
            if not item or item.startswith("#"):
                self.n += 1
                out.append(self.node(ind))
            elif item.startswith("- ") or item.rstrip() == "-" or self._key_split(item) is not None:
                # a compact nested node: re-read this line as if it started at the item's column
                self.raw[self.n] = " " * (ind + 1 + inner) + item
                out.append(self.block(ind + 1 + inner))
            else:
                out.append(self.inline(item, ind, ind + 1 + inner))

    def mapping(self, ind: int) -> dict:
        out: dict = {}
        while True:
            s = self._entry(ind)
            if s is None:
                return out
            kv = self._key_split(s)
            if kv is None:
                if s.startswith("- "):
                    return out
                raise YamlError(self.n + 1, f"not a mapping entry: {s.strip()!r}")
            key_text, rest = kv
            line = self.n + 1
            key = self.inline_one(key_text, line)
            if isinstance(key, (list, dict)):
                raise YamlError(line, "a collection as a key is not read")
            if key in out:
                raise YamlError(line, f"duplicate key {key!r}")
            body = rest.strip()
            if not body or body.startswith("#"):
                self.n += 1
                nxt = self.significant()
                if nxt == ind and self._dash(self.raw[self.n][ind:]):
                    out[key] = self.sequence(ind)
                else:
                    out[key] = self.node(ind)
            else:
                col = len(self.raw[self.n]) - len(rest.lstrip(" "))
                out[key] = self.inline(rest.lstrip(" "), ind, col)

    def inline_one(self, text: str, line: int) -> object:
        t = text.strip()
        if t[:1] == '"':
            return _unescape(t[1:-1], line) if len(t) >= 2 and t.endswith('"') else self._bad(line, t)
        if t[:1] == "'":
            return t[1:-1].replace("''", "'") if len(t) >= 2 and t.endswith("'") else self._bad(line, t)
        return _plain(t, line)

    @staticmethod
    def _bad(line: int, t: str) -> object:
        raise YamlError(line, f"unterminated quoted scalar {t!r}")

    def inline(self, text: str, parent: int, col: int) -> object:
        """A value that starts on the current line at column ``col``: quoted, flow, block scalar or
        plain, continued on the lines indented more than ``parent``."""
        line = self.n + 1
        if text[:1] in "&*!%@`" or text.startswith(("? ", "?\t")) or text.rstrip() == "?":
            raise YamlError(line, f"{text.strip()[:40]!r}: anchors, aliases, tags and complex keys are not read by "
                                  "the audit; write the value out")
        if text[:1] in "|>":
            return self.block_scalar(text, parent)
        if text[:1] in "\"'":
            return self.quoted(text, col)
        if text[:1] in "[{":
            return self.flow_collection(col)
        # plain, possibly over several lines
        first = self._strip_plain(text)
        parts = [first]
        self.n += 1
        if "#" in text and first != text.rstrip():
            return self._plain_checked(parts, line)
        while self.n < len(self.raw):
            raw = self.raw[self.n]
            body = raw.strip()
            if not body:
                parts.append("")
                self.n += 1
                continue
            ind = len(raw) - len(raw.lstrip(" "))
            if ind <= parent or body.startswith("#"):
                break
            if self._key_split(body) is not None and ind > parent:
                raise YamlError(self.n + 1, "a mapping entry inside a plain scalar (mapping values are not allowed "
                                            "here)")
            stripped = self._strip_plain(body)
            parts.append(stripped)
            self.n += 1
            if stripped != body:
                break
        while parts and parts[-1] == "":
            parts.pop()
        return self._plain_checked(parts, line)

    @staticmethod
    def _plain_checked(parts: list[str], line: int) -> object:
        return _plain(parts[0], line) if len(parts) == 1 else _fold(parts)

    @staticmethod
    def _dash(s: str) -> bool:
        return s.startswith("- ") or s.rstrip() == "-"

    def _strip_plain(self, s: str) -> str:
        for i in range(len(s)):
            if self._comment_at(s, i):
                return s[:i].rstrip()
        return s.rstrip()

    def quoted(self, text: str, col: int) -> str:
        line = self.n + 1
        q = text[0]
        buf = text[1:]
        parts: list[str] = []
        while True:
            i, end = 0, None
            while i < len(buf):
                if q == "'" and buf[i] == "'":
                    if buf[i + 1:i + 2] == "'":
                        i += 2
                        continue
                    end = i
                    break
                if q == '"' and buf[i] == "\\":
                    i += 2
                    continue
                if q == '"' and buf[i] == '"':
                    end = i
                    break
                i += 1
            if end is not None:
                parts.append(buf[:end])
                after = buf[end + 1:].strip()
                if after and not after.startswith("#"):
                    raise YamlError(self.n + 1, f"text after a quoted scalar: {after!r}")
                self.n += 1
                break
            parts.append(buf)
            self.n += 1
            if self.n >= len(self.raw):
                raise YamlError(line, "unterminated quoted scalar")
            buf = self.raw[self.n]
        return self._join_quoted(parts, q, line)

    @staticmethod
    def _join_quoted(parts: list[str], q: str, line: int) -> str:
        """Fold a quoted scalar's lines: a break is a space, n empty lines are n newlines, a double-quoted
        line ending in an escaped break joins the next without a space."""
        unq = (lambda s: _unescape(s, line)) if q == '"' else (lambda s: s.replace("''", "'"))
        segs = []
        for k, p in enumerate(parts):
            s, esc = (p if k == 0 else p.lstrip(" \t")), False
            if k < len(parts) - 1:
                s = s.rstrip(" \t")
                if q == '"' and (len(s) - len(s.rstrip("\\"))) % 2 == 1:
                    s, esc = s[:-1], True
            segs.append((s, esc))
        out, esc_prev, empties = unq(segs[0][0]), segs[0][1], 0
        for k, (s, esc) in enumerate(segs[1:], 1):
            if s == "" and k < len(segs) - 1:
                empties += 1
                continue
            out += ("\n" * empties) if empties else ("" if esc_prev else " ")
            out += unq(s)
            esc_prev, empties = esc, 0
        return out

    def flow_collection(self, col: int) -> object:
        line = self.n + 1
        chunks: list[str] = []
        depth = 0
        quote = None
        first = True
        while True:
            if self.n >= len(self.raw):
                raise YamlError(line, "unterminated flow collection")
            s = self.raw[self.n][col:] if first else self.raw[self.n]
            first = False
            kept = []
            i = 0
            done = False
            while i < len(s):
                ch = s[i]
                if quote:
                    kept.append(ch)
                    if quote == "'" and ch == "'" and s[i + 1:i + 2] == "'":
                        kept.append("'")
                        i += 2
                        continue
                    if quote == '"' and ch == "\\":
                        kept.append(s[i + 1:i + 2])
                        i += 2
                        continue
                    if ch == quote:
                        quote = None
                elif ch in "\"'":
                    quote = ch
                    kept.append(ch)
                elif self._comment_at(s, i):
                    break
                else:
                    if ch in "[{":
                        depth += 1
                    elif ch in "]}":
                        depth -= 1
                    kept.append(ch)
                    if depth == 0:
                        rest = s[i + 1:].strip()
                        if rest and not rest.startswith("#"):
                            raise YamlError(self.n + 1, f"text after a flow collection: {rest!r}")
                        done = True
                        break
                i += 1
            chunks.append("".join(kept) if quote else "".join(kept).rstrip())
            self.n += 1
            if done:
                break
        value, end = _flow("\n".join(chunks), 0, line)
        return value

    def block_scalar(self, header: str, parent: int) -> str:
        line = self.n + 1
        h = self._strip_plain(header)
        style, rest = h[0], h[1:]
        chomp, explicit = "clip", None
        for ch in rest:
            if ch in "+-":
                chomp = "keep" if ch == "+" else "strip"
            elif ch.isdigit() and ch != "0":
                explicit = int(ch)
            else:
                raise YamlError(line, f"bad block scalar header {h!r}")
        self.n += 1
        body: list[str] = []
        ind = parent + explicit if explicit is not None and parent >= 0 else (explicit if explicit else None)
        while self.n < len(self.raw):
            raw = self.raw[self.n]
            if raw.strip() == "":
                body.append(raw)
                self.n += 1
                continue
            cur = len(raw) - len(raw.lstrip(" "))
            if ind is None:
                if cur <= parent:
                    break
                ind = cur
            if cur < ind:
                break
            body.append(raw)
            self.n += 1
        lines = [b[ind:] if ind is not None and len(b) >= ind else "" for b in body]
        trailing = 0
        while lines and lines[-1] == "":
            lines.pop()
            trailing += 1
        if style == "|":
            text = "\n".join(lines)
        else:  # folded: a break between two normal lines is a space; empty lines and more-indented lines keep theirs
            text, empties, last_more = "", 0, False
            started = False
            for ln in lines:
                if ln == "":
                    empties += 1
                    continue
                more = ln[0] in " \t"
                if not started:
                    text, started = "\n" * empties + ln, True
                elif not more and not last_more:
                    text += ("\n" * empties if empties else " ") + ln
                else:
                    text += "\n" * (empties + 1) + ln
                last_more, empties = more, 0
        if not lines:
            return "\n" * trailing if chomp == "keep" else ""
        if chomp == "strip":
            return text
        if chomp == "keep":
            return text + "\n" * (trailing + 1)
        return text + "\n"


def _flow(s: str, i: int, line: int) -> tuple[object, int]:
    """One flow node of ``s`` from ``i``: a list, a mapping, a quoted or a plain scalar."""
    i = _skip(s, i)
    if i < len(s) and s[i] in "[{":
        close = "]" if s[i] == "[" else "}"
        seq: list = []
        mp: dict = {}
        i += 1
        while True:
            i = _skip(s, i)
            if i >= len(s):
                raise YamlError(line, "unterminated flow collection")
            if s[i] == close:
                return (seq if close == "]" else mp), i + 1
            key, i = _flow(s, i, line)
            i = _skip(s, i)
            if i < len(s) and s[i] == ":" and (close == "}" or True):
                val, i = _flow(s, i + 1, line)
                if close == "]":
                    seq.append({key: val})
                else:
                    if key in mp:
                        raise YamlError(line, f"duplicate key {key!r}")
                    mp[key] = val  # type: ignore[index]
            elif close == "]":
                seq.append(key)
            else:
                mp[key] = None  # type: ignore[index]
            i = _skip(s, i)
            if i < len(s) and s[i] == ",":
                i += 1
            elif i < len(s) and s[i] == close:
                continue
            else:
                raise YamlError(line, f"expected ',' or {close!r} in a flow collection at {s[i:i + 20]!r}")
    if i < len(s) and s[i] in "\"'":
        q = s[i]
        j = _quote_end(s, i)
        if j >= len(s):
            raise YamlError(line, "unterminated quoted scalar in a flow collection")
        return _Reader._join_quoted(s[i + 1:j].split("\n"), q, line), j + 1
    if i < len(s) and (s[i] in "&*!%@`" or s[i:i + 2] in ("? ", "?\n")):
        raise YamlError(line, f"{s[i:i + 20]!r}: anchors, aliases, tags and complex keys are not read by the audit")
    j = i
    while j < len(s) and s[j] not in ",]}" and not (s[j] == ":" and (j + 1 == len(s) or s[j + 1] in " \n,]}")):
        j += 1
    parts = [p.strip() for p in s[i:j].split("\n")]
    while parts and parts[-1] == "":
        parts.pop()
    return (_plain(parts[0], line) if len(parts) <= 1 else _fold(parts)) if parts else None, j


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\n":
        i += 1
    return i


def yaml_subset(text: str) -> object:
    """The YAML of a protocol, read with the standard library alone, giving what ``yaml.safe_load``
    gives: block mappings and sequences (compact ``- key: v`` items too), flow lists and mappings
    (over several lines too), plain scalars (multi-line folded too) resolved as PyYAML's YAML 1.1
    resolver does, single- and double-quoted scalars (escapes and line folding), literal and folded
    block scalars with chomping and indentation indicators, comments. Anchors, aliases, tags,
    dates, sexagesimal numbers and several documents raise :class:`YamlError` naming the line
    (``harness plan`` and ``harness tag`` refuse such a protocol, so the audit reads every one
    they accept)."""
    r = _Reader(text)
    ind = r.significant()
    if ind is None:
        return None
    doc = r.block(ind)
    if r.significant() is not None:
        raise YamlError(r.n + 1, "unexpected indentation")
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
    if rec.get("kind") == "started":
        return f"{rec['run_id']}.a{rec['attempt']}{STARTED_SUFFIX}"
    return f"{rec['spec']['run_id']}.a{rec['attempt']}{RECORD_SUFFIX}"


def iso_seconds(text: str) -> float:
    """Seconds since the epoch of an ISO 8601 time with an offset (``...+00:00``)."""
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def check_attempts(records: list[dict], started: list[dict]) -> list[str]:
    """Every schema 3 record ends a started entry of the same run and attempt, earlier in the chain;
    an interrupted record charges at most the ledger's time from that start to itself."""
    out: list[str] = []
    by_key = {(e["run_id"], e["attempt"]): e for e in started}
    for r in records:
        if r.get("schema_version", 1) < 3:
            continue
        key = (r["spec"]["run_id"], r["attempt"])
        e = by_key.get(key)
        link = r.get("start") or {}
        if e is None:
            out.append(f"{record_name(r)}: no started entry for run {key[0]} attempt {key[1]} (its start is not "
                       "in the ledger: deleted, or the attempt was never announced)")
            continue
        if link.get("sha256") != e["sha256"] or link.get("seq") != e["ledger"]["seq"]:
            out.append(f"{record_name(r)}: field start = {link} does not name its started entry "
                       f"(seq {e['ledger']['seq']}, sha256 {e['sha256'][:16]})")
        elif e["ledger"]["seq"] >= r["ledger"]["seq"]:
            out.append(f"{record_name(r)}: its started entry (seq {e['ledger']['seq']}) is not before it in the chain")
        if r.get("unit_attempt", 1) != e.get("unit_attempt", 1):
            out.append(f"{record_name(r)}: field unit_attempt = {r.get('unit_attempt')} differs from its started "
                       f"entry's {e.get('unit_attempt')}")
        if r["status"] == "interrupted" and "at" in r["ledger"] and "at" in e["ledger"]:
            span = iso_seconds(r["ledger"]["at"]) - iso_seconds(e["ledger"]["at"])
            charged = (r.get("timings") or {}).get("device_s") or 0.0
            if charged > span + 1.0:
                out.append(f"{record_name(r)}: an interrupted attempt charged {charged:.1f} device seconds, more than "
                           f"the ledger's {span:.1f} s from its start to its record")
    return out


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


# ------------------------------------------------------------------------------------------
# Provenance: the tag is the source of truth; what ran is what was frozen; time order; anchors
# ------------------------------------------------------------------------------------------

#: Fields a record's ``protocol`` holds beyond those derived from the protocol file (checked
#: against the tag, the manifest's plug-ins).
FROZEN_FIELDS = ("tag_commit", "tag_object", "tag_created", "freeze_sha256", "plugins")
ANCHOR_REF = "refs/ledger/"  # + protocol-<id>: the anchor commits `harness run --anchor` pushes
FACTORIAL = ("native", "bucketed", "packed", "cotangent")


def _git_env() -> dict:
    """git with replace objects disabled: ``git replace`` cannot substitute a tag, commit or blob."""
    return {**os.environ, "GIT_NO_REPLACE_OBJECTS": "1", "GIT_TERMINAL_PROMPT": "0"}


def git_bytes(root: str, *args: str, stdin: bytes | None = None) -> bytes | None:
    try:
        r = subprocess.run(["git", "--no-replace-objects", *args], cwd=root, capture_output=True, check=False,
                           env=_git_env(), input=stdin)
    except OSError:
        return None
    return r.stdout if r.returncode == 0 else None


def git_out(root: str, *args: str) -> str | None:
    out = git_bytes(root, *args)
    return None if out is None else out.decode("utf-8", "replace")


def git_root(directory: str) -> str | None:
    out = git_out(directory if os.path.isdir(directory) else ".", "rev-parse", "--show-toplevel")
    return out.strip() if out else None


def parse_manifest(message: str) -> dict | None:
    """The freeze manifest in a tag message (a signature after it is ignored)."""
    _, sep, body = message.partition("freeze-manifest:")
    if not sep:
        return None
    try:
        m, _ = json.JSONDecoder().raw_decode(body.lstrip())
    except json.JSONDecodeError:
        return None
    return m if isinstance(m, dict) else None


def _tagger_time(message: str) -> float | None:
    """Seconds since the epoch from a tag object's ``tagger`` header."""
    for line in message.splitlines():
        if not line:
            return None
        if line.startswith("tagger "):
            parts = line.rsplit(" ", 2)
            try:
                return float(parts[1])
            except (IndexError, ValueError):
                return None
    return None


def _when(stamp: object) -> float | None:
    from datetime import datetime

    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


TAG_FILE = "TAG"


def stored_tag(directory: str | None, tag: str) -> bytes | None:
    """The tag object ``harness run`` keeps as ``TAG`` in the records folder, if it names ``tag``."""
    path = os.path.join(directory, TAG_FILE) if directory else ""
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        raw = f.read()
    m = re.match(rb"object [0-9a-f]{40,64}\ntype commit\ntag (\S+)\n", raw)
    return raw if m and m.group(1).decode("utf-8", "replace") == tag else None


def object_id(root: str, kind: str, raw: bytes) -> str:
    """Git's object id of ``raw`` as a ``kind`` object (SHA-1, or SHA-256 in such a repository)."""
    algo = (git_out(root, "rev-parse", "--show-object-format") or "sha1").strip() or "sha1"
    return hashlib.new(algo, b"%s %d\x00" % (kind.encode(), len(raw)) + raw).hexdigest()


def read_tag(root: str, tag: str, directory: str | None = None) -> tuple[dict | None, list[str]]:
    """The tag object, its commit, creation time and freeze manifest, read with replace objects off.
    Without the ref (a clone that did not fetch tags), from the ``TAG`` file the records folder
    keeps: the same bytes, whose object id the records name and whose commit must be in the
    repository. With both, they must be the same object."""
    kind = git_out(root, "cat-file", "-t", f"refs/tags/{tag}")
    stored = stored_tag(directory, tag)
    if kind is None and stored is None:
        return None, [f"tag {tag} not found in the git repository at {root} (nor as {TAG_FILE} in {directory})"]
    if kind is not None and kind.strip() != "tag":
        return None, [f"tag {tag} is a lightweight tag (no tag object, no freeze manifest): not made by harness tag"]
    if kind is None:
        raw = stored or b""
        obj = object_id(root, "tag", raw)
        commit = raw.split(b"\n", 1)[0].split(b" ")[1].decode()
        if (git_out(root, "cat-file", "-t", commit) or "").strip() != "commit":
            return None, [f"{directory}/{TAG_FILE}: tag {tag}'s commit {commit[:12]} is not in the git repository"]
    else:
        obj = (git_out(root, "rev-parse", f"refs/tags/{tag}") or "").strip()
        commit = (git_out(root, "rev-parse", f"{obj}^{{commit}}") or "").strip()
        raw = git_bytes(root, "cat-file", "tag", obj) or b""
        if stored is not None and stored != raw:
            return None, [f"{directory}/{TAG_FILE} is not the object of the repository's tag {tag} ({obj[:12]})"]
    message = raw.decode("utf-8", "replace")
    m = parse_manifest(message)
    if m is None:
        return None, [f"tag {tag}: its message holds no readable freeze manifest"]
    return {"tag": tag, "object": obj, "commit": commit, "created": _tagger_time(message), "manifest": m,
            "freeze": sha256(canonical(m)), "signed": "-----BEGIN " in message, "tag_raw": raw}, []


def _configs_at(root: str, rev: str, ppath: str, names: list[str]) -> dict[str, bytes]:
    """The configuration files a protocol names, as ``harness.config`` finds them: ``configs/`` in
    the nearest folder at or above the protocol's that has one (at ``rev``, or in the checkout)."""
    d = os.path.dirname(ppath)
    while True:
        base = f"{d}/configs" if d else "configs"
        out = {}
        for c in names:
            if rev:
                blob = git_bytes(root, "cat-file", "blob", f"{rev}:{base}/{c}.yaml")
            else:
                full = os.path.join(root, base, f"{c}.yaml")
                blob = open(full, "rb").read() if os.path.isfile(full) else None
            if blob is not None:
                out[c] = blob
        if out or not d:
            return out
        d = os.path.dirname(d)


def load_truth(root: str, directory: str, records: list[dict], manifest: dict) -> tuple[dict, list[str]]:
    """What the study is, from the tag's protocol file (or, without any tag, the checkout's).

    The protocol ids and paths the records, MANIFEST and folder name are only where to look: a
    tag ``protocol-<id>`` for any of them, or a checkout protocol file that says ``preregistered:
    true``, makes the study preregistered, and then only the tag's manifest and the file it names
    (``git show TAG_COMMIT:PATH``, sha256 as the manifest says) define it."""
    problems: list[str] = []
    mp = manifest.get("protocol") if isinstance(manifest.get("protocol"), dict) else {}
    ids = {r["protocol"].get("id") for r in records} | {r["spec"].get("protocol_id") for r in records}
    ids |= {mp.get("id"), os.path.basename(os.path.normpath(directory))}
    paths = sorted({p for p in {r["protocol"].get("path") for r in records} | {mp.get("path")} if isinstance(p, str)})
    claims = sorted({str(r["protocol"].get("id")) for r in records if r["protocol"].get("preregistered")})
    in_checkout = []
    for p in paths:
        full = os.path.join(root, p)
        if os.path.isfile(full):
            try:
                d = yaml_subset(open(full, "rb").read().decode("utf-8"))
            except (YamlError, UnicodeDecodeError):
                continue
            if isinstance(d, dict) and d.get("preregistered") is True:
                in_checkout.append((p, d.get("id")))
                ids.add(d.get("id"))
    tags = sorted(f"protocol-{i}" for i in ids if isinstance(i, str) and i
                  and (git_out(root, "rev-parse", "-q", "--verify", f"refs/tags/protocol-{i}") is not None
                       or stored_tag(directory, f"protocol-{i}") is not None))
    truth: dict = {"tag": None, "tagged": False}
    if len(tags) > 1:
        problems.append(f"{directory}: the records name several tagged protocols ({', '.join(tags)})")
    if tags:
        info, found = read_tag(root, tags[0], directory)
        problems += found
        if info is not None:
            truth.update(info, tagged=True)
            mprot = info["manifest"].get("protocol") or {}
            path, want = mprot.get("path"), mprot.get("sha256")
            blob = git_bytes(root, "cat-file", "blob", f"{info['commit']}:{path}") if isinstance(path, str) else None
            if blob is None or sha256(blob) != want:
                problems.append(f"tag {tags[0]}: the file its manifest names ({path}) is not at the tagged commit "
                                f"{info['commit'][:12]} with sha256 {str(want)[:16]}")
            else:
                truth.update(path=path, raw=blob, sha256=want)
        else:
            truth["tag"] = tags[0]
    elif in_checkout or claims:
        why = (f"{in_checkout[0][0]} in this checkout says preregistered: true" if in_checkout
               else "the records say preregistered: true")
        pid = in_checkout[0][1] if in_checkout else claims[0]
        problems.append(f"{directory}: {why}, but there is no tag protocol-{pid} in {root}: nothing binds these records "
                        "to a frozen experiment")
    if "raw" not in truth and not truth["tagged"]:  # not preregistered: the checkout's file, as the records name it
        path = records[0]["protocol"].get("path")
        full = os.path.join(root, str(path))
        if isinstance(path, str) and os.path.isfile(full):
            raw = open(full, "rb").read()
            truth.update(path=path, raw=raw, sha256=sha256(raw))
        else:
            problems.append(f"{full}: protocol file missing")
    if "raw" in truth:
        try:
            doc = yaml_subset(truth["raw"].decode("utf-8"))
            if not isinstance(doc, dict):
                raise ValueError("the protocol is not a mapping")
            truth["doc"] = doc
            names = sorted({c for st in doc["studies"] for c in st["configs"]})
            blobs = _configs_at(root, truth.get("commit") or "", truth["path"], names)
            truth["config_sha"] = {c: sha256(b) for c, b in blobs.items()}
            missing = [c for c in names if c not in blobs]
            if missing:
                raise ValueError(f"configuration file(s) {', '.join(missing)} not found"
                                 + (f" at the tagged commit {truth['commit'][:12]}" if truth.get("commit") else ""))
            truth["summary"] = expected_summary(doc, truth["sha256"], truth["path"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            problems.append(f"{truth['path']}{' at ' + truth['tag'] if truth['tag'] else ''}: the study cannot be "
                            f"derived from the protocol ({type(e).__name__}: {e})")
            truth.pop("doc", None)
    return truth, problems


def _resolved_tests(h: dict, studies: list[dict]) -> dict:
    if "descriptive" in h:
        return {"descriptive": h["descriptive"]}
    by_name = {s["name"]: s for s in studies}
    tests = []
    for t in h["tests"]:
        cfg = t.get("config")
        if cfg is None:
            cfg = by_name[t["study"]]["configs"][0]
        tests.append({"id": t["id"], "study": t["study"], "config": cfg, "endpoint": t["endpoint"],
                      "estimand": t["estimand"], "type": t["type"], "margin": float(t.get("margin", 0.0)),
                      "better": t["better"], "censoring": t.get("censoring"),
                      "period_adjusted": t.get("period_adjusted", False),
                      "restriction_s": float(t["restriction_s"]) if t.get("restriction_s") is not None else None})
    return {"procedure": h["procedure"], "family_alpha": float(h["family_alpha"]), "min_pairs": h["min_pairs"],
            "decide_time_after_budget_stop": bool(h.get("decide_time_after_budget_stop", False)), "tests": tests}


def expected_summary(doc: dict, psha: str, path: str) -> dict:
    """``harness.protocol.Protocol.summary()``, derived here from the protocol file alone (the
    fields every record's ``protocol`` copies; plug-ins and the tag's fields are checked apart)."""
    top_level = float(doc["interval_level"])
    studies = []
    for st in doc["studies"]:
        seeds = st["seeds"]
        if isinstance(seeds, dict):
            seeds = list(range(seeds["base"], seeds["base"] + seeds["count"]))
        arms = st.get("arms") or (list(FACTORIAL) if st["design"] == "factorial" else None)
        level = st.get("interval_level")
        studies.append({"name": st["name"], "design": st["design"], "arms": list(arms), "configs": list(st["configs"]),
                        "seeds": list(seeds), "interval_level": float(level) if level else top_level,
                        "steps": st["steps"]})
    corpus = doc["corpus"]
    if isinstance(corpus, dict):
        c: dict = {"name": corpus["name"]}
        for k in ("file", "train", "valid", "test"):
            if k in corpus:
                c[k] = {"path": corpus[k]["path"], "size": corpus[k]["size"], "sha256": corpus[k]["sha256"]}
        if "split" in corpus:
            c["split"] = {s: float(corpus["split"][s]) for s in ("train", "valid", "test")}
        corpus = c
    prereg = doc["preregistered"]
    return {"id": doc["id"], "version": doc["version"], "sha256": psha, "path": path, "preregistered": prereg,
            "tag": f"protocol-{doc['id']}" if prereg else None, "interval_level": top_level,
            "hypotheses": _resolved_tests(doc["hypotheses"], studies), "max_attempts": doc.get("max_attempts", 1),
            "launcher": doc.get("launcher", "spawn"), "device": doc["device"], "compile": doc["compile"],
            "corpus": corpus, "budget_device_seconds": float(doc["budget_device_seconds"]), "studies": studies}


def _same(a: object, b: object) -> bool:
    """Equal as JSON values: numbers by value (1 == 1.0), booleans only to booleans."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _differences(want: dict, got: dict, prefix: str) -> list[str]:
    out = []
    for k in sorted(set(want) | set(got)):
        if k not in got:
            out.append(f"{prefix}.{k} is missing (the tagged protocol's is {want[k]!r})")
        elif k not in want:
            out.append(f"{prefix}.{k} = {got[k]!r} is not in the tagged protocol")
        elif isinstance(want[k], dict) and isinstance(got[k], dict):
            out += _differences(want[k], got[k], f"{prefix}.{k}")
        elif not _same(want[k], got[k]):
            out.append(f"{prefix}.{k} = {json.dumps(got[k], sort_keys=True)[:120]}, the tagged protocol's is "
                       f"{json.dumps(want[k], sort_keys=True)[:120]}")
    return out


def check_protocol_copies(truth: dict, records: list[dict], manifest: dict) -> list[str]:
    """Every copy of the protocol inside a record (and MANIFEST) equals the one derived from the
    protocol file: a difference names the record and the field."""
    want = truth["summary"]
    out = []
    for r in records:
        got = {k: v for k, v in r["protocol"].items() if k not in FROZEN_FIELDS}
        out += [f"{record_name(r)}: field {d}" for d in _differences(want, got, "protocol")]
        plugins = r["protocol"].get("plugins") or {}
        if truth["tagged"]:
            frozen = truth["manifest"].get("plugins") or {}
            shas = {k: (v or {}).get("sha256") for k, v in plugins.items()}
            if shas != frozen:
                out.append(f"{record_name(r)}: field protocol.plugins {shas} differs from the tag's manifest {frozen}")
    mp = manifest.get("protocol")
    if isinstance(mp, dict):
        got = {k: v for k, v in mp.items() if k not in FROZEN_FIELDS}
        out += [f"MANIFEST: field {d}" for d in _differences(want, got, "protocol")]
    return out


def _tree(root: str, rev: str, exempt: list[str]) -> dict | None:
    listing = git_out(root, "ls-tree", rev)
    if listing is None:
        return None
    out = {}
    for line in listing.splitlines():
        meta, _, name = line.partition("\t")
        if name in exempt or any(e.startswith("*") and name.endswith(e[1:]) for e in exempt):
            continue
        out[name] = meta.split()[2]
    return out


def check_what_ran(root: str, truth: dict, records: list[dict], manifest: dict) -> tuple[list[str], list[str], str]:
    """Each record's commit holds the tag's frozen trees and its code hash is the tag's; MANIFEST's
    sources are the tagged files; the packages that compute are one version per study. Returns
    problems, notes (what varies between runs of one study anyway) and a description."""
    m = truth["manifest"]
    problems: list[str] = []
    trees, exempt = m.get("trees") or {}, list(m.get("exempt") or [])
    seen: dict = {}
    for r in records:
        commit = (r.get("git") or {}).get("commit")
        if commit not in seen:
            seen[commit] = _tree(root, commit, exempt) if isinstance(commit, str) else None
        got = seen[commit]
        if got is None:
            problems.append(f"{record_name(r)}: field git.commit = {commit!r} is not a commit of this repository")
        elif got != trees:
            diff = sorted(k for k in set(got) | set(trees) if got.get(k) != trees.get(k))
            problems.append(f"{record_name(r)}: field git.commit = {commit[:12]} does not hold the frozen trees of the "
                            f"tag's manifest (differs in {', '.join(diff)})")
    code = (m.get("code") or {}).get("harness")
    for r in records:
        env = r.get("env")
        if env is None and r.get("status") != "ok":
            continue
        if (env or {}).get("harness_sha256") != code:
            problems.append(f"{record_name(r)}: field env.harness_sha256 = {(env or {}).get('harness_sha256')!r}, the "
                            f"tag's manifest says the harness code is {code}")
    # MANIFEST: its sources are the tagged files, its head is given
    sources = manifest.get("sources") if isinstance(manifest.get("sources"), dict) else {}
    want = {truth["path"]: truth["sha256"]}
    listing = git_out(root, "ls-tree", "-r", "--name-only", truth["commit"], "--", "harness", "analysis", "configs",
                      "verified") or ""
    names = [n for n in listing.splitlines() if n.endswith((".py", ".c", ".yaml", ".json"))
             and not (n.startswith("analysis/") and not n.endswith(".py")) and "__pycache__" not in n
             and not (n.startswith("configs/") and not n.endswith(".yaml"))
             and not (n.startswith("verified/") and not n.endswith(".json"))
             and not (n.startswith("harness/") and not n.endswith((".py", ".c")))]
    if names:
        batch = git_bytes(root, "cat-file", "--batch", stdin="".join(f"{truth['commit']}:{n}\n" for n in names).encode())
        pos = 0
        for n in names:
            if batch is None:
                break
            nl = batch.index(b"\n", pos)
            header = batch[pos:nl].split()
            size = int(header[2]) if len(header) == 3 else 0
            want[n] = sha256(batch[nl + 1:nl + 1 + size])
            pos = nl + 1 + size + 1
    bad = sorted(n for n, s in want.items() if sources.get(n) != s)
    if bad:
        problems.append(f"MANIFEST: sources {'lack' if any(n not in sources for n in bad) else 'differ in'} "
                        f"{len(bad)} tagged file(s) ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})")
    if any("ledger" in r for r in records) and not isinstance(manifest.get("ledger_head"), dict):
        problems.append(f"MANIFEST: field ledger_head = {manifest.get('ledger_head')!r}; linked records need the head")
    versions, notes = check_versions(records)
    return problems + versions, notes, (f"{len(seen)} commit(s) hold the tag's {len(trees)} frozen trees; code "
                                        f"{str(code)[:12]}; MANIFEST names {len(want)} tagged files")


#: What a run records about its machine and process that may differ between runs without the
#: study being another experiment; the audit names every one that varies within a study.
VARYING = ("host", "os", "python", "device_name", "threads", "cpu_capability")


def check_versions(records: list[dict]) -> tuple[list[str], list[str]]:
    """torch and numpy versions are one per study (a failure otherwise); what else varies is named."""
    by_study: dict = {}
    for r in records:
        if r.get("env"):
            by_study.setdefault(r["spec"]["study"], []).append(r)
    problems, notes = [], []
    for study, rs in sorted(by_study.items()):
        for key in ("torch", "numpy"):
            vals = sorted({str(x["env"].get(key)) for x in rs})
            if len(vals) > 1:
                problems.append(f"study {study}: the runs used {len(vals)} versions of {key} ({', '.join(vals)}); one "
                                "study runs on one installation")
        varied = []
        for key in VARYING:
            vals = sorted({json.dumps(x["env"].get(key), sort_keys=True) for x in rs if key in x["env"]})
            if len(vals) > 1:
                varied.append(f"{key} ({', '.join(v[:40] for v in vals)})")
        arms: dict = {}
        for x in rs:
            arms.setdefault(x["spec"]["arm"], set()).add(json.dumps((x.get("method_paths") or {}).get("phase_kernel")))
        varied += [f"phase kernel of arm {a} ({len(v)} different)" for a, v in sorted(arms.items()) if len(v) > 1]
        if varied:
            notes.append(f"study {study}: varies between runs: {'; '.join(varied)}")
        found, named = check_phase_kernels(study, rs)
        problems += found
        notes.append(named)
    return problems, notes


def _kernel_kind(r: dict) -> str | None:
    """What a record says ran the one-pass phase: ``phase.c``, ``torch kernels`` or None (no PackedAdamW)."""
    k = (r.get("method_paths") or {}).get("phase_kernel")
    if k is None:
        return None
    return next((kind for kind in ("phase.c", "torch kernels") if str(k).startswith(kind)), str(k))


def check_phase_kernels(study: str, rs: list[dict]) -> tuple[list[str], str]:
    """Every record of one arm names the same phase kernel (phase.c, or torch's kernels), and every
    record that names one names the same phase.c library (``method_paths.phase_so_sha256``): the
    environment (``CC``, ``PATH``) must not switch an arm's code between runs. Returns problems and
    the note naming each arm's kernel."""
    problems, arms = [], {}
    for r in rs:
        arms.setdefault(r["spec"]["arm"], {}).setdefault(_kernel_kind(r), []).append(r)
    for arm, kinds in sorted(arms.items()):
        if len(kinds) > 1:
            parts = [f"{len(v)} {k or 'no phase kernel'} (e.g. {record_name(v[0])})" for k, v in sorted(
                kinds.items(), key=lambda kv: str(kv[0]))]
            problems.append(f"study {study}: the records of arm {arm} disagree on field method_paths.phase_kernel: "
                            f"{', '.join(parts)}; one arm runs one code path")
    libs: dict = {}
    for r in rs:
        if _kernel_kind(r) is not None:
            libs.setdefault((r.get("method_paths") or {}).get("phase_so_sha256"), []).append(r)
    if len(libs) > 1:
        parts = [f"{str(k)[:16] if k else 'none'} ({record_name(v[0])}, {len(v)} record(s))" for k, v in sorted(
            libs.items(), key=lambda kv: str(kv[0]))]
        problems.append(f"study {study}: field method_paths.phase_so_sha256 differs between runs: {', '.join(parts)}")
    named = []
    for arm, kinds in sorted(arms.items()):
        ks = sorted(kinds, key=str)
        named.append(f"arm {arm}: " + (", ".join(
            (str((kinds[k][0].get("method_paths") or {}).get("phase_kernel")) if k else
             "none (no PackedAdamW)") + f" in {len(kinds[k])} record(s)" for k in ks)))
    return problems, f"study {study}: phase kernel: {'; '.join(named)}"


def check_time(truth: dict, records: list[dict]) -> tuple[list[str], str]:
    """The tag was created before the first record started; in the ledger, a record starts after the
    one before it unless the two ran at once on different machines; none finishes before it starts."""
    out = []
    starts = [(_when(r.get("started_at")), r) for r in records]
    first = min((s for s, _ in starts if s is not None), default=None)
    created = truth.get("created")
    if truth.get("tagged"):
        if created is None:
            out.append(f"tag {truth['tag']}: no tagger date")
        elif first is not None and created > first:
            r = min((x for x in starts if x[0] is not None), key=lambda x: x[0])[1]
            out.append(f"tag {truth['tag']} was created at {_iso(created)}, after {record_name(r)} started "
                       f"({r.get('started_at')}): the tag must precede every outcome")
    linked = sorted((r for r in records if "ledger" in r), key=lambda r: r["ledger"]["seq"])
    for a, b in zip(linked, linked[1:]):
        sa, sb = _when(a.get("started_at")), _when(b.get("started_at"))
        if sa is not None and sb is not None and sb < sa and _machine(a) == _machine(b):
            out.append(f"ledger seq {b['ledger']['seq']} ({record_name(b)}) started at {b.get('started_at')}, before "
                       f"seq {a['ledger']['seq']} on the same machine ({a.get('started_at')}): out of time order")
    for r in records:
        s, f = _when(r.get("started_at")), _when(r.get("finished_at"))
        if s is not None and f is not None and f < s:
            out.append(f"{record_name(r)}: finished_at {r.get('finished_at')} precedes started_at {r.get('started_at')}")
    what = f"tag created {_iso(created)}; " if created is not None else ""
    return out, what + (f"first record started {_iso(first)}" if first is not None else "no start times")


def _iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def _machine(r: dict) -> object:
    node = r.get("node")
    return (node or {}).get("id") if isinstance(node, dict) and node.get("id") else (r.get("env") or {}).get("host")


#: The lines that open a signature block in a git tag object (git's gpg-interface.c); the last
#: such line begins the signature, what precedes it is the signed payload.
SIG_STARTS = {"-----BEGIN SSH SIGNATURE-----": "SSH", "-----BEGIN PGP SIGNATURE-----": "OpenPGP",
              "-----BEGIN PGP MESSAGE-----": "OpenPGP", "-----BEGIN SIGNED MESSAGE-----": "X.509"}


def _isolated_env() -> dict:
    """An environment in which git and ssh-keygen read no system, global or inherited configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return {**env, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_TERMINAL_PROMPT": "0"}


def split_signature(raw: bytes) -> tuple[bytes, bytes, str | None]:
    """A tag object's signed payload, its signature block and the block's kind (None: unsigned)."""
    pos, start, kind = 0, len(raw), None
    while pos < len(raw):
        nl = raw.find(b"\n", pos)
        end = len(raw) if nl < 0 else nl + 1
        line = raw[pos:end].rstrip(b"\r\n").decode("utf-8", "replace")
        for head, name in SIG_STARTS.items():
            if line.startswith(head):
                start, kind = pos, name
        pos = end
    return raw[:start], raw[start:], kind


def _ssh_keygen(args: list[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["ssh-keygen", *args], input=stdin, capture_output=True, check=False, env=_isolated_env())


def check_signature(root: str, truth: dict, signers: str | None) -> tuple[list[str], str]:
    """With an allowed-signers file given by the reader, the tag object must carry an SSH signature
    (``-----BEGIN SSH SIGNATURE-----``) that ``ssh-keygen -Y verify`` (namespace ``git``, as git
    signs) accepts for a principal of that file. Neither git nor the audited repository's
    configuration takes part, and an OpenPGP or X.509 signature is refused: the reader's keyring
    is not the reader's allowed-signers file."""
    if not truth.get("tagged"):
        return [], "no tag"
    if signers is None:
        return [], ("signed, not verified (pass --allowed-signers FILE)" if truth.get("signed") else "not signed")
    if not truth.get("signed"):
        return [f"tag {truth['tag']} is not signed; --allowed-signers needs a tag made by harness tag --sign"], "unsigned"
    tag = truth["tag"]
    payload, sig, kind = split_signature(truth.get("tag_raw") or b"")
    if kind != "SSH":
        what = f"an {kind} signature" if kind else "no signature block git recognises"
        return [f"tag {tag}: the tag object carries {what}, not an SSH signature (-----BEGIN SSH SIGNATURE-----); "
                f"--allowed-signers {signers} verifies SSH signatures only"], "not an SSH signature"
    allowed = os.path.abspath(signers)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="audit-sig-") as tmp:
        sig_path = os.path.join(tmp, "tag.sig")
        with open(sig_path, "wb") as f:
            f.write(sig)
        try:
            found = _ssh_keygen(["-Y", "find-principals", "-f", allowed, "-s", sig_path], b"")
            principals = found.stdout.decode("utf-8", "replace").split() if found.returncode == 0 else []
            why = (found.stderr.decode("utf-8", "replace").strip().splitlines() or ["no principal matches its key"])[-1]
            for who in principals:
                r = _ssh_keygen(["-Y", "verify", "-f", allowed, "-I", who, "-n", "git", "-s", sig_path], payload)
                if r.returncode == 0:
                    return [], f"good SSH signature by {who}, allowed by {signers}"
                why = (r.stderr.decode("utf-8", "replace").strip().splitlines() or ["no detail"])[-1]
        except OSError as e:
            return [f"tag {tag}: ssh-keygen could not run to verify its signature ({e})"], "not verified"
    return [f"tag {tag}: its signature does not verify against {signers} ({why})"], "bad signature"


def check_freeze(root: str, truth: dict, records: list[dict], plan_sha: str | None) -> tuple[list[str], str]:
    """The records name the tag's object, commit, creation and freeze hash, and the tag's manifest
    binds the protocol, configurations and plan derived here: returns problems and a description."""
    tag, m, obj, commit = truth["tag"], truth["manifest"], truth["object"], truth["commit"]
    problems: list[str] = []
    names = sorted({r["protocol"].get("sha256") for r in records} - {truth.get("sha256")}, key=str)
    if names:
        problems.append(f"tag {tag}: the protocol file at the tag ({truth.get('path')}, sha256 "
                        f"{str(truth.get('sha256'))[:16]}) is not the protocol the records name ({str(names[0])[:16]})")
    if plan_sha is not None and (m.get("plan") or {}).get("sha256") != plan_sha:
        problems.append(f"tag {tag}: the freeze manifest's plan sha256 differs from the plan recomputed from the protocol")
    for c, sha in sorted((truth.get("config_sha") or {}).items()):
        if (m.get("configs") or {}).get(c) != sha:
            problems.append(f"tag {tag}: configuration {c} at the tagged commit (sha256 {sha[:16]}) is not the one "
                            "its manifest names")
    for r in records:
        p = r["protocol"]
        for field, want in (("tag", tag), ("tag_commit", commit), ("tag_object", obj), ("freeze_sha256", truth["freeze"])):
            if p.get(field) != want:
                problems.append(f"{record_name(r)}: field protocol.{field} = {p.get(field)!r}, the tag's is {want}")
                break
        else:
            made = _when(p.get("tag_created"))
            if made is None or truth.get("created") is None or abs(made - truth["created"]) > 1.0:
                problems.append(f"{record_name(r)}: field protocol.tag_created = {p.get('tag_created')!r} is not the "
                                f"tag's creation time")
    return problems, f"{tag} (object {obj[:12]}, commit {commit[:12]}, freeze {truth['freeze'][:12]})"


def check_anchor(root: str, truth: dict, records: list[dict], remote: str) -> tuple[list[str], str, int]:
    """Every head anchored in ``remote``'s ``refs/ledger/protocol-<id>`` history is in the chain, in
    order. Returns problems, a description and the highest anchored seq."""
    pid = truth.get("summary", {}).get("id") or records[0]["protocol"].get("id")
    ref = f"{ANCHOR_REF}protocol-{pid}"
    log, url = fetch_anchor(remote, ref)
    if log is None:
        return [f"anchor {remote}: cannot fetch {ref} from {url}"], "not fetched", 0
    by_seq: dict = {}
    for r in records:
        if "ledger" in r:
            by_seq.setdefault(r["ledger"]["seq"], r["sha256"])
    out, heads = [], []
    for entry in log.split("\x01"):
        if not entry.strip():
            continue
        commit, when, body = entry.strip("\n").split("\x00", 2)
        fields = dict(line.split(" ", 1) for line in body.splitlines() if " " in line)
        try:
            heads.append((int(fields["seq"]), fields["sha256"], fields.get("freeze"), commit, when))
        except (KeyError, ValueError):
            out.append(f"anchor {commit[:12]}: not a ledger head")
    heads.reverse()  # oldest first
    last = 0
    for seq, sha, freeze, commit, when in heads:
        if truth.get("freeze") and freeze != truth["freeze"]:
            out.append(f"anchor {commit[:12]} ({when}): freeze {str(freeze)[:16]} is not the tag's")
        if seq < last:
            out.append(f"anchor {commit[:12]} ({when}): seq {seq} after an anchored seq {last}: the chain was cut back")
        got = by_seq.get(seq)
        if got != sha:
            out.append(f"anchored head seq {seq} sha256 {sha[:16]} (anchor {commit[:12]}, {when}): the records hold "
                       f"{got[:16] if got else 'no record'} there: history was rewritten after it was anchored")
        last = max(last, seq)
    n = max(by_seq, default=0)
    return out, f"{len(heads)} anchored heads in {ref} fetched from {url}, up to seq {last} of {n}", last


def fetch_anchor(remote: str, ref: str) -> tuple[str | None, str]:
    """The first-parent log of ``ref`` in ``remote`` and the URL it was fetched from.

    The ref is fetched into a throwaway bare repository in a temporary folder, with no system,
    global or inherited git configuration, never into (or with the configuration of) the audited
    repository: its ``url.*.insteadOf`` cannot redirect the anchor, and no ref is written there."""
    import tempfile

    env = _isolated_env()

    def git_in(where: str, *args: str) -> str | None:
        try:
            r = subprocess.run(["git", "--no-replace-objects", *args], cwd=where, capture_output=True, check=False,
                               env=env)
        except OSError:
            return None
        return r.stdout.decode("utf-8", "replace") if r.returncode == 0 else None

    with tempfile.TemporaryDirectory(prefix="audit-anchor-") as tmp:
        bare = os.path.join(tmp, "anchor.git")
        if git_in(tmp, "init", "--quiet", "--bare", bare) is None:
            return None, remote
        url = (git_in(bare, "ls-remote", "--get-url", remote) or remote).strip() or remote
        if remote.startswith("-") or git_in(bare, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", remote,
                                            f"+{ref}:refs/audit/{ref[5:]}") is None:
            return None, url
        return git_in(bare, "log", "--first-parent", "--format=%H%x00%cI%x00%B%x01", f"refs/audit/{ref[5:]}") or "", url


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


def tally(plan: list[dict], records: list[dict], open_: list[dict] | None = None) -> tuple[list[dict], int, list[str]]:
    """Per (study, configuration, arm): planned, ok (in the analysed unit attempt), failed, interrupted
    (recorded, or started with no record), missing, superseded; and out-of-order runs."""
    by_run: dict = {}
    interrupted: dict = {}
    superseded: dict = {}
    current = {id(r) for r in analysed(records)}
    for r in records:
        rid = r["spec"]["run_id"]
        by_run.setdefault(rid, []).append(r["status"] if id(r) in current else "superseded")
        interrupted[rid] = interrupted.get(rid, 0) + (r["status"] == "interrupted")
        if id(r) not in current:
            superseded[rid] = superseded.get(rid, 0) + 1
    for u in open_ or []:
        interrupted[u["run_id"]] = interrupted.get(u["run_id"], 0) + 1
    rows: dict = {}
    missing_total = 0
    for s in plan:
        row = rows.setdefault((s["study"], s["config"], s["arm"]), {"study": s["study"], "config": s["config"],
                                                                    "arm": s["arm"], "planned": 0, "ok": 0,
                                                                    "failed": 0, "interrupted": 0, "missing": 0,
                                                                    "superseded": 0})
        st = by_run.get(s["run_id"], [])
        row["planned"] += 1
        row["interrupted"] += interrupted.get(s["run_id"], 0)
        row["superseded"] += superseded.get(s["run_id"], 0)
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


def check_sources(root: str, truth: dict, records: list[dict], manifest: dict) -> tuple[list[str], str]:
    """MANIFEST's source hashes (the code, configurations and protocol a run read) against the tagged
    commit's files for a tagged study, so later work in the repository never unseals it; without a
    tag, against the checkout, or else the one commit every record names (the records' word: an
    untagged study proves nothing about a frozen experiment)."""
    sources = sorted(manifest["sources"].items())

    def problems_at(rev: str | None, against: str | None = None) -> list[str]:
        """Files at ``rev`` (None: the checkout) whose sha256 is not MANIFEST's, or with ``against``,
        checkout files that differ from that commit's."""
        out = []
        for rel, digest in sources:
            if against is not None:
                path = os.path.join(root, rel)
                here = open(path, "rb").read() if os.path.isfile(path) else None
                if here != git_bytes(root, "cat-file", "blob", f"{against}:{rel}"):
                    out.append(rel)
                continue
            if rev:
                raw = git_bytes(root, "cat-file", "blob", f"{rev}:{rel}")
                where = f"{rel} at {rev[:12]}"
            else:
                path = os.path.join(root, rel)
                raw = open(path, "rb").read() if os.path.isfile(path) else None
                where = path
            if raw is None:
                out.append(f"{where}: source file listed in MANIFEST is missing" + ("" if rev else " from the checkout"))
            elif sha256(raw) != digest:
                out.append(f"{where}: source sha256 {sha256(raw)} differs from MANIFEST's {digest}")
        return out

    if truth.get("tagged"):
        found = problems_at(truth["commit"])
        return found, f"{len(sources)} files, {len(found)} problems, at the tagged commit {truth['commit'][:12]}"
    found = problems_at(None)
    commits = {(r.get("git") or {}).get("commit") for r in records}
    head = (git_out(root, "rev-parse", "-q", "--verify", "HEAD") or "").strip()
    if found and head and len(commits) == 1 and isinstance(next(iter(commits)), str) and not problems_at(None, head):
        commit = next(iter(commits))  # later committed work, no uncommitted edit: the records' own commit
        if (git_out(root, "cat-file", "-t", commit) or "").strip() == "commit" and not problems_at(commit) \
                and git_out(root, "merge-base", "--is-ancestor", commit, "HEAD") is not None:
            return [], (f"{len(sources)} files, 0 problems, at commit {commit[:12]}, which every record names "
                        "(the checkout has changed since)")
    return found, f"{len(sources)} files, {len(found)} problems, in this checkout"


def audit_dir(directory: str, rows: list[tuple[str, str, str]], problems: list[str],
              notes: list[str], published: tuple[int, str] | None = None, *, anchor: str | None = None,
              signers: str | None = None, anchored: dict | None = None) -> None:
    anchored = {} if anchored is None else anchored
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
    manifest = _read_json(manifest_path)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("records"), dict):
        problems.append(f"{manifest_path}: not a MANIFEST (a JSON object with a 'records' mapping); "
                        "harness status or harness report rebuilds it from the ledger")
        row("manifest", False, "MANIFEST unreadable")
        return
    listed = {**manifest["records"], **(manifest.get("started") or {})}  # schema 3: started entries apart
    files = sorted(n for n in os.listdir(directory) if n.endswith((RECORD_SUFFIX, STARTED_SUFFIX)))
    records = []
    started = []
    bad = 0
    for name in files:
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
            raw = f.read()
        rec = _read_json(path, raw)
        if not isinstance(rec, dict):
            problems.append(f"{path}: not a JSON record")
            bad += 1
            continue
        if rec.get("schema_version") not in SCHEMAS:
            problems.append(f"{path}: schema_version {rec.get('schema_version')!r} is unknown to this audit")
            bad += 1
            continue
        if not self_hash_ok(rec):
            problems.append(f"{path}: field sha256 = {rec.get('sha256')!r} does not match the record's canonical content")
            bad += 1
        if listed.get(name) != sha256(raw):
            if name in listed:
                problems.append(f"{path}: file sha256 {sha256(raw)} differs from MANIFEST's {listed[name]}")
            else:
                problems.append(f"{path}: record not listed in MANIFEST")
            bad += 1
        if name.endswith(STARTED_SUFFIX):
            if rec.get("kind") != "started":
                problems.append(f"{path}: field kind = {rec.get('kind')!r}, a started entry says 'started'")
                bad += 1
                continue
            started.append(rec)
        else:
            records.append(rec)
    for name in sorted(set(listed) - set(files)):
        problems.append(f"{os.path.join(directory, name)}: listed in MANIFEST but missing")
        bad += 1
    row("record hashes + MANIFEST records", bad == 0,
        f"{len(records)} records, {len(started)} started entries, {bad} problems")
    if not records:
        audit_empty(directory, manifest, started, published, anchor, fail, notes)
        return
    root = git_root(directory) or find_root(directory, records[0]["protocol"]["path"])
    outer = git_root(os.path.dirname(os.path.abspath(root))) if git_root(directory) else None
    if outer is not None:
        problems.append(f"{directory}: its git repository {root} lies inside another one ({outer}): a nested "
                        "repository's tags are not the study's; audit the records in the repository that tagged them")
        row("records inside the study's repository", False, f"nested repository {root}")
        return
    # the study as the tag (or, without one, the checkout's protocol file) defines it
    truth, found = load_truth(root, directory, records, manifest)
    proto = truth.get("summary")
    source_problems, source_detail = check_sources(root, truth, records, manifest)
    problems.extend(source_problems)
    row("MANIFEST source files", not source_problems, source_detail)
    plan: list[dict] | None = None
    plan_sha = None
    if proto is not None:
        found += check_protocol_copies(truth, records, manifest)
        try:
            plan = plan_from_protocol(truth["doc"], truth["sha256"], truth["config_sha"])
            plan_sha = sha256(canonical(plan))
        except (ValueError, KeyError, TypeError) as e:
            found.append(f"{truth['path']}: the plan cannot be recomputed from the protocol ({type(e).__name__}: {e})")
    where = f"{truth['path']} at {truth['tag']}" if truth.get("tagged") else f"{truth.get('path')} in this checkout"
    fail("protocol: the tagged file", found, f"{proto['id']} {proto['sha256'][:16]}... from {where}; every record's "
         "copy equal" if proto else "")
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
    if proto is None:
        return
    fail("corpus", *check_corpus(root, proto, records))
    genesis = truth["freeze"] if truth.get("tagged") else proto["sha256"]
    fail("ledger chain", check_ledger(records + started, manifest, genesis, published),
         f"{len(records) + len(started)} entries linked from "
         f"{'the freeze manifest' if truth.get('tagged') else 'the protocol'}")
    fail("attempts in the ledger", check_attempts(records, started),
         f"{len(started)} started entries, {sum(r.get('schema_version', 1) >= 3 for r in records)} records end one")
    if truth.get("tagged"):
        found, detail = check_freeze(root, truth, records, plan_sha)
        fail("tag freezes the experiment", found, detail)
        found, varied, detail = check_what_ran(root, truth, records, manifest)
        fail("what ran is what was frozen", found, detail)
        notes.extend(f"{directory}: {v}" for v in varied)
        fail("time order", *check_time(truth, records))
        fail("tag signature", *check_signature(root, truth, signers))
    else:
        row("tag freezes the experiment", True, "NOT PREREGISTERED: no tag binds these records (they prove nothing "
            "about a frozen experiment)")
        notes.extend(f"{directory}: {v}" for v in check_versions(records)[1])
        problems.extend(check_versions(records)[0])
    if anchor is not None:
        found, detail, anchored[directory] = check_anchor(root, truth, records + started, anchor)
        fail("anchored heads", found, detail)
    records = [{**r, "protocol": {**r["protocol"], **proto}} for r in records]  # the statistics use the tag's study
    open_ = unfinished(records, started)
    if plan is not None:
        table, missing, flagged = tally(plan, records, open_)
        for t in table:
            notes.append(f"{directory}: {t['study']} / {t['config']} / {t['arm']}: planned {t['planned']}, ok {t['ok']}, "
                         f"failed {t['failed']}, interrupted {t['interrupted']}, missing {t['missing']}, "
                         f"superseded {t['superseded']}")
        notes.extend(f"{directory}: out of plan order: {x}" for x in flagged)
        latest = latest_unit(records)
        for unit in sorted(u for u, k in latest.items() if k > 1):
            n = sum(1 for r in records if r["spec"]["unit"] == unit and r.get("unit_attempt", 1) < latest[unit])
            notes.append(f"{directory}: unit {unit} ran again whole: analysed from its unit attempt {latest[unit]}; "
                         f"{n} superseded attempt(s) kept")
        if missing:
            notes.append(f"{directory}: INCOMPLETE: {missing} of {len(plan)} planned runs have no ok record")
    notes.extend(f"{directory}: interrupted (started, no record): {u['run_id']} attempt {u['attempt']} started at "
                 f"{u['started_at']} on {u['node']} (ledger seq {u['seq']})" for u in open_)
    spath = os.path.join(directory, "summary.json")
    if not os.path.isfile(spath):
        row("summary.json recomputed", True, "no summary.json (run harness report): nothing to compare")
        return
    summary = _read_json(spath)
    if not isinstance(summary, dict):
        problems.append(f"{spath}: not a JSON summary (harness report writes it again)")
        row("summary.json recomputed", False, "summary.json unreadable")
        return
    before = len(problems)
    if not self_hash_ok(summary):
        problems.append(f"{spath}: field sha256 = {summary.get('sha256')!r} does not match its content")
    mine = recompute(records, started)
    theirs = {k: v for k, v in summary.items() if k != "sha256"}
    n = compare("summary", mine, theirs, problems, spath)
    row("summary.json recomputed", len(problems) == before, f"{n} values compared, {len(problems) - before} mismatches")


def _read_json(path: str, raw: bytes | None = None) -> object:
    """The JSON value in ``path`` (or ``raw``), or ``None`` where it is not JSON."""
    try:
        if raw is None:
            with open(path, "rb") as f:
                raw = f.read()
        return json.loads(raw)
    except (OSError, ValueError):
        return None


def audit_empty(directory: str, manifest: dict, started: list[dict], published: tuple[int, str] | None,
                anchor: str | None, fail: object, notes: list[str]) -> None:
    """A folder with no record yet: what it can still prove. Started entries with no record are listed
    as interrupted attempts; a MANIFEST head, a published head or an anchor that promises entries the
    folder does not hold is a failure (records were removed)."""
    head = manifest.get("ledger_head") or {}
    found = []
    seq = head.get("seq") or 0
    if seq > len(started):
        found.append(f"{os.path.join(directory, 'MANIFEST')}: ledger_head seq {seq}, but the folder holds "
                     f"{len(started)} ledger entries and no record: records were removed")
    if published is not None:
        found.append(f"--head {published[0]}:{published[1][:16]}...: the folder holds no record at that position")
    if anchor is not None:
        found.append(f"--anchor {anchor}: the folder holds no record to check the anchored heads against")
    fail("ledger of a folder with no record", found, f"no record yet; {len(started)} started entries")  # type: ignore[operator]
    notes.extend(f"{directory}: interrupted (started, no record): {u['run_id']} attempt {u['attempt']} started at "
                 f"{u['started_at']} on {u['node']} (ledger seq {u['seq']})" for u in unfinished([], started))


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="public_audit.py", description="Verify a study's records with the Python standard library alone: "
        "hashes, the ledger, the tag and what it froze, and every statistic recomputed (docs/provenance.md).")
    ap.add_argument("dirs", nargs="*", metavar="RECORDS_DIR",
                    help="records folders (default: every folder under records/ that holds a MANIFEST)")
    ap.add_argument("--head", metavar="SEQ:SHA256",
                    help="a ledger head you published: its seq and full 64-hex-digit sha256 must be in the chain")
    ap.add_argument("--anchor", metavar="REMOTE",
                    help="a git remote whose refs/ledger/protocol-<id> holds the heads harness run --anchor pushed")
    ap.add_argument("--allowed-signers", metavar="FILE",
                    help="git's allowed-signers file to verify a signed protocol tag against")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    published = None
    args = parse_args(argv)
    head, anchor, signers = args.head, args.anchor, args.allowed_signers
    if head is not None:
        seq, _, sha = head.partition(":")
        if not seq.isdigit() or not re.fullmatch(r"[0-9a-f]{64}", sha):
            print("public audit: --head takes SEQ:SHA256, the full 64-hex-digit sha256 of the ledger head you "
                  "published (a prefix can be matched by a forged chain)")
            return 2
        published = (int(seq), sha)
    if anchor is not None and os.path.exists(anchor):
        anchor = os.path.abspath(anchor)
    if signers is not None and not os.path.isfile(signers):
        print(f"public audit: --allowed-signers {signers}: no such file")
        return 2
    dirs = args.dirs
    missing = [d for d in dirs if not os.path.isdir(d)]
    if missing:
        print(f"public audit: {', '.join(missing)}: no such records folder")
        return 2
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
    anchored: dict = {}
    for d in dirs:
        audit_dir(d, rows, problems, notes, published, anchor=anchor, signers=signers, anchored=anchored)
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
    else:
        incomplete = [n for n in notes if "INCOMPLETE:" in n]
        print("Integrity: everything matched." + (" The study is INCOMPLETE (see above)." if incomplete else ""))
    print(anchor_line(published, anchor, anchored))
    return 1 if problems else 0


def anchor_line(published: tuple[int, str] | None, anchor: str | None, anchored: dict) -> str:
    """The last line: how far the chain is anchored outside the records, or that it is not."""
    if published is None and anchor is None:
        return ("NOT ANCHORED: no published head (--head SEQ:SHA256) and no anchor ref (--anchor REMOTE) were given, so "
                "nothing here shows that the records were not redrawn and resealed after the fact.")
    parts = []
    if published is not None:
        parts.append(f"the published head seq {published[0]}")
    if anchor is not None:
        parts.append(f"the anchor ref in {anchor} (up to seq {', '.join(str(v) for v in anchored.values()) or 0})")
    return f"Anchored: the chain was checked against {' and '.join(parts)}; records after that are not anchored."


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The preregistered hypotheses' tests and decisions, re-implemented: t tests on the per-pair values
(period-adjusted too), signed-rank tests, fixed-sequence and Holm procedures, sensitivity."""

from __future__ import annotations

import math
import sys

from .descriptive import magnitude_problem, number, pct, per_pair
from .tdist import student_t_sf_signed, t_critical

ENDPOINT_KEYS = {
    "training_time": "training_s",
    "time_to_target": "time_to_target_s",
    "total_time": "total_s",
    "test_bpb": "test_bpb",
    "peak_memory": "peak_memory_bytes",
}
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


def passes(t: dict, alpha: float) -> bool:
    """analysis.ttests.passes: t > t_critical(alpha, df) (1 + 1e-12) for t tests, p < alpha for ranks."""
    if t["method"] == "signed-rank":
        return t["p_value"] < alpha
    return t["statistic"] > t_critical(alpha, t["df"]) * (1.0 + 1e-12)


def gate(h: dict, spec: dict, done: dict) -> str | None:
    if done.get("complete") is False and not done.get("budget_stop"):
        return f"incomplete: {done['missing_runs']} of {done['planned_runs']} planned runs have no ok record"
    if (
        done.get("budget_stop")
        and h["endpoint"] in TIME_ENDPOINTS
        and not spec.get("decide_time_after_budget_stop")
    ):
        return (
            "stopped by the budget rule, which depends on run times, this endpoint's outcome; the "
            "protocol did not preregister deciding time endpoints after such a stop "
            "(decide_time_after_budget_stop)"
        )
    return None


def decide(spec: dict, pairs_of: dict, done: dict) -> list[dict]:
    tests, alpha = spec["tests"], spec["family_alpha"]
    results: list[tuple[dict, dict | None, str | None, dict | None]] = []
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
                status[h["id"]], used[h["id"]] = (
                    ("not reached", f"a failed prerequisite in the hierarchy: {failed}"),
                    None,
                )
            elif t is None:
                status[h["id"]], used[h["id"]], failed = ("not reached", why), alpha, h["id"]
            else:
                used[h["id"]] = alpha
                ok = passes(t, alpha)
                status[h["id"]] = ("established" if ok else "not established", None)
                failed = None if ok else h["id"]
    else:
        m = len(tests)

        def p_value(i: int) -> float:  # a hypothesis not reached sorts as p = 1
            t = results[i][1]
            return t["p_value"] if t else 1.0

        order = sorted(range(m), key=lambda i: (p_value(i), i))
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
                tau = (
                    f"{h['restriction_s']:g} s"
                    if h.get("restriction_s")
                    else "the pair's shorter training time"
                )
                estimate_of = f"{h['estimand']} of the restricted times min(T, tau), tau = {tau}"
        if t is not None and a is not None and not rank:
            level = 1.0 - 2.0 * a
            q = t_critical(a, t["df"])
            low, high = t["estimate"] - q * t["standard_error"], t["estimate"] + q * t["standard_error"]
            if rr:
                low, high = pct(high), pct(low)
        out.append(
            {
                "id": h["id"],
                "study": h["study"],
                "config": h["config"],
                "endpoint": h["endpoint"],
                "estimand": h["estimand"],
                "type": h["type"],
                "margin": h["margin"],
                "better": h["better"],
                "status": st,
                "reason": reason,
                "alpha": a,
                "test": t,
                "estimate": estimate,
                "estimate_of": estimate_of,
                "low": low,
                "high": high,
                "level": level,
                "unreached": unreached,
                "text": decision_text(h, st, reason, t, a, low, high, done),
            }
        )
    return out


def decision_text(
    h: dict,
    status: str,
    reason: str | None,
    t: dict | None,
    a: float | None,
    low: float | None,
    high: float | None,
    done: dict,
) -> str:
    what = {
        "superiority": "superiority",
        "non_inferiority": f"non-inferiority (margin {h['margin']:g})",
        "equivalence": f"equivalence (margin {h['margin']:g})",
    }[h["type"]]
    head = f"{h['id']}: {what} of {h['endpoint']} ({h['estimand']}, {h['better']} is better)"
    if t is None:
        return f"{head}: not reached ({reason})"
    stats = f"p = {t['p_value']:.3g} against alpha {a:.3g}" if a is not None else f"p = {t['p_value']:.3g}"
    if low is not None and a is not None:  # an interval is made only at a level: a is set
        stats += f"; {100 * (1 - 2 * a):.4g}% interval {low:+.5g} to {high:+.5g}"
    verdict = status if reason is None else f"{status} ({reason})"
    prefix = ""
    if done.get("budget_stop"):
        prefix = (
            "(study stopped by its budget rule; the stop depended on run times, this endpoint's outcome) "
            if h["endpoint"] in TIME_ENDPOINTS
            else "(study stopped by its budget rule) "
        )
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
    return {
        "pairs_with_a_failed_arm": len(failed),
        "failed_candidate": sum(f["failed"] == "candidate" for f in failed),
        "n": worst["n"],
        "statistic": worst["statistic"],
        "p_value": worst["p_value"],
        "method": "signed-rank of the distances from the hypothesis' bound"
        + (" (both bounds, the larger p)" if len(parts) == 2 else "")
        + "; a failed arm ranks worse than every observed pair",
    }

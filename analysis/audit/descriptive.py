"""The summary's descriptive statistics, re-implemented: intervals of paired endpoints, order
effects (crossover, drift), devices and factorial positions."""

from __future__ import annotations

import math

from .tdist import betainc_reg, student_t_ppf, student_t_sf

CELLS = ("native", "bucketed", "packed", "cotangent")


def interval(values: list[float], level: float, estimand: str) -> dict:
    """Student-t interval of the mean; ``relative_reduction``: ``100 (1 - exp)`` of the log ratio's."""
    n = len(values)
    m = math.fsum(values) / n
    var = math.fsum((x - m) ** 2 for x in values) / (n - 1)
    se = math.sqrt(var / n)
    t = student_t_ppf((1.0 + level) / 2.0, n - 1)
    out = {
        "estimand": estimand,
        "estimate": m,
        "low": m - t * se,
        "high": m + t * se,
        "df": n - 1,
        "n": n,
        "standard_error": se,
        "level": level,
        "ratio": None,
        "ratio_low": None,
        "ratio_high": None,
    }
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
    return (
        isinstance(x, (int, float))
        and not isinstance(x, bool)
        and math.isfinite(x)
        and (x > 0 or not positive)
    )


def endpoint(b0: list, c0: list, level: float, estimand: str) -> dict:
    ok = [
        (x, y)
        for x, y in zip(b0, c0)
        if number(x, estimand != "difference") and number(y, estimand != "difference")
    ]
    b, c = [x for x, _ in ok], [y for _, y in ok]
    return {
        "pairs": len(b),
        "invalid_pairs": len(b0) - len(b),
        "baseline_mean": math.fsum(b) / len(b) if b else None,
        "candidate_mean": math.fsum(c) / len(c) if c else None,
        "interval": paired(b, c, level, estimand),
    }


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
    return {
        "estimate": est,
        "standard_error": se,
        "low": est - q * se,
        "high": est + q * se,
        "df": df,
        "level": level,
        "p_value": p,
        "n": [n1, n2],
    }


def crossover(pairs: list[dict], level: float) -> dict | None:
    ab = [p for p in pairs if p["first"] == "baseline"]
    ba = [p for p in pairs if p["first"] != "baseline"]
    if len(ab) < 2 or len(ba) < 2:
        return None
    d = lambda p: math.log(p["candidate_training_s"] / p["baseline_training_s"])  # noqa: E731
    s = lambda p: math.log(p["candidate_training_s"]) + math.log(p["baseline_training_s"])  # noqa: E731
    return {
        "period": two_groups([d(p) for p in ab], [d(p) for p in ba], level, True),
        "carryover": two_groups([s(p) for p in ab], [s(p) for p in ba], level, False),
    }


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
    return {
        "slope": b1,
        "intercept": b0,
        "standard_error": se,
        "low": b1 - q * se,
        "high": b1 + q * se,
        "df": df,
        "level": level,
        "p_value": p,
        "points": [[a, b] for a, b in zip(x, y)],
    }


def by_device(pairs: list[dict], level: float) -> dict | None:
    groups: dict = {}
    for p in pairs:
        groups.setdefault(p["device"], []).append(
            math.log(p["candidate_training_s"] / p["baseline_training_s"])
        )
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
        het = {
            "F": f,
            "df": [d1, d2],
            "p_value": betainc_reg(d2 / 2, d1 / 2, d2 / (d2 + d1 * f), d1 * f / (d2 + d1 * f)),
        }
    return {"devices": rows, "heterogeneity": het}


def positions(blocks: list[dict], level: float, cells: tuple | list = CELLS) -> list[dict] | None:
    if len(blocks) < 2:
        return None
    out = []
    for pos in range(len(cells)):
        res = []
        for b in blocks:
            logs = {c: math.log(b[f"{c}_training_s"]) for c in cells}
            res.append(logs[b["order"][pos]] - math.fsum(logs.values()) / len(cells))
        m = math.fsum(res) / len(res)
        se = math.sqrt(math.fsum((v - m) ** 2 for v in res) / (len(res) - 1) / len(res))
        q = student_t_ppf((1 + level) / 2, len(res) - 1)
        out.append(
            {
                "position": pos + 1,
                "estimate": m,
                "standard_error": se,
                "low": m - q * se,
                "high": m + q * se,
                "df": len(res) - 1,
                "level": level,
            }
        )
    return out


def magnitude_problem(groups: list[list[float]]) -> str | None:
    """analysis.ttests.magnitude_problem: deviations whose squares a double cannot hold."""
    top = max(abs(x) for g in groups for x in g)
    if top > 1e150:
        return (
            f"extreme magnitudes: per-pair values up to {top:.3g}, beyond 1e+150, whose squares overflow "
            "a double"
        )
    dev = max(abs(x - math.fsum(g) / len(g)) for g in groups for x in g)
    if 0 < dev < 1e-150:
        return (
            f"extreme magnitudes: the per-pair values deviate from their mean by at most {dev:.3g}, "
            "below 1e-150, whose squares underflow a double"
        )
    return None

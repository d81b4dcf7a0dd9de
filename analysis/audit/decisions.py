"""The preregistered family's decisions, re-implemented: the gates (completeness, the budget
rule), the fixed-sequence and Holm procedures, each decision's interval and sentence, and the
sensitivity analysis of pairs with a failed arm. Each hypothesis' test is in :mod:`.hypotheses`."""

from __future__ import annotations

from .descriptive import pct
from .hypotheses import hyp_test, hyp_values, region, sign
from .ranks import signed_rank
from .tdist import t_critical

TIME_ENDPOINTS = ("training_time", "time_to_target", "total_time")


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

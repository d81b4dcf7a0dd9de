"""The decisions a protocol preregisters: one per hypothesis, under the family's multiplicity rule.

Never imports torch. ``analysis/public_audit.py`` recomputes every decision with the standard
library alone; ``tests/test_decisions.py`` cross-checks both against scipy.

Sign convention: per-pair values compare the candidate with the baseline, as
:func:`analysis.stats.paired_values` (``difference = c - b``, ``log_ratio = ln(c / b)``,
``relative_reduction = 100 (1 - c / b)``). ``better: lower`` says the candidate is better when its
endpoint is lower (times, BPB, memory). ``s = +1`` when larger estimand values favour the candidate
(``relative_reduction`` with ``better: lower``), else ``-1``; every test is one-sided on ``s * mean``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from scipy import stats as _st

from analysis.stats import paired_values

ENDPOINT_KEYS = {"training_time": "training_s", "time_to_target": "time_to_target_s", "total_time": "total_s",
                 "test_bpb": "test_bpb", "peak_memory": "peak_memory_bytes"}


@dataclass(frozen=True)
class TestResult:
    """One one-sided test of a hypothesis.

    Attributes
    ----------
    method : str
        ``t`` (paired Student t on the per-pair values), ``t-period-adjusted`` (two-period crossover)
        or ``signed-rank`` (Wilcoxon signed-rank on worst-rank differences).
    n : int
        Pairs in the test (for ``signed-rank``: non-zero differences).
    estimate, standard_error : float
        Mean of the per-pair values and its standard error (``t``); for ``signed-rank`` the median of
        the differences and ``None``.
    df : int
        Degrees of freedom of the t test (``n - 1``; ``n - 2`` period-adjusted; 0 for ranks).
    statistic, p_value : float
        Test statistic and one-sided p-value against the hypothesis' null.
    """

    method: str
    n: int
    estimate: float
    standard_error: float | None
    df: int
    statistic: float
    p_value: float


def direction(estimand: str, better: str) -> int:
    """``s``: +1 when larger values of ``estimand`` favour the candidate, else -1."""
    larger_is_less = estimand == "relative_reduction"  # 100 (1 - c/b) grows as c shrinks
    return 1 if (better == "lower") == larger_is_less else -1


def t_test(values: Sequence[float], s: int, kind: str, margin: float) -> TestResult:
    """One-sided paired t test on ``s * mean``.

    Notes
    -----
    With mean ``m``, standard error ``se = sd / sqrt(n)``, ``df = n - 1`` and ``u = s m``:

    * superiority (margin ``d >= 0``): H0 ``u <= d``; ``t = (u - d) / se``; ``p = P(T_df >= t)``;
    * non-inferiority (margin ``d > 0``): H0 ``u <= -d``; ``t = (u + d) / se``; ``p = P(T_df >= t)``;
    * equivalence (TOST, margin ``d > 0``): ``p = max(P(T >= (u + d)/se), P(T >= (d - u)/se))``,
      the statistic reported is the smaller of the two t values.
    """
    n = len(values)
    m = math.fsum(values) / n
    se = math.sqrt(math.fsum((x - m) ** 2 for x in values) / (n - 1) / n)
    return _t_result("t", n, m, se, n - 1, s, kind, margin)


def _t_result(method: str, n: int, m: float, se: float, df: int, s: int, kind: str, margin: float) -> TestResult:
    u = s * m
    if kind == "superiority":
        t = (u - margin) / se
        p = float(_st.t.sf(t, df))
    elif kind == "non_inferiority":
        t = (u + margin) / se
        p = float(_st.t.sf(t, df))
    else:
        t1, t2 = (u + margin) / se, (margin - u) / se
        t, p = min(t1, t2), max(float(_st.t.sf(t1, df)), float(_st.t.sf(t2, df)))
    return TestResult(method, n, m, se, df, t, p)


def period_adjusted(values: Sequence[float], first: Sequence[str], s: int, kind: str, margin: float) -> TestResult:
    """Two-period crossover (AB/BA) treatment effect, adjusted for a period effect.

    Notes
    -----
    With ``d_i`` the per-pair values of the pairs that ran the baseline first (group AB, ``n1``) and
    the candidate first (BA, ``n2``): estimate ``(mean_AB + mean_BA) / 2``, standard error
    ``sqrt(s_p^2 (1/n1 + 1/n2)) / 2`` with the pooled variance ``s_p^2`` and ``df = n1 + n2 - 2``
    (Jones & Kenward, *Design and Analysis of Cross-Over Trials*, 3rd ed., 2.3). A period effect
    then cancels instead of inflating the variance.
    """
    ab = [v for v, f in zip(values, first) if f == "baseline"]
    ba = [v for v, f in zip(values, first) if f != "baseline"]
    n1, n2 = len(ab), len(ba)
    m1, m2 = math.fsum(ab) / n1, math.fsum(ba) / n2
    sp2 = (math.fsum((x - m1) ** 2 for x in ab) + math.fsum((x - m2) ** 2 for x in ba)) / (n1 + n2 - 2)
    se = math.sqrt(sp2 * (1 / n1 + 1 / n2)) / 2
    return _t_result("t-period-adjusted", n1 + n2, (m1 + m2) / 2, se, n1 + n2 - 2, s, kind, margin)


def worst_rank_differences(b: Sequence[float | None], c: Sequence[float | None]) -> list[float]:
    """Per-pair ``ln(c / b)`` where both arms reached the target; an unreached arm ranks worse than
    every reached time (worst-rank imputation, Lachin 1999, *Controlled Clinical Trials* 20:408):
    ``+W`` if only the candidate missed it, ``-W`` if only the baseline did, ``0`` if both, with
    ``W = 1 + 2 max |ln(c/b)|`` larger than every observed difference."""
    finite = [math.log(y / x) for x, y in zip(b, c) if x is not None and y is not None]
    w = 1.0 + 2.0 * max((abs(v) for v in finite), default=0.0)
    out = []
    for x, y in zip(b, c):
        if x is not None and y is not None:
            out.append(math.log(y / x))
        elif x is None and y is None:
            out.append(0.0)
        else:
            out.append(w if y is None else -w)
    return out


def signed_rank(d: Sequence[float], s: int) -> TestResult:
    """One-sided Wilcoxon signed-rank test that the differences favour the candidate (sign ``s``).

    Notes
    -----
    Zeros are dropped (Wilcox's method); ties get average ranks. ``T+`` is the sum of the ranks of
    the differences with sign ``s``. Exact null distribution (all ``2^n`` sign patterns, by dynamic
    programming over rank sums) when there are no ties and ``n <= 50``; otherwise the normal
    approximation with tie correction, ``z = (T+ - n(n+1)/4) / sqrt(n(n+1)(2n+1)/24 - sum(t^3 - t)/48)``,
    without continuity correction (scipy.stats.wilcoxon's ``exact`` and ``approx`` methods).
    """
    nz = [s * x for x in d if x != 0.0]
    n = len(nz)
    med = float(sorted(d)[len(d) // 2]) if len(d) % 2 else (sorted(d)[len(d) // 2 - 1] + sorted(d)[len(d) // 2]) / 2
    if n == 0:
        return TestResult("signed-rank", 0, med, None, 0, 0.0, 1.0)
    ranks = _average_ranks([abs(x) for x in nz])
    t_plus = math.fsum(r for r, x in zip(ranks, nz) if x > 0)
    ties = len(set(abs(x) for x in nz)) != n
    if not ties and n <= 50:
        counts = [1] + [0] * (n * (n + 1) // 2)
        for k in range(1, n + 1):
            for total in range(len(counts) - 1, k - 1, -1):
                counts[total] += counts[total - k]
        p = math.fsum(counts[int(round(t_plus)):]) / 2.0**n
        return TestResult("signed-rank", n, med, None, 0, t_plus, p)
    groups: dict[float, int] = {}
    for x in nz:
        groups[abs(x)] = groups.get(abs(x), 0) + 1
    var = n * (n + 1) * (2 * n + 1) / 24.0 - math.fsum(t**3 - t for t in groups.values()) / 48.0
    z = (t_plus - n * (n + 1) / 4.0) / math.sqrt(var)
    return TestResult("signed-rank", n, med, None, 0, t_plus, 0.5 * math.erfc(z / math.sqrt(2.0)))


def _average_ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


@dataclass(frozen=True)
class HypothesisDecision:
    """The decision on one preregistered hypothesis (``status``: established, not established, not reached)."""

    id: str
    study: str
    config: str
    endpoint: str
    estimand: str
    type: str
    margin: float
    better: str
    status: str
    reason: str | None
    alpha: float | None
    test: dict[str, Any] | None
    low: float | None
    high: float | None
    level: float | None
    unreached: dict[str, int] | None
    text: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _values(h: dict[str, Any], pairs: list[dict[str, Any]]) -> tuple[list[float], list[str], dict[str, int] | None]:
    key = ENDPOINT_KEYS[h["endpoint"]]
    b = [p[f"baseline_{key}"] for p in pairs]
    c = [p[f"candidate_{key}"] for p in pairs]
    first = [p["first"] for p in pairs]
    unreached = None
    if h["endpoint"] == "time_to_target":
        unreached = {"baseline": sum(x is None for x in b), "candidate": sum(y is None for y in c),
                     "both": sum(x is None and y is None for x, y in zip(b, c))}
        if h["censoring"] == "worst_rank":
            return worst_rank_differences(b, c), first, unreached
        # restricted mean: an unreached arm counts its whole training time (the budget)
        b = [x if x is not None else p["baseline_training_s"] for x, p in zip(b, pairs)]
        c = [y if y is not None else p["candidate_training_s"] for y, p in zip(c, pairs)]
    return paired_values(b, c, h["estimand"]), first, unreached


def _test(h: dict[str, Any], pairs: list[dict[str, Any]], min_pairs: int) -> tuple[TestResult | None, str | None,
                                                                                     dict[str, int] | None]:
    if len(pairs) < min_pairs:
        return None, f"too few pairs: {len(pairs)} of the protocol's min_pairs {min_pairs}", None
    values, first, unreached = _values(h, pairs)
    s = direction(h["estimand"], h["better"])
    if h["endpoint"] == "time_to_target" and h["censoring"] == "worst_rank":
        if all(v == 0.0 for v in values):
            return None, "identical: every pair's difference is exactly 0", unreached
        return signed_rank(values, s), None, unreached
    if all(v == values[0] for v in values):
        what = "identical: every pair's difference is exactly 0" if values[0] == 0.0 else "zero spread"
        return None, what, unreached
    if h.get("period_adjusted"):
        if min(first.count("baseline"), len(first) - first.count("baseline")) < 2:
            return None, "the period-adjusted estimand needs at least two pairs in each order", unreached
        return period_adjusted(values, first, s, h["type"], h["margin"]), None, unreached
    return t_test(values, s, h["type"], h["margin"]), None, unreached


def decide(spec: dict[str, Any], pairs_of: dict[tuple[str, str], list[dict[str, Any]]],
           completeness: dict[str, Any]) -> list[HypothesisDecision]:
    """Every hypothesis' decision, in the protocol's order.

    Parameters
    ----------
    spec
        The protocol's ``hypotheses`` block as records carry it (``procedure``, ``family_alpha``,
        ``min_pairs``, ``tests``).
    pairs_of
        The used pairs per (study, configuration), as :func:`analysis.summary.derive` builds them.
    completeness
        :func:`analysis.summary.completeness` of the records.

    Notes
    -----
    ``fixed_sequence``: each hypothesis in order at the family's alpha; after the first one not
    established, the rest are not reached (a failed prerequisite). ``holm``: p-values sorted
    ascending, the k-th (from 1) compared with ``alpha / (m - k + 1)``; the first failure stops
    the procedure (Holm, 1979, *Scand. J. Statist.* 6:65). A hypothesis without a test (too few
    pairs, zero spread, incomplete) counts as ``p = 1``. The interval shown is two-sided at
    ``1 - 2 alpha_used`` (its favourable end is the one-sided bound the test compares).
    """
    tests = spec["tests"]
    alpha = spec["family_alpha"]
    gate = None
    if completeness.get("complete") is False and not completeness.get("budget_stop"):
        gate = f"incomplete: {completeness['missing_runs']} of {completeness['planned_runs']} planned runs have no ok record"
    results = []
    for h in tests:
        pairs = pairs_of.get((h["study"], h["config"]), [])
        if gate is not None:
            results.append((h, None, gate, None))
        else:
            t, why, unreached = _test(h, pairs, spec["min_pairs"])
            results.append((h, t, why, unreached))
    m = len(tests)
    used: dict[str, float | None] = {}
    status: dict[str, tuple[str, str | None]] = {}
    if spec["procedure"] == "fixed_sequence":
        failed = None
        for h, t, why, _ in results:
            if failed is not None:
                status[h["id"]] = ("not reached", f"a failed prerequisite in the hierarchy: {failed}")
                used[h["id"]] = None
            elif t is None:
                status[h["id"]], used[h["id"]] = ("not reached", why), alpha
                failed = h["id"]
            else:
                used[h["id"]] = alpha
                ok = t.p_value < alpha
                status[h["id"]] = ("established" if ok else "not established", None)
                failed = None if ok else h["id"]
    else:
        order = sorted(range(m), key=lambda i: (results[i][1].p_value if results[i][1] else 1.0, i))
        stopped = False
        for k, i in enumerate(order):
            h, t, why, _ = results[i]
            a = alpha / (m - k)
            used[h["id"]] = a
            if t is None:
                status[h["id"]] = ("not reached", why)
                stopped = True
            elif stopped:
                status[h["id"]] = ("not established", "Holm's procedure stopped at an earlier hypothesis")
            else:
                ok = t.p_value < a
                status[h["id"]] = ("established" if ok else "not established", None)
                stopped = not ok
    out = []
    for h, t, _why, unreached in results:
        st, reason = status[h["id"]]
        a = used[h["id"]]
        low = high = level = None
        if t is not None and a is not None and t.method != "signed-rank":
            level = 1.0 - 2.0 * a
            q = float(_st.t.ppf(1.0 - a, t.df))
            low, high = t.estimate - q * t.standard_error, t.estimate + q * t.standard_error
        text = _text(h, st, reason, t, a, low, high, completeness)
        out.append(HypothesisDecision(
            id=h["id"], study=h["study"], config=h["config"], endpoint=h["endpoint"], estimand=h["estimand"],
            type=h["type"], margin=h["margin"], better=h["better"], status=st, reason=reason, alpha=a,
            test=asdict(t) if t is not None else None, low=low, high=high, level=level, unreached=unreached, text=text,
        ))
    return out


def _text(h: dict[str, Any], status: str, reason: str | None, t: TestResult | None, a: float | None,
          low: float | None, high: float | None, completeness: dict[str, Any]) -> str:
    what = {"superiority": "superiority", "non_inferiority": f"non-inferiority (margin {h['margin']:g})",
            "equivalence": f"equivalence (margin {h['margin']:g})"}[h["type"]]
    head = f"{h['id']}: {what} of {h['endpoint']} ({h['estimand']}, {h['better']} is better)"
    if t is None:
        return f"{head}: not reached ({reason})"
    stats = f"p = {t.p_value:.3g} against alpha {a:.3g}" if a is not None else f"p = {t.p_value:.3g}"
    if low is not None:
        stats += f"; {100 * (1 - 2 * a):.4g}% interval {low:+.5g} to {high:+.5g}"
    verdict = status if reason is None else f"{status} ({reason})"
    prefix = "(study stopped by its budget rule) " if completeness.get("budget_stop") else ""
    return f"{prefix}{head}: {verdict}; {stats}"


def sensitivity(h: dict[str, Any], pairs: list[dict[str, Any]], failed: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Pre-specified sensitivity analysis: a pair whose arm failed counts as adverse to that arm.

    Notes
    -----
    The hypothesis' per-pair values of the used pairs, plus, for each pair with one failed and one
    ok arm, a value ``W = 1 + 2 max |value|`` on the side adverse to the failed arm (worse than any
    observed pair); then the one-sided signed-rank test (:func:`signed_rank`). It never changes the
    decision; it shows whether excluding failed pairs could have produced it. ``None`` when no pair
    has a failed arm.
    """
    if not failed:
        return None
    values = _values(h, pairs)[0] if pairs else []
    s = direction(h["estimand"], h["better"])
    w = 1.0 + 2.0 * max((abs(v) for v in values), default=0.0)
    extra = [(-s * w) if f["failed"] == "candidate" else (s * w) for f in failed]
    t = signed_rank(values + extra, s)
    return {"pairs_with_a_failed_arm": len(failed), "failed_candidate": sum(f["failed"] == "candidate" for f in failed),
            "n": t.n, "statistic": t.statistic, "p_value": t.p_value,
            "method": "signed-rank; a failed arm ranks worse than every observed pair"}

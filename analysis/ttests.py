"""One-sided paired t tests of a hypothesis, on the scale the decision is made on.

Never imports torch. ``analysis/public_audit.py`` re-implements them with the standard library.

The test scale: ``difference`` hypotheses are tested on ``c - b``; ``log_ratio`` and
``relative_reduction`` hypotheses both on the log ratio ``L = ln c - ln b``, so the two estimands
give the same decision, and swapping the arms (``L -> -L``) while flipping ``better`` gives the
mirror decision bit for bit. A hypothesis becomes an alternative region ``lo < mean < hi`` for the
mean on that scale (:func:`bounds`; ``None``: unbounded).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats as _st

from analysis.preregistration import Hypothesis
from analysis.public_audit import t_critical


@dataclass(frozen=True)
class TestResult:
    """One test of a hypothesis.

    Attributes
    ----------
    method : str
        ``t`` (paired Student t on the per-pair values), ``t-period-adjusted`` (two-period crossover)
        or ``signed-rank`` (Wilcoxon signed-rank on worst-rank scores).
    n : int
        Pairs in the test (for ``signed-rank``: non-zero scores).
    estimate, standard_error : float
        ``t``: the mean of the per-pair values on the test scale and its standard error;
        ``signed-rank``: the estimate ``estimate_of`` names, and ``None``.
    df : int
        Degrees of freedom of the t test (``n - 1``; ``n - 2`` period-adjusted; 0 for ranks).
    statistic, p_value : float
        Test statistic (``T+`` for ranks; for equivalence the smaller of the two t values) and the
        one-sided p-value against the hypothesis' null.
    estimate_of : str
        What ``estimate`` is, in words.
    """

    method: str
    n: int
    estimate: float | None
    standard_error: float | None
    df: int
    statistic: float
    p_value: float
    estimate_of: str = ""


def scale(estimand: str) -> str:
    """The test scale of an estimand: ``log_ratio`` for both ratio estimands, else ``difference``."""
    return "difference" if estimand == "difference" else "log_ratio"


def sign(better: str) -> int:
    """``s``: +1 when larger values on the test scale favour the candidate (``better: higher``), else -1."""
    return 1 if better == "higher" else -1


def one_sided(s: int, kind: str, margin: float) -> tuple[float | None, float | None]:
    """The alternative region ``(lo, hi)`` of a hypothesis whose margin is in test-scale units.

    Superiority: ``s m > d``; non-inferiority: ``s m > -d``; equivalence: ``-d < m < d``.
    """
    if kind == "equivalence":
        return -margin, margin
    bound = s * margin if kind == "superiority" else -s * margin
    return (bound, None) if s > 0 else (None, bound)


def bounds(h: Hypothesis | Mapping[str, Any]) -> tuple[float | None, float | None]:
    """The alternative region of hypothesis ``h`` for the mean on its test scale.

    Notes
    -----
    ``difference`` and ``log_ratio``: :func:`one_sided` with the margin as written. ``relative_reduction``
    ``E = 100 (1 - exp(L))`` is decreasing in ``L``, with inverse ``g(x) = ln(1 - x/100)``: with
    ``better: lower`` superiority ``E > d`` is ``L < g(d)`` and non-inferiority ``E > -d`` is
    ``L < g(-d)``; with ``better: higher`` they are ``E < -d`` (``L > g(-d)``) and ``E < d``
    (``L > g(d)``); equivalence ``-d < E < d`` is ``g(d) < L < g(-d)``. A relative margin is a
    percentage of the baseline, so its mirror (arms swapped) is the margin ``100 d / (100 - d)``.
    """
    if isinstance(h, Hypothesis):
        d, kind, estimand, better = h.margin, h.type, h.estimand, h.better
    else:  # the four keys that define the region suffice
        d, kind, estimand, better = float(h.get("margin", 0.0)), h["type"], h["estimand"], h["better"]
    if estimand != "relative_reduction":
        return one_sided(sign(better), kind, d)

    def g(x: float) -> float:
        return math.log1p(-x / 100.0)

    if kind == "equivalence":
        return g(d), g(-d)
    e = d if kind == "superiority" else -d
    return (None, g(e)) if better == "lower" else (g(-e), None)


def t_result(
    method: str, n: int, m: float, se: float, df: int, region: tuple[float | None, float | None]
) -> TestResult:
    """The one-sided t test(s) of ``lo < mean < hi`` given the mean ``m`` and its standard error.

    Notes
    -----
    Lower bound: ``t = (m - lo) / se``; upper: ``t = (hi - m) / se``; ``p = P(T_df >= t)``. With both
    (equivalence, TOST; Schuirmann 1987, *J. Pharmacokinet. Biopharm.* 15:657) ``p`` is the larger
    of the two p-values and the statistic the smaller t.
    """
    lo, hi = region
    ts = ([(m - lo) / se] if lo is not None else []) + ([(hi - m) / se] if hi is not None else [])
    p = max(float(_st.t.sf(t, df)) for t in ts)
    return TestResult(method, n, m, se, df, min(ts), p, _MEAN[method])


def critical_t(alpha: float, df: int) -> float:
    """``t_{1 - alpha, df}``, the t value a one-sided test must exceed at level ``alpha``.

    Notes
    -----
    The quantile ``q`` with ``P(T_df > q) = alpha``, found by bisection (to adjacent doubles) on the
    standard library's t survival function of the public audit
    (:func:`analysis.public_audit.t_critical`; accurate to a few ulps, ``tests/test_decision_rules.py``
    checks it against scipy and R's ``qt``). The analysis and the audit decide with this one
    function (:func:`passes`), so they agree even when ``p`` is within rounding of ``alpha``.
    """
    return t_critical(alpha, df)


def passes(t: TestResult, alpha: float) -> bool:
    """Whether a test establishes its hypothesis at level ``alpha``.

    Notes
    -----
    t tests: ``statistic > critical_t(alpha, df) (1 + CRITICAL_MARGIN)`` (for equivalence the
    statistic is the smaller t, so both one-sided tests must pass). This is ``p < alpha`` but for t
    values within ``1e-12`` (relative) of the critical value, where it says "not established": the
    quantile is accurate to about ``1e-13`` relative for ``df`` up to 5000 (checked against scipy), so
    the rule never establishes on a t statistic below the true critical value, and the audit
    computes the same doubles with the same function, so the two implementations cannot disagree.
    Signed-rank: ``p < alpha`` strictly, with ``p`` an exact count over ``2^n`` (the same double in
    both). Strict: a p-value that only reaches alpha (an atom of a discrete distribution) fails.
    """
    if t.method == "signed-rank":
        return t.p_value < alpha
    return t.statistic > critical_t(alpha, t.df) * (1.0 + CRITICAL_MARGIN)


#: The relative margin by which a t statistic must exceed the critical value (:func:`passes`).
CRITICAL_MARGIN = 1e-12


#: Per-pair deviations whose squares a double holds without underflow or overflow.
SQUARE_RANGE = (1e-150, 1e150)


def magnitude_problem(groups: Sequence[Sequence[float]]) -> str | None:
    """Why the standard error of these groups' values cannot be computed in doubles, or ``None``.

    Notes
    -----
    The variance sums squares of deviations from the group means; for a deviation beyond
    ``SQUARE_RANGE`` its square overflows (``> 1e300``) or underflows to a subnormal or 0 (all
    deviations exactly 0 are no problem here: that is zero spread). Values beyond ``1e150`` are
    refused first (their mean could overflow too).
    """
    lo, hi = SQUARE_RANGE
    top = max(abs(x) for g in groups for x in g)
    if top > hi:
        return (
            f"extreme magnitudes: per-pair values up to {top:.3g}, beyond {hi:g}, whose squares overflow "
            "a double"
        )
    dev = max(abs(x - math.fsum(g) / len(g)) for g in groups for x in g)
    if 0 < dev < lo:
        return (
            f"extreme magnitudes: the per-pair values deviate from their mean by at most {dev:.3g}, below "
            f"{lo:g}, whose squares underflow a double"
        )
    return None


_MEAN = {
    "t": "mean of the per-pair values",
    "t-period-adjusted": "period-adjusted mean of the per-pair values",
}


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error ``sd / sqrt(n)`` (denominator ``n - 1``)."""
    n = len(values)
    m = math.fsum(values) / n
    return m, math.sqrt(math.fsum((x - m) ** 2 for x in values) / (n - 1) / n)


def t_test(values: Sequence[float], s: int, kind: str, margin: float) -> TestResult:
    """One-sided paired t test on the mean of ``values``, the margin in their units (:func:`one_sided`).

    Notes
    -----
    With mean ``m``, standard error ``se = sd / sqrt(n)`` and ``df = n - 1``: superiority (margin
    ``d >= 0``) tests H0 ``s m <= d`` with ``t = (s m - d) / se``; non-inferiority H0 ``s m <= -d``;
    equivalence both ``m <= -d`` and ``m >= d`` (:func:`t_result`).
    """
    m, se = mean_se(values)
    return t_result("t", len(values), m, se, len(values) - 1, one_sided(s, kind, margin))


def period_adjusted_mean(values: Sequence[float], first: Sequence[str]) -> tuple[float, float, int]:
    """Two-period crossover (AB/BA) treatment effect adjusted for a period effect: ``(estimate, se, df)``.

    Notes
    -----
    With ``d_i`` the per-pair values of the pairs that ran the baseline first (group AB, ``n1``) and
    the candidate first (BA, ``n2``): estimate ``(mean_AB + mean_BA) / 2``, standard error
    ``sqrt(s_p^2 (1/n1 + 1/n2)) / 2`` with the pooled variance ``s_p^2`` and ``df = n1 + n2 - 2``
    (Jones & Kenward, *Design and Analysis of Cross-Over Trials*, 3rd ed., 2.3; R:
    ``lm(d ~ g)`` with sum-to-zero group coding). A period effect then cancels instead of
    inflating the variance.
    """
    ab = [v for v, f in zip(values, first) if f == "baseline"]
    ba = [v for v, f in zip(values, first) if f != "baseline"]
    n1, n2 = len(ab), len(ba)
    m1, m2 = math.fsum(ab) / n1, math.fsum(ba) / n2
    sp2 = (math.fsum((x - m1) ** 2 for x in ab) + math.fsum((x - m2) ** 2 for x in ba)) / (n1 + n2 - 2)
    return (m1 + m2) / 2, math.sqrt(sp2 * (1 / n1 + 1 / n2)) / 2, n1 + n2 - 2


def period_adjusted(
    values: Sequence[float], first: Sequence[str], s: int, kind: str, margin: float
) -> TestResult:
    """The period-adjusted one-sided test (:func:`period_adjusted_mean`, :func:`one_sided`)."""
    m, se, df = period_adjusted_mean(values, first)
    return t_result("t-period-adjusted", len(values), m, se, df, one_sided(s, kind, margin))

"""One-sided paired t tests of a hypothesis, on the scale the decision is made on, with the standard
library alone: their one home, which the analysis' decisions and the audit's recomputation both call
(``tests/test_decisions.py`` checks them against scipy, ``tests/test_references.py`` against R).

The test scale: ``difference`` hypotheses are tested on ``c - b``; ``log_ratio`` and
``relative_reduction`` hypotheses both on the log ratio ``L = ln c - ln b``, so the two estimands
give the same decision, and swapping the arms (``L -> -L``) while flipping ``better`` gives the
mirror decision bit for bit. A hypothesis becomes an alternative region ``lo < mean < hi`` for the
mean on that scale (:func:`.hypotheses.bounds`; ``None``: unbounded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from prereg.descriptive import mean_se
from prereg.tdist import student_t_sf_signed, t_critical


@dataclass(frozen=True)
class TestResult:
    """One test of a hypothesis.

    Attributes
    ----------
    method : str
        ``t`` (paired Student t on the per-pair values), ``t-period-adjusted`` (two-period crossover)
        ``signed-rank`` (Wilcoxon signed-rank on worst-rank scores), ``sign`` (the exact sign test of
        the median, :func:`.hypotheses.sign_result`), ``identity`` (every pair's
        difference exactly 0: :func:`.hypotheses.identity_result`, ``p`` 0 or 1), ``t-order-cells``
        (a lockstep study's four order cells) or ``t-replicates`` (a replicated protocol: the mean of
        its replicates' estimates, ``k - 1`` degrees of freedom).
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
    p = max(student_t_sf_signed(t, df) for t in ts)
    return TestResult(method, n, m, se, df, min(ts), p, MEAN_OF[method])


def critical_t(alpha: float, df: int) -> float:
    """``t_{1 - alpha, df}``, the t value a one-sided test must exceed at level ``alpha``.

    Notes
    -----
    The quantile ``q`` with ``P(T_df > q) = alpha``, found by bisection (to adjacent doubles) on the
    standard library's t survival function (:func:`.tdist.t_critical`; accurate to a few ulps,
    ``tests/test_decision_rules.py`` checks it against scipy and R's ``qt``). The analysis and the
    audit decide with this one function (:func:`passes`).
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
    the rule never establishes on a t statistic below the true critical value.
    Identity (every difference exactly 0): ``p < alpha`` with ``p`` 0 or 1.
    Signed-rank and sign: ``p < alpha`` strictly, with ``p`` an exact count over ``2^n`` (the same double in
    both). Strict: a p-value that only reaches alpha (an atom of a discrete distribution) fails.
    """
    if t.method in ("signed-rank", "identity", "sign"):
        return t.p_value < alpha
    return t.statistic > critical_t(alpha, t.df) * (1.0 + CRITICAL_MARGIN)


#: The relative margin by which a t statistic must exceed the critical value (:func:`passes`).
CRITICAL_MARGIN = 1e-12


#: What a t test's estimate is, by method.
MEAN_OF = {
    "t": "mean of the per-pair values",
    "t-period-adjusted": "period-adjusted mean of the per-pair values",
    "t-order-cells": "mean of the four order cells' means (build order x first block)",
    "t-replicates": "mean of the replicates' estimates (t with k - 1 degrees of freedom)",
}


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

"""Student's t distribution with the standard library alone: the survival function through the
regularised incomplete beta function, the quantile and the decisions' critical value, and the F
distribution's survival function. The one home of these distributions: the analysis and the audit
both call them; ``tests/test_decision_rules.py`` and ``tests/test_references.py`` check them against
scipy and R."""

from __future__ import annotations

import functools
import math

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


def student_t_sf_signed(t: float, df: float) -> float:
    """``P(T > t)`` for any ``t``: :func:`student_t_sf`, and ``1 - P(T > -t)`` below 0 (symmetry)."""
    return student_t_sf(t, df) if t >= 0 else 1.0 - student_t_sf(-t, df)


def f_sf(f: float, d1: float, d2: float) -> float:
    """``P(F > f)`` for the F distribution with ``(d1, d2)`` degrees of freedom, ``f >= 0``:
    ``I_{d2 / (d2 + d1 f)}(d2 / 2, d1 / 2)`` (Abramowitz & Stegun 26.6.2)."""
    return betainc_reg(d2 / 2, d1 / 2, d2 / (d2 + d1 * f), d1 * f / (d2 + d1 * f))


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


@functools.lru_cache(maxsize=4096)
def t_critical(alpha: float, df: float) -> float:
    """The t value ``q > 0`` with ``P(T > q) = alpha`` (``alpha < 0.5``): bisection to adjacent doubles.

    The decisions' critical value (:func:`.ttests.critical_t`, in the analysis and the audit alike): a t test establishes its hypothesis when its statistic exceeds it. Taking ``alpha``
    itself, not ``1 - (1 - alpha)``, keeps the ulps that subtraction would lose.
    Kept per ``(alpha, df)`` for the process (a function of them alone): a summary, its decisions
    and intervals, and the audit's recomputation ask for the same few quantiles many times, each
    a bisection over dozens of continued fractions.
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

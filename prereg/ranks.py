"""Rank statistics of the decisions, with the standard library alone: worst-rank scores for time to
target, the signed-rank test and the median. Their one home: ``analysis`` (decisions, sensitivity) and
the audit both call these; ``tests/test_references.py`` checks them against R
(``tests/fixtures/r_reference.json``) and ``tests/test_decisions.py`` against scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Relative tolerance of the signed-rank test (:func:`signed_rank`): magnitudes this close are tied and
#: scores this close to 0 are zeros. Real paired differences of times, BPB or memory never agree to 9
#: significant digits.
ROUNDING_REL_TOL = 1e-9
#: Up to this many non-zero differences the signed-rank p-value is exact (the conditional null
#: distribution of ``T+`` given the tie pattern, :func:`upper_tail_count`; under a second at the
#: limit); above it, Hoeffding's bound, which is conservative (:func:`signed_rank`).
EXACT_MAX_N = 300


@dataclass(frozen=True)
class RankTest:
    """``T+`` of the signed-rank test and its one-sided p-value."""

    n: int  # non-zero differences
    statistic: float  # T+
    p_value: float
    exact: bool


def worst_rank_differences(b: Sequence[float | None], c: Sequence[float | None]) -> list[float]:
    """Per-pair worst-rank scores: ``ln c - ln b`` where both arms reached the target (``None``: not reached).

    Notes
    -----
    An unreached arm ranks worse than every reached time (worst-rank imputation, Lachin 1999,
    *Controlled Clinical Trials* 20:408): ``+W`` if only the candidate missed it, ``-W`` if only the
    baseline did, ``0`` if both, with ``W = 1 + 2 max |ln(c/b)|`` larger than every observed score.
    The scores are log ratios whatever the hypothesis' estimand: larger scores mean a slower
    candidate, so the test's direction comes from ``better`` alone.
    """
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


def signed_rank(d: Sequence[float], s: int) -> RankTest:
    """One-sided Wilcoxon signed-rank test that the differences ``d`` lean towards sign ``s``.

    Notes
    -----
    Differences within ``ROUNDING_REL_TOL * max |d|`` of 0 are zeros and are dropped (Wilcoxon's
    method, scipy's ``zero_method="wilcox"``; R's ``wilcox.test`` drops them too). Magnitudes
    that agree to that tolerance are ties and get their average rank. ``T+`` is the sum of the
    ranks of the differences with sign ``s``; ``p = P(T+ >= t)`` under the null that each sign is
    ``+`` or ``-`` with probability 1/2 independently.

    * ``n <= EXACT_MAX_N``: exact, ``p = N / 2^n`` with ``N`` the number of the ``2^n`` sign patterns
      whose ``T+`` (given the ranks actually observed, ties included) is at least the observed one
      (:func:`upper_tail_count`). Without ties this is the classical exact distribution (scipy's
      ``method="exact"``); with ties and zeros it is the exact conditional (permutation) test.
    * above: Hoeffding's inequality for the bounded independent terms ``r_i (B_i - 1/2)``,
      ``p = min(1, exp(-2 u^2 / sum r_i^2))`` with ``u = T+ - sum r_i / 2`` when ``u > 0``, else 1.
      It bounds the exact tail from above at every ``n`` and every tie pattern, so
      ``P(p <= alpha) <= alpha`` holds; it is less powerful than the exact test (at ``z = 2.33``
      it gives 0.066), which matters little with more than 300 pairs.

    R's ``wilcox.test`` differs on ties and zeros at any ``n``: it then uses the normal
    approximation with a continuity correction, which is anti-conservative for heavily tied
    scores (51 worst-rank scores, 34 favourable: R gives 0.00877, the exact conditional
    ``pbinom(33, 51, 0.5, lower.tail = FALSE)`` = 0.01204645).
    """
    bad = [i for i, x in enumerate(d) if not math.isfinite(x)]
    if bad:
        raise ValueError(
            f"the signed-rank test needs finite differences; d[{bad[0]}] = {d[bad[0]]} "
            f"({len(bad)} not finite): a NaN would be dropped and an infinity would rank every other value 0"
        )
    top = max((abs(x) for x in d), default=0.0)
    tol = ROUNDING_REL_TOL * top
    nz = [s * x for x in d if abs(x) > tol]
    n = len(nz)
    if n == 0:
        return RankTest(0, 0.0, 1.0, True)
    ranks = average_ranks([abs(x) for x in nz], tol)
    t_plus = math.fsum(r for r, x in zip(ranks, nz) if x > 0)
    if n <= EXACT_MAX_N:
        doubled = [int(round(2 * r)) for r in ranks]
        return RankTest(n, t_plus, upper_tail_count(doubled, int(round(2 * t_plus))) / 2**n, True)
    u = t_plus - math.fsum(ranks) / 2.0
    p = 1.0 if u <= 0 else min(1.0, math.exp(-2.0 * u * u / math.fsum(r * r for r in ranks)))
    return RankTest(n, t_plus, p, False)


def upper_tail_count(doubled: Sequence[int], t2: int) -> int:
    """How many of the ``2^n`` sign patterns give a doubled rank sum ``sum_{i positive} doubled_i >= t2``.

    Notes
    -----
    The counts are the coefficients of the generating function ``prod_i (1 + x^{doubled_i})``. By
    symmetry (flipping every sign maps a sum ``S`` to ``total - S``) the count of sums ``>= t2`` is
    the count of sums ``<= total - t2``; the smaller of that and the complement of the count of sums
    ``<= t2 - 1`` is computed, truncating the polynomial at that degree ``k``. Its coefficients
    (each at most ``2^n``) are packed into one integer, ``n + 1`` bits apiece, so multiplying by
    ``1 + x^r`` is a shift and an add; the count is the sum of the packed digits (exact integers
    throughout: the p-value is the same double in the analysis and the audit).
    """
    n, total = len(doubled), sum(doubled)
    if t2 <= 0:
        return 1 << n
    if t2 > total:
        return 0
    k, complement = total - t2, False
    if k > t2 - 1:
        k, complement = t2 - 1, True
    bits = n + 1
    mask = (1 << (bits * (k + 1))) - 1
    poly = 1
    for r in sorted(doubled):
        if r > k:
            break  # x^r and beyond lie above the truncation
        poly = (poly + (poly << (r * bits))) & mask
    digits = k + 1
    while digits > 1:  # sum the digits by folding halves (no digit sum exceeds 2^n < 2^bits)
        half = (digits + 1) // 2
        poly = (poly & ((1 << (half * bits)) - 1)) + (poly >> (half * bits))
        digits = half
    return (1 << n) - poly if complement else poly


def average_ranks(values: list[float], tol: float = 0.0) -> list[float]:
    """Ranks from 1, ties (values within ``tol`` of the first of their run, in sorted order) averaged."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] - values[order[i]] <= tol:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def median(values: Sequence[float]) -> float | None:
    """The sample median (mean of the two middle values for an even count); ``None`` when empty."""
    v = sorted(values)
    if not v:
        return None
    k = len(v) // 2
    return float(v[k]) if len(v) % 2 else (v[k - 1] + v[k]) / 2


def binomial_upper(n: int, k: int) -> float:
    """``P(B >= k)`` for ``B ~ Binomial(n, 1/2)``, exact: ``sum_{i >= k} C(n, i) / 2^n`` in integers,
    divided once (Python's integer division is correctly rounded), so the analysis and the audit
    hold the same double."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / (1 << n)


def sign_test(values: Sequence[float], lo: float | None, hi: float | None) -> tuple[int, int, float]:
    """The exact one-sided sign test that the median of ``values`` lies in ``lo < median < hi``:
    ``(n, favourable, p)``.

    Notes
    -----
    One bound ``lo``: ``K = #{v_i > lo}`` of the ``n`` values, ``p = P(B >= K)`` with
    ``B ~ Binomial(n, 1/2)``; an upper bound ``hi`` the same with ``#{v_i < hi}``; both
    (equivalence) the larger ``p``, and ``favourable`` its ``K``. A value equal to the bound counts
    against the hypothesis. Under the null ``P(v > lo) <= 1/2`` (the median is at most ``lo``) each
    value beats the bound with probability at most 1/2 independently, so ``K`` is stochastically
    at most ``B`` and ``P(p < alpha) <= alpha`` for *every* distribution of the values: skewed,
    heavy-tailed, tied, or censored beyond the bound, with no continuity needed (Conover 1999,
    *Practical Nonparametric Statistics*, 3rd ed., 3.4). With ``n`` values the smallest
    ``p`` is ``2^-n``: at ``alpha = 0.05`` it can establish from 5 values on.
    """
    n = len(values)
    parts = []
    if lo is not None:
        k = sum(1 for v in values if v > lo)
        parts.append((binomial_upper(n, k), k))
    if hi is not None:
        k = sum(1 for v in values if v < hi)
        parts.append((binomial_upper(n, k), k))
    p, k = max(parts)
    return n, k, p


def median_bounds(values: Sequence[float], alpha: float) -> tuple[float | None, float | None]:
    """The distribution-free two-sided ``1 - 2 alpha`` interval for the median: ``(v_(j), v_(n+1-j))``.

    Notes
    -----
    ``v_(1) <= ... <= v_(n)`` sorted; ``j`` the largest index with ``P(B >= n - j + 1) < alpha``,
    ``B ~ Binomial(n, 1/2)``; each end misses the median with probability at most ``alpha`` for any
    distribution (``P(v_(j) > median) <= P(B <= j - 1)``; Conover 1999, 3.2). It is the inversion
    of :func:`sign_test`: a bound ``lo`` lies below ``v_(j)`` exactly when the sign test of
    ``median > lo`` establishes at ``alpha``. ``None`` for an end when no ``j`` exists (fewer
    values than the level needs: the interval is unbounded there).
    """
    v = sorted(values)
    n = len(v)
    j = 0
    while j < n and binomial_upper(n, n - j) < alpha:  # index j + 1 qualifies
        j += 1
    if j == 0:
        return None, None
    return v[j - 1], v[n - j]

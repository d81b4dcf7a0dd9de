"""Rank statistics of the decisions: worst-rank scores for time to target and the signed-rank test.

Never imports torch. ``analysis/public_audit.py`` re-implements both with the standard library;
``tests/test_references.py`` checks them against R (``tests/fixtures/r_reference.json``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from analysis.stats import ROUNDING_REL_TOL

#: Up to this many non-zero differences the signed-rank p-value is exact (the conditional null
#: distribution of ``T+`` given the tie pattern, enumerated); above it, the normal approximation.
EXACT_MAX_N = 50


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

    * ``n <= EXACT_MAX_N``: exact, from the conditional distribution of ``T+`` given the ranks
      actually observed (ties included), enumerated over all ``2^n`` sign patterns by dynamic
      programming over the doubled rank sums (integers). Without ties this is the classical exact
      distribution (scipy's ``method="exact"``).
    * above: ``z = (T+ - n(n+1)/4) / sqrt(n(n+1)(2n+1)/24 - sum(t^3 - t)/48)`` (tie-corrected), no
      continuity correction (scipy's ``method="approx", correction=False``).

    R's ``wilcox.test`` differs on ties and zeros at any ``n``: it then uses the normal
    approximation with a continuity correction; its exact branch is used only without ties.
    """
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
        counts = [1] + [0] * sum(doubled)
        top_sum = 0
        for r2 in doubled:
            top_sum += r2
            for total in range(top_sum, r2 - 1, -1):
                counts[total] += counts[total - r2]
        t2 = int(round(2 * t_plus))
        return RankTest(n, t_plus, sum(counts[t2:]) / 2**n, True)
    groups: dict[float, int] = {}
    for r in ranks:
        groups[r] = groups.get(r, 0) + 1
    var = n * (n + 1) * (2 * n + 1) / 24.0 - math.fsum(t**3 - t for t in groups.values()) / 48.0
    z = (t_plus - n * (n + 1) / 4.0) / math.sqrt(var)
    return RankTest(n, t_plus, 0.5 * math.erfc(z / math.sqrt(2.0)), False)


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

"""The Wilcoxon signed-rank test, re-implemented (analysis.ranks): T+ with tied ranks averaged, its
one-sided p from the exact conditional null up to EXACT_MAX_N pairs, Hoeffding's bound beyond."""

from __future__ import annotations

import math

ROUNDING_REL_TOL = 1e-9  # analysis.stats.ROUNDING_REL_TOL
EXACT_MAX_N = 300  # analysis.ranks.EXACT_MAX_N


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

"""Whether two designs measure the same effect: the difference of two independent groups' mean
per-pair values (the same configuration and arms run in two designs, e.g. a process per arm and
lockstep, or lockstep at two block sizes), with its Welch interval. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from prereg.tdist import student_t_ppf

__all__ = ["DesignDifference", "welch_difference"]


@dataclass(frozen=True)
class DesignDifference:
    """The difference ``mean(a) - mean(b)`` of two groups' per-pair values, and its interval."""

    difference: float
    lo: float
    hi: float
    level: float
    df: float
    se: float
    n_a: int
    n_b: int


def welch_difference(a: Sequence[float], b: Sequence[float], level: float = 0.99) -> DesignDifference:
    """The difference of two independent groups' means with Welch's two-sided interval.

    ``d = mean(a) - mean(b)``, ``se = sqrt(s_a^2/n_a + s_b^2/n_b)`` (sample variances, denominator
    ``n - 1``), Welch-Satterthwaite degrees of freedom
    ``df = se^4 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1))`` and the interval
    ``d -/+ t_{(1+level)/2, df} * se``. On per-pair log ratios (``ln c - ln b`` of each pair), ``d``
    is how much more the candidate's log time ratio is in design ``a`` than in design ``b``: an
    interval that holds 0 is what "the two designs measure the same effect" predicts. The groups
    are independent (different seeds and processes), the variances unequal: each design leaves its
    own noise. Matches ``scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(level)``
    (tests/test_lockstep.py).

    Parameters
    ----------
    a, b : sequence of float
        Each group's per-pair values, at least two each, not both without spread.
    level : float
        Two-sided confidence level.

    Returns
    -------
    DesignDifference
    """
    if len(a) < 2 or len(b) < 2:
        raise ValueError("each design needs at least two pairs")
    ma, mb = math.fsum(a) / len(a), math.fsum(b) / len(b)
    va = math.fsum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = math.fsum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    se = math.sqrt(va + vb)
    den = va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)
    if se == 0 or den == 0:  # no spread (or one too small to square in a double)
        raise ValueError("neither design's values have any spread")
    df = (va + vb) ** 2 / den
    q = student_t_ppf((1 + level) / 2, df)
    d = ma - mb
    return DesignDifference(d, d - q * se, d + q * se, level, df, se, len(a), len(b))

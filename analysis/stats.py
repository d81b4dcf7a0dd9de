"""Paired Student-t intervals (factorial contrasts: :mod:`analysis.factorial`; decisions:
:mod:`analysis.decisions`).

Never imports torch: the analysis reads records and nothing else.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from scipy import stats as _st

ESTIMANDS = ("difference", "relative_reduction", "log_ratio")


@dataclass(frozen=True)
class PairedInterval:
    """A two-sided Student-t interval for the mean of per-pair values.

    Attributes
    ----------
    estimand : str
        ``difference``, ``relative_reduction``, ``log_ratio`` or ``contrast``.
    estimate, low, high : float
        Mean of the per-pair values and the interval's ends.
    df : int
        Degrees of freedom, ``n - 1``.
    n : int
        Number of pairs.
    standard_error : float
        ``s / sqrt(n)`` with ``s`` the sample standard deviation (denominator ``n - 1``).
    level : float
        Two-sided confidence level.
    ratio, ratio_low, ratio_high : float or None
        For ``log_ratio``: ``exp`` of estimate and ends (geometric-mean ratio candidate/baseline).
    """

    estimand: str
    estimate: float
    low: float
    high: float
    df: int
    n: int
    standard_error: float
    level: float
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check(values: Sequence[float], what: str) -> list[float]:
    out = [float(v) for v in values]
    for i, v in enumerate(out):
        if not math.isfinite(v):
            raise ValueError(f"{what}[{i}] is not finite: {v}")
    return out


def paired_values(baseline: Sequence[float], candidate: Sequence[float], estimand: str) -> list[float]:
    """Per-pair values: ``c - b``; ``100 (1 - c / b)``; or ``ln(c / b)``.

    ``ln(c / b)`` is computed as ``ln c - ln b``, so that swapping the arms negates it exactly (a
    rounded ``c / b`` and ``b / c`` are not exact reciprocals). Decisions and intervals on
    ``relative_reduction`` use the log ratio (:func:`paired_interval`); its per-pair values here are
    descriptive only.
    """
    if estimand not in ESTIMANDS:
        raise ValueError(f"unknown estimand {estimand!r} (known: {', '.join(ESTIMANDS)})")
    b = _check(baseline, "baseline")
    c = _check(candidate, "candidate")
    if len(b) != len(c):
        raise ValueError(f"baseline has {len(b)} values and candidate {len(c)}; pairs need equal lengths")
    if estimand == "difference":
        return [y - x for x, y in zip(b, c)]
    if any(x <= 0 for x in b) or any(y <= 0 for y in c):
        raise ValueError(f"{estimand} needs positive values")
    if estimand == "relative_reduction":
        return [100.0 * (1.0 - y / x) for x, y in zip(b, c)]
    return [math.log(y) - math.log(x) for x, y in zip(b, c)]


def mean_interval(values: Sequence[float], level: float = 0.99, estimand: str = "contrast") -> PairedInterval:
    """Two-sided Student-t interval for the mean of ``values`` (one value per pair or block).

    Notes
    -----
    With ``n`` values ``d_i``, mean ``m``, sample standard deviation ``s`` (denominator
    ``n - 1``) and ``t = F^{-1}_{t, n-1}((1 + level) / 2)``, the interval is ``m -/+ t s / sqrt(n)``.
    A sample with zero variance gives the degenerate interval ``[m, m]``.
    """
    d = _check(values, "values")
    n = len(d)
    if n < 2:
        raise ValueError(f"an interval needs at least two pairs, got {n}")
    if not 0.5 < level < 1:
        raise ValueError(f"level must be in (0.5, 1), got {level}")
    m = math.fsum(d) / n
    var = math.fsum((x - m) ** 2 for x in d) / (n - 1)
    se = math.sqrt(var / n)
    t = float(_st.t.ppf((1.0 + level) / 2.0, n - 1))
    return PairedInterval(estimand, m, m - t * se, m + t * se, n - 1, n, se, level)


def paired_interval(
    baseline: Sequence[float], candidate: Sequence[float], level: float = 0.99, estimand: str = "difference"
) -> PairedInterval:
    """Paired two-sided Student-t interval for candidate versus baseline.

    Parameters
    ----------
    baseline, candidate : sequence of float
        One value per pair, in pair order.
    level : float
        Two-sided confidence level, e.g. 0.99.
    estimand : {"difference", "relative_reduction", "log_ratio"}
        ``difference``: mean of ``c_i - b_i``. ``log_ratio``: mean ``m`` of ``ln(c_i / b_i)``, also
        reported as the geometric-mean ratio ``exp(.)``. ``relative_reduction``: ``100 (1 - exp(.))``
        of the log ratio's estimate and ends, in percent (``low = 100 (1 - exp(high_log))``, as the
        map is decreasing); its ``standard_error`` and ``df`` are the log ratio's. Not the mean of the
        per-pair reductions ``100 (1 - c_i / b_i)``: that mean is biased under an A/A null (Jensen)
        and does not mirror when the arms are swapped.

    Returns
    -------
    PairedInterval

    Notes
    -----
    Sign convention: positive ``difference`` means the candidate's value is larger (for BPB:
    worse); positive ``relative_reduction`` means the candidate is faster; negative
    ``log_ratio`` means the candidate is faster. The interval is ``m -/+ t_{n-1, (1+level)/2} s/sqrt(n)``
    over the per-pair values (Student, 1908; as ``scipy.stats.ttest_rel(c, b).confidence_interval``
    and R's ``t.test(c, b, paired = TRUE)`` for ``difference``).
    """
    if estimand == "difference":
        return mean_interval(paired_values(baseline, candidate, estimand), level, estimand)
    res = mean_interval(paired_values(baseline, candidate, "log_ratio"), level, estimand)
    res = replace(
        res, ratio=math.exp(res.estimate), ratio_low=math.exp(res.low), ratio_high=math.exp(res.high)
    )
    if estimand == "log_ratio":
        return res
    return replace(res, estimate=reduction(res.estimate), low=reduction(res.high), high=reduction(res.low))


def reduction(log_ratio: float) -> float:
    """``100 (1 - exp(log_ratio))`` (as ``-100 expm1``): the candidate's percent reduction against the baseline."""
    return -100.0 * math.expm1(log_ratio)


#: Relative tolerance of the signed-rank test (:func:`analysis.ranks.signed_rank`): magnitudes this
#: close are tied and scores this close to 0 are zeros. Real paired differences of times, BPB or
#: memory never agree to 9 significant digits.
ROUNDING_REL_TOL = 1e-9

#: The zero-spread guard's tolerance, in units in the last place of the inputs (:func:`spread_is_rounding`).
ROUNDING_ULPS = 16


def rounding_scale(b: Sequence[float], c: Sequence[float], scale: str) -> list[float]:
    """Per pair, the magnitude whose rounding a per-pair value carries.

    ``|b| + |c|`` for a difference ``c - b``; ``1 + |ln b| + |ln c|`` for a log ratio ``ln c - ln b``
    (each logarithm is rounded to half an ulp of itself, and a value rounded to half an ulp of
    itself, ``b (1 + e)``, moves its logarithm by ``e``: the ``1``).
    """
    if scale == "difference":
        return [abs(x) + abs(y) for x, y in zip(b, c)]
    return [1.0 + abs(math.log(x)) + abs(math.log(y)) for x, y in zip(b, c)]


def spread_is_rounding(values: Sequence[float], scales: Sequence[float]) -> bool:
    """Whether per-pair values agree to the rounding of the inputs they were computed from.

    Notes
    -----
    ``max(values) - min(values) <= ROUNDING_ULPS * eps * max(scales)`` with ``eps = 2^-52`` and
    ``scales`` from :func:`rounding_scale`. A t statistic on such values divides rounding noise:
    the guard makes the hypothesis "not reached (zero spread)". The tolerance follows the inputs'
    rounding, not the values' size, so exactly proportional data (``c = k b``) or exactly shifted
    data (``c = b + k``) are zero spread whatever the effect ``k`` (true for identical values too).
    """
    return max(values) - min(values) <= ROUNDING_ULPS * sys.float_info.epsilon * max(scales)

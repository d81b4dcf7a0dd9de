"""Paired Student-t intervals and the guards on per-pair values, with the standard library alone: the
one home of the rule, which the summary (``prereg.formats.summary``), the factorial effects and the audit's
recomputation all call; ``tests/test_references.py`` checks it against R and scipy.

Sign convention: per-pair values compare the candidate ``c`` with the baseline ``b``
(``difference = c - b``, ``log_ratio = ln c - ln b``, ``relative_reduction = 100 (1 - exp(log_ratio))``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Generic, TypeGuard, TypeVar

from prereg.tdist import student_t_ppf

ESTIMANDS = ("difference", "relative_reduction", "log_ratio")


@dataclass(frozen=True)
class PairedInterval:
    """A two-sided Student-t interval for the mean of per-pair values.

    Attributes
    ----------
    estimand : str
        ``difference``, ``relative_reduction``, ``log_ratio``, ``contrast`` or ``log_contrast``.
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

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def interval(self, level: float | None = None) -> PairedInterval:
        """This interval at the level it was built with (``level`` ``None``), or the same estimate and
        standard error at another two-sided ``level`` (as scipy's
        ``res.confidence_interval(confidence_level=level)``).

        Notes
        -----
        ``m -/+ t_{df, (1+level)/2} se`` on the test scale: the log ratio for ``log_ratio`` and
        ``relative_reduction`` (whose log estimate is ``ln ratio``), mapped back as
        :func:`on_log_scale` does.
        """
        if level is None or level == self.level:
            return self
        _check_level(level)
        ratio = self.estimand in ("log_ratio", "relative_reduction")
        m = math.log(self.ratio) if ratio and self.ratio is not None else self.estimate
        low, high = t_interval(m, self.standard_error, self.df, level)
        out = replace(self, estimate=m, low=low, high=high, level=level)
        return on_log_scale(out, self.estimand) if ratio else out


def t_interval(estimate: float, standard_error: float, df: int, level: float) -> tuple[float, float]:
    """``estimate -/+ t se`` with ``t = F^{-1}_{t, df}((1 + level) / 2)`` (:func:`.tdist.student_t_ppf`):
    the two-sided Student-t interval every diagnostic and endpoint gives."""
    t = student_t_ppf((1.0 + level) / 2.0, df)
    return estimate - t * standard_error, estimate + t * standard_error


def _check_level(level: float) -> None:
    if not 0.5 < level < 1:
        raise ValueError(f"level must be in (0.5, 1), got {level}")


@dataclass(frozen=True)
class TResult:
    """A Student-t result (an estimate, its standard error and degrees of freedom) built once with
    the two-sided interval level its study preregistered; :meth:`interval` gives that interval, or
    another level's on request (as scipy's result objects' ``confidence_interval``)."""

    estimate: float
    standard_error: float
    df: int
    level: float

    def interval(self, level: float | None = None) -> tuple[float, float]:
        """``(low, high)`` at the preregistered level, or at ``level``."""
        if level is not None:
            _check_level(level)
        return t_interval(self.estimate, self.standard_error, self.df, self.level if level is None else level)


@dataclass(frozen=True)
class Ends:
    """An estimate, its two-sided interval's ends and the level that interval was taken at, as one
    result carries them: what a renderer reads of a :class:`PairedInterval`, a decision or a
    factorial effect, the level coming with the ends it belongs to (``None`` each where there is
    none)."""

    estimate: float | None
    low: float | None
    high: float | None
    level: float | None

    def mapped(self, f: Callable[[float], float | None], decreasing: bool = False) -> Ends:
        """The same result on another scale: ``f`` (monotone) of the estimate and of each end, at
        the same level; ``decreasing`` (a decreasing ``f``): the ends swap."""

        def g(x: float | None) -> float | None:
            return None if x is None else f(x)

        low, high = (self.high, self.low) if decreasing else (self.low, self.high)
        return Ends(g(self.estimate), g(low), g(high), self.level)


R = TypeVar("R", covariant=True)
S = TypeVar("S")


@dataclass(frozen=True)
class Rows(Generic[R]):
    """A configuration's rows (its pairs, or its blocks) with the interval level its study
    preregistered (the protocol's ``interval_level`` for the study, read once): every interval over
    them is built at that level and carries it."""

    rows: Sequence[R]
    level: float

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[R]:
        return iter(self.rows)

    def keep(self, rows: Sequence[S]) -> Rows[S]:
        """Other rows (a subset, or values derived from these) at the same level."""
        return Rows(rows, self.level)

    def mean(self, values: Sequence[float], estimand: str = "contrast") -> PairedInterval:
        """The Student-t interval of the mean of ``values`` (:func:`mean_interval`) at the level."""
        return mean_interval(values, self.level, estimand)

    def t(self, estimate: float, standard_error: float, df: int) -> TResult:
        """A Student-t result at the level."""
        return TResult(estimate, standard_error, df, self.level)

    def endpoint(self, b0: Sequence[object], c0: Sequence[object], estimand: str) -> Endpoint:
        """:func:`endpoint` at the level."""
        return endpoint(b0, c0, self.level, estimand)

    def descriptive(self, b: Sequence[float], c: Sequence[float], estimand: str) -> PairedInterval | None:
        """:func:`descriptive_interval` at the level."""
        return descriptive_interval(b, c, self.level, estimand)


def finite(values: Sequence[float], what: str) -> list[float]:
    """``values`` as floats, refusing a non-finite one (naming ``what`` and its index)."""
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
    b = finite(baseline, "baseline")
    c = finite(candidate, "candidate")
    if len(b) != len(c):
        raise ValueError(f"baseline has {len(b)} values and candidate {len(c)}; pairs need equal lengths")
    if estimand == "difference":
        return [y - x for x, y in zip(b, c)]
    if any(x <= 0 for x in b) or any(y <= 0 for y in c):
        raise ValueError(f"{estimand} needs positive values")
    if estimand == "relative_reduction":
        return [100.0 * (1.0 - y / x) for x, y in zip(b, c)]
    return [math.log(y) - math.log(x) for x, y in zip(b, c)]


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error ``sd / sqrt(n)`` (denominator ``n - 1``).

    Values whose squares would overflow (beyond 2^500, about 3e150) or underflow (below 2^-500)
    a float are first scaled by the power of two ``k`` nearest their largest magnitude, an exact
    operation, and the results multiplied by ``k`` after: the same formulas, so
    ``mean_se(k v) = k mean_se(v)``; values in between take the plain formulas, bit for bit."""
    n = len(values)
    top = max((abs(x) for x in values), default=0.0)
    if top == 0.0 or _SMALL <= top <= _LARGE:
        m = math.fsum(values) / n
        return m, math.sqrt(math.fsum((x - m) ** 2 for x in values) / (n - 1) / n)
    k = math.ldexp(1.0, math.frexp(top)[1])
    u = [x / k for x in values]
    mu = math.fsum(u) / n
    return mu * k, k * math.sqrt(math.fsum((x - mu) ** 2 for x in u) / (n - 1) / n)


_LARGE, _SMALL = math.ldexp(1.0, 500), math.ldexp(1.0, -500)


def mean_interval(values: Sequence[float], level: float = 0.99, estimand: str = "contrast") -> PairedInterval:
    """Two-sided Student-t interval for the mean of ``values`` (one value per pair or block).

    Notes
    -----
    With ``n`` values ``d_i``, mean ``m``, sample standard deviation ``s`` (denominator
    ``n - 1``) and ``t = F^{-1}_{t, n-1}((1 + level) / 2)`` (:func:`.tdist.student_t_ppf`), the
    interval is ``m -/+ t s / sqrt(n)``. A sample with zero variance gives the degenerate interval
    ``[m, m]``.
    """
    d = finite(values, "values")
    n = len(d)
    if n < 2:
        raise ValueError(f"an interval needs at least two pairs, got {n}")
    _check_level(level)
    m, se = mean_se(d)
    low, high = t_interval(m, se, n - 1, level)
    return PairedInterval(estimand, m, low, high, n - 1, n, se, level)


def two_stage_size(
    pilot: Sequence[float], half_width: float, level: float = 0.95, cap: int | None = None
) -> int:
    """Stein's two-stage sample size: how many values in all (the pilot's included) give
    :func:`two_stage_interval` a half-width of at most ``half_width``.

    Notes
    -----
    With the pilot's ``n0`` values, their sample standard deviation ``s0`` (denominator
    ``n0 - 1``) and ``t = F^{-1}_{t, n0-1}((1 + level) / 2)``, the size is
    ``n = max(n0, ceil((t s0 / h)^2))``, then at most ``cap`` (a cost stop: the interval stays
    exact, only wider than ``h``). ``n`` depends on the pilot's spread alone, never on its mean;
    for normal values the two are independent, so choosing ``n`` cannot steer the estimate (Stein,
    Ann. Math. Statist. 16, 1945). Under a skewed distribution they are not: an outlier in the
    pilot raises ``s0`` and adds values that dilute it.
    """
    d = finite(pilot, "pilot")
    if len(d) < 2:
        raise ValueError(f"a pilot needs at least two values, got {len(d)}")
    n = stein_size(mean_se(d)[1] * math.sqrt(len(d)), len(d), half_width, level)
    return n if cap is None else max(len(d), min(n, cap))


def stein_size(s0: float, pilot: int, half_width: float, level: float = 0.95) -> int:
    """``max(pilot, ceil((t s0 / half_width)^2))`` with ``t = F^{-1}_{t, pilot-1}((1 + level) / 2)``:
    Stein's size from a pilot's spread ``s0`` (:func:`two_stage_size`), or from an assumed spread
    when planning."""
    if not half_width > 0:
        raise ValueError(f"half_width must be positive, got {half_width}")
    _check_level(level)
    t = student_t_ppf((1.0 + level) / 2.0, pilot - 1)
    return max(pilot, math.ceil((t * s0 / half_width) ** 2))


def two_stage_interval(
    values: Sequence[float], pilot: int, level: float = 0.95, estimand: str = "contrast"
) -> PairedInterval:
    """Stein's two-stage interval for the mean of ``values``, whose first ``pilot`` values set
    their number (:func:`two_stage_size`).

    Notes
    -----
    ``m -/+ t s0 / sqrt(n)``: ``m`` the mean of all ``n`` values, ``s0`` the sample standard
    deviation of the first ``n0 = pilot`` (denominator ``n0 - 1``), ``t = F^{-1}_{t,
    n0-1}((1 + level) / 2)``; ``df`` is ``n0 - 1`` and ``standard_error`` ``s0 / sqrt(n)``. For
    normal values the coverage is exact whatever rule chose ``n`` from ``s0``: given ``n``, ``m``
    is normal with variance ``sigma^2 / n`` and independent of ``s0`` (the pilot's mean and spread
    are independent), so ``(m - mu) sqrt(n) / s0`` is Student t with ``n0 - 1`` df (Stein 1945).
    The usual interval over all ``n`` (:func:`mean_interval`) is not exact here: its ``s`` shares
    the pilot that chose ``n``. ``tests/test_two_stage.py`` simulates 4,000 two-stage samples and
    finds the coverage inside the binomial band around ``level``, and the half-width at most the
    target wherever the cap did not bind. With ``n == n0`` it is :func:`mean_interval`.
    """
    d = finite(values, "values")
    if not 2 <= pilot <= len(d):
        raise ValueError(f"the pilot must hold 2 to {len(d)} values, got {pilot}")
    _check_level(level)
    n = len(d)
    m, se = mean_se(d)
    if pilot < n:
        se = mean_se(d[:pilot])[1] * math.sqrt(pilot / n)  # s0 / sqrt(n)
    low, high = t_interval(m, se, pilot - 1, level)
    return PairedInterval(estimand, m, low, high, pilot - 1, n, se, level)


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
    return on_log_scale(
        mean_interval(paired_values(baseline, candidate, "log_ratio"), level, estimand), estimand
    )


def on_log_scale(res: PairedInterval, estimand: str) -> PairedInterval:
    """A Student-t interval of mean log ratios (:func:`mean_interval`) in ``estimand``'s terms:
    ``log_ratio`` with the geometric-mean ratio and its ends (``exp``), ``relative_reduction`` as
    ``100 (1 - exp(.))`` of the estimate and ends (:func:`paired_interval`'s Notes)."""
    res = replace(
        res, ratio=math.exp(res.estimate), ratio_low=math.exp(res.low), ratio_high=math.exp(res.high)
    )
    if estimand == "log_ratio":
        return res
    return replace(res, estimate=reduction(res.estimate), low=reduction(res.high), high=reduction(res.low))


def reduction(log_ratio: float) -> float:
    """``100 (1 - exp(log_ratio))`` (as ``-100 expm1``): the candidate's percent reduction against the baseline."""
    return -100.0 * math.expm1(log_ratio)


def scale(estimand: str) -> str:
    """The test scale of an estimand: ``log_ratio`` for both ratio estimands, else ``difference``."""
    return "difference" if estimand == "difference" else "log_ratio"


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


def valid(x: object, positive: bool) -> TypeGuard[float]:
    """Whether ``x`` is a finite number (not a bool), and positive when ``positive``."""
    return (
        isinstance(x, (int, float))
        and not isinstance(x, bool)
        and math.isfinite(x)
        and (x > 0 or not positive)
    )


def descriptive_interval(
    b: Sequence[float], c: Sequence[float], level: float, estimand: str
) -> PairedInterval | None:
    """The descriptive interval; ``None`` under two pairs or where the values' squares would underflow or
    overflow a double (:func:`magnitude_problem`; a decision on them says so)."""
    if len(b) < 2 or magnitude_problem([paired_values(b, c, scale(estimand))]) is not None:
        return None
    return paired_interval(b, c, level, estimand)


@dataclass(frozen=True)
class Endpoint:
    """Descriptive means and the paired interval over the pairs whose two values are valid numbers
    (finite; positive for ratios); ``invalid_pairs`` counts the others."""

    pairs: int
    invalid_pairs: int
    baseline_mean: float | None
    candidate_mean: float | None
    interval: PairedInterval | None  # None under two pairs, or where the values' squares overflow

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def endpoint(b0: Sequence[object], c0: Sequence[object], level: float, estimand: str) -> Endpoint:
    """Descriptive means and interval over the pairs whose two values are finite numbers (positive for
    ratios); ``invalid_pairs`` counts the others (a decision on them is "not reached", naming the pair)."""
    positive = estimand != "difference"
    ok = [(x, y) for x, y in zip(b0, c0) if valid(x, positive) and valid(y, positive)]
    b, c = [x for x, _ in ok], [y for _, y in ok]
    return Endpoint(
        pairs=len(b),
        invalid_pairs=len(b0) - len(b),
        baseline_mean=math.fsum(b) / len(b) if b else None,
        candidate_mean=math.fsum(c) / len(c) if c else None,
        interval=descriptive_interval(b, c, level, estimand),
    )

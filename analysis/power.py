"""Sample sizes from pilots: the noise of paired differences, measured on A/A pairs only.

A pilot's A/A pairs (baseline against itself, same seed) measure how much two runs of one arm
differ on a device without showing any candidate outcome. For each hypothesis of a target
protocol this module prints the pairs needed for 80% and 90% power at the hypothesis' level and
margin, and the interval's half-width at the planned number of pairs, all on the scale the decision
is tested on (the log ratio for both ratio estimands, :mod:`prereg.ttests`). A pilot of a few
pairs estimates the standard deviation loosely, so beside the plug-in figure it gives the pairs
needed at an upper confidence limit of the SD, which reach the power with that confidence.
Never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from scipy import integrate as _integrate
from scipy import stats as _st

from prereg.descriptive import reduction, scale
from prereg.designs import design_named, study_design
from prereg.hypotheses import ENDPOINT_KEYS, NotReached, Pair, bounds, values_of
from prereg.planted import CLASSES
from prereg.ranks import binomial_upper, median
from prereg.ttests import one_sided, period_adjusted_mean, sign

if TYPE_CHECKING:
    from prereg.formats.record import RunRecord


@dataclass(frozen=True)
class Noise:
    """Standard deviation of per-pair values on one endpoint, from the pilot's A/A pairs.

    Attributes
    ----------
    sd : float
        Sample standard deviation (denominator ``n - 1``) of the A/A per-pair values on the test
        scale (``c - b``, or ``ln c - ln b`` for ``log_ratio`` and ``relative_reduction``).
    pairs : int
        A/A pairs it comes from (``df = pairs - 1``).
    identical : bool
        Every A/A pair was bitwise identical on this endpoint (same seed, same arithmetic): the
        pilot then bounds the noise by the seed-to-seed spread instead (``sd`` is that, times
        ``sqrt(2)``: two independent runs), a conservative planning value for a candidate whose
        arithmetic differs.
    """

    sd: float
    pairs: int
    identical: bool
    skewness: float | None = None  # adjusted Fisher-Pearson G1 of the A/A values (3+ pairs, not all equal)
    values: tuple[float, ...] = ()  # the A/A per-pair values themselves (the sign rule's plan reads them)


#: Pilot skewness above which ``harness power`` says the t rule's error rate is not nominal.
SKEW_WARN = 1.0


def skewness(v: list[float]) -> float | None:
    """Adjusted Fisher-Pearson skewness ``G1 = g1 sqrt(n (n - 1)) / (n - 2)`` of ``v``.

    Notes
    -----
    With ``m_k = sum (v_i - mean)^k / n``, ``g1 = m_3 / m_2^(3/2)``; ``G1`` is what R's
    ``e1071::skewness(type = 2)`` and scipy's ``stats.skew(bias=False)`` compute. ``None`` below
    3 values or when every value is equal (no spread). Its standard error under normality is about
    ``sqrt(6 / n)``: at 10 pilot pairs a G1 of 1 is within 1.3 standard errors of 0, so it flags
    skew, it does not measure it.
    """
    n = len(v)
    if n < 3:
        return None
    m = math.fsum(v) / n
    scale = max(abs(x - m) for x in v)  # G1 is scale-free: deviations over their largest, so
    if scale == 0:  # tiny spreads neither underflow nor divide by zero
        return None
    dev = [(x - m) / scale for x in v]
    m2 = math.fsum(x**2 for x in dev) / n
    m3 = math.fsum(x**3 for x in dev) / n
    return m3 / m2**1.5 * math.sqrt(n * (n - 1)) / (n - 2)


def aa_pairs(records: list[RunRecord], block_steps: int | None = None) -> dict[str, list[Pair]]:
    """Per configuration, the A/A pairs (both arms the same) in ``records`` of the design a target
    study has: pairs of a process per arm (``block_steps`` None), or lockstep pairs with that
    ``block_steps`` (each design leaves its own noise), typed as the decisions read them (each
    arm's endpoint values, and which arm ran first)."""
    by: dict[str, dict[str, dict[str, RunRecord]]] = {}
    for r in records:
        s = r.spec
        if r.status != "ok" or not design_named(s.design).pairwise or s.block_steps != block_steps:
            continue
        st = next(x for x in r.protocol["studies"] if x["name"] == s.study)
        if st["arms"][0] != st["arms"][1] or st.get("planted"):
            continue  # only A/A pairs (a planted pair's candidate carries a known cost): no outcome is read
        by.setdefault(s.config, {}).setdefault(s.unit, {})[s.role] = r
    out: dict[str, list[Pair]] = {}
    for config, units in by.items():
        rows = []
        for unit, arms in sorted(units.items()):
            if len(arms) != 2:
                continue
            b, c = arms["baseline"], arms["candidate"]
            cols: dict[str, Any] = {
                f"{role}_{key}": _value(rec, key)
                for role, rec in (("baseline", b), ("candidate", c))
                for key in ENDPOINT_KEYS.values()
            }
            rows.append(Pair(unit=unit, first="baseline" if b.spec.position == 0 else "candidate", **cols))
        out[config] = rows
    return out


def aa_noise(
    records: list[RunRecord],
    endpoint: str,
    estimand: str,
    block_steps: int | None = None,
    hypothesis: Mapping[str, object] | None = None,
) -> dict[str, Noise]:
    """Per configuration, the noise of ``endpoint`` from the A/A pairs (:func:`aa_pairs`).

    With ``hypothesis``, its per-pair values are the ones its rule decides on
    (:func:`prereg.hypotheses.values_of`: restricted times or worst-rank scores for time
    to target, so censoring in the pilot counts), and a period-adjusted hypothesis' ``sd`` is the
    pooled standard deviation within the two order groups (:func:`prereg.ttests.period_adjusted_mean`:
    a period effect in the pilot is not noise to that test). Without one, the pairs where both arms
    have a value, on the estimand's test scale.
    """
    h = hypothesis or _aa_hypothesis(endpoint, estimand)
    key = ENDPOINT_KEYS[endpoint]
    out = {}
    for config, pairs in aa_pairs(records, block_steps).items():
        if hypothesis is None:  # only the pairs with both values
            pairs = [p for p in pairs if _both_values(p, key)]
        if len(pairs) < 2:
            continue
        try:
            v = values_of(h, pairs)[0]
        except NotReached:
            continue
        identical = all(x == 0 for x in v)
        sd = _identical_sd(pairs, key, estimand) if identical else _noise_sd(h, v, pairs)
        out[config] = Noise(sd, len(pairs), identical, None if identical else skewness(v), tuple(v))
    return out


def _aa_hypothesis(endpoint: str, estimand: str) -> dict[str, object]:
    """The hypothesis whose per-pair values stand for ``endpoint``'s noise where none is given: a
    superiority test of lower values (restricted means for time to target)."""
    return {
        "id": "aa",
        "study": "",
        "config": "",
        "endpoint": endpoint,
        "estimand": estimand,
        "type": "superiority",
        "better": "lower",
        **({"censoring": "restricted_mean"} if endpoint == "time_to_target" else {}),
    }


def _both_values(pair: Pair, key: str) -> bool:
    """Whether both arms of ``pair`` have a value of ``key``."""
    return pair.value("baseline", key) is not None and pair.value("candidate", key) is not None


def _identical_sd(pairs: list[Pair], key: str, estimand: str) -> float:
    """The noise of pairs whose every difference is 0 (one run shared by both arms): the spread of
    the baseline's values, on the estimand's scale, times sqrt 2 (that of a difference)."""
    b = [p.value("baseline", key) for p in pairs]
    return _sd(b if scale(estimand) == "difference" else [math.log(x) for x in b]) * math.sqrt(2.0)


def _noise_sd(h: Mapping[str, object], v: list[float], pairs: list[Pair]) -> float:
    """The per-pair values' standard deviation; a period-adjusted hypothesis' the pooled one within
    its two order groups, where each has two pairs."""
    if h.get("period_adjusted"):
        first = [p.first or "" for p in pairs]
        n1 = first.count("baseline")
        if min(n1, len(first) - n1) >= 2:
            _m, se, _df = period_adjusted_mean(v, first)
            return 2.0 * se / math.sqrt(1.0 / n1 + 1.0 / (len(first) - n1))  # the pooled sd
    return _sd(v)


def _value(rec: RunRecord, key: str) -> float | None:
    if key in ("test_bpb",):
        return rec.test_bpb if rec.test_bpb is not None and math.isfinite(rec.test_bpb) else None
    if key == "peak_memory_bytes":
        mem = rec.memory or {}
        primary = mem.get("primary")
        return mem.get(primary) if primary else None
    return (rec.timings or {}).get(key)


def _sd(v: list[float]) -> float:
    m = math.fsum(v) / len(v)
    return math.sqrt(math.fsum((x - m) ** 2 for x in v) / (len(v) - 1))


def power(n: int, sd: float, alpha: float, kind: str, margin: float, effect: float) -> float:
    """Power of the one-sided paired t test(s) with ``n`` pairs, margin and effect on the test scale.

    ``effect`` is the assumed true mean in the favourable direction (``s * mean``); see
    :func:`power_region`, which this calls with :func:`prereg.ttests.one_sided` ``(+1, kind, margin)``.
    """
    return power_region(n, sd, alpha, one_sided(1, kind, margin), effect)


def _one_bound(region: tuple[float | None, float | None]) -> tuple[float, int]:
    """A one-sided region's bound and side: ``(lo, 1)`` for ``m > lo``, ``(hi, -1)`` for ``m < hi``."""
    lo, hi = region
    if lo is not None:
        return lo, 1
    if hi is not None:
        return hi, -1
    raise ValueError("an alternative region has at least one bound")


def _check_inputs(
    n: int, sd: float, alpha: float, region: tuple[float | None, float | None], mean: float
) -> None:
    """ValueError, naming the argument, for what has no power: fewer than 2 pairs, a standard
    deviation that is not a positive finite number (0 would divide by zero: a test of no noise is
    the identity rule's, not the t test's), alpha outside (0, 0.5), a non-finite bound or mean."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"power needs a whole number of pairs n >= 2, got {n!r}")
    if not (isinstance(sd, (int, float)) and math.isfinite(sd) and sd > 0):
        raise ValueError(f"power needs a positive finite standard deviation, got sd = {sd!r}")
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 0.5):
        raise ValueError(f"power needs a one-sided alpha in (0, 0.5), got {alpha!r}")
    for name, v in (("lower bound", region[0]), ("upper bound", region[1]), ("mean", mean)):
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v)):
            raise ValueError(f"power needs a finite {name}, got {v!r}")


def power_region(
    n: int,
    sd: float,
    alpha: float,
    region: tuple[float | None, float | None],
    mean: float,
    lost: int = 1,
    df: int | None = None,
) -> float:
    """Power of the test of ``lo < mu < hi`` (:func:`prereg.ttests.t_result`) when the true mean is ``mean``.

    Notes
    -----
    One bound: the statistic is noncentral t with ``df = n - 1`` and noncentrality
    ``(mean - lo) sqrt(n) / sd`` (or ``(hi - mean) sqrt(n) / sd``); power ``P(T' > t_{1-alpha, n-1})``
    (R's ``power.t.test(type = "one.sample", alternative = "one.sided")``). Two bounds (TOST):
    both one-sided tests must reject, ``lo + c S/sqrt(n) < Xbar < hi - c S/sqrt(n)`` with
    ``c = t_{1-alpha, n-1}``, ``Xbar ~ N(mean, sd^2/n)`` independent of
    ``S^2 ~ sd^2 chi^2_{n-1}/(n-1)``; the power is the integral over ``S`` of the normal probability
    of that window (exact; Phillips 1990, *J. Pharmacokinet. Biopharm.* 18:137), not ``2 P - 1``.
    The integral runs over ``S`` within 40 widths ``sd / sqrt(2 df)`` of the density's peak
    ``sd sqrt((df - 1) / df)`` (the probability beyond them is below ``1e-180`` at any ``df >= 2``;
    for small ``df`` the range starts at 0), cut at the peak and at 1, 4 and 10 widths. ``lost``:
    the degrees of freedom the estimate uses (``df = n - lost``: 2 for the period-adjusted mean,
    whose ``sd`` is the pooled one within the order groups and whose standard error at balanced
    orders is ``sd / sqrt(n)`` too). ``df``: fixed degrees of freedom, a replicated protocol's
    ``k - 1`` (its t of the replicates' means, :func:`prereg.hypotheses._replicates_estimate`, is
    noncentral t with ``k - 1`` df and this noncentrality at no spread between equal replicates).
    """
    _check_inputs(n, sd, alpha, region, mean)
    if df is None and n - lost < 1:
        raise ValueError(f"power needs n > {lost} pairs for {lost} lost degrees of freedom, got {n}")
    df = n - lost if df is None else df
    crit = float(_st.t.ppf(1 - alpha, df))
    lo, hi = region
    if lo is None or hi is None:
        bound, k = _one_bound(region)
        dist = k * (mean - bound)  # mean - lo, or hi - mean
        return float(_st.nct.sf(crit, df, dist * math.sqrt(n) / sd))
    se = sd / math.sqrt(n)
    s_max = (hi - lo) / 2 / (crit / math.sqrt(n))  # above it the window is empty

    def window(s: float) -> float:
        half = crit * s / math.sqrt(n)
        p = _st.norm.cdf((hi - half - mean) / se) - _st.norm.cdf((lo + half - mean) / se)
        return float(max(p, 0.0)) * float(_st.chi.pdf(s * math.sqrt(df) / sd, df)) * math.sqrt(df) / sd

    # S's density has its mass within a few widths sd / sqrt(2 df) of its peak sd sqrt((df - 1) / df);
    # integrating piecewise around it keeps quad from stepping over a narrow peak (large df or small sd)
    peak, width = sd * math.sqrt((df - 1) / df), sd / math.sqrt(2 * df)
    cuts = sorted({min(max(peak + k * width, 0.0), s_max) for k in (-40, -10, -4, -1, 0, 1, 4, 10, 40)})
    return min(
        1.0,
        math.fsum(
            _integrate.quad(window, a, b, limit=200, epsabs=1e-15, epsrel=1e-11)[0]
            for a, b in zip(cuts, cuts[1:])
            if b > a
        ),
    )


def detectable_shift(
    n: int, sd: float, alpha: float, target: float = 0.8, lost: int = 1, df: int | None = None
) -> float:
    """The distance beyond a one-sided bound at which the one-sided t test with ``n`` pairs has
    power ``target``, exactly.

    Notes
    -----
    Solves ``P(T' > t_{1-alpha, n-1}) = target`` for the noncentrality ``delta`` of the noncentral t
    with ``n - 1`` degrees of freedom, and returns ``delta sd / sqrt(n)`` (R's ``power.t.test(n = n,
    sd = sd, sig.level = alpha, power = target, type = "one.sample", alternative = "one.sided")$delta``).
    The shortcut ``(t_{1-alpha} + t_{target}) sd / sqrt(n)`` is off at small ``n``: its power is
    0.784 at n = 4, alpha 0.025 (0.730 at alpha 0.005, 0.806 at alpha 0.05), so a table built on it
    claims effects detectable that are not. ``sd = 0`` gives 0: no noise, any shift is detected.
    """
    if sd == 0:
        return 0.0
    df = n - lost if df is None else df  # a replicated protocol's k - 1 (:func:`power_region`)
    crit = float(_st.t.ppf(1 - alpha, df))
    from scipy.optimize import brentq

    hi = crit + float(_st.norm.ppf(target)) + 1.0
    while float(_st.nct.sf(crit, df, hi)) < target:
        hi *= 2
    delta = float(brentq(lambda d: float(_st.nct.sf(crit, df, d)) - target, 0.0, hi, xtol=1e-14, rtol=1e-14))
    return delta * sd / math.sqrt(n)


def sd_upper(sd: float, pairs: int, confidence: float) -> float:
    """One-sided upper confidence limit of a standard deviation from ``pairs`` values.

    Notes
    -----
    ``sd sqrt((k - 1) / chi^2_{1 - confidence, k - 1})`` with ``chi^2_q`` the ``q``-quantile: the true SD
    lies below it with probability ``confidence`` (normal data). Planning at it, the study reaches the
    target power with at least that probability (Browne 1995, *Stat. Med.* 14:1933).
    """
    return sd * math.sqrt((pairs - 1) / float(_st.chi2.ppf(1 - confidence, pairs - 1)))


def pairs_needed(
    sd: float, alpha: float, kind: str, margin: float, effect: float, target: float, cap: int = 100_000
) -> int | None:
    """Smallest ``n >= 3`` whose :func:`power` reaches ``target`` (``None`` if none up to ``cap``)."""
    return pairs_needed_region(sd, alpha, one_sided(1, kind, margin), effect, target, cap)


def pairs_needed_region(
    sd: float,
    alpha: float,
    region: tuple[float | None, float | None],
    mean: float,
    target: float,
    cap: int = 100_000,
    lost: int = 1,
    df: int | None = None,
) -> int | None:
    """Smallest ``n >= 3`` (``>= 4`` for ``lost`` 2) whose :func:`power_region` reaches ``target``
    (``None`` if none up to ``cap``); ``df`` as there (fixed degrees of freedom)."""
    if sd == 0:
        return 3

    def ok(k: int) -> bool:
        return power_region(k, sd, alpha, region, mean, lost, df) >= target

    lo = hi = 2 + lost
    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > cap:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def sign_critical(n: int, alpha: float) -> int | None:
    """The fewest favourable values of ``n`` with which the sign test establishes at ``alpha``:
    the smallest ``k`` with ``P(B >= k) < alpha``, ``B ~ Binomial(n, 1/2)`` (``None``: none does)."""
    k = n
    if binomial_upper(n, k) >= alpha:
        return None
    while k > 0 and binomial_upper(n, k - 1) < alpha:
        k -= 1
    return k


def sign_power(
    n: int, values: tuple[float, ...], alpha: float, region: tuple[float | None, float | None], mean: float
) -> float:
    """Power of the sign test (:func:`prereg.ranks.sign_test`) with ``n`` pairs when the
    per-pair values are distributed as the pilot's ``values`` moved to median ``mean``.

    Notes
    -----
    The pilot's A/A values, centred at their median and shifted by ``mean``, smoothed by a Gaussian
    kernel of bandwidth ``0.9 min(sd, IQR / 1.34) k^(-1/5)`` (Silverman 1986, 3.4.2; ``k`` pilot
    values), give ``p = P(v > lo)`` (or ``P(v < hi)``); the power is ``P(Binomial(n, p) >= c)``
    with ``c`` :func:`sign_critical`. The pilot's shape (its skew, its stalls) is kept, not
    assumed normal. Equivalence: ``max(0, P_lo + P_hi - 1)``, a lower bound on both tests passing.
    """
    _check_inputs(n, 1.0, alpha, region, mean)
    return _sign_power_at(n, alpha, beyond_bounds(values, region, mean))


def beyond_bounds(
    values: tuple[float, ...], region: tuple[float | None, float | None], mean: float
) -> list[float]:
    """Per bound of ``region`` (lower, then upper), the probability that a per-pair value lies on its
    favourable side when the values are the pilot's, moved to median ``mean`` and smoothed by the
    Gaussian kernel of :func:`sign_power`."""
    med = median(values)
    if med is None:
        raise ValueError("the sign rule's power needs the pilot's per-pair values; there are none")
    v = sorted(x - med + mean for x in values)
    k = len(v)
    iqr = v[(3 * k) // 4] - v[k // 4] if k >= 4 else 0.0
    sd = _sd(v) if k >= 2 else 0.0
    spread = min(sd, iqr / 1.34) if iqr > 0 else sd
    bw = 0.9 * spread * k ** (-0.2)

    def beyond(bound: float, side: int) -> float:
        if bw == 0:
            return sum(1 for x in v if side * (x - bound) > 0) / k
        return math.fsum(float(_st.norm.cdf(side * (x - bound) / bw)) for x in v) / k

    return [beyond(b, side) for b, side in ((region[0], 1), (region[1], -1)) if b is not None]


def _sign_power_at(n: int, alpha: float, p: list[float]) -> float:
    c = sign_critical(n, alpha)
    if c is None:
        return 0.0
    parts = [float(_st.binom.sf(c - 1, n, q)) for q in p]
    return parts[0] if len(parts) == 1 else max(0.0, parts[0] + parts[1] - 1.0)


def sign_pairs_needed(
    values: tuple[float, ...],
    alpha: float,
    region: tuple[float | None, float | None],
    mean: float,
    target: float,
    cap: int = 5000,
) -> int | None:
    """Smallest ``n >= 3`` from which :func:`sign_power` stays at ``target`` or more for the next ten
    ``n`` (the binomial's power is a saw-tooth in ``n``); ``None`` if none up to ``cap``."""
    p, run = beyond_bounds(values, region, mean), 0
    for n in range(3, cap + 1):
        run = run + 1 if _sign_power_at(n, alpha, p) >= target else 0
        if run == 10:
            return n - 9
    return None


#: The confidence that a plan at the SD's upper confidence limit reaches its power.
PILOT_CONFIDENCE = 0.8


@dataclass(frozen=True)
class Plan:
    """One hypothesis' sample size. ``sd``, ``half_width_at_planned`` are on the test scale (log ratio for
    ratio estimands); ``margin``, ``effect`` and ``detectable_at_planned`` in the estimand's units."""

    id: str
    config: str
    endpoint: str
    estimand: str
    sd: float
    pilot_pairs: int
    identical_in_pilot: bool
    alpha: float
    margin: float
    effect: float
    planned_pairs: int
    n80: int | None
    n90: int | None
    power_at_planned: float
    half_width_at_planned: float
    detectable_at_planned: float | None  # smallest true effect 80% power detects (one-sided types)
    confidence: float  # of the upper-limit figures below
    sd_upper: float
    n80_upper: int | None
    n90_upper: int | None
    skewness: float | None = None  # of the pilot's A/A per-pair values (:func:`skewness`)
    rule: str = "t"  # the rule the hypothesis declares (test: t or sign)
    data_rule: str = "t"  # the rule the pilot's values call for (:func:`data_rule`)
    sequential: SequentialPlan | None = None  # a group-sequential target's figures

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def true_mean(h: Mapping[str, object], effect: float) -> float:
    """The true mean on the test scale for ``effect`` in the estimand's units, favourable direction."""
    s = sign(str(h["better"]))
    if h["estimand"] == "relative_reduction":
        return math.log1p(s * effect / 100.0)  # better lower: a reduction e is ln(1 - e/100)
    return s * effect


def plan(
    pilot_records: list[RunRecord],
    target: dict[str, Any],
    effects: dict[str, float],
    confidence: float = PILOT_CONFIDENCE,
) -> list[Plan]:
    """Per hypothesis of ``target`` (a protocol summary), the pairs needed for 80% and 90% power.

    The level is the family's alpha under a fixed sequence, ``alpha / m`` under Holm (its first,
    strictest step). The assumed true effect (estimand units, favourable direction) is the value
    given in ``effects`` by hypothesis id, default 0, for every type: 0 is the edge of superiority's
    null, which no number of pairs can establish (the line then reports the smallest effect 80%
    power detects at the planned n), and the centre of an equivalence region. The pilot's values
    are those the hypothesis' own rule decides on (:func:`aa_noise` with the hypothesis: restricted
    times or worst-rank scores for time to target, so the pilot's unreached targets count; the
    pooled within-order sd and ``n - 2`` degrees of freedom for a period-adjusted one). Worst-rank
    scores are planned with a t test of the scores; the signed-rank test the protocol runs needs
    about 1/0.955 as many pairs (its asymptotic relative efficiency). A hypothesis declaring
    ``test: sign`` is planned with the sign test's own power on the pilot's values
    (:func:`sign_power`). ``n80_upper``/``n90_upper`` plan at :func:`sd_upper` with ``confidence``
    (for the sign rule: the pilot's values scaled by ``sd_upper / sd``). Each line says which rule
    the hypothesis declares and which the pilot's skewness calls for (:func:`data_rule`).
    """
    spec = target["hypotheses"]
    if "descriptive" in spec:
        return []
    m = len(spec["tests"])
    alpha = spec["family_alpha"] if spec["procedure"] == "fixed_sequence" else spec["family_alpha"] / m
    out = []
    for h in spec["tests"]:
        st = next(s for s in target["studies"] if s["name"] == h["study"])
        block = study_design(st).block_steps(st)  # the pilot's pairs of the same design
        noise = aa_noise(pilot_records, h["endpoint"], h["estimand"], block, h).get(h["config"])
        if noise is None:
            continue
        out.append(
            _plan_one(
                h,
                noise,
                len(st["seeds"]),
                effects.get(h["id"], 0.0),
                alpha,
                confidence,
                spec.get("sequential"),
                (target.get("replicates") or {}).get("count"),
            )
        )
    return out


@dataclass(frozen=True)
class SequentialPlan:
    """A group-sequential design's figures for one hypothesis (normal approximation of its test):
    the power at the planned looks, the expected pairs at the assumed effect and at no effect, and
    the maximum pairs (looks at the same fractions) that reach 80% power."""

    power_at_planned: float
    expected_pairs: float
    expected_pairs_null: float
    max_pairs_80: int | None


def sequential_figures(
    sd: float,
    alpha: float,
    region: tuple[float | None, float | None],
    mean: float,
    looks: tuple[int, ...],
    spending: str,
    cap: int = 20_000,
) -> SequentialPlan | None:
    """The design's figures (:class:`SequentialPlan`) for a one-sided hypothesis (``None`` for
    equivalence or no noise).

    Notes
    -----
    With the drift ``theta = k (mean - bound) sqrt(n_K) / sd`` at full information, look ``j``'s
    first-crossing probability is :func:`prereg.sequential.crossing` of the design's
    efficacy boundaries at ``alpha`` (:func:`prereg.sequential.boundaries`); the power is
    their sum and the expected pairs ``sum_j P_j n_j + (1 - power) n_K`` (a futility stop, which is
    non-binding, would only lower it). The maximum pairs for 80% power scale the looks by a common
    factor (the same information fractions) and take the smallest ``n_K`` whose power reaches 0.8.
    A normal approximation of the t test, for every rule the hypothesis declares: at small ``n``
    the exact t power (the fixed design's columns) is lower, a period-adjusted test loses one more
    degree of freedom, and the sign rule's power is lower still (about ``2/pi`` as efficient under
    normal noise), so for these it is an upper bound.
    """
    from prereg.sequential import boundaries, crossing

    if sd <= 0 or region[0] is not None and region[1] is not None:
        return None
    bound, k = _one_bound(region)
    times = [n / looks[-1] for n in looks]
    c = boundaries(times, alpha, spending)

    def run(n_max: float) -> tuple[float, float]:
        theta = k * (mean - bound) * math.sqrt(n_max) / sd
        at = crossing(times, c, theta).at
        power = math.fsum(at)
        used = math.fsum(p * t * n_max for p, t in zip(at, times)) + (1 - power) * n_max
        return power, used

    power, used = run(looks[-1])
    null_used = _null_pairs(times, c, looks[-1])
    n80 = None
    if k * (mean - bound) > 0:
        lo, hi = 3, 3
        while run(hi)[0] < 0.8 and hi <= cap:
            lo, hi = hi, hi * 2
        if hi <= cap:
            while lo < hi:
                mid = (lo + hi) // 2
                if run(mid)[0] >= 0.8:
                    hi = mid
                else:
                    lo = mid + 1
            n80 = lo
    return SequentialPlan(power, used, null_used, n80)


def _null_pairs(times: list[float], c: list[float], n_max: int) -> float:
    """Expected pairs at no effect: the null's crossings (which spend alpha) end a study early."""
    from prereg.sequential import crossing

    at = crossing(times, c, 0.0)
    return math.fsum(p * t * n_max for p, t in zip(at.at, times)) + (1 - at.total) * n_max


def data_rule(skew: float | None) -> str:
    """Which rule the pilot's A/A values call for: ``sign`` where their skewness exceeds
    :data:`SKEW_WARN` in size (the t rule's error is not nominal there, ``benchmarks/coverage.py
    --noise-sweep``), else ``t``."""
    return "sign" if skew is not None and abs(skew) > SKEW_WARN else "t"


def _plan_one(
    h: dict[str, Any],
    noise: Noise,
    n_plan: int,
    effect: float,
    alpha: float,
    confidence: float,
    sequential: dict[str, Any] | None = None,
    replicates: int | None = None,
) -> Plan:
    region, mu = bounds(h), true_mean(h, effect)
    upper = sd_upper(noise.sd, noise.pairs, confidence)
    rule = h.get("test") or "t"
    lost = 2 if h.get("period_adjusted") else 1
    if rule == "sign" and noise.values and not noise.identical:
        need, at_planned, hw, mde = _sign_figures(noise, n_plan, alpha, region, mu, upper)
    else:
        df = replicates - 1 if replicates else None  # the replicate model's t (:func:`power_region`)
        need, at_planned, hw, mde = _t_figures(h, noise, n_plan, alpha, region, mu, upper, lost, df)
    return Plan(
        h["id"],
        h["config"],
        h["endpoint"],
        h["estimand"],
        noise.sd,
        noise.pairs,
        noise.identical,
        alpha,
        h["margin"],
        effect,
        n_plan,
        need[0],
        need[1],
        at_planned,
        hw,
        mde,
        confidence,
        upper,
        need[2],
        need[3],
        noise.skewness,
        rule,
        data_rule(noise.skewness),
        None
        if sequential is None
        else sequential_figures(
            noise.sd, alpha, region, mu, tuple(sequential["looks"]), sequential["spending"]
        ),
    )


_Figures = tuple[list[int | None], float, float, float | None]  # pairs needed, power, half-width, MDE


def _sign_figures(
    noise: Noise,
    n_plan: int,
    alpha: float,
    region: tuple[float | None, float | None],
    mu: float,
    upper: float,
) -> _Figures:
    """:func:`_plan_one`'s figures under the sign rule: pairs needed at 80% and 90% power (the
    pilot's values, then scaled to the ``upper`` sd), power at ``n_plan``; no half-width, no MDE."""
    scaled = tuple(x * upper / noise.sd for x in noise.values) if noise.sd > 0 else noise.values
    need = [sign_pairs_needed(v, alpha, region, mu, q) for v in (noise.values, scaled) for q in (0.8, 0.9)]
    at_planned = sign_power(n_plan, noise.values, alpha, region, mu)
    hw = float("nan")  # the median interval's width depends on the values' shape
    return need, at_planned, hw, None


def _t_figures(
    h: Mapping[str, object],
    noise: Noise,
    n_plan: int,
    alpha: float,
    region: tuple[float | None, float | None],
    mu: float,
    upper: float,
    lost: int,
    df: int | None = None,
) -> _Figures:
    """:func:`_plan_one`'s figures under the t rule: pairs needed at 80% and 90% power (the
    pilot's sd, then ``upper``), power and interval half-width at ``n_plan``, and the minimum
    detectable effect (none for an equivalence hypothesis); ``df``: a replicated protocol's
    ``k - 1`` (:func:`power_region`)."""
    mde: float | None = None
    need = [
        pairs_needed_region(sd, alpha, region, mu, q, lost=lost, df=df)
        for sd in (noise.sd, upper)
        for q in (0.8, 0.9)
    ]
    at_planned = power_region(n_plan, noise.sd, alpha, region, mu, lost, df) if noise.sd > 0 else 1.0
    hw = float(_st.t.ppf(1 - alpha, n_plan - lost if df is None else df)) * noise.sd / math.sqrt(n_plan)
    if h["type"] != "equivalence":
        shift = detectable_shift(n_plan, noise.sd, alpha, 0.8, lost, df)
        bound, k = _one_bound(region)
        m_star = bound + k * shift  # lo + shift, or hi - shift
        s = sign(str(h["better"]))
        mde = -s * reduction(m_star) if h["estimand"] == "relative_reduction" else s * m_star
    return need, at_planned, hw, mde


#: The clock a time endpoint is measured on, as a calibration's planted rows name it.
CLOCK_OF = {
    "training_time": "wall",
    "training_cpu_time": "CPU",
    "own_step_time": "wall",
    "own_step_cpu_time": "CPU",
}
#: The endpoints read by the after-own estimator (the planted rows' ``estimator``).
AFTER_OWN = ("own_step_time", "own_step_cpu_time")


def calibration_bias(planted: Sequence[Mapping[str, object]], target: dict[str, Any]) -> dict[str, str]:
    """Per hypothesis of ``target`` (a protocol summary), its design's measured bias from a
    calibration study's planted rows (``Summary.planted``: ``prereg/planted.py``), on the
    hypothesis' clock, in points of the log ratio: the spin plant measured with the most pairs
    (the narrowest interval), the largest bias over the spin sizes, and each cache-heavy plant.

    A design is its block size (None: a process per arm); a hypothesis on another endpoint, or of a
    design no planted study ran, says so instead: its bias is not measured."""
    out: dict[str, str] = {}
    spec = target["hypotheses"]
    if "descriptive" in spec:
        return out
    for h in spec["tests"]:
        st = next(s for s in target["studies"] if s["name"] == h["study"])
        design = study_design(st)
        block = design.block_steps(st)
        clock = CLOCK_OF.get(h["endpoint"])
        if clock is None:
            out[h["id"]] = "n/a (not a time endpoint)"
            continue
        if not design.pairwise:
            out[h["id"]] = f"not measured (no planted {design.name} design)"
            continue
        rows = _measured(planted, clock, block, h["endpoint"] in AFTER_OWN)
        if not rows:
            out[h["id"]] = "not measured (no planted study of this design)"
            continue
        parts = _bias_parts(rows)
        configs = sorted({r["config"] for r in rows})
        if h["config"] not in configs:
            parts.append(f"measured on {', '.join(configs)}")
        out[h["id"]] = "; ".join(parts)
    return out


def _measured(
    planted: Sequence[Mapping[str, object]], clock: str, block: int | None, own: bool
) -> list[Mapping[str, Any]]:
    """The planted rows that measured a design's bias on ``clock``: the design's block size, a bias,
    not the reference study's row, and the after-own estimator (``own``) or the whole times'."""
    return [
        r
        for r in planted
        if r["clock"] == clock
        and r.get("block_steps") == block
        and r.get("bias") is not None
        and not r.get("reference")
        and (r.get("estimator") == "after-own") == own
    ]


def _bias_parts(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A design's measured bias in words: the spin with the most pairs and the largest over the spin
    sizes, then each other plant's."""
    spins = [r for r in rows if r["kind"] == "spin"]
    parts: list[str] = []
    if spins:
        best = max(spins, key=lambda r: r["pairs"])
        worst = max(spins, key=lambda r: abs(r["bias"]))
        parts.append(
            f"spin of {best['truth']:+.2f}: {best['bias']:+.2f} ({best['bias_lo']:+.2f} to "
            f"{best['bias_hi']:+.2f}), {best['pairs']} pairs; largest over {len(spins)} sizes "
            f"{worst['bias']:+.2f}"
        )
    for r in rows:
        if r["kind"] != "spin":
            parts.append(
                f"{r['plant']} ({CLASSES[r['kind']]}): {r['bias']:+.2f} ({r['bias_lo']:+.2f} to {r['bias_hi']:+.2f})"
            )
    return parts


def table_rows(rows: list[Plan], bias: Mapping[str, str] | None = None) -> list[dict[str, object]]:
    """``harness power``'s table: one row per hypothesis, plug-in and upper-limit figures side by side."""

    def n(v: int | None) -> str:
        return str(v) if v is not None else "none"

    return [
        {
            "hypothesis": r.id,
            "config": r.config,
            "endpoint": f"{r.endpoint} ({r.estimand})",
            "sd (A/A)": f"{r.sd:.4g}" + (" *" if r.identical_in_pilot else ""),
            "skew (A/A)": "n/a"
            if r.skewness is None
            else f"{r.skewness:.2f}" + (" !" if abs(r.skewness) > SKEW_WARN else ""),
            "rule (declared / data)": f"{r.rule} / {r.data_rule}" + (" !" if r.rule != r.data_rule else ""),
            "pilot pairs": r.pilot_pairs,
            "alpha": f"{r.alpha:.3g}",
            "margin": f"{r.margin:g}",
            "effect": f"{r.effect:g}",
            "n 80%": n(r.n80),
            "n 90%": n(r.n90),
            f"n 80% at sd {100 * r.confidence:g}% UCL": n(r.n80_upper),
            f"n 90% at sd {100 * r.confidence:g}% UCL": n(r.n90_upper),
            "planned": r.planned_pairs,
            "power at planned": f"{r.power_at_planned:.2f}",
            "half-width at planned": "n/a"
            if math.isnan(r.half_width_at_planned)
            else f"{r.half_width_at_planned:.3g}",
            "detectable at planned": "n/a"
            if r.detectable_at_planned is None
            else f"{r.detectable_at_planned:.3g}",
            **({} if bias is None else {"design bias, calibration (points)": bias.get(r.id, "")}),
            **(
                {}
                if r.sequential is None
                else {
                    "seq: power at planned": f"{r.sequential.power_at_planned:.2f}",
                    "seq: expected pairs (effect / none)": f"{r.sequential.expected_pairs:.1f} / "
                    f"{r.sequential.expected_pairs_null:.1f}",
                    "seq: max pairs 80%": n(r.sequential.max_pairs_80),
                }
            ),
        }
        for r in rows
    ]


def legend(rows: list[Plan]) -> str:
    conf = f"{100 * rows[0].confidence:g}%"
    return (
        "sd: standard deviation of per-pair values over the pilot's A/A pairs (no candidate outcome is read), on "
        "the test scale (ln c - ln b for log_ratio and relative_reduction; margin, effect and detectable in the "
        "estimand's units); * the A/A arms were bitwise identical there, so sd is the seed-to-seed spread x "
        "sqrt(2) (conservative). n 80% / n 90%: plug-in, treating the pilot's sd as known. At sd "
        f"{conf} UCL: planned at the one-sided {conf} upper confidence limit of the sd (pilot pairs - 1 degrees "
        f"of freedom), so the power is reached with probability {conf} over the pilot's noise. "
        "skew: adjusted skewness G1 of the same values; ! above 1 in size, where the t rule's type-I error "
        "exceeds nominal (benchmarks/coverage.py --noise-sweep; docs/decisions.md). rule (declared / data): "
        "the hypothesis' test and the one the pilot calls for, sign where |skew| > 1 (the exact sign test of "
        "the median: test: sign, declared before any outcome; ! where they differ). "
        "rule: analysis/power.py (noncentral t; exact TOST power; the sign test's binomial power on the "
        "pilot's own values; Holm at its strictest step)"
    )


def cited(origin: str) -> str:
    """Which of the figures a protocol's ``origins: seeds:`` sentence cites."""
    text = origin.lower()
    if not text:
        return "nothing: the protocol has no origins.seeds sentence"
    if any(w in text for w in ("upper confidence", "ucl", "confidence limit", "assurance")):
        return "the figure at the sd's upper confidence limit"
    if "power" in text:
        return "the plug-in figure (the pilot's sd treated as known)"
    return "neither figure of harness power"

"""The decisions a protocol preregisters, with the standard library alone: one per hypothesis, under
the family's multiplicity rule (the gates of completeness and the budget rule, the fixed-sequence and
Holm procedures, each decision's interval and sentence), and the sensitivity analysis of pairs with a
failed arm. Their one home: the analysis' summary and the audit's recomputation both call these;
``tests/test_decisions.py`` cross-checks them against scipy and ``tests/test_references.py`` against R.

Sign convention: per-pair values compare the candidate with the baseline (``difference = c - b``,
``log_ratio = ln c - ln b``, ``relative_reduction = 100 (1 - exp(log_ratio))``). ``better: lower``
says the candidate is better when its endpoint is lower (times, BPB, memory). Ratio estimands are
tested on the log ratio (:mod:`.ttests`), so no decision depends on which of the two ratio
estimands the protocol names or on which arm it calls the baseline (swap the arms and flip
``better``: the same decision, bit for bit). Intervals are shown in the estimand's units. Each
hypothesis' per-pair values and test are :mod:`.hypotheses`.

Error control (:func:`decide`): ``P(p <= alpha) <= alpha`` holds for the rank rule when the
differences are symmetric about zero under the null, for the sign rule (``test: sign``) under every
distribution (its null is the median's; :func:`.ranks.sign_test`), and for the t rule when the
per-pair values are close to normal or symmetric (``benchmarks/coverage.py --noise-sweep``: strongly
skewed differences inflate the t rule's family-wise error to 0.16-0.60 at a nominal 0.05, the sign
rule's stays at 0-0.051 in every family simulated), and the strict ``p < alpha`` never establishes
on a p-value that only reaches alpha (an atom of a discrete rank distribution, or a rounding of one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

from prereg.attempts import Completeness
from prereg.descriptive import reduction
from prereg.hypotheses import (
    Family,
    Hypothesis,
    Pair,
    PairRow,
    bounds,
    identical_shown,
    test_of,
    values_of,
)
from prereg.ranks import median_bounds, signed_rank
from prereg.ttests import TestResult, critical_t, passes, sign

#: The reason a decision gives when every pair was identical and the exact sign test decided it
#: (:func:`.hypotheses.identical_sign_result`: records of schema 5 on, and every sequential look).
IDENTICAL_BY_SIGN = "the exact sign test, p = 2^-n (records of schema 5 on, and at looks)"
#: Endpoints measured in run time: the budget rule's stop depends on them (:func:`decide`).
TIME_ENDPOINTS = (
    "training_time",
    "training_cpu_time",
    "own_step_time",
    "own_step_cpu_time",
    "time_to_target",
    "total_time",
)

#: A hypothesis, its test (None where it is not reached), why not, and the unreached counts.
Tested = tuple[Hypothesis, TestResult | None, str | None, dict[str, int] | None]
#: Per hypothesis id: (status, reason) and the alpha its test used (None: not tested).
Verdicts = tuple[dict[str, tuple[str, str | None]], dict[str, float | None]]

#: The hypothesis' fields a decision repeats (its JSON opens with them, in this order).
DECIDED_FIELDS = ("id", "study", "config", "endpoint", "estimand", "type", "margin", "better")


@dataclass(frozen=True)
class HypothesisDecision:
    """The decision on one preregistered hypothesis (``status``: established, not established, not reached).

    ``estimate``, ``low`` and ``high`` are in the estimand's units (for worst-rank: ``estimate_of``
    says what the estimate is; no interval); ``test`` holds the test on its own scale. The
    hypothesis' own fields read through (``decision.id``, ``decision.config``, ...).
    """

    hypothesis: Hypothesis
    status: str
    reason: str | None
    alpha: float | None
    test: dict[str, object] | None
    estimate: float | None
    estimate_of: str | None
    low: float | None
    high: float | None
    level: float | None
    unreached: dict[str, int] | None
    text: str

    id = property(lambda self: self.hypothesis.id)
    study = property(lambda self: self.hypothesis.study)
    config = property(lambda self: self.hypothesis.config)
    endpoint = property(lambda self: self.hypothesis.endpoint)
    estimand = property(lambda self: self.hypothesis.estimand)
    type = property(lambda self: self.hypothesis.type)
    margin = property(lambda self: self.hypothesis.margin)
    better = property(lambda self: self.hypothesis.better)

    def as_dict(self) -> dict[str, object]:
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "hypothesis"}
        return {**{k: getattr(self.hypothesis, k) for k in DECIDED_FIELDS}, **own}


#: Below this a p-value is shown as a bound: how an incomplete beta rounds there (a subnormal
#: from one library, 0 from another) is not a difference any reader should see in a decision text.
P_FLOOR = 1e-300


def p_text(p: float) -> str:
    """``p = 0.0123`` (3 significant digits), or ``p < 1e-300`` where p underflows towards the
    subnormals (the decision is the same either way: alpha is never that small)."""
    return f"p < {P_FLOOR:.0e}" if p < P_FLOOR else f"p = {p:.3g}"


def gate(h: Hypothesis, family: Family, completeness: Completeness) -> str | None:
    """Why ``h`` is not decided on these records (incomplete, or a budget stop before a time
    endpoint's decision that the protocol did not preregister), or ``None``.

    A budget stop ends a study at a point that depends on run times, which are the outcome of a
    time endpoint: decisions on time endpoints are then made only if the protocol says
    ``decide_time_after_budget_stop: true``, and they say that the stop depended on the outcome."""
    if completeness.complete is False and not completeness.budget_stop:
        return (
            f"incomplete: {completeness.missing_runs} of {completeness.planned_runs} planned runs have "
            "no ok record"
        )
    if completeness.budget_stop and h.endpoint in TIME_ENDPOINTS and not family.decide_time_after_budget_stop:
        return (
            "stopped by the budget rule, which depends on run times, this endpoint's outcome; the protocol did not "
            "preregister deciding time endpoints after such a stop (decide_time_after_budget_stop)"
        )
    return None


def decide(
    spec: Family | Mapping[str, object],
    pairs_of: Mapping[tuple[str, str], Sequence[Pair | PairRow]],
    completeness: Completeness,
    identity: str | None = None,
    replicated: bool = False,
) -> list[HypothesisDecision]:
    """Every hypothesis' decision, in the protocol's order.

    Parameters
    ----------
    spec
        The family (:class:`.hypotheses.Family`), or the protocol's ``hypotheses`` block as records
        carry it (``procedure``, ``family_alpha``, ``min_pairs``, ``tests``, optionally
        ``decide_time_after_budget_stop``), which is typed first.
    pairs_of
        The used pairs per (study, configuration), as ``summary.json``'s ``pairs``.
    completeness
        :func:`.attempts.completeness` of the records.
    identity
        The identity rule (:data:`.hypotheses.IDENTITY_RULES`) deciding a hypothesis whose pairs
        are all identical: ``"zero"`` (records of schema 4, :func:`.hypotheses.identity_result`),
        ``"sign"`` (schema 5 on, the exact sign test's ``p = 2^-n``); ``None`` (before schema 4):
        such a hypothesis is not reached.
    replicated
        Whether the protocol declares ``replicates`` (:func:`.hypotheses.test_of`).

    Raises
    ------
    ValueError
        A family or hypothesis the protocol's rules refuse (:func:`.hypotheses.rule_problems`:
        ``harness plan`` refuses the same), naming the hypothesis and key.

    Notes
    -----
    ``fixed_sequence``: each hypothesis in order at the family's alpha; after the first one not
    established, the rest are not reached (a failed prerequisite). ``holm``: p-values sorted
    ascending (ties by protocol order), the k-th (from 1) compared with ``alpha / (m - k + 1)``;
    the first failure stops the procedure (Holm, 1979, *Scand. J. Statist.* 6:65). A hypothesis
    without a test (too few pairs, zero spread, a null endpoint, incomplete) counts as ``p = 1``.
    A hypothesis is established when ``p < alpha``, strictly (:func:`.ttests.passes`: for a
    t test, its statistic exceeds the critical value ``t_{1-alpha, df}`` by a relative ``1e-12``, the
    same doubles in the audit, so a ``p`` within rounding of alpha never splits them; for ranks, the
    exact ``p`` is below alpha; when each rule keeps ``P(p <= alpha) <= alpha``: the module's notes).
    A t test whose per-pair values agree to the rounding of the endpoint values
    (:func:`.descriptive.spread_is_rounding`; period-adjusted: within each order group), whose squares would underflow or overflow (:func:`.descriptive.magnitude_problem`), or
    whose standard error is 0, is "not reached" with that reason. The interval shown is two-sided at
    ``1 - 2 alpha_used`` (its favourable end is the one-sided bound the test compares), computed on
    the test scale and mapped to the estimand's units. A budget stop: :func:`gate`.
    """
    family = Family.of(spec)
    tested = _tested(family, pairs_of, completeness, identity, replicated)
    procedure = fixed_sequence if family.procedure == "fixed_sequence" else holm
    verdicts, used = procedure(tested, family.family_alpha)
    return [
        decision_of(
            h, t, verdicts[h.id], used[h.id], unreached, completeness, pairs_of.get((h.study, h.config), [])
        )
        for h, t, _why, unreached in tested
    ]


def _tested(
    family: Family,
    pairs_of: Mapping[tuple[str, str], Sequence[Pair | PairRow]],
    completeness: Completeness,
    identity: str | None,
    replicated: bool = False,
) -> list[Tested]:
    out: list[Tested] = []
    for h in family.tests:
        gate_ = gate(h, family, completeness)
        if gate_ is not None:
            out.append((h, None, gate_, None))
        else:
            pairs = pairs_of.get((h.study, h.config), [])
            out.append((h, *test_of(h, pairs, family.min_pairs, identity, replicated)))
    return out


def _in_units(
    t: TestResult, a: float | None, h: Hypothesis, pairs: Sequence[Pair | PairRow]
) -> tuple[float | None, float | None, float | None, float | None]:
    """A test's estimate and, for a t or sign test with an alpha, its two-sided ``1 - 2 a`` interval
    (the sign test's: :func:`.ranks.median_bounds`, ``None`` at an unbounded end), in the estimand's
    units: (estimate, low, high, level)."""
    if (
        t.method not in ("t", "t-period-adjusted", "t-order-cells", "t-replicates", "sign")
        or t.estimate is None
    ):
        return t.estimate, None, None, None
    rr = h.estimand == "relative_reduction"
    estimate = reduction(t.estimate) if rr else t.estimate
    if a is None:
        return estimate, None, None, None
    low: float | None
    high: float | None
    if t.method == "sign":
        low, high = median_bounds(values_of(h, pairs)[0], a)
    else:
        assert t.standard_error is not None  # a t test has one
        q = critical_t(a, t.df)
        low, high = t.estimate - q * t.standard_error, t.estimate + q * t.standard_error
    if rr:
        low, high = (None if high is None else reduction(high)), (None if low is None else reduction(low))
    return estimate, low, high, 1.0 - 2.0 * a


def decision_of(
    h: Hypothesis,
    t: TestResult | None,
    verdict: tuple[str, str | None],
    a: float | None,
    unreached: dict[str, int] | None,
    completeness: Completeness,
    pairs: Sequence[Pair | PairRow],
) -> HypothesisDecision:
    """One hypothesis' decision from its test, its verdict ``(status, reason)`` and the alpha its
    test used (the interval is two-sided at ``1 - 2 a``), in the estimand's units, with its sentence."""
    st, reason = verdict
    if (
        t is not None and t.method == "identity" and reason is None
    ):  # the report's reason column says which rule
        reason = f"{identical_shown(h, t.n)}: the identity rule (records of schema 4)"
    elif t is not None and t.method == "sign" and h.test != "sign" and reason is None:
        reason = f"{identical_shown(h, t.n)}: {IDENTICAL_BY_SIGN}"
    estimate, low, high, level = _in_units(t, a, h, pairs) if t is not None else (None, None, None, None)
    return HypothesisDecision(
        hypothesis=h,
        status=st,
        reason=reason,
        alpha=a,
        test=asdict(t) if t is not None else None,
        estimate=estimate,
        estimate_of=None
        if t is None
        else (t.estimate_of if t.method in ("signed-rank", "sign") else _label(h)),
        low=low,
        high=high,
        level=level,
        unreached=unreached,
        text=_text(h, st, reason, t, a, low, high, completeness),
    )


def _label(h: Hypothesis) -> str:
    if h.censoring != "restricted_mean":
        return h.estimand
    tau = f"{h.restriction_s:g} s" if h.restriction_s else "the pair's shorter training time"
    return f"{h.estimand} of the restricted times min(T, tau), tau = {tau}"


def _text(
    h: Hypothesis,
    status: str,
    reason: str | None,
    t: TestResult | None,
    a: float | None,
    low: float | None,
    high: float | None,
    completeness: Completeness,
) -> str:
    what = {
        "superiority": "superiority",
        "non_inferiority": f"non-inferiority (margin {h.margin:g})",
        "equivalence": f"equivalence (margin {h.margin:g})",
    }[h.type]
    head = f"{h.id}: {what} of {h.endpoint} ({h.estimand}, {h.better} is better)"
    if t is None:
        return f"{head}: not reached ({reason})"
    if t.method == "identity":
        held = "the interval [0, 0] lies inside" if status == "established" else "0 is not inside"
        return (
            f"{head}: {status}: {identical_shown(h, t.n)} (the identity rule: {held} the alternative region)"
        )
    stats = f"{p_text(t.p_value)} against alpha {a:.3g}" if a is not None else p_text(t.p_value)
    if t.method == "sign":
        stats += f"; sign test of the median, {int(t.statistic)} of {t.n} pairs favourable"
        if a is not None:
            iv = "unbounded (too few pairs for the level)" if low is None else f"{low:+.5g} to {high:+.5g}"
            stats += f"; {100 * (1 - 2 * a):.4g}% interval for the median {iv}"
    elif low is not None and a is not None:  # an interval is made only at a level: a is set
        stats += f"; {100 * (1 - 2 * a):.4g}% interval {low:+.5g} to {high:+.5g}"
    verdict = status if reason is None else f"{status} ({reason})"
    prefix = ""
    if completeness.budget_stop:
        prefix = (
            "(study stopped by its budget rule; the stop depended on run times, this endpoint's outcome) "
            if h.endpoint in TIME_ENDPOINTS
            else "(study stopped by its budget rule) "
        )
    return f"{prefix}{head}: {verdict}; {stats}"


def sensitivity(
    h: Hypothesis | Mapping[str, object],
    pairs: Sequence[Pair | PairRow],
    failed: Sequence[Mapping[str, object]],
) -> dict[str, object] | None:
    """Pre-specified sensitivity analysis: a pair whose arm failed counts as adverse to that arm.

    Notes
    -----
    On the hypothesis' test scale, with its alternative region ``lo < m < hi`` (:func:`.hypotheses.bounds`):
    each one-sided part is a signed-rank test (:func:`.ranks.signed_rank`) of the
    distances ``v - lo`` (or ``hi - v``) of the used pairs' values from its bound, plus, for each
    pair with one failed and one ok arm, a distance ``W = 1 + 2 max |distance|`` on the side adverse
    to the failed arm (worse than any observed pair). Superiority and non-inferiority: one test at
    the margin; equivalence: both, ``p`` the larger. Worst-rank hypotheses use their scores and
    bound 0. It never changes the decision; it shows whether excluding failed pairs could have
    produced it. ``None`` when no pair has a failed arm or the used pairs cannot be valued.
    """
    if not failed:
        return None
    h = Hypothesis.of(h)
    try:
        values = values_of(h, pairs)[0] if pairs else []
        lo, hi = bounds(h)
    except ValueError:
        return None
    s = sign(h.better)
    parts = []
    for bound, k in ((lo, 1), (hi, -1)):  # distance k (v - bound) > 0 inside the alternative
        if bound is None:
            continue
        dist = [k * (v - bound) for v in values]
        w = 1.0 + 2.0 * max((abs(x) for x in dist), default=0.0)
        # a failed candidate moves v towards -s (worse for it), a failed baseline towards +s
        dist += [(-s if f["failed"] == "candidate" else s) * k * w for f in failed]
        parts.append(signed_rank(dist, 1))
    worst = max(parts, key=lambda r: r.p_value)
    return {
        "pairs_with_a_failed_arm": len(failed),
        "failed_candidate": sum(f["failed"] == "candidate" for f in failed),
        "n": worst.n,
        "statistic": worst.statistic,
        "p_value": worst.p_value,
        "method": "signed-rank of the distances from the hypothesis' bound"
        + (" (both bounds, the larger p)" if len(parts) == 2 else "")
        + "; a failed arm ranks worse than every observed pair",
    }


def fixed_sequence(tested: list[Tested], alpha: float) -> Verdicts:
    """Each hypothesis in order at ``alpha``; after the first one not established, the rest are not reached."""
    status: dict[str, tuple[str, str | None]] = {}
    used: dict[str, float | None] = {}
    failed = None
    for h, t, why, _ in tested:
        if failed is not None:
            status[h.id] = ("not reached", f"a failed prerequisite in the hierarchy: {failed}")
            used[h.id] = None
        elif t is None:
            status[h.id], used[h.id] = ("not reached", why), alpha
            failed = h.id
        else:
            used[h.id] = alpha
            ok = passes(t, alpha)
            status[h.id] = ("established" if ok else "not established", None)
            failed = None if ok else h.id
    return status, used


def holm(tested: list[Tested], alpha: float) -> Verdicts:
    """Holm's step-down procedure (Holm, 1979, *Scand. J. Statist.* 6:65): ascending p (a hypothesis
    not reached counts as p = 1, ties in protocol order), the k-th (from 0) at ``alpha / (m - k)``,
    stopping at the first one not established."""
    status: dict[str, tuple[str, str | None]] = {}
    used: dict[str, float | None] = {}
    m = len(tested)
    p = [t.p_value if t is not None else 1.0 for _, t, _, _ in tested]
    stopped = False
    for k, i in enumerate(sorted(range(m), key=lambda i: (p[i], i))):
        h, t, why, _ = tested[i]
        a = alpha / (m - k)
        used[h.id] = a
        if t is None:
            status[h.id] = ("not reached", why)
            stopped = True
        elif stopped:
            status[h.id] = ("not established", "Holm's procedure stopped at an earlier hypothesis")
        else:
            ok = passes(t, a)
            status[h.id] = ("established" if ok else "not established", None)
            stopped = not ok
    return status, used

"""A preregistered hypothesis and its test, with the standard library alone: the typed hypothesis,
its alternative region on the test scale, its per-pair values (the endpoint's two values checked:
finite, positive for ratios; a null or non-finite one makes the hypothesis "not reached", naming the
pair; restricted mean times and worst-rank scores for time to target; the unreached counts) and the
test that decides it. Their one home: the analysis' summary and the audit both call these.

Records carry the protocol's resolved ``hypotheses`` block as JSON (``tests``: one mapping per
hypothesis, :func:`prereg.protocol.read.protocol_of`); :meth:`Hypothesis.of` turns one into the
frozen :class:`Hypothesis` at that boundary, refusing keys it does not know. The sign convention is
:mod:`.descriptive`'s; ratio estimands are tested on the log ratio (:mod:`.ttests`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

from prereg.carryover import cells_mean
from prereg.descriptive import magnitude_problem, mean_se, rounding_scale, scale, spread_is_rounding
from prereg.ranks import median, sign_test, signed_rank, worst_rank_differences
from prereg.sequential import looks_problems
from prereg.ttests import TestResult, one_sided, period_adjusted_mean, sign, t_result

#: A used pair's row as the summary holds it (``summary.json``'s ``pairs``): unit, seed, order, first,
#: device and each arm's endpoint values (``baseline_training_s``, ``candidate_test_bpb``, ...).
PairRow = Mapping[str, Any]


@dataclass(frozen=True)
class Pair:
    """One used pair, typed: what the decisions, the per-pair values and the order diagnostics read.

    Its fields are a row of ``summary.json``'s ``pairs`` (:meth:`of` reads one, refusing a key it
    does not know; a missing one is ``None``). The endpoint values are as the records hold them
    (``None`` for a missing or non-finite one); the rules check them (finite, positive for ratios)
    where they use them, naming the pair (:class:`NotReached`).

    Attributes
    ----------
    unit, seed, order, first, device
        The pair's unit id, seed, plan position of its first run, the arm that ran first
        (``baseline`` or ``candidate``) and the host and device it ran on.
    baseline_*, candidate_*
        Each arm's training time, training CPU time (records since lockstep), time to target
        (``None``: not reached), total time, test BPB, peak memory and, in a study of command arms,
        the study's metric at the last evaluation (``final_metric``).
    time_reduction_pct, test_bpb_difference
        ``100 (1 - c / b)`` of the training times and ``c - b`` of the test BPB, where both are valid.
    """

    unit: str = "?"
    seed: int | None = None
    order: int | None = None
    first: str | None = None
    device: str | None = None
    baseline_training_s: float | None = None
    candidate_training_s: float | None = None
    baseline_training_cpu_s: float | None = field(default=None, metadata={"omit_none": True})
    candidate_training_cpu_s: float | None = field(default=None, metadata={"omit_none": True})
    baseline_time_to_target_s: float | None = None
    candidate_time_to_target_s: float | None = None
    baseline_total_s: float | None = None
    candidate_total_s: float | None = None
    baseline_test_bpb: float | None = None
    candidate_test_bpb: float | None = None
    baseline_peak_memory_bytes: float | None = None
    candidate_peak_memory_bytes: float | None = None
    # a command study's metric at each arm's last evaluation (its pairs only: other rows have none)
    baseline_final_metric: float | None = field(default=None, metadata={"omit_none": True})
    candidate_final_metric: float | None = field(default=None, metadata={"omit_none": True})
    # a planted study's pairs: what the candidate's plant took on each clock (prereg.planted)
    candidate_planted_s: float | None = field(default=None, metadata={"omit_none": True})
    candidate_planted_cpu_s: float | None = field(default=None, metadata={"omit_none": True})
    # a truth study's candidate: its mean step time with and without its plant (prereg.planted)
    candidate_on_us: float | None = field(default=None, metadata={"omit_none": True})
    candidate_off_us: float | None = field(default=None, metadata={"omit_none": True})
    candidate_on_cpu_us: float | None = field(default=None, metadata={"omit_none": True})
    candidate_off_cpu_us: float | None = field(default=None, metadata={"omit_none": True})
    # a lockstep pair's mean step times after the arm's own step (prereg.carryover.own_step_means)
    baseline_own_step_us: float | None = field(default=None, metadata={"omit_none": True})
    candidate_own_step_us: float | None = field(default=None, metadata={"omit_none": True})
    baseline_own_step_cpu_us: float | None = field(default=None, metadata={"omit_none": True})
    candidate_own_step_cpu_us: float | None = field(default=None, metadata={"omit_none": True})
    # a lockstep pair whose records keep their step times: the arm that took the first block
    steps_first: str | None = field(default=None, metadata={"omit_none": True})
    # a study with warm-up steps: each arm's warm-up time, apart from the training clock
    baseline_warmup_s: float | None = field(default=None, metadata={"omit_none": True})
    candidate_warmup_s: float | None = field(default=None, metadata={"omit_none": True})
    # a replicated protocol's pairs: the replicate (1-based) the pair ran in (prereg.replicates)
    replicate: int | None = field(default=None, metadata={"omit_none": True})
    time_reduction_pct: float | None = None
    test_bpb_difference: float | None = None

    @classmethod
    def of(cls, row: Pair | PairRow) -> Pair:
        """A pair's row, typed; refuses keys it does not know."""
        if isinstance(row, Pair):
            return row
        unknown = sorted(set(row) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"pair {row.get('unit', '?')}: unknown keys {', '.join(unknown)}")
        return cls(**row)

    def to_json(self) -> dict[str, object]:
        """The pair's row (``summary.json``'s ``pairs``): every field, but the CPU time columns only
        where the records have them (earlier records do not)."""
        return present(self)

    def quality_difference(self) -> float | None:
        """Candidate minus baseline of the quality the pair has: a command study's final metric,
        else the test BPB (``None`` where an arm's is missing)."""
        b, c = self.baseline_final_metric, self.candidate_final_metric
        if b is None and c is None:
            return self.test_bpb_difference
        return None if b is None or c is None else c - b

    def value(self, role: str, key: str) -> Any:
        """Arm ``role``'s value of endpoint column ``key`` (``training_s``, ``test_bpb``, ...), unchecked."""
        return getattr(self, f"{role}_{key}")

    def log_ratio(self, key: str = "training_s") -> float:
        """``ln(c / b)`` of the two arms' ``key`` (the caller has both checked positive)."""
        return math.log(self.value("candidate", key) / self.value("baseline", key))


def present(obj: object) -> dict[str, object]:
    """A dataclass instance's fields by name, as its JSON holds them: a field whose metadata says
    ``omit_none`` is left out while it is ``None`` (a column that earlier records do not have)."""
    if not is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"present() takes a dataclass instance, not {type(obj).__name__}")
    return {
        f.name: v
        for f in fields(obj)
        if (v := getattr(obj, f.name)) is not None or not f.metadata.get("omit_none")
    }


def typed_pairs(pairs: Sequence[Pair | PairRow]) -> list[Pair]:
    """Each pair as a :class:`Pair` (rows read with :meth:`Pair.of`)."""
    return [Pair.of(p) for p in pairs]


#: The values of each key of a hypothesis and of its family (the protocol's ``hypotheses`` block).
ENDPOINTS = (
    "training_time",
    "training_cpu_time",
    "own_step_time",
    "own_step_cpu_time",
    "time_to_target",
    "total_time",
    "test_bpb",
    "peak_memory",
    "final_metric",
)
CHOICES: dict[str, tuple[str, ...]] = {
    "endpoint": ENDPOINTS,
    "estimand": ("difference", "relative_reduction", "log_ratio"),
    "type": ("superiority", "non_inferiority", "equivalence"),
    "better": ("lower", "higher"),
    "censoring": ("worst_rank", "restricted_mean"),
    "procedure": ("holm", "fixed_sequence"),
    "test": ("t", "sign"),
}


def _finite(x: float) -> bool:
    """Whether ``x`` is a finite float (an int too big for one, ``10**400``, is not)."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def rule_problems(h: Mapping[str, object]) -> list[tuple[str, str]]:
    """What is wrong with one hypothesis by the protocol's rules, as ``(key, message)`` pairs (empty
    when nothing is): a key's value outside its choices, a margin of the wrong sign, time to target
    without its censoring rule, a worst-rank test that is not superiority at margin 0 (it is a rank
    test of the sign of the difference: it has no margin and no period adjustment), censoring or a
    restriction time where they do not apply, a relative margin of 100% or more, BPB compared other
    than as a difference, a sign test with a period adjustment. The one home of these rules: ``harness plan`` (the protocol parser) names
    the first in the protocol file; the audit reading the tagged protocol and :func:`.decisions.decide`
    refuse the hypothesis with it."""
    out: list[tuple[str, str]] = []
    for key in ("endpoint", "estimand", "type", "better", "censoring", "test"):
        v = h.get(key)
        if (v is not None or key not in ("censoring", "test")) and v not in CHOICES[key]:
            out.append((key, f"{v!r} is not one of {', '.join(CHOICES[key])}"))
    if out:
        return out
    raw = h.get("margin") or 0.0
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not _finite(raw):
        return out + [("margin", f"{str(raw)[:24]!r}: the margin is a finite number")]
    margin, kind, cens = float(raw), str(h["type"]), h.get("censoring")  # a choice: a str
    if kind == "superiority" and margin < 0:
        out.append(("margin", "a superiority margin is >= 0"))
    if kind != "superiority" and margin <= 0:
        out.append(("margin", f"a {kind} hypothesis needs a positive margin"))
    out += _censoring_problems(h, kind, margin, cens)
    if h["estimand"] == "relative_reduction" and margin >= 100:
        out.append(("margin", "a relative_reduction margin is a percentage below 100"))
    if h["estimand"] != "difference" and h["endpoint"] == "test_bpb":
        out.append(("estimand", "test_bpb is compared as a difference (BPB)"))
    return out


def _censoring_problems(
    h: Mapping[str, object], kind: str, margin: float, cens: object
) -> list[tuple[str, str]]:
    """:func:`rule_problems`' rules on time to target's censoring, its restriction time and the
    sign test's pairing with them."""
    out: list[tuple[str, str]] = []
    if h["endpoint"] == "time_to_target":
        if cens is None:
            out.append(
                (
                    "censoring",
                    "a time_to_target hypothesis must say how an unreached target counts: "
                    "censoring: worst_rank or restricted_mean",
                )
            )
        elif cens == "worst_rank" and (kind != "superiority" or margin != 0 or h.get("period_adjusted")):
            out.append(("censoring", "worst_rank is a rank test: superiority with margin 0 only"))
    elif cens is not None:
        out.append(("censoring", "censoring applies to time_to_target only"))
    if h.get("restriction_s") is not None and cens != "restricted_mean":
        out.append(("restriction_s", "restriction_s is the restriction time of censoring: restricted_mean"))
    if h.get("test") == "sign" and cens == "worst_rank":
        out.append(
            (
                "test",
                "worst_rank scores are decided by the signed-rank test: with test: sign use restricted_mean",
            )
        )
    if h.get("test") == "sign" and h.get("period_adjusted"):
        out.append(("test", "the sign test has no period adjustment: period_adjusted is for the t test"))
    return out


def family_problems(spec: Mapping[str, object]) -> list[tuple[str, str]]:
    """What is wrong with a family's own keys, as ``(key, message)`` pairs: the procedure, a
    family-wise error rate outside (0, 0.5), fewer than 3 minimum pairs (an interval needs a spread)."""
    out: list[tuple[str, str]] = []
    if spec.get("procedure") not in CHOICES["procedure"]:
        out.append(
            ("procedure", f"{spec.get('procedure')!r} is not one of {', '.join(CHOICES['procedure'])}")
        )
    alpha = spec.get("family_alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 0.5:
        out.append(("family_alpha", "a one-sided family-wise error rate in (0, 0.5)"))
    n = spec.get("min_pairs")
    if isinstance(n, bool) or not isinstance(n, int) or n < 3:
        out.append(("min_pairs", "at least 3 (an interval needs a spread)"))
    return out


@dataclass(frozen=True)
class Hypothesis:
    """A one-sided test of one endpoint of one (study, configuration)'s pairs.

    Attributes
    ----------
    endpoint
        ``training_time``, ``time_to_target``, ``total_time``, ``test_bpb`` or ``peak_memory``.
    estimand
        ``difference`` (``c - b``), ``log_ratio`` (``ln c - ln b``) or ``relative_reduction``
        (``100 (1 - c / b)``), candidate ``c`` against baseline ``b``.
    type
        ``superiority``, ``non_inferiority`` or ``equivalence`` (at ``margin``, in the estimand's units).
    better
        ``lower`` or ``higher``: which way the candidate is better.
    censoring, restriction_s
        Time to target only: ``worst_rank`` or ``restricted_mean`` (restricted at ``restriction_s``,
        by default each pair's shorter training time).
    period_adjusted
        Test the AB/BA period-adjusted mean instead of the plain mean.
    test
        ``None`` or ``t``: the paired t test of the mean (the signed-rank test for worst-rank
        scores); ``sign``: the exact sign test of the median (:func:`.ranks.sign_test`), the rule
        for skewed differences, declared before any outcome exists.
    """

    id: str
    study: str
    config: str
    endpoint: str
    estimand: str
    type: str
    better: str
    margin: float = 0.0
    censoring: str | None = None
    period_adjusted: bool = False
    restriction_s: float | None = None
    test: str | None = None

    @classmethod
    def of(cls, h: Hypothesis | Mapping[str, Any]) -> Hypothesis:
        if isinstance(h, Hypothesis):
            return h
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(h) - known)
        if unknown:
            raise ValueError(f"hypothesis {h.get('id')!r}: unknown keys {', '.join(unknown)}")
        wrong = rule_problems(h)
        if wrong:
            key, message = wrong[0]
            raise ValueError(f"hypothesis {h.get('id')!r}: {key}: {message}")
        margin, tau = h.get("margin", 0.0), h.get("restriction_s")
        return cls(
            **{
                **{k: v for k, v in h.items() if k in known},
                "margin": float(margin or 0.0),
                "restriction_s": None if tau is None else float(tau),
                "period_adjusted": bool(h.get("period_adjusted", False)),
            }
        )


@dataclass(frozen=True)
class Family:
    """The preregistered family: its hypotheses in the protocol's order and the rule over them.

    Attributes
    ----------
    procedure
        ``fixed_sequence`` or ``holm`` (:func:`.decisions.decide`).
    family_alpha
        The family-wise error rate.
    min_pairs
        A hypothesis with fewer used pairs is not reached.
    tests
        The hypotheses, typed (:meth:`Hypothesis.of`).
    decide_time_after_budget_stop
        Whether time endpoints are decided after a budget stop (the stop depends on run times).
    sequential
        The group-sequential design (:class:`Sequential`), or ``None`` for one analysis at the end.
    """

    procedure: str
    family_alpha: float
    min_pairs: int
    tests: tuple[Hypothesis, ...]
    decide_time_after_budget_stop: bool = False
    sequential: Sequential | None = None

    @classmethod
    def of(cls, spec: Family | Mapping[str, Any]) -> Family:
        """The protocol's ``hypotheses`` block as records carry it, typed; refuses keys it does not know."""
        if isinstance(spec, Family):
            return spec
        unknown = sorted(set(spec) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"hypotheses: unknown keys {', '.join(unknown)}")
        wrong = family_problems(spec)
        seq = spec.get("sequential")
        if seq is not None and not wrong:
            looks = seq.get("looks") if isinstance(seq, dict) else None
            last = looks[-1] if isinstance(looks, list) and looks else 0
            names = [str(t.get("study")) for t in spec["tests"]]
            found = looks_problems(seq, [last], int(spec["min_pairs"]), names)
            wrong = [(k if k == "sequential" else f"sequential.{k}", m) for k, m in found]
        if wrong:
            raise ValueError(f"hypotheses: {wrong[0][0]}: {wrong[0][1]}")
        return cls(
            procedure=spec["procedure"],
            family_alpha=float(spec["family_alpha"]),
            min_pairs=int(spec["min_pairs"]),
            tests=tuple(map(Hypothesis.of, spec["tests"])),
            decide_time_after_budget_stop=bool(spec.get("decide_time_after_budget_stop", False)),
            sequential=None if seq is None else Sequential.of(seq),
        )


@dataclass(frozen=True)
class Sequential:
    """A group-sequential design (:mod:`.sequential`): the pair counts of its looks (the last is the
    planned number of pairs), its alpha-spending function and its non-binding futility bound on the
    Z scale of each test's p-value (``None``: no futility stop)."""

    looks: tuple[int, ...]
    spending: str
    futility_z: float | None = None

    @classmethod
    def of(cls, spec: Sequential | Mapping[str, object]) -> Sequential:
        """The ``sequential`` block as records carry it (checked by :meth:`Family.of` first), typed."""
        if isinstance(spec, Sequential):
            return spec
        looks, spending, fut = spec["looks"], spec["spending"], spec.get("futility_z")
        if not isinstance(looks, (list, tuple)) or not isinstance(spending, str):
            raise ValueError("hypotheses: sequential: looks is a list of pair counts and spending a name")
        if fut is not None and (isinstance(fut, bool) or not isinstance(fut, (int, float))):
            raise ValueError(f"hypotheses: sequential.futility_z: {fut!r} is not a number")
        return cls(tuple(looks), spending, None if fut is None else float(fut))


def bounds(h: Hypothesis | Mapping[str, Any]) -> tuple[float | None, float | None]:
    """The alternative region of hypothesis ``h`` for the mean on its test scale.

    Notes
    -----
    ``difference`` and ``log_ratio``: :func:`one_sided` with the margin as written. ``relative_reduction``
    ``E = 100 (1 - exp(L))`` is decreasing in ``L``, with inverse ``g(x) = ln(1 - x/100)``: with
    ``better: lower`` superiority ``E > d`` is ``L < g(d)`` and non-inferiority ``E > -d`` is
    ``L < g(-d)``; with ``better: higher`` they are ``E < -d`` (``L > g(-d)``) and ``E < d``
    (``L > g(d)``); equivalence ``-d < E < d`` is ``g(d) < L < g(-d)``. A relative margin is a
    percentage of the baseline, so its mirror (arms swapped) is the margin ``100 d / (100 - d)``.
    """
    if isinstance(h, Hypothesis):
        d, kind, estimand, better = h.margin, h.type, h.estimand, h.better
    else:  # the four keys that define the region suffice
        d, kind, estimand, better = float(h.get("margin", 0.0)), h["type"], h["estimand"], h["better"]
    if estimand != "relative_reduction":
        return one_sided(sign(better), kind, d)

    def g(x: float) -> float:
        return math.log1p(-x / 100.0)

    if kind == "equivalence":
        return g(d), g(-d)
    e = d if kind == "superiority" else -d
    return (None, g(e)) if better == "lower" else (g(-e), None)


ENDPOINT_KEYS = {
    "training_time": "training_s",
    "training_cpu_time": "training_cpu_s",
    # a lockstep pair's mean step time after the arm's own step (prereg/carryover.own_step_means)
    "own_step_time": "own_step_us",
    "own_step_cpu_time": "own_step_cpu_us",
    "time_to_target": "time_to_target_s",
    "total_time": "total_s",
    "test_bpb": "test_bpb",
    "peak_memory": "peak_memory_bytes",
    "final_metric": "final_metric",
}


def cpu_time_columns(baseline: Mapping[str, object], candidate: Mapping[str, object]) -> dict[str, object]:
    """A pair's training CPU time columns (``baseline_training_cpu_s``, ``candidate_training_cpu_s``)
    from its arms' ``timings``, when both recorded one on the same clock (records before CPU time
    have none, and their pairs no such columns; a configuration reports CPU time only when every
    pair has them)."""
    if "training_cpu_s" not in baseline or "training_cpu_s" not in candidate:
        return {}
    if baseline.get("training_cpu_clock") != candidate.get("training_cpu_clock"):
        return {}  # a thread's CPU time against a process's: not one endpoint
    return {
        "baseline_training_cpu_s": baseline["training_cpu_s"],
        "candidate_training_cpu_s": candidate["training_cpu_s"],
    }


class NotReached(ValueError):
    """The data cannot decide a hypothesis; the message is the reason."""


def _number(p: Pair, role: str, key: str, positive: bool) -> float:
    v = p.value(role, key)
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or (positive and v <= 0)
    ):
        what = "null" if v is None else f"{v!r}, not a finite{' positive' if positive else ''} number"
        raise NotReached(f"pair {p.unit}: the {role}'s {key} is {what} in an ok record")
    return float(v)


def _restricted(h: Hypothesis, pairs: Sequence[Pair]) -> tuple[list[float], list[float]]:
    """Restricted times ``min(T, tau)`` of both arms, one restriction ``tau`` per pair for both arms.

    ``tau`` is the hypothesis' ``restriction_s`` or, by default, the shorter of the pair's two
    training times (both fixed-step runs were observed that long, so ``min(T, tau)`` is known
    for both arms with no imputation: an unreached arm has ``T > tau``). The decision then
    compares restricted mean times (Royston & Parmar 2013, *BMC Med. Res. Methodol.* 13:152).
    """
    b: list[float] = []
    c: list[float] = []
    for p in pairs:
        train = {r: _number(p, r, "training_s", True) for r in ("baseline", "candidate")}
        tau = h.restriction_s or min(train.values())
        for role, out in (("baseline", b), ("candidate", c)):
            t = p.value(role, "time_to_target_s")
            if t is None:
                if train[role] < tau:
                    raise NotReached(
                        f"pair {p.unit}: the {role} missed the target after training "
                        f"{train[role]:.6g} s, less than the restriction {tau:g} s: its restricted "
                        "time is unknown"
                    )
                out.append(tau)
            else:
                out.append(min(_number(p, role, "time_to_target_s", True), tau))
    return b, c


def values_of(
    h: Hypothesis | Mapping[str, object], pairs: Sequence[Pair | PairRow]
) -> tuple[list[float], dict[str, int] | None]:
    """Per-pair values on the hypothesis' test scale, and the unreached counts for time to target.

    Raises :class:`NotReached` naming the pair, arm and key of a null or non-finite endpoint.
    """
    values, _scales, unreached = values_and_scales(Hypothesis.of(h), pairs)
    return values, unreached


def values_and_scales(
    h: Hypothesis, pairs: Sequence[Pair | PairRow]
) -> tuple[list[float], list[float] | None, dict[str, int] | None]:
    """:func:`values_of` and, but for worst-rank scores, each value's :func:`rounding_scale`.

    Parameters
    ----------
    h : Hypothesis
        The hypothesis: its endpoint, estimand and censoring rule say which values.
    pairs : sequence of Pair or mapping
        The used pairs (or their rows in ``summary.json``'s ``pairs``).

    Returns
    -------
    values : list of float
        One value per pair on the test scale (``c - b`` or ``ln c - ln b``; worst-rank scores).
    scales : list of float or None
        Each value's rounding scale (:func:`.descriptive.rounding_scale`); ``None`` for worst-rank
        scores, which the signed-rank test takes.
    unreached : dict or None
        For time to target, how many baseline, candidate and both arms missed the target.

    Raises
    ------
    NotReached
        Naming the pair, arm and key of a null or non-finite endpoint, or a restricted time that
        is unknown.
    """
    key = ENDPOINT_KEYS[h.endpoint]
    ratio = scale(h.estimand) == "log_ratio"
    unreached = None
    pairs = typed_pairs(pairs)
    if h.endpoint == "time_to_target":
        raw = {r: [p.value(r, key) for p in pairs] for r in ("baseline", "candidate")}
        unreached = {
            "baseline": raw["baseline"].count(None),
            "candidate": raw["candidate"].count(None),
            "both": sum(x is None and y is None for x, y in zip(raw["baseline"], raw["candidate"])),
        }
        for p in pairs:
            for role in ("baseline", "candidate"):
                if p.value(role, key) is not None:
                    _number(p, role, key, True)
        if h.censoring == "worst_rank":
            return worst_rank_differences(raw["baseline"], raw["candidate"]), None, unreached
        b, c = _restricted(h, pairs)
    else:
        b = [_number(p, "baseline", key, ratio) for p in pairs]
        c = [_number(p, "candidate", key, ratio) for p in pairs]
    scales = rounding_scale(b, c, scale(h.estimand))
    if ratio:
        return [math.log(y) - math.log(x) for x, y in zip(b, c)], scales, unreached
    return [y - x for x, y in zip(b, c)], scales, unreached


def worst_rank_estimate(pairs: Sequence[Pair | PairRow]) -> tuple[float | None, str]:
    """The estimate a worst-rank decision shows: the median log ratio where both arms reached the target.

    Parameters
    ----------
    pairs : sequence of Pair or mapping
        The used pairs.

    Returns
    -------
    estimate : float or None
        The median ``ln(c / b)`` of the pairs where both arms reached the target; ``None`` without one.
    what : str
        What the estimate is, for the decision's ``estimate_of``.
    """
    both = [
        math.log(p.candidate_time_to_target_s) - math.log(p.baseline_time_to_target_s)
        for p in typed_pairs(pairs)
        if p.baseline_time_to_target_s is not None and p.candidate_time_to_target_s is not None
    ]
    return median(both), f"median ln(c/b) of the {len(both)} pairs where both arms reached the target"


#: What an identity decision's estimate is (:func:`identity_result`).
IDENTICAL = "every pair identical: each pair's difference is exactly 0"


def identical_shown(h: Hypothesis, n: int) -> str:
    """What ``n`` pairs whose differences are all exactly 0 showed, in the same words whichever
    rule decides them (the identity rule of schema 4, the exact sign test of schema 5 on, or none
    before)."""
    return f"every pair identical: in all {n} pairs the two arms gave the same {h.endpoint}, bit for bit"


def identical_unreached(h: Hypothesis, n: int) -> str:
    """Why such pairs are not reached in records before schema 4: no rule failed, none applied."""
    return f"{identical_shown(h, n)}; shown, not tested: records before schema 4 have no rule for pairs without spread"


def identity_result(h: Hypothesis, n: int) -> TestResult:
    """The identity rule's decision of ``h`` when every pair's difference is exactly 0.

    Notes
    -----
    Every per-pair value is 0, so the mean is 0 and the interval at any level is ``[0, 0]``.
    Where 0 lies strictly inside the hypothesis' alternative region ``lo < m < hi``
    (:func:`bounds`: non-inferiority and equivalence at a positive margin) the hypothesis holds by
    identity: the t statistic ``(0 - lo) / se`` grows without bound as the spread goes to 0, so
    ``p -> 0``; it is ``p = 0`` here, and established at any alpha. Where 0 is not inside (any
    superiority hypothesis, worst-rank scores included) nothing favours the candidate: ``p = 1``,
    not established. Applies to records of schema 4 (:func:`.recompute.recompute`); later records
    are decided by the exact sign test, earlier ones keep the rule they were tagged with (not reached). docs/decisions.md gives the argument.
    """
    lo, hi = bounds(h)
    inside = (lo is None or lo < 0.0) and (hi is None or 0.0 < hi)
    return TestResult("identity", n, 0.0, None, 0, 0.0, 0.0 if inside else 1.0, IDENTICAL)


#: The identity rules: how a hypothesis whose every pair's difference is exactly 0 is decided,
#: by the records' schema (:func:`identity_rule`). ``None`` (before schema 4): not reached;
#: ``"zero"`` (schema 4): :func:`identity_result`, ``p = 0``; ``"sign"`` (schema 5 on), and at
#: every look of a sequential design: :func:`identical_sign_result`, ``p = 2^-n``.
IDENTITY_RULES = (None, "zero", "sign")


def identity_rule(schema_versions: Sequence[int]) -> str | None:
    """The identity rule of a records set, from its records' ``schema_version`` (the oldest one
    decides: a set is analysed under the rule all its records were written under)."""
    oldest = min(schema_versions, default=1)
    return "sign" if oldest >= 5 else "zero" if oldest >= 4 else None


def identical_sign_result(h: Hypothesis, n: int) -> TestResult:
    """An all-identical hypothesis (every pair's difference exactly 0) decided by the exact sign test.

    Notes
    -----
    Each of the ``n`` values (0) lies inside the alternative region where 0 does, so the sign test
    (:func:`.ranks.sign_test`) counts ``n`` of ``n`` favourable: ``p = P(Bin(n, 1/2) >= n) = 2^-n``.
    That ``p`` is exact for the median: if at most half the pairs' true differences lie inside the
    region, ``n`` identical pairs occur with probability at most ``2^-n``. The identity rule's
    ``p = 0`` (:func:`identity_result`) establishes non-inferiority at 3 pairs whenever they happen
    to agree, which in a study where 2% of pairs diverge by +0.5 BPB is 94% of studies at a nominal
    1% (``0.98^3``; ``python benchmarks/coverage.py --identity``); here 3 identical pairs give
    ``p = 1/8`` and at alpha 0.01 it takes 7. Where 0 is not inside the region (superiority)
    nothing favours the candidate: ``p = 1``, as under identity.
    """
    t = identity_result(h, n)
    if t.p_value != 0.0:
        return t
    return replace(t, method="sign", p_value=0.5**n, statistic=float(n), estimate_of=MEDIAN_OF)


#: What a sign test's estimate is (:func:`sign_result`).
MEDIAN_OF = "median of the per-pair values"


def sign_result(values: Sequence[float], region: tuple[float | None, float | None]) -> TestResult:
    """The sign test of ``h``'s region for the median of its per-pair values (:func:`.ranks.sign_test`).

    Its estimate is the sample median on the test scale; its statistic the count of values inside
    the region's bound (for equivalence, on the side with the larger p); no standard error. The
    interval the decision shows is :func:`.ranks.median_bounds` at the alpha the procedure used.
    """
    n, k, p = sign_test(values, *region)
    return TestResult("sign", n, median(values), None, 0, float(k), p, MEDIAN_OF)


def test_of(
    h: Hypothesis,
    pairs: Sequence[Pair | PairRow],
    min_pairs: int,
    identity: str | None = None,
    replicated: bool = False,
) -> tuple[TestResult | None, str | None, dict[str, int] | None]:
    """The test of ``h`` on its (study, configuration)'s used pairs, or why there is none.

    Returns
    -------
    test : TestResult or None
        The paired t test (period-adjusted where the hypothesis says so) of the per-pair values on
        the test scale, or for worst-rank scores the signed-rank test; ``None`` when not reached.
    why : str or None
        Why it is not reached: fewer pairs than ``min_pairs``, a null or non-finite endpoint, values
        identical or agreeing to rounding (:func:`.descriptive.spread_is_rounding`), magnitudes whose
        squares a double cannot hold (:func:`.descriptive.magnitude_problem`), a zero standard error.
    unreached : dict or None
        For time to target, how many baseline, candidate and both arms missed the target.

    With an ``identity`` rule (:data:`IDENTITY_RULES`: records of schema 4 on), every pair's
    difference exactly 0 is decided by :func:`identity_result` (``"zero"``) or
    :func:`identical_sign_result` (``"sign"``) instead of "not reached". ``replicated`` (the protocol
    declares ``replicates``, never the data): a t rule over them (:func:`_t_estimate`).
    """
    if len(pairs) < min_pairs:
        return None, f"too few pairs: {len(pairs)} of the protocol's min_pairs {min_pairs}", None
    unreached = None
    try:
        values, scales, unreached = values_and_scales(h, pairs)
        region = bounds(h)
    except NotReached as e:
        return None, str(e), unreached
    except ValueError:
        return None, f"a relative margin of {h.margin:g}% has no ratio", unreached
    decided = _identity_decision(h, values, identity)
    if decided is not None:
        return decided, None, unreached
    if h.test == "sign":
        return sign_result(values, region), None, unreached
    if scales is None:  # worst-rank scores: the signed-rank test
        test, why = _signed_rank_decision(h, pairs, values)
    else:
        test, why = _t_decision(h, pairs, values, scales, region, replicated)
    return test, why, unreached


def _identity_decision(h: Hypothesis, values: list[float], identity: str | None) -> TestResult | None:
    """The ``identity`` rule's decision (:data:`IDENTITY_RULES`) where every per-pair value is
    exactly 0 and ``h`` is not decided by the sign test; ``None`` where the rule does not apply."""
    if identity is None or h.test == "sign" or not values or any(v != 0.0 for v in values):
        return None
    if identity not in IDENTITY_RULES:
        raise ValueError(f"identity rule {identity!r} is not one of {IDENTITY_RULES[1:]}")
    decided = identity_result if identity == "zero" else identical_sign_result
    return decided(h, len(values))


def _signed_rank_decision(
    h: Hypothesis, pairs: Sequence[Pair | PairRow], values: list[float]
) -> tuple[TestResult | None, str | None]:
    """Worst-rank scores decided by the signed-rank test, with the median log ratio as the estimate
    (:func:`worst_rank_estimate`); not reached where every score is 0."""
    if all(v == 0.0 for v in values):
        return None, identical_unreached(h, len(values))
    r = signed_rank(values, sign(h.better))
    est, what = worst_rank_estimate(pairs)
    return TestResult("signed-rank", r.n, est, None, 0, r.statistic, r.p_value, what), None


def _t_decision(
    h: Hypothesis,
    pairs: Sequence[Pair | PairRow],
    values: list[float],
    scales: list[float],
    region: tuple[float | None, float | None],
    replicated: bool,
) -> tuple[TestResult | None, str | None]:
    """The t test of ``h``'s region (:func:`_t_estimate`), or why there is none: values that agree to
    rounding (all exactly 0 or not), no estimate, a standard error that is not positive and finite."""
    if spread_is_rounding(values, scales):
        if all(v == 0.0 for v in values):
            return None, identical_unreached(h, len(values))
        return None, ZERO_SPREAD
    estimate, why = _t_estimate(h, pairs, values, scales, replicated)
    if estimate is None:
        return None, why
    method, m, se, df = estimate
    if not (se > 0 and math.isfinite(se)):
        return None, f"the standard error is {se!r}: no t statistic"
    return t_result(method, len(values), m, se, df, region), None


def _t_estimate(
    h: Hypothesis, pairs: Sequence[Pair | PairRow], values: list[float], scales: list[float], replicated: bool
) -> tuple[tuple[str, float, float, int] | None, str | None]:
    """The t test's method, mean, standard error and degrees of freedom for ``h``'s per-pair values
    (period-adjusted, by order cells for a lockstep study, where ``h`` says so; in a ``replicated``
    protocol, the mean of the replicates' estimates: :func:`_replicates_estimate`), or why there is
    none."""
    if not replicated:
        return _pairs_estimate(h, pairs, values, scales)
    typed = typed_pairs(pairs)
    at: dict[int, list[int]] = {}  # each replicate's pairs, by index
    for i, p in enumerate(typed):
        if p.replicate is None:
            return None, "a replicated protocol's pair names no replicate (spec.replicate)"
        at.setdefault(p.replicate, []).append(i)
    if len(at) < 2:
        return None, (
            f"a replicated protocol is decided over its replicates, and only replicate {next(iter(at), None)} "
            "has complete pairs"
        )
    return _replicates_estimate(h, typed, values, scales, at)


def _replicates_estimate(
    h: Hypothesis, typed: list[Pair], values: list[float], scales: list[float], at: dict[int, list[int]]
) -> tuple[tuple[str, float, float, int] | None, str | None]:
    """A replicated protocol's estimate: each replicate's pairs give the estimate ``y_r`` the
    hypothesis would have on them alone (:func:`_pairs_estimate`: the plain, period-adjusted or
    order-cell mean), and the test is the one-sample t test of the ``k`` estimates' mean,
    ``se = sd(y_r) / sqrt(k)`` with ``k - 1`` degrees of freedom (method ``t-replicates``).

    Notes
    -----
    The replicates are independent and, in a protocol's equal slices, identically distributed,
    ``y_r ~ N(mu, tau^2 + sigma^2 / n_r)``, so this t is exact whatever the spread ``tau`` between
    them (the two-stage, summary-statistics analysis of a balanced random-effects model). The
    replicates' table weighs them by their estimated precision instead (DerSimonian-Laird with the
    HKSJ interval, :func:`.replicates.random_effects`), which is not a test at this size: with each
    replicate's variance estimated from a few pairs, its weights are noisy and its one-sided test
    rejected a true null in 2.6 to 5.2% of simulated studies at a nominal 2.5% (3 to 6 replicates
    of 4 to 20 pairs; ``python benchmarks/replicates.py --decision --studies 20000``), where this
    one gave 2.4 to 2.7% (Monte-Carlo SE 0.1%). So a claim over replicates is widened by as much as
    the replicates disagree, and its degrees of freedom are the replicates', not the pairs'.
    ``at``: each replicate's pairs, by their index in ``typed``."""
    ys = []
    for r in sorted(at):
        v, sc = [values[i] for i in at[r]], [scales[i] for i in at[r]]
        if spread_is_rounding(v, sc):
            return None, f"replicate {r}: {ZERO_SPREAD}"
        est, why = _pairs_estimate(h, [typed[i] for i in at[r]], v, sc)
        if est is None:
            return None, f"replicate {r}: {why}"
        ys.append(est[1])
    why = magnitude_problem([ys])
    if why is not None:
        return None, why
    m, se = mean_se(ys)
    return ("t-replicates", m, se, len(ys) - 1), None


def _pairs_estimate(
    h: Hypothesis, pairs: Sequence[Pair | PairRow], values: list[float], scales: list[float]
) -> tuple[tuple[str, float, float, int] | None, str | None]:
    """The t test's method, mean, standard error and degrees of freedom from the pairs alone: the
    order-cell mean of a lockstep study whose pairs name their first block, the period-adjusted mean,
    or the plain mean, as ``h`` says."""
    typed = typed_pairs(pairs)
    steps_first = [p.steps_first for p in typed]
    if h.period_adjusted and steps_first and all(x in ("baseline", "candidate") for x in steps_first):
        return _order_cells_estimate(typed, values)
    if h.period_adjusted:
        return _period_adjusted_estimate(typed, values, scales)
    why = magnitude_problem([values])
    if why is not None:
        return None, why
    m, se = mean_se(values)
    return ("t", m, se, len(values) - 1), None


def _order_cells_estimate(
    typed: list[Pair], values: list[float]
) -> tuple[tuple[str, float, float, int] | None, str | None]:
    """A lockstep study's period adjustment: its order cells (build order x first block) as
    preregistered covariates (:func:`.carryover.cells_mean`), method ``t-order-cells``."""
    cells = [
        (1 if (p.first or "") == "candidate" else -1, 1 if p.steps_first == "candidate" else -1)
        for p in typed
    ]
    try:
        m, se, df = cells_mean(values, cells)
    except ValueError as e:
        return None, f"the order-cell adjustment: {e}"
    return ("t-order-cells", m, se, df), None


def _period_adjusted_estimate(
    typed: list[Pair], values: list[float], scales: list[float]
) -> tuple[tuple[str, float, float, int] | None, str | None]:
    """The AB/BA period-adjusted mean (:func:`.ttests.period_adjusted_mean`), method
    ``t-period-adjusted``, or why there is none: fewer than two pairs in an order, no spread
    within each order group, magnitudes a double cannot square."""
    first = [p.first or "" for p in typed]
    if min(first.count("baseline"), len(first) - first.count("baseline")) < 2:
        return None, "the period-adjusted estimand needs at least two pairs in each order"
    groups = [[v for v, f in zip(values, first) if (f == "baseline") == ab] for ab in (True, False)]
    if all(spread_is_rounding(g, scales) for g in groups):
        return None, ZERO_SPREAD_WITHIN
    why = magnitude_problem(groups)
    if why is not None:
        return None, why
    m, se, df = period_adjusted_mean(values, first)
    return ("t-period-adjusted", m, se, df), None


#: The zero-spread guard's reasons (:func:`.descriptive.spread_is_rounding`).
ZERO_SPREAD = (
    "zero spread: the per-pair values agree to the rounding of the endpoint values they were computed "
    "from (16 ulps of |b| + |c|, or of 1 + |ln b| + |ln c| for a log ratio)"
)
ZERO_SPREAD_WITHIN = (
    "zero spread within each order group: the period-adjusted standard error is rounding noise "
    "(16 ulps of |b| + |c|, or of 1 + |ln b| + |ln c| for a log ratio)"
)

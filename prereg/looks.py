"""A group-sequential family's decisions, look by look, with the standard library alone: which looks
the records reach, each look's tests on the pairs so far, the levels the graphical procedure gives
each hypothesis, the nominal levels of their boundaries (:mod:`.sequential`), who is established
where, and whether the preregistered rule stops the study. Its one home: ``harness run`` asks it
whether to stop at a look, and the summary and the audit recompute every look with it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist

from prereg.attempts import Completeness
from prereg.decisions import HypothesisDecision, decision_of, gate
from prereg.designs import PAIRED, study_design
from prereg.hypotheses import Family, Hypothesis, Pair, PairRow, test_of
from prereg.sequential import nominal_levels
from prereg.ttests import TestResult, passes

_N = NormalDist()


def pair_index(unit: str) -> int:
    """A pair's seed index (``<study>.<config>.pair<i>``: ``i``; :meth:`prereg.designs.base.Design.unit_index`)."""
    return PAIRED.unit_index(unit)


def look_units(proto: Mapping[str, object], family: Family, pairs: int) -> list[str]:
    """The units look at ``pairs`` needs final: seed indices below ``pairs`` of every configuration
    of every study a hypothesis names."""
    names = {h.study for h in family.tests}
    studies = proto["studies"]
    if not isinstance(studies, list):
        raise ValueError(f"the protocol's studies are not a list: {studies!r}")
    return [
        study_design(st).unit_id(st["name"], config, i)
        for st in studies
        if st["name"] in names
        for i in range(min(pairs, len(st["seeds"])))
        for config in st["configs"]
    ]


@dataclass(frozen=True)
class LookResult:
    """One look: its pair count, each hypothesis' test there (``None``: not reached, ``why``), its
    level share after the procedure at this look, its boundary's nominal level, and who is
    established (at this look or before) and who is below the futility bound."""

    look: int  # 1-based
    pairs: int
    tests: dict[str, TestResult | None]
    why: dict[str, str | None]
    unreached: dict[str, dict[str, int] | None]
    level: dict[str, float]
    nominal: dict[str, float]
    established: tuple[str, ...]
    futile: tuple[str, ...]
    stop: str | None  # "efficacy", "futility", "final" or None (the study goes on)
    crossed: dict[
        str, tuple[int, float]
    ]  # established: (the look it crossed at, 1-based; that nominal level)

    def as_dict(self) -> dict[str, object]:
        return {
            "look": self.look,
            "pairs": self.pairs,
            "stop": self.stop,
            "hypotheses": [
                {
                    "id": h,
                    "p_value": None if t is None else t.p_value,
                    "method": None if t is None else t.method,
                    "n": None if t is None else t.n,
                    "why": self.why[h],
                    "level": self.level[h],
                    "nominal": self.nominal[h],
                    "established": h in self.established,
                    "crossed_at": self.crossed[h][0] if h in self.crossed else None,
                    "futile": h in self.futile,
                }
                for h, t in self.tests.items()
            ],
        }


def _z(p: float) -> float:
    """The Z value of a one-sided p-value (``Phi^{-1}(1 - p)``, capped at +-40)."""
    if p <= 0.0:
        return 40.0
    if p >= 1.0:
        return -40.0
    return max(-40.0, min(40.0, -_N.inv_cdf(p)))


def _weights(family: Family) -> dict[str, float]:
    ids = [h.id for h in family.tests]
    if family.procedure == "holm":
        return {h: 1.0 / len(ids) for h in ids}
    return {h: 1.0 if i == 0 else 0.0 for i, h in enumerate(ids)}


def _pass_on(family: Family, weights: dict[str, float], done: str) -> None:
    """The graphical procedure's update when ``done`` is established: Holm spreads its weight equally
    over the others not established; a fixed sequence passes it to the next in order."""
    w = weights.pop(done)
    rest = [h.id for h in family.tests if h.id in weights]
    if not rest:
        return
    if family.procedure == "holm":
        for h in rest:
            weights[h] += w / len(rest)
    else:
        order = [h.id for h in family.tests]
        after = [h for h in rest if order.index(h) > order.index(done)] or rest
        weights[after[0]] += w


@dataclass
class _Crossings:
    """What the looks so far have established, under the graphical procedure's weights: the
    hypotheses established in order, the look and nominal level each crossed at, its level then,
    and every look's tests."""

    family: Family
    weights: dict[str, float]
    established: list[str] = field(default_factory=list)
    crossed: dict[str, tuple[int, float]] = field(default_factory=dict)
    share: dict[str, float] = field(default_factory=dict)  # an established hypothesis' level when it crossed
    history: list[dict[str, TestResult | None]] = field(default_factory=list)
    levels_cache: dict[float, list[float]] = field(default_factory=dict)

    def nominal(self, share: float) -> list[float]:
        """Each look's nominal level of the boundary at level ``alpha * share``."""
        seq = self.family.sequential
        assert seq is not None
        a = self.family.family_alpha * share
        if a not in self.levels_cache:
            self.levels_cache[a] = (
                nominal_levels(seq.looks, a, seq.spending) if a > 0 else [0.0] * len(seq.looks)
            )
        return self.levels_cache[a]

    def establish(self) -> None:
        """Establish every hypothesis whose p-value at some look so far crossed its boundary at its
        current weight, passing its weight on and testing the others again."""
        alpha, family = self.family.family_alpha, self.family
        changed = True
        while changed:
            changed = False
            for h in family.tests:
                if h.id in self.established or self.weights.get(h.id, 0.0) <= 0.0:
                    continue
                levels = self.nominal(self.weights[h.id])
                j = next(
                    (
                        j
                        for j, hs in enumerate(self.history)
                        if (t := hs[h.id]) is not None and passes(t, levels[j])
                    ),
                    None,
                )
                if j is not None:
                    self.crossed[h.id] = (j + 1, levels[j])
                    self.share[h.id] = alpha * self.weights[h.id]
                    self.established.append(h.id)
                    _pass_on(family, self.weights, h.id)
                    changed = True
                    break


def run_looks(
    family: Family,
    pairs_of: Mapping[tuple[str, str], Sequence[Pair | PairRow]],
    reached: int,
    identity: str | None,
) -> list[LookResult]:
    """Every look the records reach (the first ``reached`` of the design's looks), in order, until
    the rule stops the study.

    Notes
    -----
    At look ``k`` with ``n_k`` pairs each hypothesis is tested on its configuration's pairs of seed
    index below ``n_k`` (:func:`.hypotheses.test_of`; a hypothesis not reached there counts as
    ``p = 1``). A hypothesis with level share ``w`` (of the family's alpha) is established when its
    p-value at some look ``j <= k`` is below the nominal level of look ``j``'s boundary at level
    ``alpha w`` (:func:`.sequential.nominal_levels`; for t tests: its statistic beyond the t
    quantile at that level, :func:`.ttests.passes`); each one established passes its share on
    (Holm or fixed sequence, Maurer & Bretz 2013), and the others are tested again. A hypothesis
    decided by identity (every pair's difference exactly 0, inside its region) is decided at a look
    by the sign test instead, whose exact ``p`` is then ``2^-n``, not 0. A hypothesis not reached at a look is never futile there. The study stops
    when every hypothesis is established ("efficacy"), when every one not established is below the
    futility bound ``futility_z`` at an interim look ("futility", non-binding), or at the last look
    ("final").
    """
    seq = family.sequential
    assert seq is not None
    state = _Crossings(family, _weights(family))
    out: list[LookResult] = []
    for k, n in enumerate(seq.looks[:reached]):
        tests: dict[str, TestResult | None] = {}
        why: dict[str, str | None] = {}
        unreached: dict[str, dict[str, int] | None] = {}
        for h in family.tests:
            pairs = [p for p in pairs_of.get((h.study, h.config), []) if pair_index(Pair.of(p).unit) < n]
            # every pair identical: at a look, the sign test's exact p for n favourable values
            # (2^-n), not 0, so identity alone never crosses a look's boundary on a few pairs
            t, w, u = test_of(h, pairs, family.min_pairs, "sign" if identity is not None else None)
            tests[h.id], why[h.id], unreached[h.id] = t, w, u
        state.history.append(tests)
        state.establish()
        out.append(_look_result(state, k, n, tests, why, unreached))
        if out[-1].stop is not None:
            break
    return out


def _look_result(
    state: _Crossings,
    k: int,
    n: int,
    tests: dict[str, TestResult | None],
    why: dict[str, str | None],
    unreached: dict[str, dict[str, int] | None],
) -> LookResult:
    """Look ``k`` (0-based) on ``n`` pairs once its crossings are established: each hypothesis' level
    and nominal level, those futile, and whether the rule stops the study there."""
    futile = _futile(state, tests)
    return LookResult(
        k + 1,
        n,
        tests,
        why,
        unreached,
        _levels(state),
        _nominal_at(state, k),
        tuple(state.established),
        futile,
        _stop_at(state, k, futile),
        dict(state.crossed),
    )


def _levels(state: _Crossings) -> dict[str, float]:
    """Each hypothesis' level now: its share when it crossed, else alpha times its weight."""
    alpha = state.family.family_alpha
    return {
        h.id: state.share[h.id] if h.id in state.share else alpha * state.weights.get(h.id, 0.0)
        for h in state.family.tests
    }


def _nominal_at(state: _Crossings, k: int) -> dict[str, float]:
    """Each hypothesis' nominal level at look ``k``: where it crossed, else its boundary's at its
    weight (0 without weight)."""
    out = {}
    for h in state.family.tests:
        if h.id in state.crossed:
            out[h.id] = state.crossed[h.id][1]
        elif state.weights.get(h.id, 0.0) > 0:
            out[h.id] = state.nominal(state.weights[h.id])[k]
        else:
            out[h.id] = 0.0
    return out


def _futile(state: _Crossings, tests: dict[str, TestResult | None]) -> tuple[str, ...]:
    """The hypotheses not established whose test at this look lies below the futility bound (a
    hypothesis not reached at a look is not futile there)."""
    seq = state.family.sequential
    assert seq is not None
    bound = seq.futility_z
    if bound is None:
        return ()
    return tuple(
        h.id
        for h in state.family.tests
        if h.id not in state.established and (t := tests[h.id]) is not None and _z(t.p_value) < bound
    )


def _stop_at(state: _Crossings, k: int, futile: tuple[str, ...]) -> str | None:
    """Why the rule stops the study at look ``k``: every hypothesis established, the last look, or
    every one established or futile; ``None`` where it goes on."""
    seq = state.family.sequential
    assert seq is not None
    everyone = len(state.family.tests)
    if len(state.established) == everyone:
        return "efficacy"
    if k == len(seq.looks) - 1:
        return "final"
    if seq.futility_z is not None and len(state.established) + len(futile) == everyone:
        return "futility"
    return None


def looks_reached(proto: Mapping[str, object], family: Family, final_units: Collection[str]) -> int:
    """How many of the design's looks the records reach: a look is reached when every unit it needs
    (:func:`look_units`) is final (ok, or a failed latest attempt)."""
    seq = family.sequential
    assert seq is not None
    k = 0
    for n in seq.looks:
        if not set(look_units(proto, family, n)) <= set(final_units):
            break
        k += 1
    return k


def sequential_decisions(
    family: Family,
    pairs_of: Mapping[tuple[str, str], Sequence[Pair | PairRow]],
    completeness: Completeness,
    looks: list[LookResult],
) -> list[HypothesisDecision]:
    """Each hypothesis' decision from the looks taken: established at the look where it crossed
    (its interval the repeated confidence interval at that look's nominal level, Jennison &
    Turnbull 1989), not established at the look the study stopped at, or, where the records stop
    between looks, not reached (the next look was not reached) unless already established."""
    seq = family.sequential
    assert seq is not None
    last = looks[-1] if looks else None
    out = []
    for h in family.tests:
        where = next((lk for lk in looks if h.id in lk.established), None)
        if where is not None:
            at = _established_at(h, where, looks)
        elif last is not None and last.stop is not None:
            at = _stopped_at(h, last)
        else:
            out.append(_between_looks(h, family, completeness, len(looks)))
            continue
        pairs_all = pairs_of.get((h.study, h.config), [])
        out.append(_decided_at(h, at, completeness, pairs_all, len(seq.looks), seq.spending))
    return out


@dataclass(frozen=True)
class _At:
    """Where a hypothesis was decided: the look whose test decides it, its status and reason, the
    nominal level (``None``: none reached it) and the note its sentence starts with."""

    look: LookResult
    status: str
    reason: str | None
    alpha: float | None
    note: str


def _established_at(h: Hypothesis, where: LookResult, looks: list[LookResult]) -> _At:
    """An established hypothesis: decided by the look it crossed at, at that look's nominal level."""
    j, crossed_at = where.crossed[h.id]
    note = f"established at look {where.look}" + (f", crossing at look {j}" if j != where.look else "")
    return _At(looks[j - 1], "established", None, crossed_at, note)


def _stopped_at(h: Hypothesis, last: LookResult) -> _At:
    """A hypothesis not established when the study stopped: not established at the last look (below
    the futility bound, or not), or not reached there."""
    a = last.nominal[h.id] or None
    note = f"the study stopped at look {last.look} ({last.stop})"
    if last.tests[h.id] is None:
        return _At(last, "not reached", last.why[h.id], a, note)
    if a is None:  # a fixed sequence whose alpha never reached it
        return _At(
            last, "not reached", "a failed prerequisite in the hierarchy: no alpha reached it", a, note
        )
    futile = "below the futility bound: the study stopped for futility" if h.id in last.futile else None
    return _At(last, "not established", futile, a, note)


def _between_looks(
    h: Hypothesis, family: Family, completeness: Completeness, taken: int
) -> HypothesisDecision:
    """A hypothesis whose records stop between looks: not reached, the next look named."""
    seq = family.sequential
    assert seq is not None
    g = gate(h, family, completeness)
    nxt = seq.looks[taken] if taken < len(seq.looks) else seq.looks[-1]
    reason = "; ".join(x for x in (g, f"the next look, at {nxt} pairs, was not reached") if x)
    decision = decision_of(h, None, ("not reached", reason), None, None, completeness, [])
    return replace(decision, text=f"(sequential, {len(seq.looks)} looks) {decision.text}")


def _decided_at(
    h: Hypothesis,
    at: _At,
    completeness: Completeness,
    pairs_all: Sequence[Pair | PairRow],
    planned: int,
    spending: str,
) -> HypothesisDecision:
    """The decision at its look, over the pairs that look saw, its sentence led by the look."""
    lk, a = at.look, at.alpha
    t = lk.tests[h.id]
    pairs = [p for p in pairs_all if pair_index(Pair.of(p).unit) < lk.pairs]
    decision = decision_of(
        h, t, (at.status, at.reason), a if t is not None else None, lk.unreached[h.id], completeness, pairs
    )
    head = (
        f"(look {lk.look} of {planned}, {lk.pairs} pairs, {spending} spending, "
        f"nominal level {a:.3g}; {at.note}) "
        if a
        else f"(look {lk.look} of {planned}, {lk.pairs} pairs; {at.note}) "
    )
    return replace(decision, text=head + decision.text)

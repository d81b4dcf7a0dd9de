"""The answer first: each configuration's effect with its interval, and the preregistered decisions
on it, one sentence per configuration. report.md opens with these sentences, the page's first screen
shows them, and ``harness run`` and ``harness report`` print them last.

The convention (docs/decisions.md, "One sign convention"): every study's texts give each change in
points of ``100 x ln(T_candidate / T_baseline)``, positive: the candidate slower
(:data:`prereg.calibrated.SIGN`), in every table, plot and sentence (:func:`points_throughout`),
except the committed studies published before that, named in :data:`PUBLISHED_BEFORE`, whose sealed
texts keep the form they were published in: a reduction in percent of the baseline's time, ``100 x
(1 - exp(mean log ratio))`` (:func:`prereg.descriptive.reduction`), positive: the candidate faster,
with the answer and decisions of the calibrated ones (cpu1, cpu2) in points (:func:`in_points`);
each text states which."""

from __future__ import annotations

from collections.abc import Mapping

from prereg.calibrated import Calibration
from prereg.decisions import HypothesisDecision
from prereg.descriptive import Ends, PairedInterval, reduction
from prereg.render.result import CONVENTION as CAL_CONVENTION
from prereg.render.result import (
    POINTS_CONVENTION,
    Estimate,
    block_steps,
    calibrated_effects,
    points,
    reduction_points,
    sentence,
    words,
)
from prereg.results import Descriptive, FactorialResult, PairedResult, Summary

CONVENTION = (
    "Each effect is a reduction in percent of the baseline's training time (positive: the candidate was "
    "faster) with its two-sided interval at the study's level, then the preregistered decisions on it."
)
#: The committed studies whose texts were published before every table and plot took the one
#: convention, by their protocol's sha256 (``summary.json``'s ``protocol.sha256``, which their records
#: and tags hold): their tables, every-pair lists and plots keep the reductions in percent their sealed
#: summaries render to, so the public audit (which renders each folder again with this code and
#: compares byte for byte, :mod:`audit.published`) still matches them. Frozen: no study is added here.
PUBLISHED_BEFORE = {
    "b7ca953e1c33db1ceb99f7f7ebba039e368d3f7869f7a08ea507d668c385f432": "cpu1",
    "76690f746ebcabd9cfb05f050fba00c170343a9e038d60a6ff93311184a652cd": "cpu2",
    "f92497a7b5a95cf75f878de8a2ff08b4e4ea8408cb5f568542068ee20db59429": "cpu1-pilot",
    "f1ced067ebd5ff61bf08cedfff533ed152d918e80170f5d79f4635ac385e3978": "cpu2-pilot",
    "e84587402bd7505ccc59e7042665245d21079c024ac56899f57b1c69ef0ea1b2": "calibration-cpu-pilot",
    "e5bf5f4a46a78f8837838e5b64537bab7240ce123cad2619ec0bf828da96a727": "calibration-cpu",
    "d1a8cc428c0f0932aca61b5deda58884f4f6ea0525172ed2294f2392012f2aba": "calibration-cpu-coverage",
    "b917fa1ae18a6a81e0ccaf08bbe176ffbd3ff6b593c69dcc0ea5a5a7acfa70e9": "calibration-classes",
    "23622bf29394447ae69ef5235672c7e2b952ba7debcd97b83635fd5a1ce3fea6": "calibration-classes-loaded",
    "6d731049656524446bfb707f7cd367cc880cad87ffd4562553358d482416bcae": "calibration-tost-loaded",
}


def points_throughout(protocol: Mapping[str, object]) -> bool:
    """Whether every table, plot and sentence of a study's texts gives each change in points
    (:data:`prereg.calibrated.SIGN`): every study's do (cpu3 on), a study of command arms' (what
    ``harness compare`` writes) always, except those published before, :data:`PUBLISHED_BEFORE`;
    decided by the protocol summary's ``sha256``, which the tag and the records fix."""
    return commands_protocol(protocol) or protocol.get("sha256") not in PUBLISHED_BEFORE


def commands_study(summary: Summary) -> bool:
    """Whether every study of the protocol runs command arms (``harness compare`` writes such
    studies; no committed study is one)."""
    return commands_protocol(summary.protocol)


def commands_protocol(protocol: Mapping[str, object]) -> bool:
    """:func:`commands_study` of a protocol summary's mapping."""
    studies = protocol.get("studies")
    return isinstance(studies, list) and bool(studies) and all(_has_commands(s) for s in studies)


def _has_commands(study: object) -> bool:
    """Whether a protocol summary's study entry runs command arms."""
    return isinstance(study, Mapping) and "commands" in study


def in_points(summary: Summary, cal: Calibration | None) -> bool:
    """Whether the answer and the decisions give each change in points (:data:`prereg.calibrated.SIGN`):
    a calibrated study's (``cal``: cpu1 and cpu2 too) and every study :func:`points_throughout` puts
    in points; the committed built-in studies without a calibration keep their reductions in percent."""
    return cal is not None or points_throughout(summary.protocol)


def convention(summary: Summary, cal: Calibration | None) -> str:
    """The sentence that states the texts' convention where the answer's figures are."""
    if cal is not None:
        return CAL_CONVENTION
    return POINTS_CONVENTION if points_throughout(summary.protocol) else CONVENTION


def planted_names(summary: Summary) -> set[str]:
    """The planted studies' names (the protocol's studies with ``planted``): their A/A pairs measure
    the designs, not a change, so only the planted section shows them."""
    return {s["name"] for s in summary.protocol["studies"] if s.get("planted")}


def decision_cells(
    d: HypothesisDecision, md: bool, in_points: bool = False, throughout: bool = False
) -> tuple[str, str]:
    """A decision's estimate and interval cells: a log ratio as a reduction in percent (its interval's
    ends swap), or ``in_points`` (:func:`in_points`: :data:`prereg.calibrated.SIGN`) as points, a
    difference in its own units; ``throughout`` (:func:`points_throughout`) a relative reduction too
    in points (``100 ln(1 - r / 100)``, its ends swapped); report.md's cells (``md``) name the level
    the decision's interval carries."""
    if d.estimand == "log_ratio" and d.estimate_of in (None, d.estimand):
        return _ratio_cells(d, md, in_points)
    if throughout and d.estimand == "relative_reduction" and d.estimate_of in (None, d.estimand):
        return _points_cells(_as_logs(d), md)
    est = "n/a" if d.estimate is None else f"{d.estimate:+.4g}"
    if d.estimate_of and d.estimate_of != d.estimand:
        est += f" ({d.estimate_of})"
    return est, "n/a" if d.low is None or d.high is None else f"{d.low:+.4g} to {d.high:+.4g}{_at(d, md)}"


def _ends(r: Estimate) -> Ends:
    """A result's estimate, ends and level."""
    return Ends(r.estimate, r.low, r.high, r.level)


def _as_logs(d: Estimate) -> Ends:
    """A relative reduction's estimate and interval ends as the log ratios they map from
    (:func:`prereg.render.result.reduction_points` over 100; the ends swap: the map decreases), at
    the level the result carries."""

    def log(r: float) -> float | None:
        p = reduction_points(r)
        return None if p is None else p / 100

    return _ends(d).mapped(log, decreasing=True)


def _as_reduction(d: Estimate) -> Ends:
    """A log ratio's estimate and ends as reductions in percent (:func:`prereg.descriptive.reduction`;
    the ends swap: the map decreases), at the level the result carries."""
    return _ends(d).mapped(reduction, decreasing=True)


def _at(r: Estimate, md: bool) -> str:
    """The level a result's interval carries, as report.md's cell (``md``) names it, else nothing."""
    return f" ({100 * (r.level or 0):.4g}%)" if md else ""


def _ratio_cells(d: HypothesisDecision, md: bool, in_points: bool) -> tuple[str, str]:
    """:func:`decision_cells` of a log ratio: points (a calibrated study) or a reduction in percent."""
    if in_points:
        return _points_cells(d, md)
    est = "n/a" if d.estimate is None else f"{reduction(d.estimate):.2f}% reduction"
    if d.low is None or d.high is None:
        return est, "n/a"
    return est, f"{reduction(d.high):.2f} to {reduction(d.low):.2f}%{_at(d, md)}"


def _points_cells(r: Estimate, md: bool) -> tuple[str, str]:
    """A log ratio's cells in points, the estimate in words beside it, the interval at the level the
    result carries (named in report.md's cells, ``md``)."""
    est, rng = points(r, named=md)
    return (est if r.estimate is None else f"{est} points ({words(100 * r.estimate)})"), rng


def _effect(r: Estimate) -> str:
    """A reduction in percent with its interval, at the level the result carries."""
    return f"{r.estimate:.2f}% ({100 * (r.level or 0):.4g}% interval {r.low:.2f} to {r.high:.2f}%)"


def _decided(d: HypothesisDecision) -> str:
    """A decision in the answer: its status and the head of its reason (up to a ``:`` or ``;``);
    the whole reason stands in the decisions table."""
    head = (d.reason or "").split(":")[0].split(";")[0].strip()
    return f"{d.id} {d.status}" + (f" ({head})" if head else "")


def _factorial_effects(c: FactorialResult, throughout: bool = False) -> str:
    """A factorial configuration's within-block effects: reductions in percent, or ``throughout``
    (:func:`points_throughout`) each log contrast in points with its interval and in words."""
    effects = [k for k, e in sorted((c.effects or {}).items()) if e]
    if throughout:
        shown = [f"{name.replace('_', ' ')} {sentence(c.effect(name))}" for name in effects]
        return "within-block training-time change " + ("; ".join(shown) or "n/a (no interval yet)")
    shown = [f"{name.replace('_', ' ')} {_effect(c.effect_reduction(name))}" for name in effects]
    return "within-block training-time reduction " + ("; ".join(shown) or "n/a (no interval yet)")


def clock_intervals(c: PairedResult, cpu: bool) -> list[tuple[str, PairedInterval]]:
    """A paired result's training-time intervals per clock: the wall clock's and, with ``cpu`` (a CPU
    device), the CPU clock's, each where it has one."""
    eps = (("wall", c.training_time), ("CPU", c.training_cpu_time if cpu else None))
    return [(clock, ep.interval) for clock, ep in eps if ep is not None and ep.interval is not None]


def _paired_effects(c: PairedResult, cpu: bool) -> str:
    shown = [f"{_effect(iv)} on the {clock} clock" for clock, iv in clock_intervals(c, cpu)]
    return "training-time reduction " + (", ".join(shown) or "n/a (no interval yet)")


def clock_disagreement(c: PairedResult | None) -> str | None:
    """A warning when a paired result's CPU and wall clock intervals (log ratios) do not overlap,
    with the likely reason: a wall clock that reads the change larger than the CPU clock does
    carries a wall-only cost (sleep, I/O, waiting on a lock or a child process) that the process's
    CPU clock cannot see, or contention for the processor. In points of ``100 x ln(T_candidate /
    T_baseline)``, positive: the candidate slower (the calibration's convention)."""
    wall = None if c is None else c.training_time.log_ratio
    cpu = None if c is None or c.training_cpu_time is None else c.training_cpu_time.log_ratio
    if wall is None or cpu is None or (wall.low <= cpu.high and cpu.low <= wall.high):
        return None

    def pts(iv: PairedInterval) -> str:
        return f"{100 * iv.estimate:+.2f} ({100 * iv.low:+.2f} to {100 * iv.high:+.2f})"

    more = "larger" if wall.estimate > cpu.estimate else "smaller"
    return (
        f"the clocks disagree: wall {pts(wall)} against CPU {pts(cpu)} points of 100 x ln(T_candidate / "
        f"T_baseline) (positive: the candidate slower); the wall clock reads the change {more}: likely "
        "a wall-only cost (sleep, I/O, waiting) the CPU clock cannot see, or contention for the CPU"
    )


def answer_lines(summary: Summary, cal: Calibration | None = None) -> list[str]:
    """One sentence per configuration of each (not planted) study: its effect with its interval and
    the decisions on it; then any decision on no single configuration shown. In points
    (:func:`in_points`): each change in points and in words (:func:`prereg.render.result.calibrated_effects`),
    with the study's calibration ``cal`` the design's calibrated bias beside it; otherwise a
    reduction in percent."""
    decisions, none = _decisions(summary)
    planted = planted_names(summary)
    lines: list[str] = []
    said: set[str] = set()
    for study in (s for s in summary.studies if s.configs and s.name not in planted):
        for c in study.configs:
            mine = [d for d in decisions if d.study == study.name and d.config == c.config]
            said |= {d.id for d in mine}
            lines += _config_lines(summary, study.name, c, mine, cal, none)
    lines += _unsaid_lines([d for d in decisions if d.id not in said], summary, cal)
    if not lines and planted:
        lines.append(
            "Every study of this protocol plants a known cost in an A/A pair: its answer is each design's "
            "bias against the planted effect (Planted reference effects: each design's bias)."
        )
    return lines or ["No configuration has a result yet."]


def _decisions(summary: Summary) -> tuple[list[HypothesisDecision], str]:
    """The summary's decisions, and what the answer says of a configuration with none."""
    hyp = summary.hypotheses
    if isinstance(hyp, Descriptive):
        return [], "no preregistered decision (descriptive protocol)"
    return [x.decision for x in hyp.decisions], "no preregistered decision"


def _unsaid_lines(unsaid: list[HypothesisDecision], summary: Summary, cal: Calibration | None) -> list[str]:
    """:func:`answer_lines` of the decisions on no configuration it shows: each with its effect."""
    pts, every = in_points(summary, cal), points_throughout(summary.protocol)
    return [
        f"{d.study} / {d.config or 'all'}: {_unsaid_effect(d, pts, every)}; decision: {_decided(d)}."
        for d in unsaid
    ]


def _config_lines(
    summary: Summary,
    study: str,
    c: PairedResult | FactorialResult,
    mine: list[HypothesisDecision],
    cal: Calibration | None,
    none: str,
) -> list[str]:
    """:func:`answer_lines` of one configuration: its effect with its interval and the decisions
    ``mine`` on it (``none``: what is said without one), and for a study of command arms a warning
    where the clocks disagree."""
    verdict = "decisions: " + ", ".join(map(_decided, mine)) if mine else none
    if not isinstance(c, PairedResult):
        effects = _factorial_effects(c, points_throughout(summary.protocol))
        return [f"{study} / {c.config} (factorial): {effects}; {verdict}."]
    cpu = summary.protocol.get("device") == "cpu"
    base, cand = c.baseline_arm, c.candidate_arm
    what = f"A/A null check, {base} against itself" if base == cand else f"{cand} over {base}"
    effects = (
        calibrated_effects(c, cpu, cal, block_steps(summary, study))
        if in_points(summary, cal)
        else _paired_effects(c, cpu)
    )
    lines = [f"{study} / {c.config} ({what}): {_whole_named(effects, mine)}; {verdict}."]
    warn = clock_disagreement(c) if c.final_metric is not None else None
    if warn:  # a study of command arms (new summaries only): the scripts' clocks compared
        lines.append(f"{study} / {c.config}: warning: {warn}.")
    return lines


#: The endpoints the paired answer's figures are: each run's whole training time on a clock.
WHOLE_TIMES = ("training_time", "training_cpu_time")


def _whole_named(effects: str, mine: list[HypothesisDecision]) -> str:
    """A paired answer's whole-time figures, named as such where the decisions on the same
    configuration decide on another time endpoint (the steps after each arm's own): one effect,
    one interval, and the others labelled as what they are."""
    other = sorted({d.endpoint for d in mine if d.estimand == "log_ratio" and d.endpoint not in WHOLE_TIMES})
    if not other:
        return effects
    return (
        f"whole {effects} (each run's whole training time, not the decisions' estimand: they decide on "
        f"{', '.join(other)}, whose estimates and intervals are The result's and the Decisions')"
    )


def _unsaid_effect(d: HypothesisDecision, pts: bool, every: bool) -> str:
    """The effect of a decision on no configuration the answer shows: a log ratio in points (``pts``,
    :func:`in_points`) or as a reduction, a relative reduction in points where ``every``
    (:func:`points_throughout`), another estimand in its own units."""
    if d.estimate is None or d.low is None or d.high is None:
        return "no estimate"
    if d.estimand == "log_ratio" and pts:
        return f"{d.endpoint} change {sentence(d)}"
    if d.estimand == "relative_reduction" and every:
        return f"{d.endpoint} change {sentence(_as_logs(d))}"
    if d.estimand == "log_ratio":
        return f"{d.endpoint} reduction {_effect(_as_reduction(d))}"
    level = f"{100 * (d.level or 0):.4g}% interval {d.low:+.4g} to {d.high:+.4g}"
    return f"{d.endpoint} {d.estimand} {d.estimate:+.4g} ({level})"


def terminal_answer(summary: Summary, where: Mapping[str, object], cal: Calibration | None = None) -> str:
    """The terminal's last lines: the answer, then where the details are (``where``: report, page)."""
    body = "\n".join(f"- {line}" for line in answer_lines(summary, cal))
    details = ", ".join(f"{k} {v}" for k, v in where.items())
    return f"The answer. {convention(summary, cal)}\n{body}\nDetails: {details}."

"""The answer first: each configuration's effect with its interval, and the preregistered decisions
on it, one sentence per configuration. report.md opens with these sentences, the page's first screen
shows them, and ``harness run`` and ``harness report`` print them last.

The convention (docs/decisions.md, "One sign convention"; :func:`in_points`): a calibrated study and
a study of command arms (what ``harness compare`` writes) give each change in points of ``100 x
ln(T_candidate / T_baseline)``, positive: the candidate slower (:data:`prereg.calibrated.SIGN`). The
committed studies of built-in arms without a calibration keep the form they were published in, a
reduction in percent of the baseline's time, ``100 x (1 - exp(mean log ratio))``
(:func:`prereg.descriptive.reduction`), positive: the candidate faster; each text states which."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prereg.calibrated import Calibration
from prereg.decisions import HypothesisDecision
from prereg.descriptive import PairedInterval, reduction
from prereg.render.result import CONVENTION as CAL_CONVENTION
from prereg.render.result import POINTS_CONVENTION, block_steps, calibrated_effects, points, sentence, words
from prereg.results import Descriptive, FactorialResult, PairedResult, Summary

CONVENTION = (
    "Each effect is a reduction in percent of the baseline's training time (positive: the candidate was "
    "faster) with its two-sided interval at the study's level, then the preregistered decisions on it."
)


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
    """Whether the texts give each change in points (:data:`prereg.calibrated.SIGN`): a calibrated
    study's (``cal``) and a study of command arms' do; the committed built-in studies without a
    calibration keep their published reductions in percent."""
    return cal is not None or commands_study(summary)


def convention(summary: Summary, cal: Calibration | None) -> str:
    """The sentence that states the texts' convention where the answer's figures are."""
    if cal is not None:
        return CAL_CONVENTION
    return POINTS_CONVENTION if commands_study(summary) else CONVENTION


def planted_names(summary: Summary) -> set[str]:
    """The planted studies' names (the protocol's studies with ``planted``): their A/A pairs measure
    the designs, not a change, so only the planted section shows them."""
    return {s["name"] for s in summary.protocol["studies"] if s.get("planted")}


def decision_cells(d: HypothesisDecision, with_level: bool, in_points: bool = False) -> tuple[str, str]:
    """A decision's estimate and interval cells: a log ratio as a reduction in percent (its interval's
    ends swap), or ``in_points`` (a calibrated study: :data:`prereg.calibrated.SIGN`) as points, a
    difference in its own units; ``with_level`` names the interval's level."""
    if d.estimand == "log_ratio" and d.estimate_of in (None, d.estimand):
        return _ratio_cells(d, with_level, in_points)
    level = _level_text(d, with_level)
    est = "n/a" if d.estimate is None else f"{d.estimate:+.4g}"
    if d.estimate_of and d.estimate_of != d.estimand:
        est += f" ({d.estimate_of})"
    return est, "n/a" if d.low is None or d.high is None else f"{d.low:+.4g} to {d.high:+.4g}{level}"


def _level_text(d: HypothesisDecision, with_level: bool) -> str:
    """The level a decision's interval carries, as its cell names it (``with_level``), else nothing."""
    return f" ({100 * (d.level or 0):.4g}%)" if with_level else ""


def _ratio_cells(d: HypothesisDecision, with_level: bool, in_points: bool) -> tuple[str, str]:
    """:func:`decision_cells` of a log ratio: points (a calibrated study) or a reduction in percent."""
    if in_points:
        est, rng = points(d.estimate, d.low, d.high, d.level if with_level else None)
        return (est if d.estimate is None else f"{est} points ({words(100 * d.estimate)})"), rng
    est = "n/a" if d.estimate is None else f"{reduction(d.estimate):.2f}% reduction"
    if d.low is None or d.high is None:
        return est, "n/a"
    return est, f"{reduction(d.high):.2f} to {reduction(d.low):.2f}%{_level_text(d, with_level)}"


@dataclass(frozen=True)
class Reduction:
    """A reduction in percent of the baseline's time (positive: the candidate faster), its interval,
    and the two-sided level that interval carries (as :class:`prereg.descriptive.PairedInterval`)."""

    estimate: float
    low: float
    high: float
    level: float


def _decision_reduction(d: HypothesisDecision) -> Reduction | None:
    """A log-ratio decision's estimate and interval as a reduction in percent
    (:func:`prereg.descriptive.reduction`; the ends swap), at the level the decision carries."""
    if d.estimate is None or d.low is None or d.high is None:
        return None
    return Reduction(reduction(d.estimate), reduction(d.high), reduction(d.low), d.level or 0)


def _factorial_reductions(c: FactorialResult) -> list[tuple[str, Reduction]]:
    """A factorial result's effects with an interval, by name, each at the level the result carries."""
    return [
        (name, Reduction(e["reduction_pct"], e["reduction_low_pct"], e["reduction_high_pct"], c.level))
        for name, e in sorted((c.effects or {}).items())
        if e
    ]


def _effect(r: Reduction | PairedInterval) -> str:
    """A reduction in percent with its interval, at the level the result ``r`` carries."""
    return f"{r.estimate:.2f}% ({100 * r.level:.4g}% interval {r.low:.2f} to {r.high:.2f}%)"


def _decided(d: HypothesisDecision) -> str:
    """A decision in the answer: its status and the head of its reason (up to a ``:`` or ``;``);
    the whole reason stands in the decisions table."""
    head = (d.reason or "").split(":")[0].split(";")[0].strip()
    return f"{d.id} {d.status}" + (f" ({head})" if head else "")


def _factorial_effects(c: FactorialResult) -> str:
    shown = [f"{name.replace('_', ' ')} {_effect(r)}" for name, r in _factorial_reductions(c)]
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
    hyp = summary.hypotheses
    decisions = [] if isinstance(hyp, Descriptive) else [x.decision for x in hyp.decisions]
    none = "no preregistered decision" + (" (descriptive protocol)" if isinstance(hyp, Descriptive) else "")
    planted, cpu = planted_names(summary), summary.protocol.get("device") == "cpu"
    pts = in_points(summary, cal)
    lines, said = [], set()
    for study in (s for s in summary.studies if s.configs and s.name not in planted):
        for c in study.configs:
            if isinstance(c, PairedResult):  # the study's design is analysed as pairs
                base, cand = c.baseline_arm, c.candidate_arm
                what = f"A/A null check, {base} against itself" if base == cand else f"{cand} over {base}"
                effects = (
                    calibrated_effects(c, cpu, cal, block_steps(summary, study.name))
                    if pts
                    else _paired_effects(c, cpu)
                )
            else:
                what, effects = "factorial", _factorial_effects(c)
            mine = [d for d in decisions if d.study == study.name and d.config == c.config]
            said |= {d.id for d in mine}
            verdict = "decisions: " + ", ".join(map(_decided, mine)) if mine else none
            lines.append(f"{study.name} / {c.config} ({what}): {effects}; {verdict}.")
            warn = (
                clock_disagreement(c) if isinstance(c, PairedResult) and c.final_metric is not None else None
            )
            if warn:  # a study of command arms (new summaries only): the scripts' clocks compared
                lines.append(f"{study.name} / {c.config}: warning: {warn}.")
    for d in (d for d in decisions if d.id not in said):
        if d.estimate is None or d.low is None or d.high is None:
            effect = "no estimate"
        elif d.estimand == "log_ratio" and pts:
            effect = f"{d.endpoint} change {sentence(d)}"
        elif d.estimand == "log_ratio" and (red := _decision_reduction(d)) is not None:
            effect = f"{d.endpoint} reduction {_effect(red)}"
        else:
            effect = f"{d.endpoint} {d.estimand} {d.estimate:+.4g} ({100 * (d.level or 0):.4g}% interval {d.low:+.4g} to {d.high:+.4g})"
        lines.append(f"{d.study} / {d.config or 'all'}: {effect}; decision: {_decided(d)}.")
    if not lines and planted:
        lines.append(
            "Every study of this protocol plants a known cost in an A/A pair: its answer is each design's "
            "bias against the planted effect (Planted reference effects: each design's bias)."
        )
    return lines or ["No configuration has a result yet."]


def terminal_answer(summary: Summary, where: Mapping[str, object], cal: Calibration | None = None) -> str:
    """The terminal's last lines: the answer, then where the details are (``where``: report, page)."""
    body = "\n".join(f"- {line}" for line in answer_lines(summary, cal))
    details = ", ".join(f"{k} {v}" for k, v in where.items())
    return f"The answer. {convention(summary, cal)}\n{body}\nDetails: {details}."

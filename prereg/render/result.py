"""The first screen of a calibrated study (a protocol that names its ``design_calibration``): a table
in the seed page's form, one row per configuration and speed hypothesis: parameters, each arm's
time, the change with the decision's interval, and the design's calibrated bias beside it, quiet
and loaded, with the calibration's machine (:mod:`prereg.calibrated`).

One sign convention (:data:`prereg.calibrated.SIGN`): a change and a bias are points of ``100 x
ln(T_candidate / T_baseline)``, positive: the candidate slower; in words, "faster by" or "slower
by" a percentage of the baseline's time (``harness compare``'s verdict says it the same way). Where
every figure of the texts is in points (:func:`prereg.render.answer.points_throughout`) the change
column's header says its sign (:data:`SIGNED_CHANGE`); cpu1 and cpu2, published before, keep theirs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

from prereg.calibrated import SIGN, Calibration, bias_text, endpoint_design
from prereg.decisions import HypothesisDecision
from prereg.descriptive import PairedInterval
from prereg.render.model import Section, Table, Text, num, para
from prereg.results import Descriptive, PairedResult, Summary

CONVENTION = (
    f"Each change is in {SIGN} (a bias the same: positive, the design reads the change as costing more "
    "than it does); in words, faster or slower by a percentage of the baseline's time, with its "
    "two-sided interval at the decision's level, then the preregistered decisions on it."
)
#: The same convention for a study with no calibration (a study of command arms, as
#: ``harness compare`` writes it): no bias to state.
POINTS_CONVENTION = (
    f"Each change is in {SIGN}; in words, faster or slower by a percentage of the baseline's time, "
    "with its two-sided interval at the decision's level, then the preregistered decisions on it."
)
HEAD = [
    "Configuration",
    "Parameters",
    "Clock",
    "Training time (s)",
    "Change, points",
    "Interval",
    "In words",
    "Calibrated bias, points (95%)",
]
#: The change column's header where every figure of the texts is in points (:data:`SIGN`): the
#: sign said in the header itself, the seed page's column read at a glance (issue 58).
SIGNED_CHANGE = "Change, points (negative: faster)"

#: How a table of reductions reads beside a bias in points (the convention stated where the figures are).
IN_REDUCTIONS = (
    "This table's reductions are in percent of the baseline's time, positive: the candidate faster; "
    f"the bias is in {SIGN}, so a bias of +b points reads the reduction about b% too small."
)
#: The whole-times endpoint of each clock a table names (the replicates', the every-pair table's).
CLOCK_ENDPOINT = {"wall": "training_time", "CPU": "training_cpu_time"}

#: The clock of each speed endpoint, and the summary's training time on that clock.
CLOCKS = {
    "own_step_cpu_time": ("CPU, steps after its own", "training_cpu_time"),
    "training_cpu_time": ("CPU", "training_cpu_time"),
    "own_step_time": ("wall, steps after its own", "training_time"),
    "training_time": ("wall", "training_time"),
}


def words(points: float) -> str:
    """A change in points as ``faster by 2.31%`` or ``slower by 0.40%`` of the baseline's time."""
    pct = 100 * math.expm1(points / 100)
    return f"{'faster' if pct < 0 else 'slower'} by {abs(pct):.2f}%"


def points(result: Estimate, named: bool = True) -> tuple[str, str]:
    """A log ratio's estimate and interval as points (signed), the interval naming the level its
    ``result`` carries (``named``; a cell whose table states no level leaves it out)."""
    if result.estimate is None:
        return "n/a", "n/a"
    at = f" ({100 * result.level:.4g}%)" if named and result.level else ""
    low, high = result.low, result.high
    shown = "n/a" if low is None or high is None else f"{100 * low:+.2f} to {100 * high:+.2f}{at}"
    return f"{100 * result.estimate:+.2f}", shown


def interval_points(iv: PairedInterval | None) -> tuple[float | None, float | None, float | None]:
    """A paired interval of candidate over baseline times in points (:data:`SIGN`): a log ratio's
    estimate and ends times 100; a relative reduction's (``100 (1 - exp(.))`` of the mean log ratio
    and its ends, :func:`prereg.descriptive.paired_interval`) from its geometric-mean ratio and that
    ratio's ends, ``100 x ln(ratio)``: the same mean log ratio, so the same figures as the answer's
    (positive: the candidate slower). ``None`` each without an interval or a positive ratio."""
    if iv is None:
        return None, None, None
    if iv.estimand == "log_ratio":
        return 100 * iv.estimate, 100 * iv.low, 100 * iv.high
    ratios = [r for r in (iv.ratio, iv.ratio_low, iv.ratio_high) if isinstance(r, (int, float)) and r > 0]
    if len(ratios) < 3:
        return None, None, None
    e, lo, hi = (100 * math.log(r) for r in ratios)
    return e, lo, hi


def reduction_points(r: float | None) -> float | None:
    """A reduction in percent of the baseline's time, ``100 (1 - exp(m))`` of a mean log ratio ``m``,
    in points (:data:`SIGN`): ``100 m = 100 ln(1 - r / 100)``; ``None`` for none, or at or past 100%."""
    if r is None or not math.isfinite(r) or r >= 100:
        return None
    return 100 * math.log1p(-r / 100)


def point_cells(iv: PairedInterval | None, sep: str = " to ", whole: bool = True) -> tuple[str, str]:
    """:func:`prereg.render.model.cells` of an interval in points (:func:`interval_points`): signed,
    no unit; ``n/a`` for each cell without an interval (``whole``) or for each number."""
    e, lo, hi = interval_points(iv)
    if e is None and whole:
        return "n/a", "n/a"
    return num(e, "+.2f"), f"{num(lo, '+.2f')}{sep}{num(hi, '+.2f')}"


class Estimate(Protocol):
    """An estimate with its interval and the interval's level, as a result carries them
    (:class:`prereg.descriptive.PairedInterval`, :class:`prereg.decisions.HypothesisDecision`,
    :class:`prereg.descriptive.Ends`): what every renderer of an effect takes, never a level
    passed beside it."""

    @property
    def estimate(self) -> float | None: ...
    @property
    def low(self) -> float | None: ...
    @property
    def high(self) -> float | None: ...
    @property
    def level(self) -> float | None: ...


def sentence(result: Estimate) -> str:
    """A log ratio (or a within-block log contrast) in a sentence, at the level its ``result``
    carries: ``-2.31 points (99% interval -2.90 to -1.70; faster by 2.28%)``; ``n/a`` without an
    estimate."""
    estimate, low, high = result.estimate, result.low, result.high
    if estimate is None:
        return "n/a"
    at = f"{100 * result.level:.4g}% interval " if result.level else "interval "
    rng = "no interval" if low is None or high is None else f"{at}{100 * low:+.2f} to {100 * high:+.2f}"
    return f"{100 * estimate:+.2f} points ({rng}; {words(100 * estimate)})"


def parameters(n: int | None) -> str:
    """A parameter count as the seed page gives it: ``3.35M``, or ``43.3K`` under a million."""
    if n is None:
        return "n/a"
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}K"


def block_steps(summary: Summary, study: str) -> int | None:
    """A study's lockstep block size (None: a process per arm)."""
    return study_block(next((s for s in summary.protocol["studies"] if s["name"] == study), None))


def study_block(st: Mapping[str, object] | None) -> int | None:
    """A protocol study's lockstep block size (None: a process per arm, or no such study)."""
    lockstep = (st or {}).get("lockstep")
    steps = lockstep.get("block_steps") if isinstance(lockstep, Mapping) else None
    return steps if isinstance(steps, int) else None


def _speed_decisions(summary: Summary) -> list[HypothesisDecision]:
    hyp = summary.hypotheses
    decided = [] if isinstance(hyp, Descriptive) else [x.decision for x in hyp.decisions]
    return [d for d in decided if d.endpoint in CLOCKS and d.estimand == "log_ratio"]


def result_rows(summary: Summary, cal: Calibration) -> list[list[str]]:
    """One row per speed decision on a configuration of two different arms, primary first."""
    configs: dict[tuple[str, str], PairedResult] = {
        (s.name, c.config): c
        for s in summary.studies
        for c in s.paired_configs()
        if c.baseline_arm != c.candidate_arm
    }
    rows = []
    for d in _speed_decisions(summary):
        c = configs.get((d.study, d.config or ""))
        if c is None:
            continue
        clock, field = CLOCKS[d.endpoint]
        ep = getattr(c, field, None)
        times = "n/a"
        if ep is not None and ep.baseline_mean is not None and ep.candidate_mean is not None:
            times = f"{c.baseline_arm} {ep.baseline_mean:.2f} / {c.candidate_arm} {ep.candidate_mean:.2f}"
        est, iv = points(d)
        said = "n/a" if d.estimate is None else words(100 * d.estimate)
        params = parameters(c.parameters)
        bias = bias_text(cal, block_steps(summary, d.study), d.endpoint)
        rows.append([c.config, params, clock, times, est, iv, said, bias])
    return rows


def machines_line(cal: Calibration, study_machines: tuple[str, ...]) -> str:
    """Where the study ran and where its calibration was made: named, and a difference said."""
    here = ", ".join(study_machines) or "not recorded"
    there = ", ".join(cal.machines()) or "not recorded"
    conds = "; ".join(c.pin() for c in cal.conditions) or "no records yet"
    differ = bool(study_machines) and bool(cal.machines()) and set(study_machines) != set(cal.machines())
    note = (
        " The study ran on a CPU model its calibration was not made on: the bias is the calibration "
        "machine's, measured, not this machine's."
        if differ
        else ""
    )
    later = (
        " The calibration was measured after this study: its protocol, frozen before, names none; the "
        f"bias is that of its design on the {cal.effect_class} class (docs/decisions.md)."
        if cal.later
        else ""
    )
    return (
        f"Calibrated bias: the design's estimate less the truth for a {cal.effect_class} change, from "
        f"{cal.protocol} ({conds}), per plant with its 95% interval; calibrated on {there}; this study "
        f"ran on {here}.{note}{later}"
    )


def result_section(summary: Summary, cal: Calibration, signed: bool = False) -> Section:
    """The first screen: the convention, the table, and the machines; ``signed`` (every figure of
    the texts in points, :func:`prereg.render.answer.points_throughout`): the change column's header
    says its sign (:data:`SIGNED_CHANGE`)."""
    rows = result_rows(summary, cal)
    head = [SIGNED_CHANGE if signed and h == "Change, points" else h for h in HEAD]
    blocks: list[Text | Table] = [para(CONVENTION)]
    if rows:
        blocks.append(Table("Each configuration's speed, with the design's calibrated bias", head, rows))
    else:
        blocks.append(para("No speed decision on a configuration of two different arms yet."))
    blocks.append(para(machines_line(cal, cal.study_machines)))
    return Section("The result", blocks)


def calibrated_effects(c: PairedResult, cpu: bool, cal: Calibration | None, block: int | None) -> str:
    """A configuration's training-time change on each clock in points with its interval, in words,
    and, with the study's calibration ``cal``, the design's calibrated bias beside each (the whole
    times' estimator)."""
    shown = []
    for clock, field, endpoint in (
        ("wall", "training_time", "training_time"),
        ("CPU", "training_cpu_time", "training_cpu_time"),
    ):
        ep = getattr(c, field, None) if clock == "wall" or cpu else None
        iv = getattr(ep, "log_ratio", None)
        if iv is None:
            continue
        bias = "" if cal is None else f", calibrated bias {bias_text(cal, block, endpoint)}"
        shown.append(f"{sentence(iv)} on the {clock} clock{bias}")
    return "training-time change " + (", ".join(shown) or "n/a (no interval yet)")


def bias_line(
    cal: Calibration, block: int | None, endpoint: str, beside: str, reductions: bool = True
) -> str:
    """The line under a table of speed figures (``beside`` names them): the design's calibrated bias
    on the endpoint's clock for the calibration's class, quiet and loaded, each plant with its 95%
    interval and the calibration's machine (:func:`prereg.calibrated.bias_text`, the first screen's
    cell); with ``reductions`` (a table of reductions in percent), how the two conventions read."""
    design, clock = endpoint_design(block, endpoint) or ("this design", "its")
    said = (
        f"Calibrated bias beside {beside} ({design}, {clock} clock, a {cal.effect_class} change): "
        f"{bias_text(cal, block, endpoint)}."
    )
    return f"{said} {IN_REDUCTIONS}" if reductions else f"{said} In {SIGN}, as this table."

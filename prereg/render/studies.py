"""Each study's sections of the published texts: a paired study's training time (table, forest plot),
CPU time, quality, completion and memory costs, every pair and its order diagnostics; a factorial
study's cell means and within-block effects; and the answer in one figure (the page's)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import geometric_mean
from typing import Any, Protocol

from prereg.calibrated import SIGN, Calibration
from prereg.descriptive import Endpoint, PairedInterval
from prereg.designs import design_label, design_named, study_design
from prereg.factorial import design_of, effect_names
from prereg.hypotheses import Pair
from prereg.render.answer import clock_intervals, points_throughout
from prereg.render.beside import Beside
from prereg.render.model import Section, Table, Text, cells, cols, ends, esc, level_pct, num, para, raw
from prereg.render.result import CLOCK_ENDPOINT, bias_line, interval_points, point_cells, study_block
from prereg.render.svg import forest_svg, pairs_svg
from prereg.results import PairedResult, StudyResult

MIB = 1024 * 1024
NO_ORDER = "Too few pairs for order diagnostics."
DONE_HEAD = "Configuration | Pairs where both reached the target | Time-to-target reduction"
NO_METRIC_MD = "BPB; lower is better; positive difference means the candidate was worse"
NO_METRIC = "Full-test bits per byte (lower is better; a positive difference means the candidate was worse)"
MEMORY = "Peak resident memory of the run's process"
CPU_CLOCK = (
    "Training CPU time (the training thread's with one intra-op thread, the process's with more; "
    "both arms of a pair on the same clock)"
)


NO_MEMORY = (
    "No peak memory per arm: a pair's records hold no memory figure (none was measured for these runs)."
)
ONE_PROCESS = (
    "No peak memory per arm: in lockstep one process ran both arms, so its peak resident memory is "
    "neither arm's alone."
)
SCRIPT_CLOCK = (
    "Training CPU time (each script process's CPU time, time.process_time, over its timed steps; both "
    "arms on the same clock)"
)
TURNS = "n/a (lockstep: two processes took turns, so each one's total time holds the other's turns)"
#: What a paired study's texts say of how its arms ran, by (lockstep, command arms): why it compares
#: no total time (``None``: it does), why its peak-memory table has no row, its records' CPU clock.
RAN: dict[tuple[bool, bool], tuple[str | None, str, str]] = {
    (True, True): (TURNS, NO_MEMORY, SCRIPT_CLOCK),
    (True, False): ("n/a (lockstep: one process ran both arms)", ONE_PROCESS, CPU_CLOCK),
    (False, True): (None, NO_MEMORY, SCRIPT_CLOCK),
    (False, False): (None, NO_MEMORY, CPU_CLOCK),
}


def geometric_means(c: PairedResult, key: str) -> tuple[float | None, float | None]:
    """Both arms' geometric mean ``key`` (``training_s``, ``training_cpu_s``) over the pairs where
    both are positive: 1 - candidate / baseline of these is the reduction from the mean log ratio
    shown beside them (an arithmetic mean's ratio is not)."""
    arms = ((getattr(p, f"baseline_{key}", 0), getattr(p, f"candidate_{key}", 0)) for p in c.pairs)
    both = [x for x in arms if all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in x)]
    if not both:
        return None, None
    return geometric_mean(b for b, _ in both), geometric_mean(k for _, k in both)


def answer_figure(
    studies: Sequence[StudyResult], protocol: Mapping[str, Any], beside: Beside | None
) -> list[Text]:
    """The answer in one figure (the page's): every paired study's training-time reduction per
    configuration, on the wall clock and, on a CPU device, the CPU clock where recorded, each study's
    design (``protocol``'s) named; ``beside``'s wall-clock rows after them. Nothing without an interval."""
    cpu = protocol.get("device") == "cpu"  # an A/A null check is in its own section, not here
    pts = points_throughout(protocol)  # every study but those published before: in points, as the answer
    shown = [(s, c) for s in studies for c in s.paired_configs() if c.baseline_arm != c.candidate_arm]
    rows = [
        (f"{s.name} / {c.config}, {clock}", *(interval_points(log) if pts else ends(iv)))
        for s, c in shown
        for clock, iv, log in _clocks(c, cpu)
    ]
    names = dict.fromkeys(f"{c.candidate_arm} over {c.baseline_arm}" for _, c in shown)
    level = next((c.level for _, c in shown if c.level), 0.99)
    for b in beside.rows if beside else ():
        label = f"{beside.protocol_id} {b.earlier_study} / {b.config}, wall"  # type: ignore[union-attr]
        if all(r[0] != label for r in rows):  # one earlier result beside several studies: once
            tt = b.earlier.training_time
            rows.append(
                (label, *(interval_points(getattr(tt, "log_ratio", None)) if pts else ends(tt.interval)))
            )
    what = "change in points" if pts else "reduction"
    svg = forest_svg("answer", f"Training-time {what} per study and configuration", rows, pts)
    kinds = "; ".join(f"{esc(s['name'])}: {esc(design_label(s))}" for s in protocol["studies"])
    if beside and beside.rows:
        kinds += (
            f"; beside it, the earlier study {esc(beside.protocol_id)} ({esc(beside.rows[0].earlier_design)})"
        )
    side = (
        f"in {SIGN}; right of the dashed line the candidate is slower"
        if pts
        else ("right of the dashed line the candidate is faster")
    )
    return figure(
        svg,
        f"The answer in one figure: the training-time {what} of {esc(', '.join(names))}, "
        "per study and configuration, on the wall clock and the training thread's CPU clock where recorded, "
        f"with {level_pct(level)} paired intervals; {side}. How each study's pairs ran: {kinds}.",
    )


def _clocks(c: PairedResult, cpu: bool) -> list[tuple[str, PairedInterval, PairedInterval | None]]:
    """:func:`prereg.render.answer.clock_intervals` with each clock's log-ratio interval beside."""
    cpu_time = c.training_cpu_time
    logs = {"wall": c.training_time.log_ratio, "CPU": None if cpu_time is None else cpu_time.log_ratio}
    return [(clock, iv, logs[clock]) for clock, iv in clock_intervals(c, cpu)]


def figure(svg: str, caption: str) -> list[Text]:
    """A plot with its caption (the page's markup); nothing without a plot."""
    return [raw(f"<figure>{svg}<figcaption>{caption}</figcaption></figure>")] if svg else []


def paired(
    study: StudyResult,
    n: int,
    protocol_study: Mapping[str, object] | None,
    cpu: bool,
    cal: Calibration | None = None,
    points: bool = False,
) -> list[Section]:
    """A paired study's sections: training time (and the page's forest plot), CPU time (the page's
    with ``cpu``, a CPU device), quality and completion costs, peak memory; report.md's every pair
    and order diagnostics. ``n`` numbers the page's plots; ``protocol_study`` names the design;
    with the study's calibration ``cal``, the design's calibrated bias under each time table; in
    ``points`` (:func:`prereg.render.answer.points_throughout`) every change in points, as the answer."""
    cfgs = study.paired_configs()
    base, cand, lvl = cfgs[0].baseline_arm, cfgs[0].candidate_arm, level_pct(cfgs[0].level)
    arms, geo = f"{base} / {cand}", f"{base} / {cand} (geometric mean)"
    st = protocol_study or {}
    no_total, no_memory, clock = RAN[bool(st) and study_design(st).shares_process, "commands" in st]
    commands = "commands" in st  # a script's own model: no parameter count
    shown, change = ("1 - candidate / baseline of them is the reduction shown", "reduction")
    if points:
        shown, change = ("100 x ln(candidate / baseline) of them is the change shown", "change (points)")
    said = (
        f"Fixed-budget training time; pairs ran in {design_label(protocol_study)}. Times are geometric "
        f"means over the pairs ({shown}). Intervals are {_intervals_are(cfgs[0], lvl)}; "
        + (
            f"each change is in {SIGN}, as the answer's."
            if points
            else "a positive reduction means the candidate was faster."
        )
    )
    blocks: list[Text | Table] = [para(said)]
    head = ["Configuration", "Parameters", geo, f"Time {change}", f"{lvl} interval", "Faster / slower pairs"]
    head = [h for h in head if not (commands and h == "Parameters")]
    blocks += _clock(f"Training time, {arms}", head, cfgs, ("training_time", "training_s"), commands, points)
    blocks += _bias(cal, protocol_study, "training_time", f"the training times of study {study.name}", points)
    blocks += _study_forest(cfgs, n, f"{cand} over {base}", lvl, points)
    with_cpu = [c for c in cfgs if c.training_cpu_time is not None] if cpu else []
    if with_cpu:
        cpu_head = ["Configuration", geo, f"CPU-time {change}", f"{lvl} interval"]
        blocks += [para(f"{clock}.", "md")]
        blocks += _clock(
            f"{clock}, {arms}", cpu_head, with_cpu, ("training_cpu_time", "training_cpu_s"), commands, points
        )
        blocks += _bias(
            cal, protocol_study, "training_cpu_time", f"the CPU times of study {study.name}", points
        )
    every = _bias(
        cal,
        protocol_study,
        "training_time",
        f"every pair's time {'change' if points else 'reduction'}",
        points,
    )
    return [
        Section(f"Study {study.name}: {cand} versus {base}", blocks),
        *_costs(study.name, cfgs, lvl, (arms, no_total, no_memory), cal is not None, points),
        _md_pairs(cfgs, lvl, every, points),
    ]


def _study_forest(cfgs: Sequence[PairedResult], n: int, who: str, lvl: str, points: bool) -> list[Text]:
    """A paired study's forest plot of its training time per configuration: reductions in percent, or
    in ``points`` (a study of command arms: the answer's convention, from the log ratio's interval)."""
    if not points:
        forest = [(c.config, *ends(c.training_time.interval)) for c in cfgs]
        svg = forest_svg(f"forest{n}", f"Training-time reduction of {who}, {lvl} intervals", forest)
        said = f"Training-time reduction per configuration with its {lvl} interval; right of the dashed line "
        return figure(svg, said + "the candidate is faster.")
    forest = [(c.config, *interval_points(c.training_time.log_ratio)) for c in cfgs]
    svg = forest_svg(f"forest{n}", f"Training-time change of {who} in points, {lvl} intervals", forest, True)
    said = f"Training-time change per configuration with its {lvl} interval, in {SIGN}: right of the dashed line "
    return figure(svg, said + "the candidate is slower.")


def _bias(
    cal: Calibration | None, st: Mapping[str, object] | None, endpoint: str, beside: str, points: bool = False
) -> list[Text]:
    """The design's calibrated bias under a table of ``endpoint``'s figures (none without ``cal``): how
    it reads beside a table of reductions, or beside one in ``points``, the bias's own convention."""
    return [] if cal is None else [para(bias_line(cal, study_block(st), endpoint, beside, not points))]


def _intervals_are(c: PairedResult, lvl: str) -> str:
    """What the time tables' intervals are: the paired t over the pairs, or in a replicated protocol
    the decision's, the t over the replicates' estimates (the pooled pairs' interval, which holds no
    spread between replicates, is not shown)."""
    k = c.training_time.replicates
    if k is None:
        return f"two-sided {lvl} paired Student-t intervals"
    return (
        f"the decision's: two-sided {lvl} Student-t intervals over the {k} replicates' estimates "
        f"(each replicate's mean log ratio, {k - 1} degrees of freedom), so they widen by as much as the "
        "replicates disagree; an interval pooling all pairs as one sample holds no spread between "
        "replicates and is not shown"
    )


def _clock(
    caption: str,
    head: list[str],
    cfgs: Sequence[PairedResult],
    fields: tuple[str, str],
    commands: bool,
    points: bool,
) -> list[Table]:
    """One clock's table twice, report.md's (an en dash, ``n/a`` per number) and the page's: each
    configuration's arms' geometric mean of the second of ``fields`` (seconds), the first's (an
    endpoint's) reduction in percent and its interval, or in ``points`` (:data:`prereg.calibrated.SIGN`,
    from the log ratio's interval); the wall clock's with the parameters (not for ``commands``, a
    study of command arms: their models are the scripts' own) and the faster / slower pairs."""
    (ep, key), ivc, out = fields, _interval_cells(points), []
    for md in (True, False):
        rows = []
        for c in cfgs:
            b, k = geometric_means(c, key)
            e = getattr(c, ep)
            iv = e.log_ratio if points else e.interval
            row = [f"{num(b, '.3f')} / {num(k, '.3f')} s", *ivc(iv, sep="–" if md else " to ", whole=not md)]
            if ep == "training_time":
                params = "n/a" if md and not c.parameters else num((c.parameters or 0) / 1e6, ".2f") + "M"
                row = [*([] if commands else [params]), *row, f"{c.counts['faster']} / {c.counts['slower']}"]
            rows.append([c.config, *row])
        out.append(Table(caption, head, rows, only="md" if md else "html"))
    return out


def _quality(q: Endpoint, md: bool) -> list[str]:
    """A quality endpoint's arms' means, difference and interval cells."""
    means = f"{num(q.baseline_mean, '.4f')} / {num(q.candidate_mean, '.4f')}"
    return [means, *cells(q.interval, "+.5f", "", whole=not md)]


#: Under the time to the target and the total time of a calibrated study: the calibration planted
#: its costs in the training steps and read them on the design's training clocks, so it measures no
#: bias for these two endpoints (issue 57: the bias beside every speed result, or why there is none).
UNCALIBRATED = (
    "Calibrated bias: not measured for the time to the target or the total time (the calibration reads "
    "its planted costs on the design's training-time clocks only); read these two columns without one."
)


#: Above the time to the target and the total time of a study of command arms: their convention.
IN_POINTS = (
    f"Time to the target and total time are in {SIGN}, as the answer: each is 100 x the mean over the "
    "pairs of ln(candidate / baseline), with its interval."
)


class IntervalCells(Protocol):
    """The cells of an interval (:func:`prereg.render.model.cells` or
    :func:`prereg.render.result.point_cells`): its estimate's and its ends'."""

    def __call__(
        self, iv: PairedInterval | None, *, sep: str = ..., whole: bool = ...
    ) -> tuple[str, str]: ...


def _interval_cells(points: bool) -> IntervalCells:
    """The cells of a costs table's interval: reductions in percent, or ``points``."""
    return point_cells if points else cells


def _costs(
    name: str,
    cfgs: Sequence[PairedResult],
    lvl: str,
    ran: tuple[str, str | None, str],
    calibrated: bool = False,
    points: bool = False,
) -> list[Section]:
    """A paired study's costs: report.md's time to the target and total time, quality endpoint and
    peak memory (or why it has none); the page's quality and completion costs in one table, then its
    peak memory (``ran``: the arms' words, then the design's :data:`RAN` words ``no_total`` and
    ``no_memory``); in a ``calibrated`` study, that the calibration says nothing of these endpoints'
    bias; with ``points`` (a study of command arms), both times in the answer's convention."""
    arms, no_total, no_memory = ran
    done, page, mem_md, mem_page, fm = [], [], [], [], cfgs[0].final_metric
    note = [para(UNCALIBRATED)] if calibrated else []
    note += [para(IN_POINTS)] if points else []
    ivc, change = _interval_cells(points), "change (points)" if points else "reduction"
    mem_change = "Change (points; positive: the candidate used more)" if points else "Reduction"
    for c in cfgs:
        md_cells, (total, reached) = _completion(c, ivc, no_total, fm is not None)
        done.append([c.config, *md_cells])
        page.append([c.config, *_quality(c.final_metric or c.test_bpb, False), total, reached])
        if (m := c.peak_memory) and m.baseline_mean is not None and m.candidate_mean is not None:
            b, k = geometric_means(c, "peak_memory_bytes")  # both arms' means recorded: their geometric means
            mib = f"{num(b and b / MIB, '.1f')} / {num(k and k / MIB, '.1f')} MiB"
            mem_md.append([c.config, mib, ivc(m.interval, whole=False)[0]])
            mem_page.append([c.config, mib, ivc(m.interval)[0]])
    qs = [(c.config, c.test_bpb if fm is None else c.final_metric) for c in cfgs]
    quality = [[config, *_quality(q, True)] for config, q in qs if q is not None]
    metric, better = ("BPB", "") if fm is None else (fm.metric["name"], fm.metric.get("better", "lower"))
    words = (  # a script-reported metric's, as both texts say it
        f"{metric} at each arm's last evaluation, as its script reported it ({better} is better; the "
        "difference is candidate minus baseline)"
    )
    head = ["Configuration", f"{arms} {metric}", "Difference", f"{lvl} interval"]
    md: list[Text | Table] = [
        para("Time to the fixed validation target and total completion time."),
        Table(
            "",
            [*cols(DONE_HEAD.replace("reduction", change)), f"{lvl} interval", f"Total-time {change}"],
            done,
        ),
        *note,
        para(f"Full-test quality ({NO_METRIC_MD})." if fm is None else f"Quality: {words}."),
        Table("", head, quality),
        para("Peak memory."),
        Table("", ["Configuration", f"{arms} peak (geometric mean)", mem_change], mem_md),
    ]
    caption = f"{NO_METRIC if fm is None else words}, total completion time and time to the validation target"
    costs = Table(caption, [*head, f"Total-time {change}", f"Time-to-target {change}"], page)
    memory = Table(MEMORY, ["Configuration", f"{arms} (geometric mean)", mem_change], mem_page)
    return [
        Section(None, md if mem_md else [*md[:-1], para(no_memory)], only="md"),
        Section(f"Quality and completion costs ({name})", [costs, *note], 3, "html"),
        Section(f"Peak memory ({name})", [memory if mem_page else para(no_memory)], 3, "html"),
    ]


def _completion(
    c: PairedResult, ivc: IntervalCells, no_total: str | None, script_metric: bool
) -> tuple[list[str], list[str]]:
    """A configuration's time to the target and total time: report.md's cells (pairs reached, the
    time to target and its interval, the total time) and the page's (total time, time to target),
    each through ``ivc`` (:func:`_interval_cells`); a study with a ``script_metric`` says why a cell
    is empty rather than ``n/a%``."""
    t = c.time_to_target
    (te, tr), (re_, rr) = ivc(c.total_time.interval), ivc(t.interval)
    base, cand = t.unreached["baseline"], t.unreached["candidate"]
    reached = f"{t.pairs} (unreached: baseline {base}, candidate {cand})"
    total = no_total or ivc(c.total_time.interval, whole=False)[0]
    ttt = ivc(t.interval, sep="–", whole=False)
    if script_metric and t.interval is None:  # a command study: a cell says why, not "n/a%"
        ttt, rr = ("none: no pair where both reached the target", ""), "no interval"
        re_ = "none"
    page_reached = f"{re_} ({rr}); {t.pairs} pairs reached, unreached {base} / {cand}"
    return [reached, *ttt, total], [no_total or f"{te} ({tr})", page_reached]


def _delta(c: PairedResult) -> str:
    """The column of a pair's quality difference: the script's metric's or full-test BPB's."""
    return "Test Δ BPB" if c.final_metric is None else f"Δ {c.final_metric.metric['name']}"


def pair_value(p: Pair, points: bool) -> float | None:
    """A pair's time reduction in percent, or its change in ``points`` (100 x ln(candidate / baseline));
    ``None`` where a time is missing or not positive."""
    if not points:
        v = p.time_reduction_pct
        return None if v is None else float(v)
    b, k = p.baseline_training_s, p.candidate_training_s
    if not (isinstance(b, (int, float)) and isinstance(k, (int, float))):
        return None
    return 100 * math.log(k / b) if all(math.isfinite(v) and v > 0 for v in (b, k)) else None


def _pair_cells(p: Pair, points: bool = False) -> list[str]:
    """A pair's two training times, its time reduction (or change in ``points``: 100 x ln(candidate /
    baseline)) and its quality difference."""
    times = [num(p.baseline_training_s, ".3f"), num(p.candidate_training_s, ".3f")]
    change = num(pair_value(p, points), "+.2f" if points else ".2f%")
    return [*times, change, num(p.quality_difference(), "+.5f")]


def _md_pairs(
    cfgs: Sequence[PairedResult], lvl: str, bias: Sequence[Text] = (), points: bool = False
) -> Section:
    """report.md's every pair and order diagnostics of a paired study, ``bias`` under its table; each
    pair's change in ``points`` (a study of command arms)."""
    rows = [[c.config, str(p.seed), str(p.first), *_pair_cells(p, points)] for c in cfgs for p in c.pairs]
    base, cand = (f"{arm.capitalize()} (s)" for arm in (cfgs[0].baseline_arm, cfgs[0].candidate_arm))
    change = "Time change (points)" if points else "Time reduction"
    head = ["Configuration", "Seed", "First", base, cand, change, _delta(cfgs[0])]
    lines = [line for c in cfgs for line in _order(c, c.config, True)] or [NO_ORDER]
    order = (
        f"Order diagnostics ({lvl} intervals): AB/BA period effect, treatment-by-period check, drift "
        "over execution order."
    )
    blocks: list[Text | Table] = [para("Every pair, including adverse ones."), Table("", head, rows), *bias]
    return Section(None, [*blocks, para(order), Text("\n".join(lines))], only="md")


def _order(c: PairedResult, at: str, md: bool) -> list[str]:
    """A configuration's order lines as report.md (``md``) or the page words them: report.md's first
    its devices (each one's log ratio, their heterogeneity); the AB/BA period effect and
    treatment-by-period check; the drift over execution order."""
    oe, dev, out = c.order_effects or {}, c.by_device if md else None, []
    if dev:
        each = "; ".join(
            f"{d['device']}: {d['estimate']:+.4f} ({d['pairs']} pairs"
            + (f", [{d['low']:+.4f}, {d['high']:+.4f}])" if d["low"] is not None else ")")
            for d in dev["devices"]
        )
        h = dev["heterogeneity"]
        het = f". Heterogeneity across devices: F = {h['F']:.3g}, p = {h['p_value']:.3g}." if h else "."
        out.append(
            f"{c.config}: pairs ran on {len(dev['devices'])} devices; every pair within one device, so the "
            "pooled interval averages within-device differences. Per device, ln(candidate/baseline time): "
            f"{each}{het}"
        )
    if oe.get("crossover"):
        p, k = oe["crossover"]["period"], oe["crossover"]["carryover"]
        period = "period effect (second run vs first, log time)" if md else "period effect"
        check = "treatment-by-period check" if md else "treatment-by-period"
        out.append(f"{at}: {period} {_fit(p['estimate'], p, '+.4f')}; {check} p = {k['p_value']:.3g}.")
    if oe.get("drift"):
        d, drift = oe["drift"], "drift of ln(candidate/baseline)" if md else "drift"
        out.append(f"{at}: {drift} per plan position {_fit(d['slope'], d, '+.3g')}.")
    return out


def _fit(x: float, iv: Mapping[str, object], fmt: str, p: bool = True) -> str:
    """An estimate, its interval in brackets and (``p``) its p-value."""
    return f"{x:{fmt}} [{iv['low']:{fmt}}, {iv['high']:{fmt}}]" + (f", p = {iv['p_value']:.3g}" if p else "")


def factorial(study: StudyResult, declared: Mapping[str, object], points: bool = False) -> list[Section]:
    """A factorial study's sections: per configuration its blocks, cell means and within-block
    effects with their intervals (report.md's of the design's effects, labelled; the page's by name),
    in the order of the design ``declared`` (the protocol's study); each effect a reduction in percent,
    or in ``points`` (:func:`prereg.render.answer.points_throughout`), 100 x its log contrast."""
    factors, cells_ = design_of(declared)
    title = "norms x optimizer" if "factors" not in declared else " x ".join(f for f, _ in factors)
    labels = {} if "factors" in declared else {"packed_adamw": "Packed AdamW"}
    for name, subset in effect_names(factors):
        named = " x ".join(factors[j][0] for j in subset)  # an interaction of two factors: the one
        words = f"{factors[subset[0]][1][1]} {named}" if len(subset) == 1 else "interaction"
        words += f" {named}" if len(subset) > 1 and len(factors) > 2 else ""
        labels.setdefault(name, words[0].upper() + words[1:])
    md: list[Text | Table] = (
        [para(f"Each effect in {SIGN}: 100 x its within-block log contrast.")] if points else []
    )
    html: list[Text | Table] = []
    change = "Time change (points)" if points else "Time reduction"
    for c in study.factorial_configs():
        lvl, means, effects = level_pct(c.level), c.cell_mean_training_s or {}, c.effects or {}
        shown = [k for k in _design_order(effects, [n for n, _ in effect_names(factors)]) if effects[k]]
        each = ", ".join(f"{k} {num(means[k], '.3f')} s" for k in cells_)
        md.append(Text(f"{c.config}: {c.blocks_used} blocks; mean training time {each}."))
        rows = [[labels[k], *_effect(effects[k], "–", points)] for k in shown if k in labels]
        md.append(Table("", ["Effect (within-block, log time)", change, f"{lvl} interval"], rows))
        if c.positions:
            at = "; ".join(f"{q['position']}: {_fit(q['estimate'], q, '+.4f', False)}" for q in c.positions)
            md.append(Text(f"Position in the Williams square (log time relative to the block mean): {at}"))
        each = ", ".join(f"{esc(k)} {num(means[k], '.3f')} s" for k in _design_order(means, cells_))
        html.append(
            raw(f"<p>{esc(c.config)}: {c.blocks_used} blocks; mean training time per cell: {each}.</p>")
        )
        rows = [[k.replace("_", " "), *_effect(effects[k], " to ", points)] for k in shown]
        caption = f"Within-block effects on log training time, {c.config}" + (
            f", in {SIGN}" if points else ""
        )
        html.append(Table(caption, ["Effect", change, f"{lvl} interval"], rows))
    shape = "x".join("2" for _ in factors)
    return [
        Section(f"Study {study.name}: {shape} factorial ({title})", md, only="md"),
        Section(f"Study {study.name}: factorial decomposition", html, only="html"),
    ]


def _effect(e: Mapping[str, float], sep: str, points: bool = False) -> list[str]:
    """A within-block effect's time reduction and interval cells, or in ``points`` (100 x its log
    contrast and its ends)."""
    if points:
        return [f"{100 * e['estimate']:+.2f}", f"{100 * e['low']:+.2f}{sep}{100 * e['high']:+.2f}"]
    low, high = e["reduction_low_pct"], e["reduction_high_pct"]
    return [f"{e['reduction_pct']:.2f}%", f"{low:.2f}{sep}{high:.2f}%"]


def _design_order(values: Mapping[str, object], order: Sequence[str]) -> list[str]:
    """The keys of ``values`` in the design's order (cells, effects), any others after them: the
    order of the protocol, not of summary.json's sorted keys."""
    return [k for k in order if k in values] + sorted(k for k in values if k not in order)


def _pairs_figure(ident: str, name: str, cfgs: Sequence[PairedResult], points: bool) -> list[Text]:
    """The page's dot plot of every pair of study ``name``: reductions, or changes in ``points``."""
    dots = [(c.config, [x for p in c.pairs if (x := pair_value(p, points)) is not None]) for c in cfgs]
    what = f"change in points ({SIGN})" if points else "reduction"
    svg = pairs_svg(ident, f"Every pair's training-time {what}, study {name}", dots, points)
    return figure(svg, "Each mark is one pair; red squares are adverse pairs.")


def every_pair(
    studies: Sequence[StudyResult],
    cal: Calibration | None = None,
    by_name: Mapping[str, Mapping[str, object]] | None = None,
    points: bool = False,
) -> Section:
    """The page's every pair of every paired study, adverse ones (the candidate was slower) marked,
    with a dot plot per study; with the study's calibration ``cal``, the design's calibrated bias
    under each study's table (its design from the protocol's studies ``by_name``); each pair's
    change in ``points`` (:func:`prereg.render.answer.points_throughout`), as the answer."""
    said = "Adverse pairs (the candidate was slower) are marked. A positive quality difference means the "
    blocks: list[Text | Table] = [para(said + "candidate was worse.")]
    for n, study in enumerate(s for s in studies if design_named(s.design).pairwise and s.configs):
        cfgs, rows, cls = study.paired_configs(), [], []
        st = (by_name or {}).get(study.name)
        for c in cfgs:
            for p in c.pairs:  # a damaged (null or non-finite) endpoint shows as n/a
                verdict, kind = ("slower", "adverse") if (p.time_reduction_pct or 0.0) < 0 else ("faster", "")
                rows.append([f"{c.config} seed {p.seed}", str(p.first), *_pair_cells(p, points), verdict])
                cls.append(kind)
        blocks += _pairs_figure(f"pairs{n}", study.name, cfgs, points)
        base, cand = cfgs[0].baseline_arm, cfgs[0].candidate_arm
        change = "Time change (points)" if points else "Time reduction"
        head = ["Pair", "First", f"{base} (s)", f"{cand} (s)", change, _delta(cfgs[0]), "Candidate"]
        blocks.append(Table(f"Study {study.name}: every pair", head, rows, cls))
        blocks += _bias(cal, st, CLOCK_ENDPOINT["wall"], f"the pairs of study {study.name}", points)
    return Section("Every pair, including adverse ones", blocks, only="html")


def order_html(studies: Sequence[StudyResult]) -> Section:
    """The page's order diagnostics of the paired studies: the AB/BA period effect and
    treatment-by-period check, and the drift of the log ratio over execution order."""
    items = [
        f"<li>{line}</li>"
        for study in studies
        if design_named(study.design).pairwise
        for c in study.paired_configs()
        for line in _order(c, f"{esc(study.name)} / {esc(c.config)}", False)
    ]
    intro = (
        "<p>AB/BA period effect and treatment-by-period check (log time), and "
        "drift of the log ratio over execution order.</p><ul>"
    )
    items = items or [f"<li>{NO_ORDER}</li>"]
    return Section("Order diagnostics", [raw(x) for x in (intro, *items, "</ul>")], only="html")

"""Each study's sections of the published texts: a paired study's training time (table, forest plot),
CPU time, quality, completion and memory costs, every pair and its order diagnostics; a factorial
study's cell means and within-block effects; and the answer in one figure (the page's)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeGuard

from prereg.factorial import design_of, effect_names
from prereg.render.answer import clock_intervals
from prereg.render.beside import Beside
from prereg.render.model import Section, Table, Text, cells, esc, level_pct, num, para, raw
from prereg.render.svg import forest_svg, pairs_svg
from prereg.results import PairedResult, StudyResult

__all__ = ["answer_figure", "design_label", "every_pair", "factorial", "order_html", "paired"]

MIB = 1024 * 1024
MEMORY = "Peak resident memory of the run's process"
#: A row of one of a paired study's tables, for report.md (``True``) or the page.
Row = Callable[[PairedResult, bool], list[str]]
CPU_CLOCK = (
    "Training CPU time (the training thread's with one intra-op thread, the process's with more; "
    "both arms of a pair on the same clock)"
)


def design_label(protocol_study: Mapping[str, Any] | None) -> str:
    """How a paired study's pairs ran: lockstep (its block size; built-in arms in one process, a
    command study's two processes taking turns) or a process per arm."""
    st = protocol_study or {}
    if st.get("lockstep"):
        n = st["lockstep"]["block_steps"]
        steps = f"{n} step" + ("s" if n != 1 else "")
        if "commands" in st:
            return f"lockstep, two processes (one per arm) taking turns in blocks of {steps}"
        return f"lockstep, both arms in one process, alternating blocks of {steps}"
    return "a process per arm"


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
    both = []
    for p in c.pairs:
        b, k = getattr(p, f"baseline_{key}", None), getattr(p, f"candidate_{key}", None)
        if _positive(b) and _positive(k):
            both.append((b, k))
    if not both:
        return None, None
    logs = [math.fsum(math.log(x[i]) for x in both) / len(both) for i in (0, 1)]
    return math.exp(logs[0]), math.exp(logs[1])


def _positive(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def answer_figure(
    studies: Sequence[StudyResult],
    protocol_studies: Sequence[Mapping[str, Any]],
    cpu: bool = True,
    beside: Beside | None = None,
) -> list[Text]:
    """The answer in one figure (the page's): every paired study's training-time reduction per
    configuration, on the wall clock and, with ``cpu`` (a CPU device), the CPU clock where recorded,
    each study's design named; ``beside``'s wall-clock rows after them. Nothing without an interval."""
    design = {s["name"]: design_label(s) for s in protocol_studies}
    rows: list[tuple[str, float | None, float | None, float | None]] = []
    level, names = None, []
    for study in studies:
        for c in study.paired_configs():
            if c.baseline_arm == c.candidate_arm:
                continue  # an A/A null check is in its own section
            level = level or c.level
            names.append(f"{c.candidate_arm} over {c.baseline_arm}")
            rows += [
                (f"{study.name} / {c.config}, {clock}", *_ends(iv)) for clock, iv in clock_intervals(c, cpu)
            ]
    for b in beside.rows if beside else ():
        iv = b.earlier.training_time.interval
        if iv is not None:
            label = f"{beside.protocol_id} {b.earlier_study} / {b.config}, wall"  # type: ignore[union-attr]
            if all(r[0] != label for r in rows):  # one earlier result beside several studies: once
                rows.append((label, iv.estimate, iv.low, iv.high))
    svg = forest_svg("answer", "Training-time reduction per study and configuration", rows)
    kinds = "; ".join(f"{esc(n)}: {esc(d)}" for n, d in design.items())
    if beside and beside.rows:
        kinds += (
            f"; beside it, the earlier study {esc(beside.protocol_id)} ({esc(beside.rows[0].earlier_design)})"
        )
    return figure(
        svg,
        f"The answer in one figure: the training-time reduction of {esc(', '.join(dict.fromkeys(names)))}, "
        "per study and configuration, on the wall clock and the training thread's CPU clock where recorded, "
        f"with {level_pct(level or 0.99)} paired intervals; right of the dashed line the candidate is "
        f"faster. How each study's pairs ran: {kinds}.",
    )


def figure(svg: str, caption: str) -> list[Text]:
    """A plot with its caption (the page's markup); nothing without a plot."""
    return [raw(f"<figure>{svg}<figcaption>{caption}</figcaption></figure>")] if svg else []


def _times(c: PairedResult, ep: Any, key: str, md: bool) -> tuple[str, str, str]:
    """An endpoint's arms' geometric mean ``key`` (seconds), its reduction and interval: report.md's
    cells (``md``: an en dash, ``n/a`` per number) or the page's."""
    est, rng = cells(ep.interval, sep="–" if md else " to ", whole=not md)
    b, k = geometric_means(c, key)
    return f"{num(b, '.3f')} / {num(k, '.3f')} s", est, rng


def paired(study: StudyResult, n: int, protocol_study: Mapping[str, Any] | None, cpu: bool) -> list[Section]:
    """A paired study's sections: training time (and the page's forest plot), CPU time (the page's
    with ``cpu``, a CPU device), quality and completion costs, peak memory; report.md's every pair
    and order diagnostics. ``n`` numbers the page's plots; ``protocol_study`` names the design."""
    cfgs = study.paired_configs()
    base, cand, lvl = cfgs[0].baseline_arm, cfgs[0].candidate_arm, level_pct(cfgs[0].level)
    arms, geo = f"{base} / {cand}", f"{base} / {cand} (geometric mean)"
    blocks: list[Text | Table] = [
        para(
            f"Fixed-budget training time; pairs ran in {design_label(protocol_study)}. Times are geometric "
            "means over the pairs (1 - candidate / baseline of them is the reduction shown). Intervals are "
            f"two-sided {lvl} paired Student-t intervals; a positive reduction means the candidate was faster."
        )
    ]
    head = ["Configuration", "Parameters", geo, "Time reduction", f"{lvl} interval", "Faster / slower pairs"]
    blocks += _both(f"Training time, {arms}", head, _time_row, cfgs)
    forest = [(c.config, *_ends(c.training_time.interval)) for c in cfgs]
    svg = forest_svg(f"forest{n}", f"Training-time reduction of {cand} over {base}, {lvl} intervals", forest)
    said = f"Training-time reduction per configuration with its {lvl} interval; right of the dashed line "
    blocks += figure(svg, said + "the candidate is faster.")
    st = protocol_study or {}
    no_total, no_memory, clock = RAN[bool(st.get("lockstep")), "commands" in st]
    with_cpu = [c for c in cfgs if c.training_cpu_time is not None] if cpu else []
    if with_cpu:
        cpu_head = ["Configuration", geo, "CPU-time reduction", f"{lvl} interval"]
        blocks += [para(f"{clock}.", "md"), *_both(f"{clock}, {arms}", cpu_head, _cpu_row, with_cpu)]
    blocks += [*_md_completion(cfgs, lvl, no_total), *_md_quality(cfgs, lvl, arms)]
    blocks += [*_md_memory(cfgs, arms, no_memory), *_md_pairs(cfgs, lvl)]
    memory = _memory(cfgs, False)
    page_memory = Table(MEMORY, ["Configuration", geo, "Reduction"], memory)
    return [
        Section(f"Study {study.name}: {cand} versus {base}", blocks),
        _page_costs(study, cfgs, lvl, no_total),
        Section(
            f"Peak memory ({study.name})",
            [page_memory if memory else para(no_memory, "html")],
            3,
            "html",
        ),
    ]


def _both(caption: str, head: list[str], row: Row, cfgs: Sequence[PairedResult]) -> list[Table]:
    """One table twice, report.md's and the page's: the same columns, each row built by ``row`` for
    each output (``md``: report.md's cells)."""
    return [
        Table(caption, head, [row(c, md) for c in cfgs], only="md" if md else "html") for md in (True, False)
    ]


def _time_row(c: PairedResult, md: bool) -> list[str]:
    params = "n/a" if md and not c.parameters else num((c.parameters or 0) / 1e6, ".2f") + "M"
    times = _times(c, c.training_time, "training_s", md)
    return [c.config, params, *times, f"{c.counts['faster']} / {c.counts['slower']}"]


def _cpu_row(c: PairedResult, md: bool) -> list[str]:
    return [c.config, *_times(c, c.training_cpu_time, "training_cpu_s", md)]


def _ends(iv: Any) -> tuple[float | None, float | None, float | None]:
    return (None, None, None) if iv is None else (iv.estimate, iv.low, iv.high)


def _memory(cfgs: Sequence[PairedResult], md: bool) -> list[list[str]]:
    """Peak memory rows: the configurations where both arms' means were recorded, as geometric means
    (the reduction beside them is their ratio's)."""
    rows = []
    for c in cfgs:
        m = c.peak_memory
        if m and m.baseline_mean is not None and m.candidate_mean is not None:
            est = cells(m.interval, whole=not md)[0]
            b, k = geometric_means(c, "peak_memory_bytes")
            rows.append([c.config, f"{num(b and b / MIB, '.1f')} / {num(k and k / MIB, '.1f')} MiB", est])
    return rows


def _md_completion(cfgs: Sequence[PairedResult], lvl: str, no_total: str | None) -> list[Text | Table]:
    """report.md's time to the target and total time of a paired study."""
    rows = []
    for c in cfgs:
        t = c.time_to_target
        reached = (
            f"{t.pairs} (unreached: baseline {t.unreached['baseline']}, candidate {t.unreached['candidate']})"
        )
        total = no_total or cells(c.total_time.interval, whole=False)[0]
        rows.append([c.config, reached, *cells(t.interval, sep="–", whole=False), total])
    head = ["Configuration", "Pairs where both reached the target", "Time-to-target reduction"]
    return [
        para("Time to the fixed validation target and total completion time.", "md"),
        Table("", [*head, f"{lvl} interval", "Total-time reduction"], rows, only="md"),
    ]


def _metric(c: PairedResult) -> str | None:
    """The quality metric the script reported (``None``: full-test BPB)."""
    return None if c.final_metric is None else str(c.final_metric.metric["name"])


def _quality_words(fm: Any) -> str:
    """What a script-reported quality metric is, as both texts say it."""
    return (
        f"{fm.metric['name']} at each arm's last evaluation, as its script reported it "
        f"({fm.metric.get('better', 'lower')} is better; the difference is candidate minus baseline)"
    )


def _quality(q: Any, md: bool) -> list[str]:
    """A quality endpoint's arms' means, difference and interval cells."""
    means = f"{num(q.baseline_mean, '.4f')} / {num(q.candidate_mean, '.4f')}"
    return [means, *cells(q.interval, "+.5f", "", whole=not md)]


def _md_quality(cfgs: Sequence[PairedResult], lvl: str, arms: str) -> list[Text | Table]:
    """report.md's quality endpoint of a paired study."""
    metric = _metric(cfgs[0])
    words = (
        f"Quality: {_quality_words(cfgs[0].final_metric)}."
        if metric is not None
        else "Full-test quality (BPB; lower is better; positive difference means the candidate was worse)."
    )
    qs = [(c.config, c.test_bpb if metric is None else c.final_metric) for c in cfgs]
    rows = [[config, *_quality(q, True)] for config, q in qs if q is not None]
    head = ["Configuration", f"{arms} {metric or 'BPB'}", "Difference", f"{lvl} interval"]
    return [para(words, "md"), Table("", head, rows, only="md")]


def _md_memory(cfgs: Sequence[PairedResult], arms: str, no_memory: str) -> list[Text | Table]:
    """report.md's peak memory of a paired study, or why it has none."""
    memory = _memory(cfgs, True)
    table = Table("", ["Configuration", f"{arms} peak (geometric mean)", "Reduction"], memory, only="md")
    return [para("Peak memory.", "md"), table if memory else para(no_memory, "md")]


def _delta(c: PairedResult) -> str:
    """The column of a pair's quality difference."""
    metric = _metric(c)
    return f"Δ {metric}" if metric is not None else "Test Δ BPB"


def _pair_cells(p: Any) -> list[str]:
    """A pair's two training times, its time reduction and its quality difference."""
    times = [num(p.baseline_training_s, ".3f"), num(p.candidate_training_s, ".3f")]
    return [*times, num(p.time_reduction_pct, ".2f%"), num(p.quality_difference(), "+.5f")]


def _md_pairs(cfgs: Sequence[PairedResult], lvl: str) -> list[Text | Table]:
    """report.md's every pair and order diagnostics of a paired study."""
    rows = [[c.config, str(p.seed), str(p.first), *_pair_cells(p)] for c in cfgs for p in c.pairs]
    base, cand = (f"{arm.capitalize()} (s)" for arm in (cfgs[0].baseline_arm, cfgs[0].candidate_arm))
    head = ["Configuration", "Seed", "First", base, cand, "Time reduction", _delta(cfgs[0])]
    lines = [line for c in cfgs for line in _order_md(c)] or ["Too few pairs for order diagnostics."]
    order = (
        f"Order diagnostics ({lvl} intervals): AB/BA period effect, treatment-by-period check, drift "
        "over execution order."
    )
    return [
        para("Every pair, including adverse ones.", "md"),
        Table("", head, rows, only="md"),
        para(order, "md"),
        Text("\n".join(lines)),
    ]


def _page_costs(study: StudyResult, cfgs: Sequence[PairedResult], lvl: str, no_total: str | None) -> Section:
    """The page's quality and completion costs: the quality endpoint, total time, time to target."""
    base, cand, fm = cfgs[0].baseline_arm, cfgs[0].candidate_arm, cfgs[0].final_metric
    rows = []
    for c in cfgs:
        q, ttt = c.final_metric or c.test_bpb, c.time_to_target
        te, tr = cells(c.total_time.interval)
        re_, rr = cells(ttt.interval)
        total = no_total or f"{te} ({tr})"
        unreached = f"unreached {ttt.unreached['baseline']} / {ttt.unreached['candidate']}"
        rows.append(
            [c.config, *_quality(q, False), total, f"{re_} ({rr}); {ttt.pairs} pairs reached, {unreached}"]
        )
    caption = (
        _quality_words(fm)
        if fm is not None
        else "Full-test bits per byte (lower is better; a positive difference means the candidate was worse)"
    )
    head = ["Configuration", f"{base} / {cand} {_metric(cfgs[0]) or 'BPB'}", "Difference", f"{lvl} interval"]
    head += ["Total-time reduction", "Time-to-target reduction"]
    table = Table(caption + ", total completion time and time to the validation target", head, rows)
    return Section(f"Quality and completion costs ({study.name})", [table], level=3, only="html")


def _order_md(c: PairedResult) -> list[str]:
    """report.md's order lines of one configuration: devices, the AB/BA period effect, drift."""
    dev, out = c.by_device, []
    if dev:
        het = dev["heterogeneity"]
        out.append(
            f"{c.config}: pairs ran on {len(dev['devices'])} devices; every pair within one device, so the "
            "pooled interval averages within-device differences. Per device, ln(candidate/baseline time): "
            + "; ".join(
                f"{d['device']}: {d['estimate']:+.4f} ({d['pairs']} pairs"
                + (f", [{d['low']:+.4f}, {d['high']:+.4f}])" if d["low"] is not None else ")")
                for d in dev["devices"]
            )
            + (
                f". Heterogeneity across devices: F = {het['F']:.3g}, p = {het['p_value']:.3g}."
                if het
                else "."
            )
        )
    return out + _order(c, c.config, True)


def _order(c: PairedResult, at: str, md: bool) -> list[str]:
    """A configuration's AB/BA period effect and treatment-by-period check, and its drift over
    execution order, as report.md (``md``) or the page words them."""
    oe, out = c.order_effects or {}, []
    if oe.get("crossover"):
        p, k = oe["crossover"]["period"], oe["crossover"]["carryover"]
        period = "period effect (second run vs first, log time)" if md else "period effect"
        check = "treatment-by-period check" if md else "treatment-by-period"
        out.append(f"{at}: {period} {_fit(p['estimate'], p, '+.4f')}; {check} p = {k['p_value']:.3g}.")
    if oe.get("drift"):
        d, drift = oe["drift"], "drift of ln(candidate/baseline)" if md else "drift"
        out.append(f"{at}: {drift} per plan position {_fit(d['slope'], d, '+.3g')}.")
    return out


def _fit(x: float, iv: Mapping[str, Any], fmt: str, p: bool = True) -> str:
    """An estimate, its interval in brackets and (``p``) its p-value."""
    return f"{x:{fmt}} [{iv['low']:{fmt}}, {iv['high']:{fmt}}]" + (f", p = {iv['p_value']:.3g}" if p else "")


def factorial(study: StudyResult, declared: Mapping[str, Any]) -> list[Section]:
    """A factorial study's sections: per configuration its blocks, cell means and within-block
    effects with their intervals, in the order of the design ``declared`` (the protocol's study)."""
    factors, cells_ = design_of(declared)
    title = "norms x optimizer" if "factors" not in declared else " x ".join(f for f, _ in factors)
    labels = {}
    for name, subset in effect_names(factors):
        words = (
            f"{factors[subset[0]][1][1]} {factors[subset[0]][0]}"
            if len(subset) == 1
            else "interaction"
            + ("" if len(factors) == 2 else " " + " x ".join(factors[j][0] for j in subset))
        )
        labels[name] = words[0].upper() + words[1:]
    if "factors" not in declared:
        labels["packed_adamw"] = "Packed AdamW"
    md: list[Text | Table] = []
    html: list[Text | Table] = []
    for c in study.factorial_configs():
        lvl, means, effects = level_pct(c.level), c.cell_mean_training_s or {}, c.effects or {}
        each = ", ".join(f"{k} {num(means[k], '.3f')} s" for k in cells_)
        md.append(Text(f"{c.config}: {c.blocks_used} blocks; mean training time {each}."))
        rows = [_effect(label, e, "–") for name, label in labels.items() if (e := effects.get(name))]
        md.append(Table("", ["Effect (within-block, log time)", "Time reduction", f"{lvl} interval"], rows))
        if c.positions:
            at = "; ".join(f"{q['position']}: {_fit(q['estimate'], q, '+.4f', False)}" for q in c.positions)
            md.append(Text(f"Position in the Williams square (log time relative to the block mean): {at}"))
        each = ", ".join(f"{esc(k)} {num(means[k], '.3f')} s" for k in _design_order(means, cells_))
        html.append(
            raw(f"<p>{esc(c.config)}: {c.blocks_used} blocks; mean training time per cell: {each}.</p>")
        )
        order = _design_order(effects, [n for n, _ in effect_names(factors)])
        rows = [_effect(name.replace("_", " "), e, " to ") for name in order if (e := effects[name])]
        caption = f"Within-block effects on log training time, {c.config}"
        html.append(Table(caption, ["Effect", "Time reduction", f"{lvl} interval"], rows))
    shape = "x".join("2" for _ in factors)
    return [
        Section(f"Study {study.name}: {shape} factorial ({title})", md, only="md"),
        Section(f"Study {study.name}: factorial decomposition", html, only="html"),
    ]


def _effect(label: str, e: Mapping[str, float], sep: str) -> list[str]:
    low, high = e["reduction_low_pct"], e["reduction_high_pct"]
    return [label, f"{e['reduction_pct']:.2f}%", f"{low:.2f}{sep}{high:.2f}%"]


def _design_order(values: Any, order: Sequence[str]) -> list[str]:
    """The keys of ``values`` in the design's order (cells, effects), any others after them: the
    order of the protocol, not of summary.json's sorted keys."""
    return [k for k in order if k in values] + sorted(k for k in values if k not in order)


def every_pair(studies: Sequence[StudyResult]) -> Section:
    """The page's every pair of every paired study, adverse ones (the candidate was slower) marked,
    with a dot plot per study."""
    blocks: list[Text | Table] = [
        para(
            "Adverse pairs (the candidate was slower) are marked. A positive quality difference means the "
            "candidate was worse."
        )
    ]
    for n, study in enumerate(s for s in studies if s.design == "paired" and s.configs):
        rows, cls, dots = [], [], []
        for c in study.paired_configs():
            dots.append(
                (c.config, [p.time_reduction_pct for p in c.pairs if p.time_reduction_pct is not None])
            )
            for p in c.pairs:  # a damaged (null or non-finite) endpoint shows as n/a
                adverse = (p.time_reduction_pct or 0.0) < 0
                verdict = "slower" if adverse else "faster"
                rows.append([f"{c.config} seed {p.seed}", str(p.first), *_pair_cells(p), verdict])
                cls.append("adverse" if adverse else "")
        svg = pairs_svg(f"pairs{n}", f"Every pair's training-time reduction, study {study.name}", dots)
        blocks += figure(svg, "Each mark is one pair; red squares are adverse pairs.")
        first = study.paired_configs()[0]
        head = ["Pair", "First", f"{first.baseline_arm} (s)", f"{first.candidate_arm} (s)", "Time reduction"]
        blocks.append(
            Table(f"Study {study.name}: every pair", [*head, _delta(first), "Candidate"], rows, cls)
        )
    return Section("Every pair, including adverse ones", blocks, only="html")


def order_html(studies: Sequence[StudyResult]) -> Section:
    """The page's order diagnostics of the paired studies: the AB/BA period effect and
    treatment-by-period check, and the drift of the log ratio over execution order."""
    items = [
        f"<li>{line}</li>"
        for study in studies
        if study.design == "paired"
        for c in study.paired_configs()
        for line in _order(c, f"{esc(study.name)} / {esc(c.config)}", False)
    ]
    intro = (
        "<p>AB/BA period effect and treatment-by-period check (log time), and "
        "drift of the log ratio over execution order.</p><ul>"
    )
    items = items or ["<li>Too few pairs for order diagnostics.</li>"]
    return Section("Order diagnostics", [raw(x) for x in (intro, *items, "</ul>")], only="html")

"""Each study's sections of the published texts: a paired study's training time (table, forest plot),
CPU time, quality, completion and memory costs, every pair and its order diagnostics; a factorial
study's cell means and within-block effects; and the answer in one figure (the page's)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from prereg.factorial import design_of, effect_names
from prereg.render.beside import Beside
from prereg.render.model import Section, Table, Text, cells, esc, level_pct, num, para, raw
from prereg.render.svg import forest_svg, pairs_svg
from prereg.results import PairedResult, StudyResult

__all__ = ["answer_figure", "design_label", "every_pair", "factorial", "order_html", "paired"]

MIB = 1024 * 1024
MEMORY = "Peak resident memory of the run's process"
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


def _no_total(protocol_study: Mapping[str, Any] | None) -> str | None:
    """Why a lockstep study compares no total time (``None``: it does)."""
    st = protocol_study or {}
    if not st.get("lockstep"):
        return None
    if "commands" in st:
        return "n/a (lockstep: two processes took turns, so each one's total time holds the other's turns)"
    return "n/a (lockstep: one process ran both arms)"


def _no_memory(protocol_study: Mapping[str, Any] | None) -> str:
    """Why a study's peak-memory table has no row."""
    st = protocol_study or {}
    if st.get("lockstep") and "commands" not in st:
        return (
            "No peak memory per arm: in lockstep one process ran both arms, so its peak resident memory "
            "is neither arm's alone."
        )
    return (
        "No peak memory per arm: a pair's records hold no memory figure (none was measured for these runs)."
    )


def _cpu_clock(protocol_study: Mapping[str, Any] | None) -> str:
    """The CPU clock of the study's records, as they name it."""
    if "commands" in (protocol_study or {}):
        return (
            "Training CPU time (each script process's CPU time, time.process_time, over its timed steps; "
            "both arms on the same clock)"
        )
    return CPU_CLOCK


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
            for clock, ep in (("wall", c.training_time), ("CPU", c.training_cpu_time if cpu else None)):
                iv = ep.interval if ep is not None else None
                if iv is not None:
                    rows.append((f"{study.name} / {c.config}, {clock}", iv.estimate, iv.low, iv.high))
    for b in beside.rows if beside else ():
        iv = b.earlier.training_time.interval
        if iv is not None:
            label = f"{beside.protocol_id} {b.earlier_study} / {b.config}, wall"  # type: ignore[union-attr]
            if all(r[0] != label for r in rows):  # one earlier result beside several studies: once
                rows.append((label, iv.estimate, iv.low, iv.high))
    svg = forest_svg("answer", "Training-time reduction per study and configuration", rows)
    if not svg:
        return []
    kinds = "; ".join(f"{esc(n)}: {esc(d)}" for n, d in design.items())
    if beside and beside.rows:
        kinds += (
            f"; beside it, the earlier study {esc(beside.protocol_id)} ({esc(beside.rows[0].earlier_design)})"
        )
    return [
        raw(
            f"<figure>{svg}<figcaption>The answer in one figure: the training-time reduction of "
            f"{esc(', '.join(dict.fromkeys(names)))}, per study and configuration, on the wall clock and the "
            f"training thread's CPU clock where recorded, with {level_pct(level or 0.99)} paired intervals; right "
            f"of the dashed line the candidate is faster. How each study's pairs ran: {kinds}.</figcaption></figure>",
        )
    ]


def _times(
    ep: Any,
    md: bool,
    fmt: str = ".3f",
    unit: str = " s",
    means: tuple[float | None, float | None] | None = None,
) -> tuple[str, str, str]:
    """An endpoint's baseline / candidate means (``means``, else the endpoint's arithmetic ones), its
    reduction and interval: report.md's cells (``md``: an en dash, ``n/a`` per number) or the page's."""
    est, rng = cells(ep.interval, sep="–" if md else " to ", whole=not md)
    b, k = means or (ep.baseline_mean, ep.candidate_mean)
    return f"{num(b, fmt)} / {num(k, fmt)}{unit}", est, rng


def paired(study: StudyResult, n: int, protocol_study: Mapping[str, Any] | None, cpu: bool) -> list[Section]:
    """A paired study's sections: training time (and the page's forest plot), CPU time (the page's
    with ``cpu``, a CPU device), quality and completion costs, peak memory; report.md's every pair
    and order diagnostics. ``n`` numbers the page's plots; ``protocol_study`` names the design."""
    cfgs = study.paired_configs()
    first = cfgs[0]
    base, cand, lvl = first.baseline_arm, first.candidate_arm, level_pct(first.level)
    blocks: list[Text | Table] = [
        para(
            f"Fixed-budget training time; pairs ran in {design_label(protocol_study)}. Times are geometric "
            "means over the pairs (1 - candidate / baseline of them is the reduction shown). Intervals are "
            f"two-sided {lvl} paired Student-t intervals; a positive reduction means the candidate was faster."
        )
    ]
    geo = f"{base} / {cand} (geometric mean)"
    head = ["Configuration", "Parameters", geo, "Time reduction", f"{lvl} interval", "Faster / slower pairs"]
    for md in (True, False):
        rows = []
        for c in cfgs:
            params = "n/a" if md and not c.parameters else num((c.parameters or 0) / 1e6, ".2f") + "M"
            counts = f"{c.counts['faster']} / {c.counts['slower']}"
            rows.append(
                [
                    c.config,
                    params,
                    *_times(c.training_time, md, means=geometric_means(c, "training_s")),
                    counts,
                ]
            )
        blocks.append(Table(f"Training time, {base} / {cand}", head, rows, only="md" if md else "html"))
    forest = [(c.config, *_ends(c.training_time.interval)) for c in cfgs]
    svg = forest_svg(f"forest{n}", f"Training-time reduction of {cand} over {base}, {lvl} intervals", forest)
    if svg:
        blocks.append(
            raw(
                f"<figure>{svg}<figcaption>Training-time reduction per configuration with its {lvl} interval; "
                "right of the dashed line the candidate is faster.</figcaption></figure>",
            )
        )
    with_cpu = [c for c in cfgs if c.training_cpu_time is not None] if cpu else []
    clock = _cpu_clock(protocol_study)
    if with_cpu:
        blocks.append(para(f"{clock}.", "md"))
    for md in (True, False) if with_cpu else ():
        rows = [
            [c.config, *_times(c.training_cpu_time, md, means=geometric_means(c, "training_cpu_s"))]
            for c in with_cpu
        ]
        cpu_head = ["Configuration", geo, "CPU-time reduction", f"{lvl} interval"]
        blocks.append(Table(f"{clock}, {base} / {cand}", cpu_head, rows, only="md" if md else "html"))
    blocks += _md_costs(cfgs, lvl, f"{base} / {cand}", protocol_study)
    memory = _memory(cfgs, False)
    page_memory: list[Text | Table] = [para(_no_memory(protocol_study), "html")]
    if memory:
        page_memory = [
            Table(MEMORY, ["Configuration", f"{base} / {cand} (geometric mean)", "Reduction"], memory)
        ]
    return [
        Section(f"Study {study.name}: {cand} versus {base}", blocks),
        _page_costs(study, cfgs, lvl, _no_total(protocol_study)),
        Section(f"Peak memory ({study.name})", page_memory, 3, "html"),
    ]


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


def _md_costs(
    cfgs: Sequence[PairedResult], lvl: str, names: str, protocol_study: Mapping[str, Any] | None
) -> list[Text | Table]:
    """report.md's completion, quality, memory, every-pair and order blocks of a paired study."""
    first = cfgs[0]
    rows = []
    for c in cfgs:
        t = c.time_to_target
        reached = (
            f"{t.pairs} (unreached: baseline {t.unreached['baseline']}, candidate {t.unreached['candidate']})"
        )
        total = _no_total(protocol_study) or cells(c.total_time.interval, whole=False)[0]
        rows.append([c.config, reached, *cells(t.interval, sep="–", whole=False), total])
    head = [
        "Configuration",
        "Pairs where both reached the target",
        "Time-to-target reduction",
        f"{lvl} interval",
    ]
    out: list[Text | Table] = [
        para("Time to the fixed validation target and total completion time.", "md"),
        Table("", [*head, "Total-time reduction"], rows, only="md"),
    ]
    if first.final_metric is not None:
        metric, better = first.final_metric.metric["name"], first.final_metric.metric.get("better", "lower")
        out.append(
            para(
                f"Quality: {metric} at each arm's last evaluation, as its script reported it ({better} is "
                "better; the difference is candidate minus baseline).",
                "md",
            )
        )
    else:
        metric = None
        out.append(
            para(
                "Full-test quality (BPB; lower is better; positive difference means the candidate was worse).",
                "md",
            )
        )
    rows = []
    for c in cfgs:
        q = c.test_bpb if metric is None else c.final_metric
        if q is not None:
            rows.append(
                [c.config, _times(q, True, ".4f", "")[0], *cells(q.interval, "+.5f", "", whole=False)]
            )
    head = ["Configuration", f"{names} {metric or 'BPB'}", "Difference", f"{lvl} interval"]
    out += [Table("", head, rows, only="md"), para("Peak memory.", "md")]
    memory = _memory(cfgs, True)
    if memory:
        out.append(
            Table("", ["Configuration", f"{names} peak (geometric mean)", "Reduction"], memory, only="md")
        )
    else:
        out.append(para(_no_memory(protocol_study), "md"))
    rows = [
        [
            c.config,
            str(p.seed),
            str(p.first),
            num(p.baseline_training_s, ".3f"),
            num(p.candidate_training_s, ".3f"),
        ]
        + [num(p.time_reduction_pct, ".2f%"), num(p.quality_difference(), "+.5f")]
        for c in cfgs
        for p in c.pairs
    ]
    delta = f"Δ {metric}" if metric is not None else "Test Δ BPB"
    head = ["Configuration", "Seed", "First", f"{first.baseline_arm.capitalize()} (s)"]
    out += [para("Every pair, including adverse ones.", "md")]
    out.append(
        Table(
            "", [*head, f"{first.candidate_arm.capitalize()} (s)", "Time reduction", delta], rows, only="md"
        )
    )
    out.append(
        para(
            f"Order diagnostics ({lvl} intervals): AB/BA period effect, treatment-by-period check, drift "
            "over execution order.",
            "md",
        )
    )
    lines = [line for c in cfgs for line in _order_md(c)] or ["Too few pairs for order diagnostics."]
    return [*out, Text("\n".join(lines))]


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
        ttt_text = f"{re_} ({rr}); {ttt.pairs} pairs reached, {unreached}"
        rows.append(
            [c.config, _times(q, True, ".4f", "")[0], *cells(q.interval, "+.5f", ""), total, ttt_text]
        )
    caption = (
        f"{fm.metric['name']} at each arm's last evaluation, as its script reported it "
        f"({fm.metric.get('better', 'lower')} is better; the difference is candidate minus baseline)"
        if fm is not None
        else "Full-test bits per byte (lower is better; a positive difference means the candidate was worse)"
    )
    head = [
        "Configuration",
        f"{base} / {cand} {fm.metric['name'] if fm is not None else 'BPB'}",
        "Difference",
    ]
    head += [f"{lvl} interval", "Total-time reduction", "Time-to-target reduction"]
    table = Table(caption + ", total completion time and time to the validation target", head, rows)
    return Section(f"Quality and completion costs ({study.name})", [table], level=3, only="html")


def _order_md(c: PairedResult) -> list[str]:
    """report.md's order lines of one configuration: devices, the AB/BA period effect, drift."""
    oe, dev, out = c.order_effects, c.by_device, []
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
    if oe["crossover"]:
        p, k = oe["crossover"]["period"], oe["crossover"]["carryover"]
        out.append(
            f"{c.config}: period effect (second run vs first, log time) {p['estimate']:+.4f} "
            f"[{p['low']:+.4f}, {p['high']:+.4f}], p = {p['p_value']:.3g}; treatment-by-period check "
            f"p = {k['p_value']:.3g}."
        )
    if oe["drift"]:
        d = oe["drift"]
        out.append(
            f"{c.config}: drift of ln(candidate/baseline) per plan position {d['slope']:+.3g} "
            f"[{d['low']:+.3g}, {d['high']:+.3g}], p = {d['p_value']:.3g}."
        )
    return out


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
        md.append(
            Text(
                f"{c.config}: {c.blocks_used} blocks; mean training time "
                + ", ".join(f"{k} {num(means[k], '.3f')} s" for k in cells_)
                + "."
            )
        )
        rows = [_effect(label, e, "–") for name, label in labels.items() if (e := effects.get(name))]
        md.append(Table("", ["Effect (within-block, log time)", "Time reduction", f"{lvl} interval"], rows))
        if c.positions:
            md.append(
                Text(
                    "Position in the Williams square (log time relative to the block mean): "
                    + "; ".join(
                        f"{q['position']}: {q['estimate']:+.4f} [{q['low']:+.4f}, {q['high']:+.4f}]"
                        for q in c.positions
                    )
                )
            )
        shown = ", ".join(f"{esc(k)} {num(means[k], '.3f')} s" for k in _design_order(means, cells_))
        html.append(
            raw(f"<p>{esc(c.config)}: {c.blocks_used} blocks; mean training time per cell: {shown}.</p>")
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
    return [
        label,
        f"{e['reduction_pct']:.2f}%",
        f"{e['reduction_low_pct']:.2f}{sep}{e['reduction_high_pct']:.2f}%",
    ]


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
                red = "n/a" if p.time_reduction_pct is None else f"{p.time_reduction_pct:.2f}%"
                times = [num(p.baseline_training_s, ".3f"), num(p.candidate_training_s, ".3f")]
                quality = num(p.quality_difference(), "+.5f")
                verdict = "slower" if adverse else "faster"
                rows.append([f"{c.config} seed {p.seed}", str(p.first), *times, red, quality, verdict])
                cls.append("adverse" if adverse else "")
        svg = pairs_svg(f"pairs{n}", f"Every pair's training-time reduction, study {study.name}", dots)
        if svg:
            blocks.append(
                raw(
                    f"<figure>{svg}<figcaption>Each mark is one pair; red squares are adverse pairs.</figcaption></figure>",
                )
            )
        first = study.paired_configs()[0]
        delta = f"Δ {first.final_metric.metric['name']}" if first.final_metric is not None else "Test Δ BPB"
        head = ["Pair", "First", f"{first.baseline_arm} (s)", f"{first.candidate_arm} (s)", "Time reduction"]
        blocks.append(Table(f"Study {study.name}: every pair", [*head, delta, "Candidate"], rows, cls))
    return Section("Every pair, including adverse ones", blocks, only="html")


def order_html(studies: Sequence[StudyResult]) -> Section:
    """The page's order diagnostics of the paired studies: the AB/BA period effect and
    treatment-by-period check, and the drift of the log ratio over execution order."""
    items = []
    for study in (s for s in studies if s.design == "paired"):
        for c in study.paired_configs():
            oe, at = c.order_effects or {}, f"{esc(study.name)} / {esc(c.config)}"
            if oe.get("crossover"):
                p, k = oe["crossover"]["period"], oe["crossover"]["carryover"]
                items.append(
                    f"<li>{at}: period effect {p['estimate']:+.4f} [{p['low']:+.4f}, {p['high']:+.4f}], "
                    f"p = {p['p_value']:.3g}; treatment-by-period p = {k['p_value']:.3g}.</li>"
                )
            if oe.get("drift"):
                d = oe["drift"]
                items.append(
                    f"<li>{at}: drift per plan position {d['slope']:+.3g} [{d['low']:+.3g}, {d['high']:+.3g}], "
                    f"p = {d['p_value']:.3g}.</li>"
                )
    intro = (
        "<p>AB/BA period effect and treatment-by-period check (log time), and "
        "drift of the log ratio over execution order.</p><ul>"
    )
    items = items or ["<li>Too few pairs for order diagnostics.</li>"]
    return Section("Order diagnostics", [raw(x) for x in (intro, *items, "</ul>")], only="html")

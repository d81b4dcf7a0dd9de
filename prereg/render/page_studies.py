"""The study page's sections for each study: a paired study's training-time table and forest plot,
its quality, completion-time and memory costs; a factorial study's decomposition; every pair of the
paired studies, adverse ones marked; and the order diagnostics of the paired studies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prereg.factorial import design_of, effect_names
from prereg.render.beside import Beside
from prereg.render.page_html import esc, html_table, interval_cells, num
from prereg.render.svg import forest_svg, pairs_svg
from prereg.results import StudyResult

__all__ = [
    "answer_figure",
    "design_label",
    "every_pair_section",
    "factorial_section",
    "order_section",
    "paired_section",
]

MIB = 1024 * 1024


def beside_section(beside: Beside) -> list[str]:
    """This study's training-time reductions beside an earlier study's, per configuration: estimate,
    interval and its width, so what the designs resolve reads side by side.

    Parameters
    ----------
    beside : Beside
        The earlier study and the configurations both ran with the same arms.

    Returns
    -------
    list of str
        The section's HTML blocks (nothing when no configuration matches).
    """
    if not beside.rows:
        return []
    rows = []
    for b in beside.rows:
        cells = []
        for name, r in ((b.study, b.result), (f"{beside.protocol_id} {b.earlier_study}", b.earlier)):
            iv = r.training_time.interval
            est, rng = interval_cells(iv)
            width = f"{(iv.high - iv.low) / 2:.2f}" if iv is not None else "n/a"
            cells += [f"{esc(name)}: {r.pairs_used}", est, rng, f"±{width}"]
        rows.append([b.config, *cells])
    lvl = f"{beside.rows[0].result.level * 100:g}%"
    return [
        f"<h2>Beside {esc(beside.protocol_id)}</h2>",
        f"<p>The same configurations and arms in the earlier study {esc(beside.protocol_id)} "
        f"({esc(beside.rows[0].earlier_design)}; its records: <code>{esc(beside.folder)}</code>, audited on "
        "their own), read from its sealed summary.json.</p>",
        html_table(
            f"Training-time reduction, this study beside {beside.protocol_id} ({lvl} intervals, half-widths in "
            "percentage points)",
            [
                "Configuration",
                "This study: pairs",
                "Reduction",
                "Interval",
                "Half-width",
                f"{beside.protocol_id}: pairs",
                "Reduction",
                "Interval",
                "Half-width",
            ],
            rows,
        ),
    ]


def design_label(protocol_study: dict[str, Any] | None) -> str:
    """How a paired study's pairs ran, from its protocol summary: lockstep (its block size) or a
    process per arm."""
    lock = (protocol_study or {}).get("lockstep")
    if lock:
        return f"lockstep, both arms in one process, alternating blocks of {lock['block_steps']} step" + (
            "s" if lock["block_steps"] != 1 else ""
        )
    return "a process per arm"


def answer_figure(
    studies: Sequence[StudyResult],
    protocol_studies: Sequence[dict[str, Any]],
    cpu: bool = True,
    beside: Beside | None = None,
) -> list[str]:
    """The answer in one figure: every paired study's training-time reduction per configuration, on
    the wall clock and (where recorded) the CPU clock, with its interval, each study's design named.

    Parameters
    ----------
    studies : sequence of StudyResult
        The summary's studies (factorial ones are left to their section).
    protocol_studies : sequence of dict
        The protocol summary's studies (their designs).
    cpu : bool
        Whether to show the CPU clock (a study on a CPU device; on a GPU the host thread's CPU time
        does not measure the device's work).
    beside : Beside, optional
        An earlier study whose wall-clock rows of the same configurations follow this study's.

    Returns
    -------
    list of str
        The figure, or nothing when no paired study has an interval yet.
    """
    design = {s["name"]: design_label(s) for s in protocol_studies}
    rows: list[tuple[str, float | None, float | None, float | None]] = []
    level = None
    names = []
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
            rows.append((label, iv.estimate, iv.low, iv.high))
    svg = forest_svg("answer", "Training-time reduction per study and configuration", rows)
    if not svg:
        return []
    lvl = f"{(level or 0.99) * 100:g}%"
    kinds = "; ".join(f"{esc(n)}: {esc(d)}" for n, d in design.items())
    if beside and beside.rows:
        kinds += (
            f"; beside it, the earlier study {esc(beside.protocol_id)} ({esc(beside.rows[0].earlier_design)})"
        )
    return [
        f"<figure>{svg}<figcaption>The answer in one figure: the training-time reduction of "
        f"{esc(', '.join(dict.fromkeys(names)))}, per study and configuration, on the wall clock and the "
        f"training thread's CPU clock where recorded, with {lvl} paired intervals; right of the dashed line "
        f"the candidate is faster. How each study's pairs ran: {kinds}.</figcaption></figure>"
    ]


def paired_section(
    study: StudyResult, n: int, protocol_study: dict[str, Any] | None = None, cpu: bool = True
) -> list[str]:
    """A paired study's section: training time (table and forest plot), quality and completion costs,
    peak memory.

    Parameters
    ----------
    study : StudyResult
        A paired study with at least one configuration.
    n : int
        The study's index among the page's paired studies (it makes the plot's element ids unique).
    protocol_study : dict, optional
        The study in the protocol summary (its design: lockstep or a process per arm).
    cpu : bool
        Whether to show training CPU time (a study on a CPU device).

    Returns
    -------
    list of str
        The section's HTML blocks.
    """
    cfgs = study.paired_configs()
    first = cfgs[0]
    base, cand = first.baseline_arm, first.candidate_arm
    lvl = f"{first.level * 100:g}%"
    out = [
        f"<h2>Study {esc(study.name)}: {esc(cand)} versus {esc(base)}</h2>",
        f"<p>Fixed-budget training time; pairs ran in {esc(design_label(protocol_study))}. Intervals are "
        f"two-sided {lvl} paired Student-t intervals; a positive reduction means the candidate was faster.</p>",
    ]
    rows: list[list[str]] = []
    forest: list[tuple[str, float | None, float | None, float | None]] = []
    for c in cfgs:
        tt = c.training_time
        est, rng = interval_cells(tt.interval)
        rows.append(
            [
                c.config,
                num((c.parameters or 0) / 1e6, ".2f") + "M",
                f"{num(tt.baseline_mean, '.3f')} / {num(tt.candidate_mean, '.3f')} s",
                est,
                rng,
                f"{c.counts['faster']} / {c.counts['slower']}",
            ]
        )
        iv = tt.interval
        forest.append(
            (c.config, None, None, None) if iv is None else (c.config, iv.estimate, iv.low, iv.high)
        )
    out.append(
        html_table(
            f"Training time, {base} / {cand}",
            [
                "Configuration",
                "Parameters",
                f"{base} / {cand}",
                "Time reduction",
                f"{lvl} interval",
                "Faster / slower pairs",
            ],
            rows,
        )
    )
    svg = forest_svg(f"forest{n}", f"Training-time reduction of {cand} over {base}, {lvl} intervals", forest)
    if svg:
        out.append(
            f"<figure>{svg}<figcaption>Training-time reduction per configuration with its {lvl} interval; "
            "right of the dashed line the candidate is faster.</figcaption></figure>"
        )
    with_cpu = [c for c in cfgs if c.training_cpu_time is not None] if cpu else []
    if with_cpu:
        rows = []
        for c in with_cpu:
            ct = c.training_cpu_time
            assert ct is not None
            est, rng = interval_cells(ct.interval)
            rows.append(
                [c.config, f"{num(ct.baseline_mean, '.3f')} / {num(ct.candidate_mean, '.3f')} s", est, rng]
            )
        out.append(
            html_table(
                f"Training CPU time (the training thread's with one intra-op thread, the process's with "
                f"more; both arms of a pair on the same clock), {base} / {cand}",
                ["Configuration", f"{base} / {cand}", "CPU-time reduction", f"{lvl} interval"],
                rows,
            )
        )
    out.append(f"<h3>Quality and completion costs ({esc(study.name)})</h3>")
    rows = []
    lockstep = bool((protocol_study or {}).get("lockstep"))
    fm = cfgs[0].final_metric  # a study of command arms: its scripts' own metric, not BPB
    for c in cfgs:
        q, tot, ttt = c.final_metric or c.test_bpb, c.total_time, c.time_to_target
        qe, qr = interval_cells(q.interval, "+.5f", "")
        te, tr = interval_cells(tot.interval)
        re_, rr = interval_cells(ttt.interval)
        rows.append(
            [
                c.config,
                f"{num(q.baseline_mean, '.4f')} / {num(q.candidate_mean, '.4f')}",
                qe,
                qr,
                "n/a (lockstep: one process ran both arms)" if lockstep else f"{te} ({tr})",
                f"{re_} ({rr}); {ttt.pairs} pairs reached, unreached {ttt.unreached['baseline']}"
                f" / {ttt.unreached['candidate']}",
            ]
        )
    out.append(
        html_table(
            (
                f"{fm.metric['name']} at each arm's last evaluation, as its script reported it "
                f"({fm.metric.get('better', 'lower')} is better; the difference is candidate minus baseline)"
                if fm is not None
                else "Full-test bits per byte (lower is better; a positive difference means the candidate was "
                "worse)"
            )
            + ", total completion time and time to the validation target",
            [
                "Configuration",
                f"{base} / {cand} {fm.metric['name'] if fm is not None else 'BPB'}",
                "Difference",
                f"{lvl} interval",
                "Total-time reduction",
                "Time-to-target reduction",
            ],
            rows,
        )
    )
    out.append(f"<h3>Peak memory ({esc(study.name)})</h3>")
    rows = []
    for c in cfgs:
        m = c.peak_memory
        if m and m.baseline_mean is not None and m.candidate_mean is not None:
            rows.append(
                [
                    c.config,
                    f"{m.baseline_mean / MIB:.1f} / {m.candidate_mean / MIB:.1f} MiB",
                    interval_cells(m.interval)[0],
                ]
            )
    out.append(
        html_table(
            "Peak resident memory of the run's process",
            ["Configuration", f"{base} / {cand}", "Reduction"],
            rows,
        )
    )
    return out


def factorial_section(study: StudyResult, declared: Mapping[str, Any]) -> list[str]:
    """A factorial study's section: blocks and cell means per configuration, and the within-block
    effects with their intervals, in the order of the design ``declared`` (the protocol's study).

    Parameters
    ----------
    study : StudyResult
        A factorial study.

    Returns
    -------
    list of str
        The section's HTML blocks.
    """
    factors, cells = design_of(declared)
    out = [f"<h2>Study {esc(study.name)}: factorial decomposition</h2>"]
    for c in study.factorial_configs():
        lvl = f"{c.level * 100:g}%"
        means = c.cell_mean_training_s or {}
        out.append(
            f"<p>{esc(c.config)}: {c.blocks_used} blocks; mean training time per cell: "
            + ", ".join(f"{esc(k)} {num(means[k], '.3f')} s" for k in _design_order(means, cells))
            + ".</p>"
        )
        rows = []
        effects = c.effects or {}
        for name in _design_order(effects, [n for n, _ in effect_names(factors)]):
            e = effects[name]
            if e:
                rows.append(
                    [
                        name.replace("_", " "),
                        f"{e['reduction_pct']:.2f}%",
                        f"{e['reduction_low_pct']:.2f} to {e['reduction_high_pct']:.2f}%",
                    ]
                )
        out.append(
            html_table(
                f"Within-block effects on log training time, {c.config}",
                ["Effect", "Time reduction", f"{lvl} interval"],
                rows,
            )
        )
    return out


def _design_order(values: Any, order: Sequence[str]) -> list[str]:
    """The keys of ``values`` in the design's order (cells, effects), any others after them: the
    order of the protocol, not of summary.json's sorted keys."""
    return [k for k in order if k in values] + sorted(k for k in values if k not in order)


def every_pair_section(studies: Sequence[StudyResult]) -> list[str]:
    """Every pair of every paired study, adverse ones (the candidate was slower) marked, with a dot plot
    per study.

    Parameters
    ----------
    studies : sequence of StudyResult
        The summary's studies; factorial ones and those without configurations are skipped.

    Returns
    -------
    list of str
        The section's HTML blocks.
    """
    out = [
        "<h2>Every pair, including adverse ones</h2>",
        "<p>Adverse pairs (the candidate was slower) are marked. A positive quality difference means the "
        "candidate was worse.</p>",
    ]
    for n, study in enumerate(s for s in studies if s.design == "paired" and s.configs):
        rows, cls, dots = [], [], []
        for c in study.paired_configs():
            dots.append(
                (c.config, [p.time_reduction_pct for p in c.pairs if p.time_reduction_pct is not None])
            )
            for p in c.pairs:  # a damaged (null or non-finite) endpoint shows as n/a
                adverse = (p.time_reduction_pct or 0.0) < 0
                rows.append(
                    [
                        f"{c.config} seed {p.seed}",
                        str(p.first),
                        num(p.baseline_training_s, ".3f"),
                        num(p.candidate_training_s, ".3f"),
                        "n/a" if p.time_reduction_pct is None else f"{p.time_reduction_pct:.2f}%",
                        num(p.quality_difference(), "+.5f"),
                        "slower" if adverse else "faster",
                    ]
                )
                cls.append("adverse" if adverse else "")
        svg = pairs_svg(f"pairs{n}", f"Every pair's training-time reduction, study {study.name}", dots)
        if svg:
            out.append(
                f"<figure>{svg}<figcaption>Each mark is one pair; red squares are adverse pairs."
                "</figcaption></figure>"
            )
        first = study.paired_configs()[0]
        out.append(
            html_table(
                f"Study {study.name}: every pair",
                [
                    "Pair",
                    "First",
                    f"{first.baseline_arm} (s)",
                    f"{first.candidate_arm} (s)",
                    "Time reduction",
                    f"Δ {first.final_metric.metric['name']}"
                    if first.final_metric is not None
                    else "Test Δ BPB",
                    "Candidate",
                ],
                rows,
                cls,
            )
        )
    return out


def order_section(studies: Sequence[StudyResult]) -> list[str]:
    """The order diagnostics of the paired studies: the AB/BA period effect and treatment-by-period
    check, and the drift of the log ratio over execution order.

    Parameters
    ----------
    studies : sequence of StudyResult
        The summary's studies; only paired ones have order diagnostics.

    Returns
    -------
    list of str
        The section's HTML blocks.
    """
    out = [
        "<h2>Order diagnostics</h2>",
        "<p>AB/BA period effect and treatment-by-period check (log time), and "
        "drift of the log ratio over execution order.</p><ul>",
    ]
    items = 0
    for study in studies:
        if study.design != "paired":
            continue
        for c in study.paired_configs():
            oe = c.order_effects or {}
            if oe.get("crossover"):
                p, k = oe["crossover"]["period"], oe["crossover"]["carryover"]
                out.append(
                    f"<li>{esc(study.name)} / {esc(c.config)}: period effect {p['estimate']:+.4f} "
                    f"[{p['low']:+.4f}, {p['high']:+.4f}], p = {p['p_value']:.3g}; treatment-by-period "
                    f"p = {k['p_value']:.3g}.</li>"
                )
                items += 1
            if oe.get("drift"):
                d = oe["drift"]
                out.append(
                    f"<li>{esc(study.name)} / {esc(c.config)}: drift per plan position "
                    f"{d['slope']:+.3g} [{d['low']:+.3g}, {d['high']:+.3g}], p = {d['p_value']:.3g}.</li>"
                )
                items += 1
    if not items:
        out.append("<li>Too few pairs for order diagnostics.</li>")
    return [*out, "</ul>"]

"""``report.md``'s section for each study: a paired study's training-time, completion-time,
quality and memory tables, every pair and its order diagnostics; a factorial study's cell means,
within-block effects and positions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prereg.factorial import design_of, effect_names
from prereg.render.report_md import interval_end, level_pct, md_table, num
from prereg.results import PairedResult, StudyResult

__all__ = ["factorial_study_section", "paired_study_section"]

MIB = 1024 * 1024


def paired_study_section(study: StudyResult) -> list[str]:
    """A paired study's section: training time, time to target and total time, quality, memory, every
    pair, order.

    Parameters
    ----------
    study : StudyResult
        A paired study with at least one configuration.

    Returns
    -------
    list of str
        The section's markdown lines.
    """
    configs = study.paired_configs()
    first = configs[0]
    lvl = level_pct(first.level)
    out = [f"## Study {study.name}: {first.candidate_arm} versus {first.baseline_arm}", ""]
    out.append(
        f"Fixed-budget training time. Intervals are two-sided {lvl} paired Student-t intervals; "
        "positive reduction means the candidate was faster."
    )
    out.append("")
    names = f"{first.baseline_arm.capitalize()} / {first.candidate_arm.capitalize()}"
    out += _training_table(configs, lvl, names)
    cpu = [c for c in configs if c.training_cpu_time is not None]
    if cpu:
        out += [
            "",
            "Training CPU time (the training thread's with one intra-op thread, the process's with more; "
            "both arms of a pair on the same clock).",
            "",
        ]
        rows = []
        for c in cpu:
            ct = c.training_cpu_time
            assert ct is not None
            iv = ct.interval
            rows.append(
                [
                    c.config,
                    f"{num(ct.baseline_mean, '.3f')} / {num(ct.candidate_mean, '.3f')} s",
                    num(interval_end(iv, "estimate"), ".2f") + "%",
                    f"{num(interval_end(iv, 'low'), '.2f')}–{num(interval_end(iv, 'high'), '.2f')}%",
                ]
            )
        out += md_table(["Configuration", names, "CPU-time reduction", f"{lvl} interval"], rows)
    out += ["", "Time to the fixed validation target and total completion time.", ""]
    out += _completion_table(configs, lvl)
    command = first.final_metric is not None  # a study of command arms: its own metric, not BPB
    if command:
        fm = first.final_metric
        assert fm is not None
        name, better = fm.metric["name"], fm.metric.get("better", "lower")
        out += [
            "",
            f"Quality: {name} at each arm's last evaluation, as its script reported it ({better} is "
            "better; the difference is candidate minus baseline).",
            "",
        ]
        out += _quality_table(configs, lvl, names, name)
    else:
        out += [
            "",
            "Full-test quality (BPB; lower is better; positive difference means the candidate was worse).",
            "",
        ]
        out += _quality_table(configs, lvl, names)
    out += ["", "Peak memory.", ""]
    rows = []
    for c in configs:
        m = c.peak_memory
        if m and m.baseline_mean is not None and m.candidate_mean is not None:
            rows.append(
                [
                    c.config,
                    f"{m.baseline_mean / MIB:.1f} / {m.candidate_mean / MIB:.1f} MiB",
                    num(interval_end(m.interval, "estimate"), ".2f") + "%",
                ]
            )
    out += md_table(["Configuration", f"{names} peak", "Reduction"], rows)
    out += ["", "Every pair, including adverse ones.", ""]
    rows = []
    for c in configs:
        for pr in c.pairs:
            rows.append(
                [
                    c.config,
                    str(pr.seed),
                    str(pr.first),
                    num(pr.baseline_training_s, ".3f"),
                    num(pr.candidate_training_s, ".3f"),
                    num(pr.time_reduction_pct, ".2f%"),
                    num(pr.quality_difference(), "+.5f"),
                ]
            )
    out += md_table(
        [
            "Configuration",
            "Seed",
            "First",
            f"{first.baseline_arm.capitalize()} (s)",
            f"{first.candidate_arm.capitalize()} (s)",
            "Time reduction",
            f"Δ {first.final_metric.metric['name']}" if first.final_metric is not None else "Test Δ BPB",
        ],
        rows,
    )
    out += [
        "",
        f"Order diagnostics ({lvl} intervals): AB/BA period effect, treatment-by-period check, drift "
        "over execution order.",
        "",
    ]
    out += [line for c in configs for line in _order(c)] or ["Too few pairs for order diagnostics."]
    out.append("")
    return out


def _training_table(configs: list[PairedResult], lvl: str, names: str) -> list[str]:
    rows = []
    for c in configs:
        tt = c.training_time
        iv = tt.interval
        rows.append(
            [
                c.config,
                num(c.parameters / 1e6, ".2f") + "M" if c.parameters else "n/a",
                f"{num(tt.baseline_mean, '.3f')} / {num(tt.candidate_mean, '.3f')} s",
                num(interval_end(iv, "estimate"), ".2f") + "%",
                f"{num(interval_end(iv, 'low'), '.2f')}–{num(interval_end(iv, 'high'), '.2f')}%",
                f"{c.counts['faster']} / {c.counts['slower']}",
            ]
        )
    return md_table(
        ["Configuration", "Parameters", names, "Time reduction", f"{lvl} interval", "faster / slower pairs"],
        rows,
    )


def _completion_table(configs: list[PairedResult], lvl: str) -> list[str]:
    rows = []
    for c in configs:
        t, tot = c.time_to_target, c.total_time
        rows.append(
            [
                c.config,
                f"{t.pairs} (unreached: baseline {t.unreached['baseline']}, "
                f"candidate {t.unreached['candidate']})",
                num(interval_end(t.interval, "estimate"), ".2f") + "%",
                f"{num(interval_end(t.interval, 'low'), '.2f')}–{num(interval_end(t.interval, 'high'), '.2f')}%",
                num(interval_end(tot.interval, "estimate"), ".2f") + "%",
            ]
        )
    return md_table(
        [
            "Configuration",
            "Pairs where both reached the target",
            "Time-to-target reduction",
            f"{lvl} interval",
            "Total-time reduction",
        ],
        rows,
    )


def _quality_table(configs: list[PairedResult], lvl: str, names: str, metric: str | None = None) -> list[str]:
    """The quality table: each configuration's test BPB, or a command study's final metric
    (``metric``: its name), as means and the difference's interval."""
    rows = []
    for c in configs:
        q = c.test_bpb if metric is None else c.final_metric
        if q is None:
            continue
        iv = q.interval
        rows.append(
            [
                c.config,
                f"{num(q.baseline_mean, '.4f')} / {num(q.candidate_mean, '.4f')}",
                num(interval_end(iv, "estimate"), "+.5f"),
                f"{num(interval_end(iv, 'low'), '+.5f')} to {num(interval_end(iv, 'high'), '+.5f')}",
            ]
        )
    return md_table(["Configuration", f"{names} {metric or 'BPB'}", "Difference", f"{lvl} interval"], rows)


def _order(c: PairedResult) -> list[str]:
    oe = c.order_effects
    out = []
    dev = c.by_device
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


def factorial_study_section(study: StudyResult, declared: Mapping[str, Any]) -> list[str]:
    """A factorial study's section: cell means, within-block effects, positions.

    Parameters
    ----------
    study : StudyResult
        A factorial study.
    declared : mapping
        The study as the protocol declares it (its factors and cells name the effects).

    Returns
    -------
    list of str
        The section's markdown lines.
    """
    factors, cells = design_of(declared)
    shape = "x".join("2" for _ in factors)
    title = "norms x optimizer" if "factors" not in declared else " x ".join(f for f, _ in factors)
    out = [f"## Study {study.name}: {shape} factorial ({title})", ""]
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
    for c in study.factorial_configs():
        lvl = level_pct(c.level)
        means = c.cell_mean_training_s
        out.append(
            f"{c.config}: {c.blocks_used} blocks; mean training time "
            + ", ".join(f"{cell} {num(means[cell], '.3f')} s" for cell in cells)
            + "."
        )
        out.append("")
        rows = []
        for name, label in labels.items():
            e = c.effects.get(name)
            if e:
                rows.append(
                    [
                        label,
                        f"{e['reduction_pct']:.2f}%",
                        f"{e['reduction_low_pct']:.2f}–{e['reduction_high_pct']:.2f}%",
                    ]
                )
        out += md_table(["Effect (within-block, log time)", "Time reduction", f"{lvl} interval"], rows)
        if c.positions:
            out += [
                "",
                "Position in the Williams square (log time relative to the block mean): "
                + "; ".join(
                    f"{q['position']}: {q['estimate']:+.4f} [{q['low']:+.4f}, {q['high']:+.4f}]"
                    for q in c.positions
                ),
            ]
        out.append("")
    return out

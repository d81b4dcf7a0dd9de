"""The report: ``summary.json`` (every number shown), ``report.md`` (the study's tables), PNG plots,
the study page ``index.html`` (:mod:`analysis.page`), and the per-run table as CSV or Parquet for
users' own analysis.

``python -m analysis report records/<id>`` or ``harness report PROTOCOL``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.decisions import HypothesisDecision
from analysis.factorial import design_of, effect_names
from analysis.page import write_page
from analysis.plots import plots
from analysis.results import Descriptive, Hypotheses, PairedResult, StudyResult, Summary
from analysis.stats import PairedInterval
from analysis.summary import derive, load_records
from harness.files import atomic_write
from harness.records import load_started, seal, write_json

MIB = 1024 * 1024


def _f(x: float | None, fmt: str) -> str:
    """``x`` in ``fmt`` (a trailing ``%`` is printed after the number), ``n/a`` for ``None``."""
    return "n/a" if x is None else format(x, fmt.rstrip("%")) + "%" * fmt.endswith("%")


def _at(iv: PairedInterval | None, end: str) -> float | None:
    """An interval's ``estimate``, ``low`` or ``high``; ``None`` without an interval."""
    return None if iv is None else float(getattr(iv, end))


def _pct(level: float) -> str:
    return f"{level * 100:g}%"


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def markdown(summary: Summary) -> str:
    """``report.md``: the completeness line, the records, the decisions, the flow of planned runs, each
    study's tables and every run attempt."""
    out = _header(summary)
    out += _decisions(summary.hypotheses) + _flow(summary.flow)
    for study in summary.studies:
        if not study.configs:
            continue
        out += (
            _paired_study(study)
            if study.design == "paired"
            else _factorial_study(
                study, next(st for st in summary.protocol["studies"] if st["name"] == study.name)
            )
        )
    out += [
        "## Every run attempt",
        "",
        f"{len(summary.runs)} attempts, failures and interruptions included.",
        "",
    ]
    rows = [
        [
            r["run_id"],
            str(r["attempt"]),
            r["status"],
            r["arm"],
            str(r["seed"]),
            _f(r["training_s"], ".3f"),
            _f(r["test_bpb"], ".4f"),
            (r["reason"] or "")[:80],
        ]
        for r in summary.runs
    ]
    out += _md_table(["Run", "Attempt", "Status", "Arm", "Seed", "Training (s)", "Test BPB", "Reason"], rows)
    return "\n".join(out).rstrip() + "\n"


def _header(summary: Summary) -> list[str]:
    """Completeness, the protocol and its tag, the records (superseded, unfinished) and the exclusions."""
    p = summary.protocol
    rec = summary.records
    done = summary.completeness
    out = [f"**{done.text}.**", "", f"# Protocol {p['id']} (version {p['version']})", ""]
    out.append(
        f"Protocol sha256 `{p['sha256']}`"
        + (f", tag `{p['tag']}`" if p.get("tag") else ", not preregistered")
        + "."
    )
    out.append(
        f"Records: {rec.files} run attempts ({rec.ok} ok, {rec.failed} failed, "
        f"{rec.interrupted} interrupted); {rec.device_seconds:.1f} device seconds in all."
    )
    if rec.superseded:
        out.append(
            f"Superseded: {rec.superseded} attempts of units that ran again whole (kept, not analysed; "
            "each unit is analysed from its latest unit attempt)."
        )
    for u in rec.unfinished:
        out.append(
            f"Interrupted, no record yet: {u['run_id']} attempt {u['attempt']} started at {u['started_at']} "
            f"on {u['node']} (ledger seq {u['seq']})."
        )
    if summary.exclusions:
        out.append(
            "Excluded units: " + "; ".join(f"{e['unit']} ({e['reason']})" for e in summary.exclusions) + "."
        )
    out.append("")
    return out


def _paired_study(study: StudyResult) -> list[str]:
    """A paired study: training time, time to target and total time, quality, memory, every pair, order."""
    configs = study.paired_configs()
    first = configs[0]
    lvl = _pct(first.level)
    out = [f"## Study {study.name}: {first.candidate_arm} versus {first.baseline_arm}", ""]
    out.append(
        f"Fixed-budget training time. Intervals are two-sided {lvl} paired Student-t intervals; "
        "positive reduction means the candidate was faster."
    )
    out.append("")
    names = f"{first.baseline_arm.capitalize()} / {first.candidate_arm.capitalize()}"
    out += _training_table(configs, lvl, names)
    out += ["", "Time to the fixed validation target and total completion time.", ""]
    out += _completion_table(configs, lvl)
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
                    _f(_at(m.interval, "estimate"), ".2f") + "%",
                ]
            )
    out += _md_table(["Configuration", f"{names} peak", "Reduction"], rows)
    out += ["", "Every pair, including adverse ones.", ""]
    rows = []
    for c in configs:
        for pr in c.pairs:
            rows.append(
                [
                    c.config,
                    str(pr["seed"]),
                    pr["first"],
                    _f(pr["baseline_training_s"], ".3f"),
                    _f(pr["candidate_training_s"], ".3f"),
                    _f(pr["time_reduction_pct"], ".2f%"),
                    _f(pr["test_bpb_difference"], "+.5f"),
                ]
            )
    out += _md_table(
        [
            "Configuration",
            "Seed",
            "First",
            f"{first.baseline_arm.capitalize()} (s)",
            f"{first.candidate_arm.capitalize()} (s)",
            "Time reduction",
            "Test Δ BPB",
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
                _f((c.parameters or 0) / 1e6, ".2f") + "M",
                f"{_f(tt.baseline_mean, '.3f')} / {_f(tt.candidate_mean, '.3f')} s",
                _f(_at(iv, "estimate"), ".2f") + "%",
                f"{_f(_at(iv, 'low'), '.2f')}–{_f(_at(iv, 'high'), '.2f')}%",
                f"{c.counts['faster']} / {c.counts['slower']}",
            ]
        )
    return _md_table(
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
                _f(_at(t.interval, "estimate"), ".2f") + "%",
                f"{_f(_at(t.interval, 'low'), '.2f')}–{_f(_at(t.interval, 'high'), '.2f')}%",
                _f(_at(tot.interval, "estimate"), ".2f") + "%",
            ]
        )
    return _md_table(
        [
            "Configuration",
            "Pairs where both reached the target",
            "Time-to-target reduction",
            f"{lvl} interval",
            "Total-time reduction",
        ],
        rows,
    )


def _quality_table(configs: list[PairedResult], lvl: str, names: str) -> list[str]:
    rows = []
    for c in configs:
        q = c.test_bpb
        iv = q.interval
        rows.append(
            [
                c.config,
                f"{_f(q.baseline_mean, '.4f')} / {_f(q.candidate_mean, '.4f')}",
                _f(_at(iv, "estimate"), "+.5f"),
                f"{_f(_at(iv, 'low'), '+.5f')} to {_f(_at(iv, 'high'), '+.5f')}",
            ]
        )
    return _md_table(["Configuration", f"{names} BPB", "Difference", f"{lvl} interval"], rows)


def _factorial_study(study: StudyResult, declared: Mapping[str, Any]) -> list[str]:
    """A factorial study's section: cell means, within-block effects, positions."""
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
        lvl = _pct(c.level)
        means = c.cell_mean_training_s
        out.append(
            f"{c.config}: {c.blocks_used} blocks; mean training time "
            + ", ".join(f"{cell} {_f(means[cell], '.3f')} s" for cell in cells)
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
        out += _md_table(["Effect (within-block, log time)", "Time reduction", f"{lvl} interval"], rows)
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


def _decisions(hyp: Hypotheses | Descriptive) -> list[str]:
    if isinstance(hyp, Descriptive):
        return ["## Decisions", "", f"Descriptive protocol: no hypothesis is decided. {hyp.descriptive}", ""]
    out = [
        "## Decisions",
        "",
        f"{len(hyp.decisions)} preregistered hypotheses, {hyp.procedure.replace('_', ' ')} procedure at a "
        f"one-sided family-wise error rate of {hyp.family_alpha:g}; a decision needs at least "
        f"{hyp.min_pairs} pairs.",
        "",
    ]
    rows = []
    for x in hyp.decisions:
        d, sens = x.decision, x.sensitivity
        t = d.test or {}
        iv = (
            f"{d.low:+.4g} to {d.high:+.4g} ({100 * (d.level or 0):.4g}%)"
            if d.low is not None and d.high is not None
            else "n/a"
        )
        rows.append(
            [
                d.id,
                f"{d.study} / {d.config}",
                f"{d.endpoint} ({d.estimand})",
                d.type.replace("_", "-") + (f", margin {d.margin:g}" if d.margin else ""),
                str(t.get("n", "n/a")),
                _estimate(d),
                iv,
                _f(t.get("p_value"), ".3g"),
                _f(d.alpha, ".3g"),
                d.status + (f" ({d.reason})" if d.reason else ""),
                f"p = {sens['p_value']:.3g} ({sens['pairs_with_a_failed_arm']} failed pairs)"
                if sens
                else "none",
            ]
        )
    out += _md_table(
        [
            "Hypothesis",
            "Study / configuration",
            "Endpoint",
            "Type",
            "n",
            "Estimate",
            "Interval",
            "p",
            "alpha",
            "Decision",
            "Failed arm as adverse",
        ],
        rows,
    )
    return out + [""]


def _estimate(d: HypothesisDecision) -> str:
    """The decision's estimate in its estimand's units; a worst-rank one says what it is."""
    if d.estimate_of and d.estimate_of != d.estimand:
        return f"{_f(d.estimate, '+.4g')} ({d.estimate_of})"
    return _f(d.estimate, "+.4g")


def _flow(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    out = [
        "## Flow of planned runs",
        "",
        "Per arm: planned, started, ok, failed, interrupted attempts, superseded attempts (of a unit that "
        "ran again whole), missing (no ok record), analysed (in a complete pair or block) and excluded (ok, "
        "but its partner was not).",
        "",
    ]
    table = [
        [
            r["study"],
            r["config"],
            f"{r['role']} ({r['arm']})",
            *(
                str(r.get(k, 0))
                for k in (
                    "planned",
                    "started",
                    "ok",
                    "failed",
                    "interrupted_attempts",
                    "superseded_attempts",
                    "missing",
                    "analysed",
                    "excluded",
                )
            ),
        ]
        for r in rows
    ]
    out += _md_table(
        [
            "Study",
            "Configuration",
            "Arm",
            "Planned",
            "Started",
            "OK",
            "Failed",
            "Interrupted",
            "Superseded",
            "Missing",
            "Analysed",
            "Excluded",
        ],
        table,
    )
    return out + [""]


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


@dataclass
class ReportOutput:
    summary_path: Path
    report_path: Path
    export_path: Path | None
    plots: list[Path]
    markdown: str
    page_path: Path | None = None


def write_report(
    records_dir: Path, export: str | None = None, records_rel: str | None = None
) -> ReportOutput:
    """Derive the summary from ``records_dir`` and write summary.json, report.md, plots, the study page
    and the export; ``records_rel`` is how the page's audit command names the folder."""
    records_dir = Path(records_dir)
    records = load_records(records_dir)
    if not records:
        raise FileNotFoundError(f"no records in {records_dir}")
    summary = derive(records, load_started(records_dir))
    sealed = seal(summary.to_json())
    summary_path = records_dir / "summary.json"
    write_json(summary_path, sealed, pretty=True)
    md = markdown(summary)
    made = plots(summary, records, records_dir)
    if made:
        md += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in made) + "\n"
    report_path = records_dir / "report.md"
    atomic_write(report_path, md.encode("utf-8"), overwrite=True)
    page_path = write_page(summary, records_dir, records_rel=records_rel, summary_sha256=sealed["sha256"])
    export_path = None
    if export:
        import pandas as pd

        frame = pd.DataFrame(summary.runs)
        export_path = records_dir / f"runs.{export}"
        if export == "csv":
            frame.to_csv(export_path, index=False)
        else:
            frame.to_parquet(export_path, index=False)
    return ReportOutput(summary_path, report_path, export_path, made, md, page_path)

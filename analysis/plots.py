"""The report's PNG plots (matplotlib, imported when plotting): every decision's interval against its
margin (``plot_forest.png``), drift over plan order, every pair's time reduction and BPB difference,
and the validation curves of every pair."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prereg.calibrated import SIGN
from prereg.decisions import HypothesisDecision
from prereg.formats.record import RunRecord
from prereg.render.answer import commands_study
from prereg.results import Hypotheses, PairedResult, Summary

__all__ = ["plots"]


def plots(summary: Summary, records: list[RunRecord], directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # before any pyplot import (the helpers import it)

    made: list[Path] = []
    paired = [c for s in summary.studies for c in s.paired_configs() if c.pairs]
    study_of = {id(c): s.name for s in summary.studies for c in s.configs}
    made += _forest(summary, directory) + _drift(paired, study_of, directory)
    if not paired:
        return made
    margins = {
        (d.study, d.config): d.margin
        for d in _decisions(summary)
        if d.endpoint == "test_bpb" and d.type != "superiority"
    }
    for kind in ("time", "quality"):
        made.append(_pairs_plot(kind, paired, study_of, margins, directory))
    made.append(_validation_plot(paired, records, directory))
    return made


def _pairs_plot(
    kind: str,
    paired: list[PairedResult],
    study_of: dict[int, str],
    margins: dict[tuple[str, str], float],
    directory: Path,
) -> Path:
    """Every pair's time reduction (``kind`` "time") or test BPB difference ("quality"), one panel
    per paired configuration, with its interval and (quality) its margin: ``plot_<kind>.png``."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(paired), figsize=(3.2 * len(paired) + 1, 3.2), squeeze=False)
    for ax, c in zip(axes[0], paired):
        key = "time_reduction_pct" if kind == "time" else "test_bpb_difference"
        vals = [v if (v := getattr(p, key)) is not None else float("nan") for p in c.pairs]
        ax.scatter(range(len(vals)), vals, s=12)
        iv = (c.training_time if kind == "time" else c.test_bpb).interval
        if iv:
            ax.axhspan(iv.low, iv.high, alpha=0.25, label=f"{iv.level * 100:g}% interval")
            ax.axhline(iv.estimate, lw=1)
        tol = margins.get((study_of[id(c)], c.config))
        if kind == "quality" and tol is not None:
            ax.axhline(tol, color="red", ls="--", lw=1, label=f"margin {tol:g}")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title(c.config, fontsize=9)
        ax.set_xlabel("pair")
    axes[0][0].set_ylabel("time reduction (%)" if kind == "time" else "test Δ BPB (cand − base)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = directory / f"plot_{kind}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _validation_plot(paired: list[PairedResult], records: list[RunRecord], directory: Path) -> Path:
    """Every pair's validation curves, baseline and candidate, one panel per paired
    configuration: ``plot_validation.png``."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(paired), figsize=(3.2 * len(paired) + 1, 3.2), squeeze=False)
    by_unit: dict[str, dict[str, RunRecord]] = {}
    for r in records:
        if r.status == "ok":
            by_unit.setdefault(r.spec.unit, {})[r.spec.role] = r
    for ax, c in zip(axes[0], paired):
        for pr in c.pairs:
            for role, color in (("baseline", "tab:blue"), ("candidate", "tab:orange")):
                rec = by_unit.get(pr.unit, {}).get(role)
                if rec and rec.val_curve:
                    xs = [v[2] for v in rec.val_curve]
                    ys = [v[1] for v in rec.val_curve]
                    ax.plot(xs, ys, color=color, lw=0.7, alpha=0.6)
        ax.set_title(c.config, fontsize=9)
        ax.set_xlabel("training clock (s)")
    axes[0][0].set_ylabel("validation-subset BPB")
    axes[0][0].plot([], [], color="tab:blue", label="baseline")
    axes[0][0].plot([], [], color="tab:orange", label="candidate")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = directory / "plot_validation.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _decisions(summary: Summary) -> list[HypothesisDecision]:
    """The summary's decisions (none for a descriptive protocol)."""
    hyp = summary.hypotheses
    return [x.decision for x in hyp.decisions] if isinstance(hyp, Hypotheses) else []


def _forest_rows(summary: Summary, pts: bool) -> list[tuple[str, Any, Any, Any, Any, str]]:
    """The forest's rows (label, estimate, low, high, margin, status): each decision, then each paired
    configuration's descriptive log ratio; with ``pts`` (a study of command arms) each log ratio in
    points."""
    rows: list[tuple[str, Any, Any, Any, Any, str]] = []  # label, estimate, low, high, margin, status
    for d in _decisions(summary):
        if d.low is not None:
            margin = d.margin if d.type != "superiority" else 0.0
            k = 100.0 if pts and d.estimand == "log_ratio" else 1.0
            e, lo, hi, m = (
                v if v is None or k == 1.0 else k * v for v in (d.estimate, d.low, d.high, margin)
            )
            rows.append((f"{d.id} {d.study}/{d.config} {d.endpoint}", e, lo, hi, m, d.status))
    for st in summary.studies:
        for c in st.paired_configs():
            iv = c.training_time.log_ratio
            if iv:
                label = f"{st.name}/{c.config} {'points' if pts else 'ln(time ratio)'}, descriptive"
                ends = (
                    (100 * iv.estimate, 100 * iv.low, 100 * iv.high)
                    if pts
                    else (iv.estimate, iv.low, iv.high)
                )
                rows.append((label, *ends, None, "descriptive"))
    return rows


def _forest(summary: Summary, directory: Path) -> list[Path]:
    """Every hypothesis' estimate and interval against its margin, plus every paired study's
    descriptive log-time interval (the A/A null among them), in one figure; in a study of command
    arms (what ``harness compare`` writes) each log ratio in points, the answer's convention."""
    import matplotlib.pyplot as plt

    pts = commands_study(summary)
    rows = _forest_rows(summary, pts)
    if not rows:
        return []
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    colors = {
        "established": "tab:green",
        "not established": "tab:red",
        "not reached": "tab:gray",
        "descriptive": "tab:blue",
    }
    for i, (_label, est, lo, hi, margin, status) in enumerate(rows):
        y = len(rows) - i
        ax.plot([lo, hi], [y, y], color=colors.get(status, "black"), lw=2)
        ax.plot([est], [y], "o", color=colors.get(status, "black"))
        if margin:
            ax.plot([margin, margin], [y - 0.3, y + 0.3], color="red", lw=1)
            ax.plot([-margin, -margin], [y - 0.3, y + 0.3], color="red", lw=1, ls=":")
    ax.axvline(0, color="black", lw=0.5)
    ax.set_yticks(range(len(rows), 0, -1))
    ax.set_yticklabels([r[0] for r in rows], fontsize=7)
    ax.set_xlabel(
        f"estimate with its interval: times in {SIGN}; other endpoints in their units; red ticks: margins"
        if pts
        else "estimate (estimand units) with its interval; red ticks: margins"
    )
    fig.tight_layout()
    path = directory / "plot_forest.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the figure grows to its longest label: none clipped
    plt.close(fig)
    return [path]


def _drift(paired: list[PairedResult], study_of: dict[int, str], directory: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    with_drift = [c for c in paired if c.order_effects["drift"]]
    if not with_drift:
        return []
    fig, axes = plt.subplots(1, len(with_drift), figsize=(3.2 * len(with_drift) + 1, 3.2), squeeze=False)
    for ax, c in zip(axes[0], with_drift):
        d = c.order_effects["drift"]
        xs = [p[0] for p in d["points"]]
        ax.scatter(xs, [p[1] for p in d["points"]], s=12)
        ax.plot([min(xs), max(xs)], [d["intercept"] + d["slope"] * x for x in (min(xs), max(xs))], lw=1)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title(f"{study_of[id(c)]}/{c.config}", fontsize=9)
        ax.set_xlabel("plan position")
    axes[0][0].set_ylabel("ln(candidate / baseline time)")
    fig.tight_layout()
    path = directory / "plot_drift.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]

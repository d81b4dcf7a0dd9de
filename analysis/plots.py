"""The report's PNG plots (matplotlib, imported when plotting): every decision's interval against its
margin (``plot_forest.png``), drift over plan order, every pair's time reduction and BPB difference,
and the validation curves of every pair."""

from __future__ import annotations

import math
from pathlib import Path

from prereg.calibrated import SIGN
from prereg.decisions import HypothesisDecision
from prereg.formats.record import RunRecord
from prereg.render.answer import points_throughout
from prereg.render.result import reduction_points
from prereg.render.studies import pair_value
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
        made.append(
            _pairs_plot(kind, paired, study_of, margins, directory, points_throughout(summary.protocol))
        )
    made.append(_validation_plot(paired, records, directory))
    return made


def _pairs_plot(
    kind: str,
    paired: list[PairedResult],
    study_of: dict[int, str],
    margins: dict[tuple[str, str], float],
    directory: Path,
    pts: bool = False,
) -> Path:
    """Every pair's time reduction (``kind`` "time"; with ``pts``,
    :func:`prereg.render.answer.points_throughout`, its change in points with the log ratio's interval)
    or test BPB difference ("quality"), one panel per paired configuration, with its interval and
    (quality) its margin: ``plot_<kind>.png``."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(paired), figsize=(3.2 * len(paired) + 1, 3.2), squeeze=False)
    for ax, c in zip(axes[0], paired):
        vals, iv = _pair_values(kind, c, pts)
        ax.scatter(range(len(vals)), vals, s=12)
        if iv:
            ax.axhspan(iv[1], iv[2], alpha=0.25, label=f"{iv[3] * 100:g}% interval")
            ax.axhline(iv[0], lw=1)
        tol = margins.get((study_of[id(c)], c.config))
        if kind == "quality" and tol is not None:
            ax.axhline(tol, color="red", ls="--", lw=1, label=f"margin {tol:g}")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title(c.config, fontsize=9)
        ax.set_xlabel("pair")
    time = "time change, points (positive: slower)" if pts else "time reduction (%)"
    axes[0][0].set_ylabel(time if kind == "time" else "test Δ BPB (cand − base)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = directory / f"plot_{kind}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pair_values(
    kind: str, c: PairedResult, pts: bool
) -> tuple[list[float], tuple[float, float, float, float] | None]:
    """A configuration's per-pair values and the interval drawn behind them (estimate, low, high,
    level): time reductions in percent, or with ``pts`` changes in points
    (:func:`prereg.render.studies.pair_value`, with the log ratio's interval times 100); test BPB
    differences."""
    nan = float("nan")
    if kind == "time" and pts:
        vals = [nan if (v := pair_value(p, True)) is None else v for p in c.pairs]
        lr = c.training_time.log_ratio
        return vals, None if lr is None else (100 * lr.estimate, 100 * lr.low, 100 * lr.high, lr.level)
    key = "time_reduction_pct" if kind == "time" else "test_bpb_difference"
    vals = [v if (v := getattr(p, key)) is not None else nan for p in c.pairs]
    iv = (c.training_time if kind == "time" else c.test_bpb).interval
    return vals, None if iv is None else (iv.estimate, iv.low, iv.high, iv.level)


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


def _nan_if_none(v: float | None) -> float:
    """A value to draw: NaN (not drawn) for none."""
    return math.nan if v is None else v


#: A forest row: label, estimate, low, high, margin (``None``: none drawn) and status.
ForestRow = tuple[str, float | None, float | None, float | None, float | None, str]


def _forest_rows(summary: Summary, pts: bool) -> list[ForestRow]:
    """The forest's rows (label, estimate, low, high, margin, status): each decision, then each paired
    configuration's descriptive log ratio; with ``pts`` (:func:`prereg.render.answer.points_throughout`)
    each log ratio and each relative reduction in points (:func:`_decision_ends`)."""
    rows: list[ForestRow] = []
    for d in _decisions(summary):
        if d.low is not None:
            label = f"{d.id} {d.study}/{d.config} {d.endpoint}"
            rows.append((label, *_decision_ends(d, pts), d.status))
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


def _decision_ends(
    d: HypothesisDecision, pts: bool
) -> tuple[float | None, float | None, float | None, float | None]:
    """A decision's estimate, low, high and margin as the forest draws them: in the estimand's units,
    or with ``pts`` a log ratio times 100 and a relative reduction ``r`` as ``100 ln(1 - r / 100)``
    (its interval's ends swapped; its margin as the size of the points it bounds)."""
    margin = d.margin if d.type != "superiority" else 0.0
    if pts and d.estimand == "log_ratio":
        e, lo, hi, m = (None if v is None else 100 * v for v in (d.estimate, d.low, d.high, margin))
        return e, lo, hi, m
    if pts and d.estimand == "relative_reduction":
        size = -(reduction_points(margin) or 0.0) if margin else margin  # the ticks stand at +m and -m
        return reduction_points(d.estimate), reduction_points(d.high), reduction_points(d.low), size
    return d.estimate, d.low, d.high, margin


def _forest(summary: Summary, directory: Path) -> list[Path]:
    """Every hypothesis' estimate and interval against its margin, plus every paired study's
    descriptive log-time interval (the A/A null among them), in one figure; each log ratio in points,
    the answer's convention, in every study but those published before
    (:func:`prereg.render.answer.points_throughout`)."""
    import matplotlib.pyplot as plt

    pts = points_throughout(summary.protocol)
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
        # an end without a value (None) is NaN to matplotlib: not drawn
        ax.plot([_nan_if_none(lo), _nan_if_none(hi)], [y, y], color=colors.get(status, "black"), lw=2)
        ax.plot([_nan_if_none(est)], [y], "o", color=colors.get(status, "black"))
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

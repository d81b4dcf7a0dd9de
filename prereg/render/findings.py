"""The sections of one sentence and one table from the summary's rows, in both texts: the planted
studies' bias (``summary.planted``: prereg/planted.py), the lockstep model's order cells and
carry-over (prereg/carryover.py), the stall rule's flagged pairs (prereg/interference.py) and the
replicates' random-effects mean (prereg/replicates.py); each none when its rows are."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prereg.calibrated import Calibration
from prereg.render.model import Section, Table, Text, cols, level_pct, num, para
from prereg.render.result import CLOCK_ENDPOINT, bias_line, block_steps
from prereg.replicates import by_machine
from prereg.results import Summary

PLANTED = "Planted reference effects: each design's bias"
PLANTED_HEAD = cols(
    "Study | Design | Plant | Clock | Pairs | True effect | Estimate (interval) | Bias (interval) | "
    "Covered | Coverage over replicate studies"
)
MODEL = "Lockstep order cells and carry-over"
CARRY = ("baseline", "candidate", "candidate_less_baseline")
MODEL_HEAD = cols(
    "Study | Configuration | Clock | Pairs | Effect, mean of the four cells | Built first | Steps first | "
    "Interaction"
) + [f"Carry-over: {k.replace('_', ' ')}" for k in CARRY]
STALL = "Interference: lockstep arms' wall against CPU time"
STALL_HEAD = cols(
    "Study | Configuration | Pairs judged | Flagged | "
    "Flagged pairs (stall fractions: baseline, candidate; difference of ln CPU share)"
)
REPLICATES = "Replicates: the effect across times and machines"
REPLICATES_HEAD = cols(
    "Study | Configuration | Clock | Each replicate: pairs, estimate (SE) | "
    "Precision-weighted mean (interval; descriptive, not the decision) | "
    "Between-replicate SD | I²"
)
TIMES_HEAD = cols(
    "Replicate | First record (UTC) | Last record (UTC) | Machines | CPU (instruction set) | "
    "1-minute load as runs started | Since the previous one"
)


def _section(title: str, anchor: str, sentence: str, head: list[str], rows: list[list[str]]) -> Section:
    """A section of one sentence and one table captioned as titled (none without rows)."""
    blocks: list[Text | Table] = [para(sentence), Table(title, head, rows)]
    return Section(title, blocks, anchor=anchor) if rows else Section(None)


def _pts(x: float | None, *ends: float | None, scale: float = 1) -> str:
    """Points with a sign (``x`` times ``scale``); with ``ends``, the interval after them."""
    text = "n/a" if x is None else f"{scale * x:+.2f}"
    return text + (f" ({_pts(ends[0], scale=scale)} to {_pts(ends[1], scale=scale)})" if ends else "")


def planted_section(summary: Summary) -> Section:
    """Each design's bias against the effects planted in it, the planted studies' only section."""
    rows = summary.planted or []
    level = rows[0]["level"] if rows else 0.95
    sentence = (
        "A known cost planted in the candidate of an A/A pair, run through each design. Effects, "
        "estimates and biases in points of the log ratio (100 x ln(candidate / baseline) time; "
        "positive: the plant read as costing more; a point is about a percentage point here). A "
        "spin's true effect is arithmetic, pair by pair; a cache-heavy plant's is measured by the "
        "design with the longest blocks (its interval shown), the others' bias the Welch difference "
        f"from it. Intervals at {level_pct(level)}; Covered: the nominal interval holds the true effect."
    )
    return _section(PLANTED, "planted", sentence, PLANTED_HEAD, [_planted_row(r) for r in rows])


def _planted_row(r: Mapping[str, Any]) -> list[str]:
    first = [r["study"], r["design"], r["plant"], r["clock"], str(r["pairs"])]
    if r.get("bias") is None:
        return [*first, "n/a", "n/a", r.get("why", "n/a"), "", ""]
    truth = (
        _pts(r["truth"], r["truth_lo"], r["truth_hi"]) + ", measured"
        if "truth_lo" in r
        else _pts(r["truth"]) + ", arithmetic"
    )
    bias = "0 (the reference)" if r.get("reference") else _pts(r["bias"], r["bias_lo"], r["bias_hi"])
    cov_text = ""
    if cov := r.get("coverage"):
        cov_text = (
            f"{cov['covered']} of {cov['studies']} studies of {cov['pairs_each']} pairs "
            f"({100 * cov['rate']:.0f}%; 95% {100 * cov['lo']:.0f} to {100 * cov['hi']:.0f}%)"
        )
    covered = "" if r.get("reference") else ("yes" if r.get("covered") else "no")
    return [*first, truth, _pts(r["estimate"], r["estimate_lo"], r["estimate_hi"]), bias, covered, cov_text]


def model_section(summary: Summary) -> Section:
    """Each lockstep study's four order cells and carry-over, on both clocks (``order_cells`` and
    ``carry_over`` of its configurations), when its records hold what the model needs; planted
    studies too, since their order effects are those of the design they measure."""
    rows = []
    for study, r, clock in ((s, r, k) for s in summary.studies for r in s.configs for k in ("wall", "CPU")):
        m = (getattr(r, "order_cells", None) or {}).get(clock) or {}  # a paired result's (factorial: none)
        c = (getattr(r, "carry_over", None) or {}).get(clock) or {}
        fit = [m.get(k) for k in ("effect", "built_first", "steps_first", "interaction")]
        fit += [c.get(k) for k in CARRY]  # coefficients in points, each with its interval
        shown = [_pts(v["estimate"], v["lo"], v["hi"], scale=100) if v else "n/a" for v in fit]
        if m or c:
            rows.append([study.name, r.config, clock, str(m.get("pairs") or c.get("pairs") or ""), *shown])
    sentence = (
        "Per lockstep study, the per-pair log ratio fitted on the four order cells (which arm was built "
        "first, which stepped first; sum coding, +1 when the candidate is first): the effect with the "
        "order effects taken out and each coefficient, in points of the log ratio (100 x ln(candidate / "
        "baseline)); and the carry-over, an arm's mean log step time after its partner's block less "
        "after its own step (warm-up steps and the first step left out). Intervals at the study's level; "
        "prereg/carryover.py."
    )
    return _section(MODEL, "lockstep-model", sentence, MODEL_HEAD, rows)


def interference_section(summary: Summary) -> Section:
    """The stall rule's section: one row per lockstep study and configuration it judged, the pairs
    whose arms' CPU shares part each named."""
    rows, limit = [], None
    for study, r in ((s, r) for s in summary.studies for r in s.configs):
        if s := getattr(r, "interference", None):
            limit = s["limit"]
            fractions = ("baseline_stall_fraction", "candidate_stall_fraction", "log_share_difference")
            shown = [
                "{} ({}, {}; {})".format(f["unit"], *(num(f[k], ".3f") for k in fractions))
                for f in s["flagged"]
            ]
            flagged = [str(s["pairs_judged"]), str(len(s["flagged"])), "; ".join(shown) or "none"]
            rows.append([study.name, r.config, *flagged])
    sentence = (
        "Each arm's stall is its timed blocks' wall time less its own CPU time, where positive; its "
        "stall fraction, that over its training time; its CPU share, one less that. A pair whose two "
        f"arms' CPU shares differ by more than {limit or 0:g} on the log scale is flagged: one arm was kept "
        "off the processor while timed (stopped, starved) more than the machine's other work explains. "
        "A flagged pair stays in the analysis as preregistered; prereg/interference.py."
    )
    return _section(STALL, "interference", sentence, STALL_HEAD, rows if limit is not None else [])


def _replicate_row(r: Mapping[str, Any]) -> list[str]:
    each = "; ".join(
        f"{x['replicate']}: {x['pairs']}, {x['estimate']:+.2f} ({x['se']:.2f})" for x in r["replicates"]
    )
    if "mean" not in r:
        return [r["study"], r["config"], r["clock"], each, r.get("why", "n/a"), "", ""]
    mean = _pts(r["mean"], r["lo"], r["hi"])
    return [r["study"], r["config"], r["clock"], each, mean, f"{r['tau']:.2f}", f"{100 * r['i2']:.0f}%"]


def _times(rows: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """When and where each replicate ran (the same for every row: one run of the runner each)."""
    seen: dict[int, Mapping[str, Any]] = {}
    for x in (x for r in rows for x in r["replicates"] if "from" in x):
        seen.setdefault(x["replicate"], x)
    return [
        [str(k), x["from"], x["to"], ", ".join(x["hosts"]), "; ".join(x.get("cpus") or ["n/a"])]
        + [f"{x['load'][0]:.1f}-{x['load'][1]:.1f}" if "load" in x else "n/a"]
        + ["" if x["gap_s"] is None else f"{x['gap_s'] / 3600:.2f} h"]
        for k, x in sorted(seen.items())
    ]


def replicates_section(summary: Summary, cal: Calibration | None = None) -> Section:
    """Each replicate's estimate and their random-effects mean with the between-replicate spread, and
    when and where each ran (none when the protocol declares no replicates); with the study's
    calibration ``cal``, the design's calibrated bias under the table, per study and clock."""
    rows = summary.replicates or []
    level = next((r["level"] for r in rows if "level" in r), None)
    at = f" at {level_pct(level)}" if level is not None else ""
    sentence = (
        "Each replicate is a separate run of the runner, at another time or on another machine. "
        "Estimates in points of the log ratio (100 x ln(candidate / baseline) training time; positive: "
        "the candidate takes longer), each replicate's the mean of its pairs with its standard error. "
        "The effect, its interval and the decision are the equal-weight t over these estimates (the "
        "study's time tables and the decisions). Shown beside it, descriptive only: the "
        "precision-weighted mean, DerSimonian-Laird's random-effects mean with the "
        f"Hartung-Knapp-Sidik-Jonkman interval{at} (t with replicates - 1 degrees of freedom), whose "
        "weights are estimated from each replicate's few pairs (not a test at this size: "
        "docs/decisions.md); the between-replicate SD is the effect's variation (tau), I² its share of "
        "the spread of the replicates' estimates."
    )
    out = _section(REPLICATES, "replicates", sentence, REPLICATES_HEAD, [_replicate_row(r) for r in rows])
    if cal is not None and rows:
        shown = dict.fromkeys((r["study"], r["clock"]) for r in rows if r["clock"] in CLOCK_ENDPOINT)
        out.blocks += [
            para(
                bias_line(
                    cal,
                    block_steps(summary, st),
                    CLOCK_ENDPOINT[clock],
                    f"the replicates of study {st}",
                    False,
                )
            )
            for st, clock in shown
        ]
    if times := _times(rows):
        out.blocks.append(Table("When and where each replicate ran", TIMES_HEAD, times))
        out.blocks.append(para(machines_sentence(rows)))
    return out


def machines_sentence(rows: Sequence[Mapping[str, Any]]) -> str:
    """The spread by machine: on one CPU model, that it is not measured; on several, each model's
    mean estimate per study, configuration and clock (:func:`prereg.replicates.by_machine`)."""
    models = sorted({m for r in rows for m in by_machine(r["replicates"])})
    if len(models) <= 1:
        n = max((len(r["replicates"]) for r in rows), default=0)
        return (
            f"Spread by machine: all {n} replicates ran on one CPU model ({models[0] if models else 'n/a'}), "
            "so the spread between machines is not measured here: the between-replicate SD above is "
            "the spread between times on one machine."
        )
    parts = []
    for r in rows:
        each = "; ".join(
            f"{m}: {len(ys)} replicate(s), mean {_pts(sum(ys) / len(ys))}"
            for m, ys in sorted(by_machine(r["replicates"]).items())
        )
        parts.append(f"{r['study']} / {r['config']} ({r['clock']}): {each}")
    return (
        "Spread by machine (points, each CPU model's mean of its replicates' estimates): "
        + " | ".join(parts)
        + "."
    )

"""``report.md``'s sections on the protocol as a whole: the header (completeness, the protocol and
its tag, the records, exclusions), the preregistered decisions, the flow of planned runs and every
run attempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prereg.attempts import FLOW_COUNTS
from prereg.decisions import HypothesisDecision
from prereg.plan import defaults_text
from prereg.render.report_md import md_table, num
from prereg.results import Descriptive, Hypotheses, Summary

__all__ = ["decisions_section", "flow_section", "header_section", "look_rows", "runs_section", "LOOK_HEAD"]


def header_section(summary: Summary) -> list[str]:
    """Completeness, the protocol and its tag, the records (superseded, unfinished) and the exclusions.

    Parameters
    ----------
    summary : Summary
        The study's summary.

    Returns
    -------
    list of str
        The section's markdown lines.
    """
    p = summary.protocol
    rec = summary.records
    done = summary.completeness
    out = [f"**{done.text}.**", "", f"# Protocol {p['id']} (version {p['version']})", ""]
    out.append(
        f"Protocol sha256 `{p['sha256']}`"
        + (f", tag `{p['tag']}`" if p.get("tag") else ", not preregistered")
        + "."
        + (
            f" Defaults for the keys it leaves out: {defaults_text(p['defaults'])}."
            if p.get("defaults")
            else ""
        )
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


def decisions_section(hyp: Hypotheses | Descriptive) -> list[str]:
    """The preregistered decisions: the procedure, and one row per hypothesis with its test, decision
    and failed-arm sensitivity analysis (or a descriptive protocol's statement).

    Parameters
    ----------
    hyp : Hypotheses or Descriptive
        The summary's hypotheses.

    Returns
    -------
    list of str
        The section's markdown lines.
    """
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
                num(t.get("p_value"), ".3g"),
                num(d.alpha, ".3g"),
                d.status + (f" ({d.reason})" if d.reason else ""),
                f"p = {sens['p_value']:.3g} ({sens['pairs_with_a_failed_arm']} failed pairs)"
                if sens
                else "none",
            ]
        )
    out += md_table(
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
    if hyp.sequential is not None:
        out += ["", "### Sequential looks", "", sequential_text(hyp.sequential), ""]
        out += md_table(LOOK_HEAD, look_rows(hyp.sequential))
        out += ["", *(f"* {x.decision.text}" for x in hyp.decisions)]
    return out + [""]


#: The columns of the looks' table (report and page).
LOOK_HEAD = [
    "Look",
    "Pairs",
    "Hypothesis",
    "Test",
    "n",
    "p (stage-wise)",
    "Level",
    "Nominal",
    "At this look",
    "Stop",
]


def sequential_text(seq: Mapping[str, Any]) -> str:
    """The design in one sentence: its looks, spending, futility bound and where it stopped."""
    fut = (
        f", non-binding futility below z = {seq['futility_z']:g}" if seq.get("futility_z") is not None else ""
    )
    stop = (
        f"; the rule stopped the study at look {seq['stopped_at']} ({seq['stop']})"
        if seq.get("stop") in ("efficacy", "futility")
        else "; it ran to its last look"
        if seq.get("stop") == "final"
        else "; the records stop before its next look"
    )
    return (
        f"Group-sequential design: looks at {', '.join(map(str, seq['looks_planned']))} pairs, "
        f"Lan-DeMets {seq['spending'].replace('_', '-')} alpha spending{fut}{stop}. Each look tests the "
        "pairs so far against its boundary's nominal level (the decision's interval is the repeated "
        "confidence interval at that level)."
    )


def look_rows(seq: Mapping[str, Any]) -> list[list[str]]:
    """One row per look and hypothesis: its test on the pairs so far, the stage-wise p-value, the
    hypothesis' level share, its boundary's nominal level, what the look found, and the stop."""
    rows = []
    for lk in seq["looks"]:
        for h in lk["hypotheses"]:
            found = (
                f"established (crossed at look {h['crossed_at']})"
                if h["established"]
                else "below the futility bound"
                if h["futile"]
                else "not reached" + (f" ({h['why']})" if h["why"] else "")
                if h["p_value"] is None
                else "not yet"
            )
            rows.append(
                [
                    str(lk["look"]),
                    str(lk["pairs"]),
                    h["id"],
                    h["method"] or "n/a",
                    str(h["n"]) if h["n"] is not None else "n/a",
                    num(h["p_value"], ".3g"),
                    num(h["level"], ".3g"),
                    num(h["nominal"], ".3g"),
                    found,
                    lk["stop"] or "go on",
                ]
            )
    return rows


def _estimate(d: HypothesisDecision) -> str:
    """The decision's estimate in its estimand's units; a worst-rank one says what it is."""
    if d.estimate_of and d.estimate_of != d.estimand:
        return f"{num(d.estimate, '+.4g')} ({d.estimate_of})"
    return num(d.estimate, "+.4g")


def flow_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The flow of planned runs: per study, configuration and arm, planned to analysed and excluded.

    Parameters
    ----------
    rows : sequence of mapping
        The summary's ``flow`` rows (:func:`prereg.attempts.flow`).

    Returns
    -------
    list of str
        The section's markdown lines.
    """
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
            *(str(r.get(k, 0)) for k, _ in FLOW_COUNTS),
        ]
        for r in rows
    ]
    out += md_table(
        [
            "Study",
            "Configuration",
            "Arm",
            *(heading for _, heading in FLOW_COUNTS),
        ],
        table,
    )
    return out + [""]


def runs_section(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every run attempt, failures and interruptions included, in plan order.

    Parameters
    ----------
    runs : sequence of mapping
        The summary's ``runs`` rows (:func:`prereg.attempts.run_rows`).

    Returns
    -------
    list of str
        The section's markdown lines.
    """
    out = [
        "## Every run attempt",
        "",
        f"{len(runs)} attempts, failures and interruptions included.",
        "",
    ]
    rows = [
        [
            r["run_id"],
            str(r["attempt"]),
            r["status"],
            r["arm"],
            str(r["seed"]),
            num(r["training_s"], ".3f"),
            num(r["test_bpb"], ".4f"),
            (r["reason"] or "").replace("|", "\\|").replace("\n", " "),  # whole, one table cell
        ]
        for r in runs
    ]
    return out + md_table(
        ["Run", "Attempt", "Status", "Arm", "Seed", "Training (s)", "Test BPB", "Reason"], rows
    )

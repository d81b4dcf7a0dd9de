"""The planted studies' section of report.md and the study page, from one table: each design's
bias against the effects planted in it (``summary.planted``: ``prereg/planted.py``).

Planted studies are listed here and only here: their A/A pairs measure the designs, not a change,
so the report's study sections, its answer figure and its decisions leave them out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prereg.render.page_html import esc, html_table
from prereg.render.report_md import md_table
from prereg.results import Summary

__all__ = ["planted_html", "planted_md", "planted_names"]

TITLE = "Planted reference effects: each design's bias"
HEADER = [
    "Study",
    "Design",
    "Plant",
    "Clock",
    "Pairs",
    "True effect",
    "Estimate (interval)",
    "Bias (interval)",
    "Covered",
    "Coverage over replicate studies",
]


def planted_names(summary: Summary) -> set[str]:
    """The planted studies' names (the protocol's studies with ``planted``)."""
    return {s["name"] for s in summary.protocol["studies"] if s.get("planted")}


def _pts(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}"


def _row(r: Mapping[str, Any]) -> list[str]:
    if r.get("bias") is None:
        return [
            r["study"],
            r["design"],
            r["plant"],
            r["clock"],
            str(r["pairs"]),
            "n/a",
            "n/a",
            r.get("why", "n/a"),
            "",
            "",
        ]
    truth = _pts(r["truth"])
    if "truth_lo" in r:
        truth += f" ({_pts(r['truth_lo'])} to {_pts(r['truth_hi'])}), measured"
    else:
        truth += ", arithmetic"
    est = f"{_pts(r['estimate'])} ({_pts(r['estimate_lo'])} to {_pts(r['estimate_hi'])})"
    bias = (
        "0 (the reference)"
        if r.get("reference")
        else f"{_pts(r['bias'])} ({_pts(r['bias_lo'])} to {_pts(r['bias_hi'])})"
    )
    cov = r.get("coverage")
    cov_text = (
        f"{cov['covered']} of {cov['studies']} studies of {cov['pairs_each']} pairs "
        f"({100 * cov['rate']:.0f}%; 95% {100 * cov['lo']:.0f} to {100 * cov['hi']:.0f}%)"
        if cov
        else ""
    )
    covered = "" if r.get("reference") else ("yes" if r.get("covered") else "no")
    return [
        r["study"],
        r["design"],
        r["plant"],
        r["clock"],
        str(r["pairs"]),
        truth,
        est,
        bias,
        covered,
        cov_text,
    ]


def _sentence(rows: Sequence[Mapping[str, Any]]) -> str:
    level = rows[0]["level"] if rows else 0.95
    return (
        "A known cost planted in the candidate of an A/A pair, run through each design. Effects, "
        "estimates and biases in points of the log ratio (100 x ln(candidate / baseline) time; "
        "positive: the plant read as costing more; a point is about a percentage point here). A "
        "spin's true effect is arithmetic, pair by pair; a cache-heavy plant's is measured by the "
        "design with the longest blocks (its interval shown), the others' bias the Welch difference "
        f"from it. Intervals at {100 * level:g}%; Covered: the nominal interval holds the true effect."
    )


def planted_md(summary: Summary) -> list[str]:
    """report.md's section (nothing when the protocol plants nothing)."""
    rows = summary.planted or []
    if not rows:
        return []
    return [f"## {TITLE}", "", _sentence(rows), "", *md_table(HEADER, [_row(r) for r in rows]), ""]


def planted_html(summary: Summary) -> list[str]:
    """The study page's section (nothing when the protocol plants nothing)."""
    rows = summary.planted or []
    if not rows:
        return []
    return [
        f"<h2 id=planted>{esc(TITLE)}</h2>",
        f"<p>{esc(_sentence(rows))}</p>",
        html_table(TITLE, HEADER, [_row(r) for r in rows]),
    ]

"""The replicates' section of report.md and the study page, from one table: each replicate's
estimate and their random-effects mean with the between-replicate spread (``summary.replicates``:
``prereg/replicates.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prereg.render.model import Section, Table, Text, para
from prereg.results import Summary

__all__ = ["replicates_section"]

TITLE = "Replicates: the effect across times and machines"
HEADER = [
    "Study",
    "Configuration",
    "Clock",
    "Each replicate: pairs, estimate (SE)",
    "Random-effects mean (interval)",
    "Between-replicate SD",
    "I²",
]


def _row(r: Mapping[str, Any]) -> list[str]:
    each = "; ".join(
        f"{x['replicate']}: {x['pairs']}, {x['estimate']:+.2f} ({x['se']:.2f})" for x in r["replicates"]
    )
    if "mean" not in r:
        return [r["study"], r["config"], r["clock"], each, r.get("why", "n/a"), "", ""]
    return [
        r["study"],
        r["config"],
        r["clock"],
        each,
        f"{r['mean']:+.2f} ({r['lo']:+.2f} to {r['hi']:+.2f})",
        f"{r['tau']:.2f}",
        f"{100 * r['i2']:.0f}%",
    ]


TIMES_HEADER = ["Replicate", "First record (UTC)", "Last record (UTC)", "Machines", "Since the previous one"]


def _times(rows: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """When and where each replicate ran (the same for every row: one run of the runner each)."""
    seen: dict[int, Mapping[str, Any]] = {}
    for r in rows:
        for x in r["replicates"]:
            if "from" in x:
                seen.setdefault(x["replicate"], x)
    return [
        [
            str(k),
            x["from"],
            x["to"],
            ", ".join(x["hosts"]),
            "" if x["gap_s"] is None else f"{x['gap_s'] / 3600:.2f} h",
        ]
        for k, x in sorted(seen.items())
    ]


def _sentence(rows: Sequence[Mapping[str, Any]]) -> str:
    level = next((r["level"] for r in rows if "level" in r), None)
    at = f" at {100 * level:g}%" if level is not None else ""
    return (
        "Each replicate is a separate run of the runner, at another time or on another machine. "
        "Estimates in points of the log ratio (100 x ln(candidate / baseline) training time; positive: "
        "the candidate takes longer), each replicate's the mean of its pairs with its standard error; "
        "the mean over replicates is DerSimonian-Laird's random-effects mean with the "
        f"Hartung-Knapp-Sidik-Jonkman interval{at} (t with replicates - 1 degrees of freedom), so the "
        "interval widens by as much as the effect varies between replicates; the between-replicate SD "
        "is that variation (tau), I² its share of the spread of the replicates' estimates."
    )


def replicates_section(summary: Summary) -> Section:
    """Both texts' section (none when the protocol declares no replicates)."""
    rows = summary.replicates or []
    if not rows:
        return Section(None)
    times = _times(rows)
    blocks: list[Text | Table] = [para(_sentence(rows)), Table(TITLE, HEADER, [_row(r) for r in rows])]
    if times:
        blocks.append(Table("When and where each replicate ran", TIMES_HEADER, times))
    return Section(TITLE, blocks, anchor="replicates")

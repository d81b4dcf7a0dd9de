"""The stall rule's section of report.md and the study page: the lockstep pairs whose arms' CPU
shares part (``interference``: :mod:`prereg.interference`), each named, for the studies whose records
hold each arm's stall (none written before the rule)."""

from __future__ import annotations

from typing import Any

from prereg.render.model import Section, Table, para
from prereg.results import Summary

__all__ = ["interference_section"]


STALL_TITLE = "Interference: lockstep arms' wall against CPU time"
STALL_HEADER = [
    "Study",
    "Configuration",
    "Pairs judged",
    "Flagged",
    "Flagged pairs (stall fractions: baseline, candidate; difference of ln CPU share)",
]


def _frac(v: Any) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def stall_rows(summary: Summary) -> tuple[list[list[str]], float | None]:
    """One row per lockstep study and configuration judged by the stall rule, and the rule's limit."""
    out = []
    limit = None
    for study in summary.studies:
        for r in study.configs:
            s = getattr(r, "interference", None)
            if not s:
                continue
            limit = s["limit"]
            named = "; ".join(
                f"{f['unit']} ({_frac(f['baseline_stall_fraction'])}, {_frac(f['candidate_stall_fraction'])}; "
                f"{_frac(f['log_share_difference'])})"
                for f in s["flagged"]
            )
            out.append(
                [study.name, r.config, str(s["pairs_judged"]), str(len(s["flagged"])), named or "none"]
            )
    return out, limit


def _stall_sentence(limit: float) -> str:
    return (
        "Each arm's stall is its timed blocks' wall time less its own CPU time, where positive; its "
        "stall fraction, that over its training time; its CPU share, one less that. A pair whose two "
        f"arms' CPU shares differ by more than {limit:g} on the log scale is flagged: one arm was kept "
        "off the processor while timed (stopped, starved) more than the machine's other work explains. "
        "A flagged pair stays in the analysis as preregistered; prereg/interference.py."
    )


def interference_section(summary: Summary) -> Section:
    """Both texts' section on the stall rule (none when no study was judged by it)."""
    rows, limit = stall_rows(summary)
    if not rows or limit is None:
        return Section(None)
    return Section(
        STALL_TITLE,
        [para(_stall_sentence(limit)), Table(STALL_TITLE, STALL_HEADER, rows)],
        anchor="interference",
    )

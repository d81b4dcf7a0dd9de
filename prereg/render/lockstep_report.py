"""The lockstep model's section of report.md and the study page, from one table: each lockstep
study's four order cells and carry-over, on both clocks (``order_cells`` and ``carry_over`` of its
configurations' results: ``prereg/carryover.py``).

A study appears when its records hold what the model needs (lockstep pairs whose runs kept their
step times); planted studies too, since their order effects are those of the design they measure.

Then the pairs the stall rule flags (``interference``: :mod:`prereg.interference`), each named, for
the studies whose records hold each arm's stall (none written before the rule)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prereg.render.page_html import esc, html_table
from prereg.render.report_md import md_table
from prereg.results import Summary

__all__ = ["interference_html", "interference_md", "model_html", "model_md"]

TITLE = "Lockstep order cells and carry-over"
HEADER = [
    "Study",
    "Configuration",
    "Clock",
    "Pairs",
    "Effect, mean of the four cells",
    "Built first",
    "Steps first",
    "Interaction",
    "Carry-over: baseline",
    "Carry-over: candidate",
    "Carry-over: candidate less baseline",
]


def _iv(v: Mapping[str, Any] | None) -> str:
    if not v:
        return "n/a"
    return f"{100 * v['estimate']:+.2f} ({100 * v['lo']:+.2f} to {100 * v['hi']:+.2f})"


def rows_of(summary: Summary) -> list[list[str]]:
    """One row per lockstep study, configuration and clock that has the order-cell model."""
    out = []
    for study in summary.studies:
        for r in study.configs:
            cells = getattr(r, "order_cells", None) or {}  # a paired result's (factorial results have none)
            carry = getattr(r, "carry_over", None) or {}
            for clock in ("wall", "CPU"):
                m = cells.get(clock)
                c = carry.get(clock) or {}
                if not m and not c:
                    continue
                out.append(
                    [
                        study.name,
                        r.config,
                        clock,
                        str((m or {}).get("pairs") or c.get("pairs") or ""),
                        _iv((m or {}).get("effect")),
                        _iv((m or {}).get("built_first")),
                        _iv((m or {}).get("steps_first")),
                        _iv((m or {}).get("interaction")),
                        _iv(c.get("baseline")),
                        _iv(c.get("candidate")),
                        _iv(c.get("candidate_less_baseline")),
                    ]
                )
    return out


SENTENCE = (
    "Per lockstep study, the per-pair log ratio fitted on the four order cells (which arm was built "
    "first, which stepped first; sum coding, +1 when the candidate is first): the effect with the "
    "order effects taken out and each coefficient, in points of the log ratio (100 x ln(candidate / "
    "baseline)); and the carry-over, an arm's mean log step time after its partner's block less "
    "after its own step (warm-up steps and the first step left out). Intervals at the study's level; "
    "prereg/carryover.py."
)


def model_md(summary: Summary) -> list[str]:
    """report.md's section (nothing when no study has the model)."""
    rows = rows_of(summary)
    if not rows:
        return []
    return [f"## {TITLE}", "", SENTENCE, "", *md_table(HEADER, rows), ""]


def model_html(summary: Summary) -> list[str]:
    """The study page's section (nothing when no study has the model)."""
    rows = rows_of(summary)
    if not rows:
        return []
    return [
        f"<h2 id=lockstep-model>{esc(TITLE)}</h2>",
        f"<p>{esc(SENTENCE)}</p>",
        html_table(TITLE, HEADER, rows),
    ]


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


def interference_md(summary: Summary) -> list[str]:
    """report.md's section on the stall rule (nothing when no study was judged by it)."""
    rows, limit = stall_rows(summary)
    if not rows or limit is None:
        return []
    return [f"## {STALL_TITLE}", "", _stall_sentence(limit), "", *md_table(STALL_HEADER, rows), ""]


def interference_html(summary: Summary) -> list[str]:
    """The study page's section on the stall rule (nothing when no study was judged by it)."""
    rows, limit = stall_rows(summary)
    if not rows or limit is None:
        return []
    return [
        f"<h2 id=interference>{esc(STALL_TITLE)}</h2>",
        f"<p>{esc(_stall_sentence(limit))}</p>",
        html_table(STALL_TITLE, STALL_HEADER, rows),
    ]

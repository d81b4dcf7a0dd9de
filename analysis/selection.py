"""Which records count: the record-selection rules of :mod:`analysis.summary`.

Each unit's latest unit attempt (:func:`current`), each run's latest attempt in it, the per-run table
(:func:`run_rows`, superseded attempts included), completeness against the plan and the budget rule
(:func:`completeness`), every planned run's path from planned to analysed (:func:`flow`), the pairs
with one failed arm (:func:`failed_pairs`, for the sensitivity analysis) and the attempts that
started and never ended (:func:`unfinished`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from analysis.audit.factorial import arms_by_cell, design_of
from analysis.public_audit import completeness_text, plan_units, stop_check
from analysis.results import Completeness, PairedResult, StudyResult
from harness.records import RunRecord, StartedEntry, budget_attempts

__all__ = [
    "completeness",
    "current",
    "failed_pairs",
    "flow",
    "latest_unit_attempts",
    "peak_memory",
    "run_rows",
    "unfinished",
]


#: The flow table's counts, in order: a flow row's key (:func:`flow`) and its column heading.
FLOW_COUNTS = (
    ("planned", "Planned"),
    ("started", "Started"),
    ("ok", "OK"),
    ("failed", "Failed"),
    ("interrupted_attempts", "Interrupted"),
    ("superseded_attempts", "Superseded"),
    ("missing", "Missing"),
    ("analysed", "Analysed"),
    ("excluded", "Excluded"),
)


def measured(x: float | None) -> float | None:
    """A record's measurement as the summary's tables hold it: ``None`` when absent or non-finite
    (a record reads a non-finite one, ``null`` in its file, as NaN)."""
    return x if x is not None and math.isfinite(x) else None


def peak_memory(rec: RunRecord) -> float | None:
    """The record's peak memory in bytes, by the key its ``memory`` names ``primary``.

    Parameters
    ----------
    rec : RunRecord
        One run attempt's record.

    Returns
    -------
    float or None
        The primary peak, or ``None`` when the record names none or it is missing.
    """
    mem = rec.memory or {}
    key = mem.get("primary")
    return float(mem[key]) if key and mem.get(key) is not None else None


def latest_unit_attempts(records: list[RunRecord]) -> dict[str, int]:
    """Each unit's latest unit attempt (``unit_attempt``; 1 for records that predate the field)."""
    out: dict[str, int] = {}
    for r in records:
        u = r.spec.unit
        out[u] = max(out.get(u, 1), r.unit_attempt)
    return out


def current(records: list[RunRecord]) -> list[RunRecord]:
    """The records of each unit's latest unit attempt: the ones the analysis may use."""
    latest = latest_unit_attempts(records)
    return [r for r in records if r.unit_attempt == latest[r.spec.unit]]


def run_rows(records: list[RunRecord]) -> list[dict[str, Any]]:
    """One row per run attempt, every status, in plan order; ``superseded`` when its unit ran again whole."""
    rows = []
    latest = latest_unit_attempts(records)
    for r in records:
        s, t = r.spec, r.timings or {}
        ua = r.unit_attempt
        rows.append(
            {
                "run_id": s.run_id,
                "attempt": r.attempt,
                "unit_attempt": ua,
                "superseded": ua < latest[s.unit],
                "status": r.status,
                "reason": r.reason,
                "study": s.study,
                "config": s.config,
                "arm": s.arm,
                "role": s.role,
                "seed": s.seed,
                "unit": s.unit,
                "position": s.position,
                "order": s.order,
                "training_s": t.get("training_s"),
                "time_to_target_s": t.get("time_to_target_s"),
                "total_s": t.get("total_s"),
                "device_s": t.get("device_s"),
                "val_bpb": measured(r.val_bpb),
                "test_bpb": measured(r.test_bpb),
                "peak_memory_bytes": peak_memory(r),
            }
        )
    rows.sort(key=lambda x: (x["order"], x["attempt"]))
    return rows


def completeness(records: list[RunRecord]) -> Completeness:
    """Planned runs against runs with an ``ok`` record, and whether the budget rule explains a stop.

    Planned runs per study: seeds x configurations x runs per unit (2 for a pair, one per cell for a
    block). Whether a stop is the budget's is the rule ``harness run`` applies before each unit, in
    its one home (:mod:`analysis.audit.budget`, through :mod:`analysis.public_audit`): the first
    unit in plan order with runs to do would take ``spent + k * m`` past the budget.
    """
    proto = records[0].protocol
    ok_ids = {r.spec.run_id for r in current(records) if r.status == "ok"}
    planned = 0
    for st in proto["studies"]:
        if "seeds" not in st:  # schema 1 records do not say
            return Completeness(
                planned_runs=None,
                ok_runs=len(ok_ids),
                missing_runs=None,
                complete=None,
                budget_stop=None,
                text="completeness unknown: these records do not list the planned seeds",
            )
        size = 2 if st["design"] == "paired" else len(design_of(st)[1])  # runs per unit
        planned += len(st["seeds"]) * len(st["configs"]) * size
    missing = planned - len(ok_ids)
    budget = proto.get("budget_device_seconds")
    stop = (
        stop_check(plan_units(proto["studies"]), budget_attempts(records), budget)
        if missing and budget is not None
        else None
    )
    return Completeness(
        planned_runs=planned,
        ok_runs=len(ok_ids),
        missing_runs=missing,
        complete=missing == 0,
        budget_stop=bool(stop is not None and stop.refuses),
        text=completeness_text(planned, missing, stop),
    )


def _final(records: list[RunRecord]) -> dict[str, RunRecord]:
    """Each run's latest attempt (failed, interrupted or ok)."""
    out: dict[str, RunRecord] = {}
    for r in records:
        rid = r.spec.run_id
        if rid not in out or r.attempt > out[rid].attempt:
            out[rid] = r
    return out


def flow(
    records: list[RunRecord], studies: list[StudyResult], protocol: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Every planned run per (study, configuration, arm): planned, started, ok, failed,
    interrupted (attempts), superseded (attempts of a unit that ran again whole), missing, analysed
    (in a used pair or block) and excluded; a run's state is its latest attempt in its unit's
    analysed unit attempt."""
    final = _final(current(records))
    cur = {id(r) for r in current(records)}
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for st in protocol["studies"]:
        roles = (
            (("baseline", st["arms"][0]), ("candidate", st["arms"][1]))
            if st["design"] == "paired"
            else tuple(arms_by_cell(st).items())
        )
        for config in st["configs"]:
            for role, arm in roles:
                rows[(st["name"], config, role)] = {
                    "study": st["name"],
                    "config": config,
                    "role": role,
                    "arm": arm,
                    "planned": len(st["seeds"]) if "seeds" in st else None,
                    "started": 0,
                    "ok": 0,
                    "failed": 0,
                    "interrupted_attempts": 0,
                    "superseded_attempts": 0,
                    "analysed": 0,
                }
    attempts: dict[str, list[str]] = {}
    for r in records:
        attempts.setdefault(r.spec.run_id, []).append(r.status)
        if id(r) not in cur:
            s = r.spec
            rows[(s.study, s.config, s.role)]["superseded_attempts"] += 1
    used = {
        x["unit"]
        for st in studies
        for c in st.configs
        for x in (c.pairs if isinstance(c, PairedResult) else c.blocks)
    }
    for r in final.values():
        s = r.spec
        row = rows[(s.study, s.config, s.role)]
        row["started"] += 1
        row["interrupted_attempts"] += attempts[s.run_id].count("interrupted")
        if r.status == "ok":
            row["ok"] += 1
        elif r.status == "failed":
            row["failed"] += 1
        row["analysed"] += int(s.unit in used and r.status == "ok")
    for row in rows.values():
        row["missing"] = None if row["planned"] is None else row["planned"] - row["ok"]
        row["excluded"] = row["ok"] - row["analysed"]
    return list(rows.values())


def failed_pairs(records: list[RunRecord]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Pairs whose final records are one ok and one failed arm (for the sensitivity analysis)."""
    by_unit: dict[str, dict[str, RunRecord]] = {}
    for r in _final(current(records)).values():
        if r.spec.design == "paired":
            by_unit.setdefault(r.spec.unit, {})[r.spec.role] = r
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for unit in sorted(by_unit):
        arms = by_unit[unit]
        st = sorted((role, r.status) for role, r in arms.items())
        if len(st) == 2 and sorted(x for _, x in st) == ["failed", "ok"]:
            spec = next(iter(arms.values())).spec
            out.setdefault((spec.study, spec.config), []).append(
                {"unit": unit, "failed": next(role for role, x in st if x == "failed")}
            )
    return out


def unfinished(records: list[RunRecord], started: list[StartedEntry]) -> list[dict[str, Any]]:
    """Started entries that no record ends: interrupted attempts, with their start time."""
    ended = {(r.spec.run_id, r.attempt) for r in records}
    return [
        {
            "run_id": e["run_id"],
            "attempt": e["attempt"],
            "unit_attempt": e.get("unit_attempt", 1),
            "started_at": e["started_at"],
            "node": e["node"],
            "seq": e["ledger"]["seq"],
        }
        for e in sorted(started, key=lambda e: e["ledger"]["seq"])
        if (e["run_id"], e["attempt"]) not in ended
    ]

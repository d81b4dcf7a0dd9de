"""Which records count, with the standard library alone: the one home of the record-selection rules,
which the summary (``prereg.formats.summary.derive``, through :mod:`.recompute`) and the audit both apply to
the records as their files hold them (JSON objects: a record's ``spec``, ``attempt``, ``unit_attempt``,
``status``, ``timings``, ...).

Each unit's latest unit attempt (:func:`analysed`; the others are superseded), each run's latest
attempt in it (:func:`final_attempts`), the per-run table (:func:`run_rows`, superseded attempts
included), completeness against the plan and the budget rule (:func:`completeness`), every planned
run's path from planned to analysed (:func:`flow`), the pairs with one failed arm
(:func:`failed_pairs`, for the sensitivity analysis) and the attempts that started and never ended
(:func:`unfinished`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prereg.budget import Attempt, completeness_text, plan_units, stop_check
from prereg.designs import find_design, study_design
from prereg.failstop import attempt_of, failing_arms
from prereg.failstop import stop_text as failure_stop_text

#: A record as its file holds it (non-finite measurements are ``null``).
Rec = Mapping[str, Any]

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


@dataclass(frozen=True)
class Completeness:
    """Planned runs against runs with an ``ok`` record; whether the budget rule explains a stop
    (``None`` where records do not list the planned seeds)."""

    planned_runs: int | None
    ok_runs: int
    missing_runs: int | None
    complete: bool | None
    budget_stop: bool | None
    text: str


def final_attempts(records: Sequence[Rec]) -> dict[str, Rec]:
    """Each run's latest attempt (failed, interrupted or ok), by run id."""
    out: dict[str, Rec] = {}
    for r in records:
        rid = r["spec"]["run_id"]
        if rid not in out or r["attempt"] > out[rid]["attempt"]:
            out[rid] = r
    return out


def latest_unit(records: Sequence[Rec]) -> dict[str, int]:
    """Each unit's latest unit attempt (``unit_attempt``; 1 for records that predate the field)."""
    out: dict[str, int] = {}
    for r in records:
        u = r["spec"]["unit"]
        out[u] = max(out.get(u, 1), r.get("unit_attempt", 1))
    return out


def analysed(records: Sequence[Rec]) -> list[Rec]:
    """The records of each unit's latest unit attempt (the rest are superseded): the ones the
    analysis may use."""
    latest = latest_unit(records)
    return [r for r in records if r.get("unit_attempt", 1) == latest[r["spec"]["unit"]]]


def final_units(records: Sequence[Rec]) -> set[str]:
    """The units that are final in the analysed records: every run's latest attempt ok, or one of
    them failed (nothing is left to run without ``--retry-failed``). A unit counts its runs by the
    protocol: two for a pair, one per cell for a block."""
    proto = records[0]["protocol"] if records else {}
    size = {st["name"]: study_design(st).runs_per_unit(st) for st in proto.get("studies", [])}
    latest = final_attempts(analysed(records))
    by_unit: dict[str, list[str]] = {}
    for r in latest.values():
        by_unit.setdefault(r["spec"]["unit"], []).append(r["status"])
    return {
        u
        for u, sts in by_unit.items()
        if "failed" in sts or sts.count("ok") == size.get(u.split(".", 1)[0], 2)
    }


def redrawn(records: Sequence[Rec]) -> list[str]:
    """The runs analysed from a later attempt than their first (``attempt`` > 1, or a unit that ran
    again whole, ``unit_attempt`` > 1), by run id in ledger order: an earlier attempt of each
    started, and ended without being the one analysed (interrupted, killed, its unit run again),
    so its outcome (a checkpoint on disk, a log) could have been read before the run was drawn
    again. The audit names them in its verdict (exit status 4), since it cannot tell a crash from
    a peek (docs/provenance.md, "Redraws")."""
    out = []
    for rid, r in final_attempts(analysed(records)).items():
        if r["attempt"] > 1 or r.get("unit_attempt", 1) > 1:
            out.append(rid)
    return out


def peak(r: Rec) -> float | None:
    """The record's peak memory in bytes, by the key its ``memory`` names ``primary``; ``None`` when
    it names none or the value is missing."""
    mem = r.get("memory") or {}
    key = mem.get("primary")
    return float(mem[key]) if key and mem.get(key) is not None else None


def run_rows(records: Sequence[Rec]) -> list[dict[str, object]]:
    """One row per run attempt, every status, in plan order; ``superseded`` when its unit ran again whole."""
    rows = []
    latest = latest_unit(records)
    for r in records:
        s, t = r["spec"], r.get("timings") or {}
        ua = r.get("unit_attempt", 1)
        rows.append(
            {
                "run_id": s["run_id"],
                "attempt": r["attempt"],
                "unit_attempt": ua,
                "superseded": ua < latest[s["unit"]],
                "status": r["status"],
                "reason": r.get("reason"),
                "study": s["study"],
                "config": s["config"],
                "arm": s["arm"],
                "role": s["role"],
                "seed": s["seed"],
                "unit": s["unit"],
                "position": s["position"],
                "order": s["order"],
                "training_s": t.get("training_s"),
                "time_to_target_s": t.get("time_to_target_s"),
                "total_s": t.get("total_s"),
                "device_s": t.get("device_s"),
                "val_bpb": r.get("val_bpb"),
                "test_bpb": r.get("test_bpb"),
                "peak_memory_bytes": peak(r),
            }
        )
    rows.sort(key=lambda x: (x["order"], x["attempt"]))
    return rows


def open_started(ended: Collection[tuple[str, int]], started: Sequence[Rec]) -> list[Rec]:
    """The started entries, in ledger order, whose (run id, attempt) is not in ``ended``: attempts no
    record ends (interrupted, or still running). The one rule ``harness status``, the runner and the
    audit apply."""
    return [
        e
        for e in sorted(started, key=lambda e: e["ledger"]["seq"])
        if (e["run_id"], e["attempt"]) not in ended
    ]


def unfinished(records: Sequence[Rec], started: Sequence[Rec]) -> list[dict[str, object]]:
    """Started entries that no record ends: interrupted attempts, with their start time."""
    ended = {(r["spec"]["run_id"], r["attempt"]) for r in records}
    return [
        {
            "run_id": e["run_id"],
            "attempt": e["attempt"],
            "unit_attempt": e.get("unit_attempt", 1),
            "started_at": e["started_at"],
            "node": e["node"],
            "seq": e["ledger"]["seq"],
        }
        for e in open_started(ended, started)
    ]


def flow(records: Sequence[Rec], used: Collection[str], proto: Mapping[str, Any]) -> list[dict[str, object]]:
    """Every planned run per (study, configuration, arm): planned, started, ok, failed,
    interrupted (attempts), superseded (attempts of a unit that ran again whole), missing, analysed
    (in a ``used`` pair or block: the summary's) and excluded; a run's state is its latest
    attempt in its unit's analysed unit attempt."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for st in proto["studies"]:
        roles = study_design(st).roles(st)
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
    latest = latest_unit(records)
    for r in records:
        attempts.setdefault(r["spec"]["run_id"], []).append(r["status"])
        s = r["spec"]
        if r.get("unit_attempt", 1) < latest[s["unit"]]:
            rows[(s["study"], s["config"], s["role"])]["superseded_attempts"] += 1
    for r in final_attempts(analysed(records)).values():
        s = r["spec"]
        row = rows[(s["study"], s["config"], s["role"])]
        row["started"] += 1
        row["interrupted_attempts"] += attempts[s["run_id"]].count("interrupted")
        row["ok"] += r["status"] == "ok"
        row["failed"] += r["status"] == "failed"
        row["analysed"] += int(s["unit"] in used and r["status"] == "ok")
    for row in rows.values():
        row["missing"] = None if row["planned"] is None else row["planned"] - row["ok"]
        row["excluded"] = row["ok"] - row["analysed"]
    return list(rows.values())


def failed_pairs(records: Sequence[Rec]) -> dict[tuple[str, str], list[dict[str, str]]]:
    """Pairs whose final records are one ok and one failed arm (for the sensitivity analysis), per
    (study, configuration)."""
    by_unit: dict[str, dict[str, Rec]] = {}
    for r in final_attempts(analysed(records)).values():
        if getattr(find_design(r["spec"]["design"]), "pairwise", False):
            by_unit.setdefault(r["spec"]["unit"], {})[r["spec"]["role"]] = r
    out: dict[tuple[str, str], list[dict[str, str]]] = {}
    for unit in sorted(by_unit):
        arms = by_unit[unit]
        st = sorted((role, r["status"]) for role, r in arms.items())
        if len(st) == 2 and sorted(x for _, x in st) == ["failed", "ok"]:
            spec = next(iter(arms.values()))["spec"]
            out.setdefault((spec["study"], spec["config"]), []).append(
                {"unit": unit, "failed": next(role for role, x in st if x == "failed")}
            )
    return out


def planned_runs(studies: Sequence[Rec]) -> int | None:
    """The runs a protocol summary's studies plan: seeds x configurations x the runs of a unit of
    each study's design (:meth:`prereg.designs.base.Design.runs_per_unit`); None where a study does
    not list its seeds (schema 1 records do not say)."""
    planned = 0
    for st in studies:
        if "seeds" not in st:
            return None
        planned += len(st["seeds"]) * len(st["configs"]) * study_design(st).runs_per_unit(st)
    return planned


def _spent(records: Sequence[Rec]) -> list[Attempt]:
    """Each attempt as the budget rule reads it: run, unit, attempt, status and device seconds."""
    return [
        (
            r["spec"]["run_id"],
            r["spec"]["unit"],
            r["attempt"],
            r["status"],
            (r.get("timings") or {}).get("device_s") or 0.0,
        )
        for r in records
    ]


def completeness(records: Sequence[Rec]) -> Completeness:
    """Planned runs against runs with an ``ok`` record, and whether the budget rule explains a stop.

    Planned runs per study: seeds x configurations x runs per unit (2 for a pair, one per cell for a
    block). Whether a stop is the budget's is the rule ``harness run`` applies before each unit, in
    its one home (:mod:`.budget`): the first unit in plan order with runs to do would take
    ``spent + k * m`` past the budget.
    """
    proto = records[0]["protocol"]
    ok_ids = {r["spec"]["run_id"] for r in analysed(records) if r["status"] == "ok"}
    planned = planned_runs(proto["studies"])
    if planned is None:
        return Completeness(
            planned_runs=None,
            ok_runs=len(ok_ids),
            missing_runs=None,
            complete=None,
            budget_stop=None,
            text="completeness unknown: these records do not list the planned seeds",
        )
    missing = planned - len(ok_ids)
    budget = proto.get("budget_device_seconds")
    stop = (
        stop_check(plan_units(proto["studies"]), _spent(records), budget)
        if missing and budget is not None
        else None
    )
    text = completeness_text(planned, missing, stop)
    failing = failing_arms([attempt_of(r) for r in records]) if missing else []
    if failing and not (stop is not None and stop.refuses):
        text = failure_stop_text(planned, missing, failing)
    return Completeness(
        planned_runs=planned,
        ok_runs=len(ok_ids),
        missing_runs=missing,
        complete=missing == 0,
        budget_stop=bool(stop is not None and stop.refuses),
        text=text,
    )

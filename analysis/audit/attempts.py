"""Which records count, re-implemented (analysis/summary.py states the rules): each run's final
attempt, each unit's latest unit attempt (the rest superseded), attempts started with no record,
each arm's flow from planned runs to analysed ones, pairs with one failed arm, and the study's
completeness against its plan and budget rule."""

from __future__ import annotations

from dataclasses import dataclass

from .budget import completeness_text, plan_units, stop_check
from .factorial import arms_by_cell, design_of


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


def final_attempts(records: list[dict]) -> dict:
    out: dict = {}
    for r in records:
        rid = r["spec"]["run_id"]
        if rid not in out or r["attempt"] > out[rid]["attempt"]:
            out[rid] = r
    return out


def latest_unit(records: list[dict]) -> dict:
    out: dict = {}
    for r in records:
        u = r["spec"]["unit"]
        out[u] = max(out.get(u, 1), r.get("unit_attempt", 1))
    return out


def analysed(records: list[dict]) -> list[dict]:
    """The records of each unit's latest unit attempt (the rest are superseded)."""
    latest = latest_unit(records)
    return [r for r in records if r.get("unit_attempt", 1) == latest[r["spec"]["unit"]]]


def unfinished(records: list[dict], started: list[dict]) -> list[dict]:
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
        for e in sorted(started, key=lambda e: e["ledger"]["seq"])
        if (e["run_id"], e["attempt"]) not in ended
    ]


def flow(records: list[dict], studies: list[dict], proto: dict) -> list[dict]:
    rows: dict = {}
    for st in proto["studies"]:
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
    attempts: dict = {}
    latest = latest_unit(records)
    for r in records:
        attempts.setdefault(r["spec"]["run_id"], []).append(r["status"])
        s = r["spec"]
        if r.get("unit_attempt", 1) < latest[s["unit"]]:
            rows[(s["study"], s["config"], s["role"])]["superseded_attempts"] += 1
    used = {x["unit"] for st in studies for c in st["configs"] for x in c.get("pairs", c.get("blocks", []))}
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


def failed_pairs(records: list[dict]) -> dict:
    by_unit: dict = {}
    for r in final_attempts(analysed(records)).values():
        if r["spec"]["design"] == "paired":
            by_unit.setdefault(r["spec"]["unit"], {})[r["spec"]["role"]] = r
    out: dict = {}
    for unit in sorted(by_unit):
        arms = by_unit[unit]
        st = sorted((role, r["status"]) for role, r in arms.items())
        if len(st) == 2 and sorted(x for _, x in st) == ["failed", "ok"]:
            spec = next(iter(arms.values()))["spec"]
            out.setdefault((spec["study"], spec["config"]), []).append(
                {"unit": unit, "failed": next(role for role, x in st if x == "failed")}
            )
    return out


def completeness(records: list[dict]) -> Completeness:
    """Planned runs (seeds x configurations x runs per unit) against ok runs; the budget rule's
    verdict (:mod:`.budget`, the rule ``harness run`` applies)."""
    proto = records[0]["protocol"]
    ok_ids = {r["spec"]["run_id"] for r in analysed(records) if r["status"] == "ok"}
    planned = 0
    for st in proto["studies"]:
        if "seeds" not in st:
            return Completeness(
                planned_runs=None,
                ok_runs=len(ok_ids),
                missing_runs=None,
                complete=None,
                budget_stop=None,
                text="completeness unknown: these records do not list the planned seeds",
            )
        size = 2 if st["design"] == "paired" else len(design_of(st)[1])
        planned += len(st["seeds"]) * len(st["configs"]) * size
    missing = planned - len(ok_ids)
    budget = proto.get("budget_device_seconds")
    attempts = [
        (
            r["spec"]["run_id"],
            r["spec"]["unit"],
            r["attempt"],
            r["status"],
            (r.get("timings") or {}).get("device_s") or 0.0,
        )
        for r in records
    ]
    stop = (
        stop_check(plan_units(proto["studies"]), attempts, budget) if missing and budget is not None else None
    )
    return Completeness(
        planned_runs=planned,
        ok_runs=len(ok_ids),
        missing_runs=missing,
        complete=missing == 0,
        budget_stop=bool(stop is not None and stop.refuses),
        text=completeness_text(planned, missing, stop),
    )

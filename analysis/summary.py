"""From records to every number the report shows (``summary.json``).

Selection rules (the audit re-implements them):

* a run's outcome is its ``ok`` record (at most one per run); failed and interrupted attempts stay
  in the per-run table and are counted;
* a pair or block is used only when every arm of it has an ``ok`` record; others are listed under
  ``exclusions`` with the reason;
* time to target: pairs where an arm never reached the target are excluded (rule ``exclude``) or
  take that arm's full training time (rule ``full_budget``), as the protocol says; their count is
  reported;
* completeness (:func:`completeness`): a study whose planned runs do not all have an ``ok`` record
  is incomplete, and its decisions are "not reached (incomplete)", unless the protocol's budget
  rule explains the stop (the device seconds spent plus one more unit at the mean device seconds
  of the ok runs exceed the budget), in which case the decisions are made and say so.
"""

from __future__ import annotations

import math
from typing import Any

from analysis.stats import factorial_contrasts, paired_interval, quality_decision
from harness.records import load_records

__all__ = ["completeness", "derive", "load_records", "run_rows"]

SUMMARY_SCHEMA = 2  # 2: "completeness"; decisions say "not reached" for an incomplete study
UNIT_RUNS = {"paired": 2, "factorial": 4}


def _peak(rec: dict[str, Any]) -> float | None:
    mem = rec.get("memory") or {}
    key = mem.get("primary")
    return float(mem[key]) if key and mem.get(key) is not None else None


def run_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run attempt, every status, in plan order."""
    rows = []
    for r in records:
        s, t = r["spec"], r.get("timings") or {}
        rows.append({
            "run_id": s["run_id"], "attempt": r["attempt"], "status": r["status"], "reason": r.get("reason"),
            "study": s["study"], "config": s["config"], "arm": s["arm"], "role": s["role"], "seed": s["seed"],
            "unit": s["unit"], "position": s["position"], "order": s["order"],
            "training_s": t.get("training_s"), "time_to_target_s": t.get("time_to_target_s"),
            "total_s": t.get("total_s"), "device_s": t.get("device_s"),
            "val_bpb": r.get("val_bpb"), "test_bpb": r.get("test_bpb"), "peak_memory_bytes": _peak(r),
        })
    rows.sort(key=lambda x: (x["order"], x["attempt"]))
    return rows


def _parameters(units: dict[str, dict[str, dict[str, Any]]]) -> int | None:
    for arms in units.values():
        for rec in arms.values():
            if rec.get("parameters") is not None:
                return int(rec["parameters"])
    return None


def _interval(b: list[float], c: list[float], level: float, estimand: str) -> dict[str, Any] | None:
    if len(b) < 2:
        return None
    return paired_interval(b, c, level, estimand).as_dict()


def _endpoint(b: list[float], c: list[float], level: float, estimand: str) -> dict[str, Any]:
    return {
        "pairs": len(b),
        "baseline_mean": math.fsum(b) / len(b) if b else None,
        "candidate_mean": math.fsum(c) / len(c) if c else None,
        "interval": _interval(b, c, level, estimand),
    }


def completeness(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Planned runs against runs with an ``ok`` record, and whether the budget rule explains a stop.

    Planned runs per study: seeds x configurations x runs per unit (2 for a pair, 4 for a block).
    The budget explains a stop when ``spent + u * m > budget``: ``spent`` the device seconds of every
    attempt, ``m`` the mean device seconds of the ok runs, ``u`` the smallest unit among studies with
    missing runs (the rule ``harness run`` applies before each unit).
    """
    proto = records[0]["protocol"]
    ok_ids = {r["spec"]["run_id"] for r in records if r["status"] == "ok"}
    planned = 0
    missing_units: list[int] = []
    for st in proto["studies"]:
        if "seeds" not in st:  # schema 1 records do not say
            return {"planned_runs": None, "ok_runs": len(ok_ids), "missing_runs": None, "complete": None,
                    "budget_stop": None, "text": "completeness unknown: these records do not list the planned seeds"}
        n = len(st["seeds"]) * len(st["configs"]) * UNIT_RUNS[st["design"]]
        planned += n
        done = sum(1 for r in ok_ids if r.split(".", 1)[0] == st["name"])
        if done < n:
            missing_units.append(UNIT_RUNS[st["design"]])
    missing = planned - len(ok_ids)
    spent = math.fsum((r.get("timings") or {}).get("device_s") or 0.0 for r in records)
    ok_s = [(r.get("timings") or {}).get("device_s") or 0.0 for r in records if r["status"] == "ok"]
    budget = proto.get("budget_device_seconds")
    budget_stop = bool(missing and ok_s and budget is not None
                       and spent + min(missing_units) * math.fsum(ok_s) / len(ok_s) > budget)
    if missing == 0:
        text = f"complete: all {planned} planned runs have an ok record"
    elif budget_stop:
        text = (f"STOPPED BY THE BUDGET RULE: {missing} of {planned} planned runs have no ok record; "
                f"{spent:.1f} of {budget:g} device seconds spent, and one more unit would exceed the budget")
    else:
        text = f"INCOMPLETE: {missing} of {planned} planned runs have no ok record"
    return {"planned_runs": planned, "ok_runs": len(ok_ids), "missing_runs": missing, "complete": missing == 0,
            "budget_stop": budget_stop, "text": text}


def _paired(study: dict[str, Any], config: str, units: dict[str, dict[str, dict[str, Any]]],
            protocol: dict[str, Any], exclusions: list[dict[str, str]], done: dict[str, Any]) -> dict[str, Any]:
    level = study["interval_level"]
    pairs = []
    for unit in sorted(units):
        arms = units[unit]
        missing = [role for role in ("baseline", "candidate") if role not in arms]
        if missing:
            exclusions.append({"unit": unit, "reason": f"no ok record for {', '.join(missing)}"})
            continue
        b, c = arms["baseline"], arms["candidate"]
        pairs.append({
            "unit": unit, "seed": b["spec"]["seed"],
            "first": "baseline" if b["spec"]["position"] == 0 else "candidate",
            "baseline_training_s": b["timings"]["training_s"], "candidate_training_s": c["timings"]["training_s"],
            "baseline_time_to_target_s": b["timings"]["time_to_target_s"],
            "candidate_time_to_target_s": c["timings"]["time_to_target_s"],
            "baseline_total_s": b["timings"]["total_s"], "candidate_total_s": c["timings"]["total_s"],
            "baseline_test_bpb": b["test_bpb"], "candidate_test_bpb": c["test_bpb"],
            "baseline_peak_memory_bytes": _peak(b), "candidate_peak_memory_bytes": _peak(c),
            "time_reduction_pct": 100.0 * (1.0 - c["timings"]["training_s"] / b["timings"]["training_s"]),
            "test_bpb_difference": c["test_bpb"] - b["test_bpb"],
        })
    col = lambda key: [p[key] for p in pairs]  # noqa: E731
    training = _endpoint(col("baseline_training_s"), col("candidate_training_s"), level, "relative_reduction")
    training["log_ratio"] = _interval(col("baseline_training_s"), col("candidate_training_s"), level, "log_ratio")
    rule = protocol["unreached_target"]
    tb, tc, unreached = [], [], 0
    for p in pairs:
        x, y = p["baseline_time_to_target_s"], p["candidate_time_to_target_s"]
        if x is None or y is None:
            unreached += 1
            if rule == "exclude":
                continue
            x = p["baseline_training_s"] if x is None else x
            y = p["candidate_training_s"] if y is None else y
        tb.append(x)
        tc.append(y)
    ttt = _endpoint(tb, tc, level, "relative_reduction")
    ttt.update(rule=rule, unreached_pairs=unreached)
    quality = _endpoint(col("baseline_test_bpb"), col("candidate_test_bpb"), level, "difference")
    mem_b, mem_c = col("baseline_peak_memory_bytes"), col("candidate_peak_memory_bytes")
    memory = _endpoint(mem_b, mem_c, level, "relative_reduction") if None not in mem_b + mem_c else None
    primary_key = "time_to_target" if study["primary_endpoint"] == "time_to_target" else "training_time"
    faster = sum(1 for p in pairs if p["candidate_training_s"] < p["baseline_training_s"])
    slower = sum(1 for p in pairs if p["candidate_training_s"] > p["baseline_training_s"])
    decision = None
    if quality["interval"] is not None:
        from analysis.stats import PairedInterval

        d = quality_decision(PairedInterval(**quality["interval"]), protocol["quality_tolerance_bpb"],
                             study["quality_decision"])
        decision = {"applies": d.applies, "tolerance": d.tolerance, "upper": d.upper,
                    "established": d.established, "text": d.text}
        if d.applies and done["complete"] is False:
            if done["budget_stop"]:
                decision["text"] = f"(study stopped by its budget rule) {d.text}"
            else:
                decision.update(established=None, text=f"not reached (incomplete: {done['missing_runs']} of "
                                                       f"{done['planned_runs']} planned runs have no ok record)")
    return {
        "config": config, "design": "paired", "level": level, "primary_endpoint": primary_key,
        "parameters": _parameters(units),
        "baseline_arm": study["arms"][0], "candidate_arm": study["arms"][1],
        "units_seen": len(units), "pairs_used": len(pairs),
        "training_time": training, "time_to_target": ttt,
        "total_time": _endpoint(col("baseline_total_s"), col("candidate_total_s"), level, "relative_reduction"),
        "test_bpb": quality, "peak_memory": memory,
        "counts": {"faster": faster, "slower": slower, "ties": len(pairs) - faster - slower,
                   "worse_test_bpb": sum(1 for p in pairs if p["test_bpb_difference"] > 0)},
        "decision": decision, "pairs": pairs,
    }


CELLS = ("native", "bucketed", "packed", "cotangent")


def _factorial(study: dict[str, Any], config: str, units: dict[str, dict[str, dict[str, Any]]],
               exclusions: list[dict[str, str]]) -> dict[str, Any]:
    level = study["interval_level"]
    blocks = []
    for unit in sorted(units):
        cells = units[unit]
        missing = [c for c in CELLS if c not in cells]
        if missing:
            exclusions.append({"unit": unit, "reason": f"no ok record for {', '.join(missing)}"})
            continue
        order = sorted(CELLS, key=lambda c: cells[c]["spec"]["position"])
        blocks.append({"unit": unit, "seed": cells["native"]["spec"]["seed"], "order": order,
                       **{f"{c}_training_s": cells[c]["timings"]["training_s"] for c in CELLS},
                       **{f"{c}_test_bpb": cells[c]["test_bpb"] for c in CELLS}})
    means = {c: (math.fsum(b[f"{c}_training_s"] for b in blocks) / len(blocks) if blocks else None) for c in CELLS}
    effects: dict[str, Any] = {}
    if len(blocks) >= 2:
        for name, iv in factorial_contrasts([{c: b[f"{c}_training_s"] for c in CELLS} for b in blocks], level).items():
            d = iv.as_dict()
            d["reduction_pct"] = 100.0 * (1.0 - math.exp(iv.estimate))
            d["reduction_low_pct"] = 100.0 * (1.0 - math.exp(iv.high))
            d["reduction_high_pct"] = 100.0 * (1.0 - math.exp(iv.low))
            effects[name] = d
    return {"config": config, "design": "factorial", "level": level, "units_seen": len(units),
            "parameters": _parameters(units),
            "blocks_used": len(blocks), "cell_mean_training_s": means, "effects": effects, "blocks": blocks}


def derive(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Every number of the report, from the records alone."""
    if not records:
        raise ValueError("no records")
    protocol = records[0]["protocol"]
    shas = {r["protocol"]["sha256"] for r in records}
    if len(shas) != 1:
        raise ValueError(f"records name {len(shas)} different protocol files: {sorted(shas)}")
    ok: dict[tuple[str, str], dict[str, dict[str, dict[str, Any]]]] = {}
    seen_units: dict[tuple[str, str], set[str]] = {}
    for r in records:
        s = r["spec"]
        seen_units.setdefault((s["study"], s["config"]), set()).add(s["unit"])
        if r["status"] == "ok":
            ok.setdefault((s["study"], s["config"]), {}).setdefault(s["unit"], {})[s["role"]] = r
    exclusions: list[dict[str, str]] = []
    done = completeness(records)
    studies = []
    for study in protocol["studies"]:
        entries = []
        for config in study["configs"]:
            units = {u: ok.get((study["name"], config), {}).get(u, {}) for u in sorted(seen_units.get((study["name"], config), set()))}
            if not units:
                continue
            if study["design"] == "paired":
                entries.append(_paired(study, config, units, protocol, exclusions, done))
            else:
                entries.append(_factorial(study, config, units, exclusions))
        studies.append({"name": study["name"], "design": study["design"], "configs": entries})
    status = [r["status"] for r in records]
    return {
        "schema_version": SUMMARY_SCHEMA,
        "protocol": protocol,
        "records": {"files": len(records), "ok": status.count("ok"), "failed": status.count("failed"),
                    "interrupted": status.count("interrupted"),
                    "device_seconds": math.fsum((r.get("timings") or {}).get("device_s") or 0.0 for r in records)},
        "completeness": done,
        "exclusions": sorted(exclusions, key=lambda e: e["unit"]),
        "studies": studies,
        "runs": run_rows(records),
    }

"""The summary recomputed from the records (by the rules stated in analysis/summary.py), and its
comparison with the stored ``summary.json``."""

from __future__ import annotations

import math

from .descriptive import (
    by_device,
    crossover,
    drift,
    endpoint,
    interval,
    number,
    paired,
    params_of,
    peak,
    positions,
)
from .factorial import block_effect, effects, from_summary
from .hypotheses import decide, sensitivity

REL_TOL = 1e-9
#: ``summary.json`` schema versions this audit recomputes (``analysis.summary.SUMMARY_SCHEMA``).
SUMMARY_SCHEMAS = (4,)


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


def recompute(records: list[dict], started: list[dict] | None = None) -> dict:
    """The summary, from the records, by the rules stated in analysis/summary.py."""
    proto = records[0]["protocol"]
    ok: dict = {}
    seen: dict = {}
    for r in sorted(analysed(records), key=lambda x: x["attempt"]):
        s = r["spec"]
        seen.setdefault((s["study"], s["config"]), set()).add(s["unit"])
        if r["status"] == "ok":
            ok.setdefault((s["study"], s["config"]), {}).setdefault(s["unit"], {})[s["role"]] = r
    exclusions: list = []
    done = completeness(records)
    studies = []
    pairs_of: dict = {}
    for st in proto["studies"]:
        entries = []
        level = st["interval_level"]
        for config in st["configs"]:
            units = {
                u: ok.get((st["name"], config), {}).get(u, {})
                for u in sorted(seen.get((st["name"], config), set()))
            }
            if not units:
                continue
            if st["design"] == "paired":
                entry = _paired(st, config, units, level, exclusions)
                pairs_of[(st["name"], config)] = entry["pairs"]
            else:
                entry = _factorial(st, config, units, level, exclusions)
            entries.append(entry)
        studies.append({"name": st["name"], "design": st["design"], "configs": entries})
    spec = proto.get("hypotheses") or {"descriptive": "these records predate preregistered hypotheses"}
    if "descriptive" in spec:
        hyp = {"descriptive": spec["descriptive"]}
    else:
        failed = failed_pairs(records)
        decisions = []
        for d in decide(spec, pairs_of, done):
            h = next(t for t in spec["tests"] if t["id"] == d["id"])
            d["sensitivity"] = sensitivity(
                h, pairs_of.get((d["study"], d["config"]), []), failed.get((d["study"], d["config"]), [])
            )
            decisions.append(d)
        hyp = {
            "procedure": spec["procedure"],
            "family_alpha": spec["family_alpha"],
            "min_pairs": spec["min_pairs"],
            "decisions": decisions,
        }
    status = [r["status"] for r in records]
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
    return {
        "schema_version": SUMMARY_SCHEMAS[-1],
        "protocol": proto,
        "completeness": done,
        "hypotheses": hyp,
        "flow": flow(records, studies, proto),
        "records": {
            "files": len(records),
            "ok": status.count("ok"),
            "failed": status.count("failed"),
            "interrupted": status.count("interrupted"),
            "superseded": len(records) - len(analysed(records)),
            "unfinished": unfinished(records, started or []),
            "device_seconds": math.fsum((r.get("timings") or {}).get("device_s") or 0.0 for r in records),
        },
        "exclusions": sorted(exclusions, key=lambda e: e["unit"]),
        "studies": studies,
        "runs": rows,
    }


def flow(records: list[dict], studies: list[dict], proto: dict) -> list[dict]:
    rows: dict = {}
    for st in proto["studies"]:
        roles = (
            (("baseline", st["arms"][0]), ("candidate", st["arms"][1]))
            if st["design"] == "paired"
            else tuple(zip(*from_summary(st)[1:]))
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


def completeness(records: list[dict]) -> dict:
    """Planned runs (seeds x configurations x 2 or 4) against ok runs; the budget rule's verdict."""
    proto = records[0]["protocol"]
    ok_ids = {r["spec"]["run_id"] for r in analysed(records) if r["status"] == "ok"}
    planned, unit_sizes = 0, []
    for st in proto["studies"]:
        if "seeds" not in st:
            return {
                "planned_runs": None,
                "ok_runs": len(ok_ids),
                "missing_runs": None,
                "complete": None,
                "budget_stop": None,
                "text": "completeness unknown: these records do not list the planned seeds",
            }
        size = 2 if st["design"] == "paired" else len(from_summary(st)[1])
        n = len(st["seeds"]) * len(st["configs"]) * size
        planned += n
        if sum(1 for r in ok_ids if r.split(".", 1)[0] == st["name"]) < n:
            unit_sizes.append(size)
    missing = planned - len(ok_ids)
    spent = math.fsum((r.get("timings") or {}).get("device_s") or 0.0 for r in records)
    ok_s = [(r.get("timings") or {}).get("device_s") or 0.0 for r in records if r["status"] == "ok"]
    budget = proto.get("budget_device_seconds")
    stop = bool(
        missing
        and ok_s
        and budget is not None
        and spent + min(unit_sizes) * math.fsum(ok_s) / len(ok_s) > budget
    )
    if missing == 0:
        text = f"complete: all {planned} planned runs have an ok record"
    elif stop:
        text = (
            f"STOPPED BY THE BUDGET RULE: {missing} of {planned} planned runs have no ok record; "
            f"{spent:.1f} of {budget:g} device seconds spent, and one more unit would exceed the budget; "
            "where it stopped depended on run times, the outcome of every time endpoint"
        )
    else:
        text = f"INCOMPLETE: {missing} of {planned} planned runs have no ok record"
    return {
        "planned_runs": planned,
        "ok_runs": len(ok_ids),
        "missing_runs": missing,
        "complete": missing == 0,
        "budget_stop": stop,
        "text": text,
    }


def _paired(st: dict, config: str, units: dict, level: float, exclusions: list) -> dict:
    pairs = []
    for unit in sorted(units):
        arms = units[unit]
        missing = [x for x in ("baseline", "candidate") if x not in arms]
        if missing:
            exclusions.append({"unit": unit, "reason": f"no ok record for {', '.join(missing)}"})
            continue
        b, c = arms["baseline"], arms["candidate"]
        bt, ct = b["timings"], c["timings"]
        pairs.append(
            {
                "unit": unit,
                "seed": b["spec"]["seed"],
                "order": min(b["spec"]["order"], c["spec"]["order"]),
                "first": "baseline" if b["spec"]["position"] == 0 else "candidate",
                "device": f"{(b.get('env') or {}).get('host', 'unknown host')} / "
                f"{(b.get('env') or {}).get('device_name', 'unknown device')}",
                "baseline_training_s": bt["training_s"],
                "candidate_training_s": ct["training_s"],
                "baseline_time_to_target_s": bt["time_to_target_s"],
                "candidate_time_to_target_s": ct["time_to_target_s"],
                "baseline_total_s": bt["total_s"],
                "candidate_total_s": ct["total_s"],
                "baseline_test_bpb": b["test_bpb"],
                "candidate_test_bpb": c["test_bpb"],
                "baseline_peak_memory_bytes": peak(b),
                "candidate_peak_memory_bytes": peak(c),
                "time_reduction_pct": 100.0 * (1.0 - ct["training_s"] / bt["training_s"])
                if number(bt["training_s"], True) and number(ct["training_s"], True)
                else None,
                "test_bpb_difference": c["test_bpb"] - b["test_bpb"]
                if number(b["test_bpb"], False) and number(c["test_bpb"], False)
                else None,
            }
        )
    col = lambda k: [p[k] for p in pairs]  # noqa: E731
    training = endpoint(col("baseline_training_s"), col("candidate_training_s"), level, "relative_reduction")
    timed = [p for p in pairs if p["time_reduction_pct"] is not None]  # both training times finite, positive
    training["log_ratio"] = paired(
        [p["baseline_training_s"] for p in timed],
        [p["candidate_training_s"] for p in timed],
        level,
        "log_ratio",
    )
    both = [
        p
        for p in pairs
        if p["baseline_time_to_target_s"] is not None and p["candidate_time_to_target_s"] is not None
    ]
    ttt = endpoint(
        [p["baseline_time_to_target_s"] for p in both],
        [p["candidate_time_to_target_s"] for p in both],
        level,
        "relative_reduction",
    )
    ttt.update(
        rule="pairs where both arms reached the target",
        unreached={
            "baseline": sum(p["baseline_time_to_target_s"] is None for p in pairs),
            "candidate": sum(p["candidate_time_to_target_s"] is None for p in pairs),
        },
    )
    quality = endpoint(col("baseline_test_bpb"), col("candidate_test_bpb"), level, "difference")
    mb, mc = col("baseline_peak_memory_bytes"), col("candidate_peak_memory_bytes")
    memory = endpoint(mb, mc, level, "relative_reduction") if None not in mb + mc else None
    faster = sum(1 for p in timed if p["candidate_training_s"] < p["baseline_training_s"])
    slower = sum(1 for p in timed if p["candidate_training_s"] > p["baseline_training_s"])
    return {
        "config": config,
        "design": "paired",
        "level": level,
        "parameters": params_of(units),
        "baseline_arm": st["arms"][0],
        "candidate_arm": st["arms"][1],
        "units_seen": len(units),
        "pairs_used": len(pairs),
        "training_time": training,
        "time_to_target": ttt,
        "total_time": endpoint(
            col("baseline_total_s"), col("candidate_total_s"), level, "relative_reduction"
        ),
        "test_bpb": quality,
        "peak_memory": memory,
        "counts": {
            "faster": faster,
            "slower": slower,
            "ties": len(timed) - faster - slower,
            "worse_test_bpb": sum(1 for p in pairs if (p["test_bpb_difference"] or 0.0) > 0),
        },
        "order_effects": {"crossover": crossover(timed, level), "drift": drift(timed, level)},
        "by_device": by_device(timed, level),
        "pairs": pairs,
    }


def _factorial(st: dict, config: str, units: dict, level: float, exclusions: list) -> dict:
    factors, cells, _ = from_summary(st)
    blocks = []
    for unit in sorted(units):
        have = units[unit]
        missing = [c for c in cells if c not in have]
        if missing:
            exclusions.append({"unit": unit, "reason": f"no ok record for {', '.join(missing)}"})
            continue
        blk = {
            "unit": unit,
            "seed": have[cells[0]]["spec"]["seed"],
            "order": sorted(cells, key=lambda c: have[c]["spec"]["position"]),
        }
        for c in cells:
            blk[f"{c}_training_s"] = have[c]["timings"]["training_s"]
            blk[f"{c}_test_bpb"] = have[c]["test_bpb"]
        blocks.append(blk)
    means = {
        c: (math.fsum(b[f"{c}_training_s"] for b in blocks) / len(blocks) if blocks else None) for c in cells
    }
    found = {}
    if len(blocks) >= 2:
        for name, subset in effects(factors):
            vals = [
                block_effect([math.log(b[f"{c}_training_s"]) for c in cells], subset, len(factors))
                for b in blocks
            ]
            iv = interval(vals, level, "log_contrast")
            iv.update(
                reduction_pct=100.0 * (1.0 - math.exp(iv["estimate"])),
                reduction_low_pct=100.0 * (1.0 - math.exp(iv["high"])),
                reduction_high_pct=100.0 * (1.0 - math.exp(iv["low"])),
            )
            found[name] = iv
    return {
        "config": config,
        "design": "factorial",
        "level": level,
        "units_seen": len(units),
        "parameters": params_of(units),
        "positions": positions(blocks, level, cells),
        "blocks_used": len(blocks),
        "cell_mean_training_s": means,
        "effects": found,
        "blocks": blocks,
    }


def compare(path: str, mine: object, theirs: object, problems: list[str], where: str) -> int:
    """Compare recomputed (mine) with stored (theirs); return the number of values compared."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        n = 0
        for k in sorted(set(mine) | set(theirs)):
            if k not in theirs:
                problems.append(f"{where}: field {path}.{k} missing (recomputed {mine[k]!r})")
            elif k not in mine:
                problems.append(
                    f"{where}: field {path}.{k} = {theirs[k]!r} is not derivable from the records"
                )
            else:
                n += compare(f"{path}.{k}", mine[k], theirs[k], problems, where)
        return n
    if isinstance(mine, list) and isinstance(theirs, list):
        if len(mine) != len(theirs):
            problems.append(f"{where}: field {path} has {len(theirs)} entries, recomputed {len(mine)}")
            return 1
        return sum(
            compare(f"{path}[{i}]", a, b, problems, where) for i, (a, b) in enumerate(zip(mine, theirs))
        )
    num = (int, float)
    if (
        isinstance(mine, num)
        and isinstance(theirs, num)
        and not isinstance(mine, bool)
        and not isinstance(theirs, bool)
    ):
        if not (
            math.isclose(mine, theirs, rel_tol=REL_TOL, abs_tol=1e-12)
            or (math.isnan(mine) and math.isnan(theirs))
        ):
            problems.append(f"{where}: field {path} = {theirs!r}, recomputed {mine!r}")
        return 1
    if mine != theirs:
        problems.append(f"{where}: field {path} = {theirs!r}, recomputed {mine!r}")
    return 1

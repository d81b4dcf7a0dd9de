"""From records to every number the report shows (``summary.json``).

Selection rules (the audit recomputes the summary by them; which records count is :mod:`analysis.selection`,
the pairs, blocks and endpoints built from them are here):

* a run's outcome is its ``ok`` record (at most one per run); failed and interrupted attempts stay
  in the per-run table and are counted;
* a pair or block is used only when every arm of it has an ``ok`` record; others are listed under
  ``exclusions`` with the reason;
* a run's outcome is the ok record of its latest attempt (a retried unit re-runs every arm);
* exactly one *unit attempt* per unit is analysed: its latest (``unit_attempt``, 1 for records
  that predate it). A unit that ran again whole (a node died, a failed unit retried) keeps the
  records of its earlier unit attempts; they are *superseded*: listed (``runs[].superseded``),
  counted (``records.superseded``, ``flow[].superseded_attempts``), never paired, so both arms of a
  pair always come from the same unit attempt;
* attempts that started (a started entry in the ledger) and have no record yet are listed under
  ``records.unfinished`` as interrupted, with their start time;
* time to target, descriptively: the pairs where both arms reached the target, with the unreached
  count per arm; a decision on it follows its hypothesis' censoring rule (:mod:`analysis.audit.decisions`);
* completeness (:func:`analysis.selection.completeness`): a study whose planned runs do not all have an ``ok`` record
  is incomplete, and its decisions are "not reached (incomplete)", unless the protocol's budget
  rule explains the stop (the device seconds spent plus one more unit at the mean device seconds
  of the ok runs exceed the budget), in which case the decisions are made and say so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from analysis.audit.decisions import decide, sensitivity
from analysis.audit.descriptive import descriptive_interval, valid
from analysis.audit.descriptive import endpoint as descriptive_endpoint
from analysis.audit.factorial import design_of, factorial_effects
from analysis.audit.order import by_device, crossover, drift, positions
from analysis.results import (
    SUMMARY_SCHEMA,
    Completeness,
    Decided,
    Descriptive,
    FactorialResult,
    Hypotheses,
    PairedResult,
    RecordCounts,
    StudyResult,
    Summary,
    TimeToTarget,
    TrainingTime,
)
from analysis.selection import (
    completeness,
    current,
    failed_pairs,
    flow,
    measured,
    peak_memory,
    run_rows,
    unfinished,
)
from harness.records import RunRecord, StartedEntry, load_records

__all__ = ["derive", "load_records"]


def _device(rec: RunRecord) -> str:
    """The device a pair ran on: host and device name (a pair never spans two devices)."""
    env = rec.env or {}
    return f"{env.get('host', 'unknown host')} / {env.get('device_name', 'unknown device')}"


def _parameters(units: dict[str, dict[str, RunRecord]]) -> int | None:
    for arms in units.values():
        for rec in arms.values():
            if rec.parameters is not None:
                return int(rec.parameters)
    return None


def _paired(
    study: dict[str, Any],
    config: str,
    units: dict[str, dict[str, RunRecord]],
    exclusions: list[dict[str, str]],
) -> PairedResult:
    level = study["interval_level"]
    pairs = []
    for unit in sorted(units):
        arms = units[unit]
        missing = [role for role in ("baseline", "candidate") if role not in arms]
        if missing:
            exclusions.append({"unit": unit, "reason": f"no ok record for {', '.join(missing)}"})
            continue
        b, c = arms["baseline"], arms["candidate"]
        pairs.append(
            {
                "unit": unit,
                "seed": b.spec.seed,
                "order": min(b.spec.order, c.spec.order),
                "first": "baseline" if b.spec.position == 0 else "candidate",
                "device": _device(b),
                "baseline_training_s": b.timings["training_s"],
                "candidate_training_s": c.timings["training_s"],
                "baseline_time_to_target_s": b.timings["time_to_target_s"],
                "candidate_time_to_target_s": c.timings["time_to_target_s"],
                "baseline_total_s": b.timings["total_s"],
                "candidate_total_s": c.timings["total_s"],
                "baseline_test_bpb": measured(b.test_bpb),
                "candidate_test_bpb": measured(c.test_bpb),
                "baseline_peak_memory_bytes": peak_memory(b),
                "candidate_peak_memory_bytes": peak_memory(c),
                "time_reduction_pct": 100.0 * (1.0 - c.timings["training_s"] / b.timings["training_s"])
                if valid(b.timings["training_s"], True) and valid(c.timings["training_s"], True)
                else None,
                "test_bpb_difference": c.test_bpb - b.test_bpb
                if valid(b.test_bpb, False) and valid(c.test_bpb, False)
                else None,
            }
        )
    col = lambda key: [p[key] for p in pairs]  # noqa: E731
    timed = [
        p for p in pairs if p["time_reduction_pct"] is not None
    ]  # both training times finite and positive
    training = TrainingTime(
        **vars(
            descriptive_endpoint(
                col("baseline_training_s"), col("candidate_training_s"), level, "relative_reduction"
            )
        ),
        log_ratio=descriptive_interval(
            [p["baseline_training_s"] for p in timed],
            [p["candidate_training_s"] for p in timed],
            level,
            "log_ratio",
        ),
    )
    both = [
        p
        for p in pairs
        if p["baseline_time_to_target_s"] is not None and p["candidate_time_to_target_s"] is not None
    ]
    ttt = TimeToTarget(
        **vars(
            descriptive_endpoint(
                [p["baseline_time_to_target_s"] for p in both],
                [p["candidate_time_to_target_s"] for p in both],
                level,
                "relative_reduction",
            )
        ),
        rule="pairs where both arms reached the target",
        unreached={
            "baseline": sum(p["baseline_time_to_target_s"] is None for p in pairs),
            "candidate": sum(p["candidate_time_to_target_s"] is None for p in pairs),
        },
    )
    quality = descriptive_endpoint(col("baseline_test_bpb"), col("candidate_test_bpb"), level, "difference")
    mem_b, mem_c = col("baseline_peak_memory_bytes"), col("candidate_peak_memory_bytes")
    memory = (
        descriptive_endpoint(mem_b, mem_c, level, "relative_reduction") if None not in mem_b + mem_c else None
    )
    faster = sum(1 for p in timed if p["candidate_training_s"] < p["baseline_training_s"])
    slower = sum(1 for p in timed if p["candidate_training_s"] > p["baseline_training_s"])
    return PairedResult(
        config=config,
        design="paired",
        level=level,
        parameters=_parameters(units),
        baseline_arm=study["arms"][0],
        candidate_arm=study["arms"][1],
        units_seen=len(units),
        pairs_used=len(pairs),
        training_time=training,
        time_to_target=ttt,
        total_time=descriptive_endpoint(
            col("baseline_total_s"), col("candidate_total_s"), level, "relative_reduction"
        ),
        test_bpb=quality,
        peak_memory=memory,
        counts={
            "faster": faster,
            "slower": slower,
            "ties": len(timed) - faster - slower,
            "worse_test_bpb": sum(1 for p in pairs if (p["test_bpb_difference"] or 0.0) > 0),
        },
        order_effects={"crossover": crossover(timed, level), "drift": drift(timed, level)},
        by_device=by_device(timed, level),
        pairs=pairs,
    )


def _factorial(
    study: dict[str, Any],
    config: str,
    units: dict[str, dict[str, RunRecord]],
    exclusions: list[dict[str, str]],
) -> FactorialResult:
    level = study["interval_level"]
    factors, names = design_of(study)
    blocks = []
    for unit in sorted(units):
        cells = units[unit]
        missing = [c for c in names if c not in cells]
        if missing:
            exclusions.append({"unit": unit, "reason": f"no ok record for {', '.join(missing)}"})
            continue
        order = sorted(names, key=lambda c: cells[c].spec.position)
        blocks.append(
            {
                "unit": unit,
                "seed": cells[names[0]].spec.seed,
                "order": order,
                **{f"{c}_training_s": cells[c].timings["training_s"] for c in names},
                **{f"{c}_test_bpb": measured(cells[c].test_bpb) for c in names},
            }
        )
    means = {
        c: (math.fsum(b[f"{c}_training_s"] for b in blocks) / len(blocks) if blocks else None) for c in names
    }
    effects: dict[str, Any] = {}
    if len(blocks) >= 2:
        times = [{c: b[f"{c}_training_s"] for c in names} for b in blocks]
        for name, iv in factorial_effects(times, factors, names, level).items():
            d = iv.as_dict()
            d["reduction_pct"] = 100.0 * (1.0 - math.exp(iv.estimate))
            d["reduction_low_pct"] = 100.0 * (1.0 - math.exp(iv.high))
            d["reduction_high_pct"] = 100.0 * (1.0 - math.exp(iv.low))
            effects[name] = d
    return FactorialResult(
        config=config,
        design="factorial",
        level=level,
        units_seen=len(units),
        parameters=_parameters(units),
        positions=positions(blocks, names, level),
        blocks_used=len(blocks),
        cell_mean_training_s=means,
        effects=effects,
        blocks=blocks,
    )


def derive(records: list[RunRecord], started: list[StartedEntry] | None = None) -> Summary:
    """Every number of the report, from the records (and the ledger's started entries) alone."""
    if not records:
        raise ValueError("no records")
    protocol = records[0].protocol
    shas = {r.protocol["sha256"] for r in records}
    if len(shas) != 1:
        raise ValueError(f"records name {len(shas)} different protocol files: {sorted(shas)}")
    ok: dict[tuple[str, str], dict[str, dict[str, RunRecord]]] = {}
    seen_units: dict[tuple[str, str], set[str]] = {}
    for r in sorted(current(records), key=lambda x: x.attempt):  # the latest ok attempt wins
        s = r.spec
        seen_units.setdefault((s.study, s.config), set()).add(s.unit)
        if r.status == "ok":
            ok.setdefault((s.study, s.config), {}).setdefault(s.unit, {})[s.role] = r
    exclusions: list[dict[str, str]] = []
    done = completeness(records)
    studies: list[StudyResult] = []
    pairs_of: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for study in protocol["studies"]:
        entries: list[PairedResult | FactorialResult] = []
        for config in study["configs"]:
            units = {
                u: ok.get((study["name"], config), {}).get(u, {})
                for u in sorted(seen_units.get((study["name"], config), set()))
            }
            if not units:
                continue
            if study["design"] == "paired":
                paired = _paired(study, config, units, exclusions)
                pairs_of[(study["name"], config)] = [dict(p) for p in paired.pairs]
                entries.append(paired)
            else:
                entries.append(_factorial(study, config, units, exclusions))
        studies.append(StudyResult(name=study["name"], design=study["design"], configs=entries))
    status = [r.status for r in records]
    return Summary(
        schema_version=SUMMARY_SCHEMA,
        protocol=protocol,
        records=RecordCounts(
            files=len(records),
            ok=status.count("ok"),
            failed=status.count("failed"),
            interrupted=status.count("interrupted"),
            superseded=len(records) - len(current(records)),
            unfinished=unfinished(records, started or []),
            device_seconds=math.fsum((r.timings or {}).get("device_s") or 0.0 for r in records),
        ),
        completeness=done,
        hypotheses=_hypotheses(records, protocol, pairs_of, done),
        flow=flow(records, studies, protocol),
        exclusions=sorted(exclusions, key=lambda e: e["unit"]),
        studies=studies,
        runs=run_rows(records),
    )


def _hypotheses(
    records: list[RunRecord],
    protocol: Mapping[str, Any],
    pairs_of: dict[tuple[str, str], list[dict[str, Any]]],
    done: Completeness,
) -> Hypotheses | Descriptive:
    """The preregistered decisions, each with its failed-arm sensitivity analysis."""
    spec = protocol.get("hypotheses") or {"descriptive": "these records predate preregistered hypotheses"}
    if "descriptive" in spec:
        return Descriptive(descriptive=spec["descriptive"])
    failed = failed_pairs(records)
    decided = []
    for d in decide(spec, pairs_of, done):
        h = next(t for t in spec["tests"] if t["id"] == d.id)
        decided.append(
            Decided(
                decision=d,
                sensitivity=sensitivity(
                    h, pairs_of.get((d.study, d.config), []), failed.get((d.study, d.config), [])
                ),
            )
        )
    return Hypotheses(
        procedure=spec["procedure"],
        family_alpha=spec["family_alpha"],
        min_pairs=spec["min_pairs"],
        decisions=decided,
    )

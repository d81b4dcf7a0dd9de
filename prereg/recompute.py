"""The summary from the records as their files hold them, with the standard library alone: the one
home of the pairs, blocks, endpoints and counts that ``summary.json`` holds (``prereg.formats.summary.derive``
calls :func:`recompute` and reads its result into typed objects; the audit calls it on the raw
records of a folder), and its comparison with a stored ``summary.json`` (:func:`compare`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from prereg.attempts import (
    Completeness,
    Rec,
    analysed,
    completeness,
    failed_pairs,
    final_units,
    flow,
    peak,
    run_rows,
    unfinished,
)
from prereg.carryover import carry_over, order_cells, own_step_columns
from prereg.decisions import decide, sensitivity
from prereg.descriptive import Endpoint, Rows, valid
from prereg.designs import study_design
from prereg.factorial import design_of, factorial_effects
from prereg.hypotheses import Family, Pair, cpu_time_columns, identity_rule
from prereg.interference import flagged_pairs
from prereg.looks import LookResult, looks_reached, run_looks, sequential_decisions
from prereg.order import by_device, crossover, drift, positions
from prereg.planted import pair_columns, planted_rows
from prereg.replicates import replicate_rows, replicate_times, replicates_interval
from prereg.results import (
    Decided,
    Descriptive,
    FactorialResult,
    FinalMetric,
    Hypotheses,
    PairedResult,
    RecordCounts,
    StudyResult,
    Summary,
    TimeToTarget,
    TrainingTime,
)

REL_TOL = 1e-9
#: ``summary.json`` schema versions this audit recomputes (``prereg.formats.summary.SUMMARY_SCHEMA``).
SUMMARY_SCHEMAS = (4,)


def summary_of(
    protocol: Mapping[str, Any], records: Sequence[Rec], started: Sequence[Row] | None = None
) -> Summary:
    """The summary (``summary.json`` without its seal, typed), of ``protocol`` (the protocol summary
    the records name) from the records as their files hold them and the ledger's started entries
    alone, by the rules :mod:`prereg.formats.summary` states (which records count: :mod:`.attempts`)."""
    ok, seen = _ok_units(records)
    exclusions: list[dict[str, str]] = []
    done = completeness(records)
    studies, pairs_of = _studies(protocol, ok, seen, exclusions)
    hyp, done = _hypotheses(records, protocol, pairs_of, done)
    return Summary(
        schema_version=SUMMARY_SCHEMAS[-1],
        protocol=protocol,
        records=_record_counts(records, started),
        completeness=done,
        hypotheses=hyp,
        flow=flow(records, _used_units(studies), protocol),
        exclusions=sorted(exclusions, key=lambda e: e["unit"]),
        studies=studies,
        runs=run_rows(records),
        planted=planted_rows(protocol["studies"], pairs_of)
        if any(st.get("planted") for st in protocol["studies"])
        else None,
        replicates=replicate_rows(
            protocol["studies"], pairs_of, protocol["interval_level"], replicate_times(records)
        )
        if protocol.get("replicates")
        else None,
    )


def recompute(records: Sequence[Rec], started: Sequence[Row] | None = None) -> dict[str, Any]:
    """The summary as ``summary.json`` holds it (:func:`summary_of` of the records' protocol, as
    JSON): what the audit compares with a folder's stored file (:func:`compare`)."""
    return summary_of(records[0]["protocol"], records, started).to_json()


_Units = dict[tuple[str, str], dict[str, dict[str, Rec]]]
_Pairs = dict[tuple[str, str], list[dict[str, Any]]]
#: A pair's unit and its two arms' ``timings`` (what the stall rule reads).
_ArmTimings = tuple[str, Rec, Rec]
#: A row of JSON (a started entry, as its file holds it).
Row = Mapping[str, Any]


def _ok_units(records: Sequence[Rec]) -> tuple[_Units, dict[tuple[str, str], set[str]]]:
    """The analysed ok records by (study, config), unit and role, and every unit seen per (study, config)."""
    ok: _Units = {}
    seen: dict[tuple[str, str], set[str]] = {}
    for r in sorted(analysed(records), key=lambda x: x["attempt"]):
        s = r["spec"]
        seen.setdefault((s["study"], s["config"]), set()).add(s["unit"])
        if r["status"] == "ok":
            ok.setdefault((s["study"], s["config"]), {}).setdefault(s["unit"], {})[s["role"]] = r
    return ok, seen


def _studies(
    proto: Mapping[str, Any],
    ok: _Units,
    seen: dict[tuple[str, str], set[str]],
    exclusions: list[dict[str, str]],
) -> tuple[list[StudyResult], _Pairs]:
    """The summary's ``studies`` (one entry a config with units) and each paired config's pairs."""
    studies = []
    pairs_of: _Pairs = {}
    for st in proto["studies"]:
        entries: list[PairedResult | FactorialResult] = []
        for config in st["configs"]:
            units = {
                u: ok.get((st["name"], config), {}).get(u, {})
                for u in sorted(seen.get((st["name"], config), set()))
            }
            if not units:
                continue
            if study_design(st).pairwise:
                paired, pairs = _paired(st, config, units, exclusions, bool(proto.get("replicates")))
                pairs_of[(st["name"], config)] = pairs
                entries.append(paired)
            else:
                entries.append(_factorial(st, config, units, exclusions))
        studies.append(StudyResult(name=st["name"], design=st["design"], configs=entries))
    return studies, pairs_of


def _used_units(studies: list[StudyResult]) -> set[str]:
    """The units of every used pair and block."""
    return {p.unit for st in studies for c in st.paired_configs() for p in c.pairs} | {
        b["unit"] for st in studies for c in st.factorial_configs() for b in c.blocks
    }


def _hypotheses(
    records: Sequence[Rec], proto: Mapping[str, Any], pairs_of: _Pairs, done: Completeness
) -> tuple[Hypotheses | Descriptive, Completeness]:
    """The summary's ``hypotheses`` and the completeness (which a sequential stop rewrites)."""
    spec = proto.get("hypotheses") or {"descriptive": "these records predate preregistered hypotheses"}
    if "descriptive" in spec:
        return Descriptive(descriptive=spec["descriptive"]), done
    failed = failed_pairs(records)
    # identical pairs are decided by the rule their records were written under: the exact
    # sign test from schema 5, identity (p = 0) in schema 4, not reached before
    identity = identity_rule([r.get("schema_version", 1) for r in records])
    family = Family.of(spec)
    sequential = None
    if family.sequential is not None:
        looks = run_looks(family, pairs_of, looks_reached(proto, family, final_units(records)), identity)
        done, sequential = _sequential(family, looks, done)
        decided = sequential_decisions(family, pairs_of, done, looks)
    else:
        decided = decide(family, pairs_of, done, identity, replicated=bool(proto.get("replicates")))
    tests = {t["id"]: t for t in reversed(spec["tests"])}  # the first of an id
    decisions = [
        Decided(
            decision=d,
            sensitivity=sensitivity(
                tests[d.id], pairs_of.get((d.study, d.config), []), failed.get((d.study, d.config), [])
            ),
        )
        for d in decided
    ]
    hyp = Hypotheses(
        procedure=spec["procedure"],
        family_alpha=spec["family_alpha"],
        min_pairs=spec["min_pairs"],
        decisions=decisions,
        sequential=sequential,
    )
    return hyp, done


def _record_counts(records: Sequence[Rec], started: Sequence[Row] | None) -> RecordCounts:
    """The summary's ``records``: the files by status, the unfinished runs, the device seconds."""
    status = [r["status"] for r in records]
    return RecordCounts(
        files=len(records),
        ok=status.count("ok"),
        failed=status.count("failed"),
        interrupted=status.count("interrupted"),
        superseded=len(records) - len(analysed(records)),
        unfinished=unfinished(records, started or []),
        device_seconds=math.fsum((r.get("timings") or {}).get("device_s") or 0.0 for r in records),
    )


def _sequential(
    family: Family, looks: list[LookResult], done: Completeness
) -> tuple[Completeness, dict[str, object]]:
    """The summary's ``hypotheses.sequential`` (the design, every look taken, where the rule stopped)
    and the completeness, whose text says so when the rule stopped the study before its last look."""
    seq = family.sequential
    assert seq is not None
    last = looks[-1] if looks else None
    stop = last.stop if last is not None else None
    out: dict[str, object] = {
        "looks_planned": list(seq.looks),
        "spending": seq.spending,
        "futility_z": seq.futility_z,
        "looks": [lk.as_dict() for lk in looks],
        "stopped_at": last.look if stop is not None and last is not None else None,
        "stop": stop,
    }
    if stop in ("efficacy", "futility") and last is not None and done.missing_runs:
        done = Completeness(
            planned_runs=done.planned_runs,
            ok_runs=done.ok_runs,
            missing_runs=done.missing_runs,
            complete=done.complete,
            budget_stop=False,
            text=(
                f"STOPPED AT LOOK {last.look} OF {len(seq.looks)} by the preregistered sequential rule "
                f"({stop}, {last.pairs} pairs): {done.missing_runs} of {done.planned_runs} planned runs "
                "were not needed"
            ),
        )
    return done, out


def _paired(
    st: Mapping[str, Any],
    config: str,
    units: dict[str, dict[str, Rec]],
    exclusions: list[dict[str, str]],
    replicated: bool = False,
) -> tuple[PairedResult, list[dict[str, Any]]]:
    """A paired configuration's result, and its pairs' rows (what the decisions read); every
    interval at the level its study preregistered (the protocol summary's ``interval_level`` of
    the study, read here once: the rows, and so each interval and the result, carry it)."""
    rows, arm_timings = _pairs(units, exclusions)
    pairs = Rows(rows, st["interval_level"])

    def col(key: str) -> list[object]:
        return [p[key] for p in pairs]

    # both training times finite, positive
    timed = pairs.keep([p for p in rows if p["time_reduction_pct"] is not None])
    cpu_time = None  # when every pair recorded its training CPU time (records since lockstep)
    if rows and all("baseline_training_cpu_s" in p for p in pairs):
        cpu_time = _time_endpoint(pairs, "training_cpu_s", replicated)
    mb, mc = col("baseline_peak_memory_bytes"), col("candidate_peak_memory_bytes")
    cells, carry = _lockstep_model(st, units, pairs)
    warmup = None
    if st.get("warmup_steps") and rows and all("baseline_warmup_s" in p for p in pairs):
        warmup = _time_endpoint(pairs, "warmup_s")
    result = PairedResult(
        config=config,
        design=st["design"],
        level=pairs.level,
        parameters=params_of(units),
        baseline_arm=st["arms"][0],
        candidate_arm=st["arms"][1],
        units_seen=len(units),
        pairs_used=len(pairs),
        training_time=_time_endpoint(pairs, "training_s", replicated),
        time_to_target=_time_to_target(pairs),
        total_time=pairs.endpoint(col("baseline_total_s"), col("candidate_total_s"), "relative_reduction"),
        test_bpb=pairs.endpoint(col("baseline_test_bpb"), col("candidate_test_bpb"), "difference"),
        peak_memory=pairs.endpoint(mb, mc, "relative_reduction") if None not in mb + mc else None,
        counts=_counts(rows, timed.rows),
        order_effects={"crossover": crossover(timed), "drift": drift(timed)},
        by_device=by_device(timed),
        pairs=[Pair.of(p) for p in pairs],
        training_cpu_time=cpu_time,
        final_metric=_final_metric(st, pairs),
        order_cells=cells,
        carry_over=carry,
        warmup_time=warmup,
        interference=flagged_pairs(arm_timings),  # None for records from before the stall rule
    )
    return result, rows


def _final_metric(st: Mapping[str, Any], pairs: Rows[Row]) -> FinalMetric | None:
    """A command study's metric at each arm's last evaluation, compared as a difference (``None``
    for other studies, and without pairs)."""
    if "metric" not in st or not pairs:
        return None
    ep = pairs.endpoint(
        [p["baseline_final_metric"] for p in pairs],
        [p["candidate_final_metric"] for p in pairs],
        "difference",
    )
    return FinalMetric(**_own(ep), metric=st["metric"])


def _own(ep: Endpoint) -> dict[str, Any]:
    """An endpoint's fields, as they are (to build a result that extends it)."""
    return {f.name: getattr(ep, f.name) for f in fields(ep)}


def _pairs(
    units: dict[str, dict[str, Rec]], exclusions: list[dict[str, str]]
) -> tuple[list[dict[str, Any]], list[_ArmTimings]]:
    """The pairs of the units whose both arms have an ok record (the others go to ``exclusions``),
    and each pair's arms' timings, for the stall rule."""
    pairs = []
    arm_timings: list[_ArmTimings] = []
    for unit in sorted(units):
        arms = units[unit]
        missing = [x for x in ("baseline", "candidate") if x not in arms]
        if missing:
            exclusions.append({"unit": unit, "reason": f"no ok record for {', '.join(missing)}"})
            continue
        b, c = arms["baseline"], arms["candidate"]
        arm_timings.append((unit, b["timings"], c["timings"]))
        pairs.append(_pair_row(unit, b, c))
    return pairs, arm_timings


def _pair_row(unit: str, b: Rec, c: Rec) -> dict[str, object]:
    """One pair's row of the summary: both arms' figures and the pair's differences."""
    bt, ct = b["timings"], c["timings"]
    return {
        "unit": unit,
        "seed": b["spec"]["seed"],
        "order": min(b["spec"]["order"], c["spec"]["order"]),
        "first": "baseline" if b["spec"]["position"] == 0 else "candidate",
        "device": f"{(b.get('env') or {}).get('host', 'unknown host')} / "
        f"{(b.get('env') or {}).get('device_name', 'unknown device')}",
        "baseline_training_s": bt.get("training_s"),
        "candidate_training_s": ct.get("training_s"),
        **cpu_time_columns(bt, ct),
        "baseline_time_to_target_s": bt.get("time_to_target_s"),
        "candidate_time_to_target_s": ct.get("time_to_target_s"),
        "baseline_total_s": bt.get("total_s"),
        "candidate_total_s": ct.get("total_s"),
        "baseline_test_bpb": b.get("test_bpb"),
        "candidate_test_bpb": c.get("test_bpb"),
        "baseline_peak_memory_bytes": peak(b),
        "candidate_peak_memory_bytes": peak(c),
        **final_metric_columns(b, c),
        **pair_columns(b, c),
        **_step_columns(b, c),
        **own_step_columns(b, c),
        **({"replicate": b["spec"]["replicate"]} if b["spec"].get("replicate") else {}),
        "time_reduction_pct": 100.0 * (1.0 - float(ct["training_s"]) / float(bt["training_s"]))
        if valid(bt.get("training_s"), True) and valid(ct.get("training_s"), True)
        else None,
        "test_bpb_difference": float(c["test_bpb"]) - float(b["test_bpb"])
        if valid(b.get("test_bpb"), False) and valid(c.get("test_bpb"), False)
        else None,
    }


def _time_to_target(pairs: Rows[Row]) -> TimeToTarget:
    """The time-to-target endpoint over the pairs where both arms reached the target, with the
    count of pairs where each arm did not."""
    both = [
        p
        for p in pairs
        if p["baseline_time_to_target_s"] is not None and p["candidate_time_to_target_s"] is not None
    ]
    ep = pairs.endpoint(
        [p["baseline_time_to_target_s"] for p in both],
        [p["candidate_time_to_target_s"] for p in both],
        "relative_reduction",
    )
    return TimeToTarget(
        **_own(ep),
        rule="pairs where both arms reached the target",
        unreached={
            "baseline": sum(p["baseline_time_to_target_s"] is None for p in pairs),
            "candidate": sum(p["candidate_time_to_target_s"] is None for p in pairs),
        },
    )


def _counts(pairs: list[dict[str, Any]], timed: Sequence[Row]) -> dict[str, int]:
    """The paired entry's ``counts``: faster, slower and tied timed pairs, pairs with worse test bpb."""
    faster = sum(1 for p in timed if p["candidate_training_s"] < p["baseline_training_s"])
    slower = sum(1 for p in timed if p["candidate_training_s"] > p["baseline_training_s"])
    return {
        "faster": faster,
        "slower": slower,
        "ties": len(timed) - faster - slower,
        "worse_test_bpb": sum(1 for p in pairs if (p["test_bpb_difference"] or 0.0) > 0),
    }


def _step_columns(b: Rec, c: Rec) -> dict[str, object]:
    """The columns of a pair whose records keep their step times (built-in arms since planting;
    absent from earlier records, whose rows keep their columns): a lockstep pair's first-block arm,
    and each arm's warm-up time where the study has warm-up steps."""
    if "step_times" not in b or "step_times" not in c:
        return {}
    out: dict[str, Any] = {}
    if b["spec"].get("steps_first") is not None:
        out["steps_first"] = "baseline" if b["spec"]["steps_first"] else "candidate"
    if b["spec"].get("warmup_steps") and "warmup_s" in b["timings"]:  # a command arm's clock has none
        out["baseline_warmup_s"] = b["timings"].get("warmup_s")
        out["candidate_warmup_s"] = c["timings"].get("warmup_s")
    return out


def _lockstep_model(
    st: Mapping[str, object], units: dict[str, dict[str, Rec]], pairs: Rows[Row]
) -> tuple[dict[str, dict[str, object] | None] | None, dict[str, object] | None]:
    """A lockstep study's order-cell model per clock and its carry-over (:mod:`.carryover`), where
    its pairs' records keep their step times; ``None`` otherwise."""
    block = study_design(st).block_steps(st)
    if block is None or not pairs or not all("steps_first" in p for p in pairs):
        return None, None
    used = {p["unit"] for p in pairs}
    cells = {
        clock: order_cells(pairs, key) for key, clock in (("training_s", "wall"), ("training_cpu_s", "CPU"))
    }
    return cells, carry_over(pairs.keep([units[u] for u in sorted(used)]), int(block))


def final_metric_columns(b: Rec, c: Rec) -> dict[str, object]:
    """A command study's pair columns of the study's metric at each arm's last evaluation (none for
    other studies' pairs, whose rows keep their columns)."""
    if "command" not in b["spec"]:
        return {}
    return {"baseline_final_metric": b.get("final_metric"), "candidate_final_metric": c.get("final_metric")}


def _time_endpoint(pairs: Rows[Row], key: str, replicated: bool = False) -> TrainingTime:
    """A time's endpoint over the pairs (``baseline_<key>``, ``candidate_<key>``; relative reduction)
    with its log-ratio interval over the pairs whose two times are finite and positive. In a
    ``replicated`` protocol both intervals are the decision's, over the replicates' estimates
    (:func:`.replicates.replicates_interval`; ``replicates`` says over how many), never the pooled
    pairs' (which hold no spread between replicates)."""
    b, c = f"baseline_{key}", f"candidate_{key}"
    out = _own(pairs.endpoint([p[b] for p in pairs], [p[c] for p in pairs], "relative_reduction"))
    timed = [p for p in pairs if valid(p[b], True) and valid(p[c], True)]
    if not replicated:
        log_ratio = pairs.descriptive([p[b] for p in timed], [p[c] for p in timed], "log_ratio")
        return TrainingTime(**out, log_ratio=log_ratio)
    values_of: dict[int, list[float]] = {}
    for p in timed:
        if isinstance(p.get("replicate"), int):
            values_of.setdefault(p["replicate"], []).append(math.log(p[c]) - math.log(p[b]))
    out["interval"] = replicates_interval(values_of, pairs.level, "relative_reduction")
    log_ratio = replicates_interval(values_of, pairs.level, "log_ratio")
    return TrainingTime(**out, log_ratio=log_ratio, replicates=len(values_of))


def _factorial(
    st: Mapping[str, Any],
    config: str,
    units: dict[str, dict[str, Rec]],
    exclusions: list[dict[str, str]],
) -> FactorialResult:
    """A factorial configuration's result: its complete blocks, each cell's mean time, the factors'
    effects and the positions' diagnostics, at the level its study preregistered (read here once:
    the blocks, and so each interval and the result, carry it)."""
    factors, cells = design_of(st)
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
            blk[f"{c}_training_s"] = have[c]["timings"].get("training_s")
            blk[f"{c}_test_bpb"] = have[c].get("test_bpb")
        blocks.append(blk)
    means = {
        c: (math.fsum(b[f"{c}_training_s"] for b in blocks) / len(blocks) if blocks else None) for c in cells
    }
    found = {}
    used = Rows(blocks, st["interval_level"])
    if len(blocks) >= 2:
        times = used.keep([{c: b[f"{c}_training_s"] for c in cells} for b in blocks])
        for name, effect in factorial_effects(times, factors, cells).items():
            found[name] = {
                **effect.as_dict(),
                "reduction_pct": 100.0 * (1.0 - math.exp(effect.estimate)),
                "reduction_low_pct": 100.0 * (1.0 - math.exp(effect.high)),
                "reduction_high_pct": 100.0 * (1.0 - math.exp(effect.low)),
            }
    return FactorialResult(
        config=config,
        design=st["design"],
        level=used.level,
        units_seen=len(units),
        parameters=params_of(units),
        positions=positions(used, cells),
        blocks_used=len(blocks),
        cell_mean_training_s=means,
        effects=found,
        blocks=blocks,
    )


def params_of(units: dict[str, dict[str, Rec]]) -> int | None:
    """The first record's parameter count among a configuration's units, or ``None``."""
    for arms in units.values():
        for r in arms.values():
            if r.get("parameters") is not None:
                return int(r["parameters"])
    return None


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
    if mine != theirs or isinstance(mine, bool) != isinstance(theirs, bool):  # true is not 1 in JSON
        problems.append(f"{where}: field {path} = {theirs!r}, recomputed {mine!r}")
    return 1

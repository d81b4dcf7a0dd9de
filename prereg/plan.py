"""What the protocol file alone implies: the plan (the rule's one home: :func:`plan_from_protocol`,
which ``harness.plan.make_plan`` calls and the audit runs on the tagged file), the protocol summary
every record copies, and the tally of planned runs against their records."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from prereg.attempts import analysed, latest_unit, redrawn
from prereg.commands import ROLES, commands_of, label_sha256, metric_of
from prereg.designs.base import STEPS_SECOND
from prereg.formats.record import SCHEMA_VERSION
from prereg.hypotheses import Family
from prereg.protocol.model import Protocol, Study
from prereg.protocol.schema import named_defaults
from prereg.replicates import replicate_of

#: The top-level protocol keys that may be left out and that every record names when they are, and
#: what each then is (docs/your-change.md, "A minimal protocol"): the keys whose origin is
#: :data:`prereg.protocol.schema.NAMED` in :data:`prereg.protocol.schema.TOP`, where each key is
#: declared once. ``harness plan`` and ``harness run`` and the audit read a protocol with the same
#: reader (:func:`prereg.protocol.read.protocol_of`), which fills in these values, and every record
#: names the keys that took them (``protocol.defaults``).
PROTOCOL_DEFAULTS: dict[str, Any] = named_defaults()

#: One planned run: the JSON of a ``prereg.formats.record.RunSpec`` (:func:`plan_from_protocol`; its fields
#: are the design's, the command study's and the study's, so the spec's reader types it).
PlannedRun = dict[str, object]


def study_level(own: float | None, top_level: float) -> float:
    """A study's interval level (the rule's one home): its own ``interval_level`` where it sets
    one, else the protocol's (which itself defaults to :data:`PROTOCOL_DEFAULTS`'s)."""
    return float(own) if own else top_level


def defaults_text(keys: list[str]) -> str:
    """The left-out keys and the defaults they took, as harness plan, harness run and report.md
    state them: ``device cpu, compile false, ...`` (hypotheses: descriptive)."""

    def shown(k: str) -> str:
        v = PROTOCOL_DEFAULTS[k]
        if k == "hypotheses":
            return "descriptive (no decision)"
        if isinstance(v, bool):
            return "true" if v else "false"
        return '""' if v == "" else str(v)

    return ", ".join(f"{k} {shown(k)}" for k in keys)


def plan_from_protocol(
    spec: Protocol, protocol_sha: str, config_sha: Mapping[str, str], schema: int = SCHEMA_VERSION
) -> list[PlannedRun]:
    """The plan of the typed protocol ``spec`` (:func:`prereg.protocol.read.protocol_of`): balanced
    pair orders, lockstep orders (build order crossed with who steps first, all four combinations per
    group of four pairs), Williams-balanced blocks (harness.plan's docstring says how); each run as the
    JSON of a ``prereg.formats.record.RunSpec``, as records schema ``schema`` writes it (its ``design``:
    :meth:`prereg.designs.base.Design.recorded_as`)."""

    def rng(*parts: object) -> random.Random:
        return random.Random(":".join(str(p) for p in (spec.order_seed, *parts)))

    runs: list[PlannedRun] = []
    for st in spec.studies:
        _study_runs(spec, st, rng, protocol_sha, config_sha, runs, schema)
    if spec.schedule == "interleaved":
        runs = _interleaved(runs, rng("interleaved"))
    return runs


def _study_runs(
    spec: Protocol,
    st: Study,
    rng: Callable[..., random.Random],
    protocol_sha: str,
    config_sha: Mapping[str, str],
    runs: list[PlannedRun],
    schema: int,
) -> None:
    """Append one study's runs to ``runs`` (seed by seed, config by config, in each unit's order)."""
    targets, commands = _targets_and_commands(st)
    arms = list(ROLES) if st.commands else st.arms
    design = st.design
    orders = {config: design.orders(st, config, len(st.seeds), rng) for config in st.configs}
    for si, seed in enumerate(st.seeds):
        for config in st.configs:
            unit = design.unit_id(st.name, config, si)
            roles = [r for r in orders[config][si] if r != STEPS_SECOND]
            second = STEPS_SECOND in orders[config][si]
            for pos, role in enumerate(roles):
                runs.append(
                    {
                        **design.run_fields(st, unit, roles, pos, second),
                        **_run_extra(spec, st, role, si),
                        **commands.get(role, {}),
                        "run_id": f"{unit}.{role}",
                        "protocol_id": spec.id,
                        "protocol_sha256": protocol_sha,
                        "study": st.name,
                        "design": design.recorded_as(schema),
                        "config": config,
                        "config_sha256": label_sha256(config) if st.commands else config_sha[config],
                        "arm": design.arm_of(st, role, arms),
                        "role": role,
                        "seed": seed,
                        "unit": unit,
                        "position": pos,
                        "order": len(runs),
                        **_run_common(spec, st, targets[config]),
                    }
                )


def _targets_and_commands(st: Study) -> tuple[dict[str, float], dict[str, dict[str, object]]]:
    """A study's target per configuration (a command study's: its metric's), and a command study's
    arm and metric by role (none for built-in arms)."""
    metric = metric_of(st.metric) if st.commands and st.metric is not None else None
    target = metric["target"] if metric is not None else st.val_target_bpb
    targets = {c: _number(target[c] if isinstance(target, dict) else target) for c in st.configs}
    if metric is None:
        return targets, {}
    return targets, {role: {"command": arm, "metric": metric} for role, arm in commands_of(st.arms).items()}


def _number(value: object) -> float:
    """A validation target as a float (TypeError naming it where it is not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a validation target is a number, got {value!r}")
    return float(value)


#: A planned run's optional fields (:func:`_run_extra`): a record may hold one only where its plan does.
OPTIONAL_SPEC = ("planted", "warmup_steps", "replicate")


def _run_extra(spec: Protocol, st: Study, role: str, si: int) -> dict[str, object]:
    """A run's optional fields (:data:`OPTIONAL_SPEC`): the candidate's plant, the warm-up steps,
    the replicate."""
    return {
        **({"planted": dict(st.planted)} if st.planted and role == "candidate" else {}),
        **({"warmup_steps": st.warmup_steps} if st.warmup_steps else {}),
        **(
            {"replicate": replicate_of(si, len(st.seeds), spec.replicates["count"])}
            if spec.replicates
            else {}
        ),
    }


def _run_common(spec: Protocol, st: Study, target: float) -> dict[str, object]:
    """A run's fields that every run of the study shares (its steps, target, corpus, machine)."""
    return {
        "steps": st.steps,
        "val_every": st.val_every,
        "val_target_bpb": target,
        "corpus": spec.corpus["name"] if isinstance(spec.corpus, dict) else spec.corpus,
        "data_dir": spec.data_dir,
        "device": spec.device,
        "compile": spec.compile,
        "threads": spec.threads,
    }


def _interleaved(runs: list[PlannedRun], r: random.Random) -> list[PlannedRun]:
    """``schedule: interleaved``: the units of every study in one seeded random order (each unit's
    runs kept together and in their order), so that the studies meet the machine's load of one time
    window alike; ``order`` numbered again."""
    units: dict[object, list[PlannedRun]] = {}
    for run in runs:
        units.setdefault(run["unit"], []).append(run)
    order = list(units)
    r.shuffle(order)
    out = [run for u in order for run in units[u]]
    return [{**run, "order": i} for i, run in enumerate(out)]


def _resolved_tests(h: Mapping[str, Any]) -> dict[str, object]:
    """The protocol summary's ``hypotheses``: the typed protocol's resolved block, in the order of
    the keys every record holds, typed once more by :meth:`prereg.hypotheses.Family.of`."""
    if "descriptive" in h:
        return {"descriptive": h["descriptive"]}
    tests = [
        {
            **{
                k: t[k] for k in ("id", "study", "config", "endpoint", "estimand", "type", "margin", "better")
            },
            **{k: t[k] for k in ("censoring", "period_adjusted", "restriction_s")},
            **({"test": t["test"]} if t.get("test") is not None else {}),
        }
        for t in h["tests"]
    ]
    out = {
        "procedure": h["procedure"],
        "family_alpha": h["family_alpha"],
        "min_pairs": h["min_pairs"],
        "decide_time_after_budget_stop": h["decide_time_after_budget_stop"],
        "tests": tests,
        **({"sequential": h["sequential"]} if h.get("sequential") is not None else {}),
    }
    Family.of(out)  # refuses (ValueError, naming the hypothesis and key) what harness plan refuses
    return out


def expected_summary(spec: Protocol, psha: str, path: str, schema: int = SCHEMA_VERSION) -> dict[str, object]:
    """``harness.protocol.Protocol.summary()``, derived here from the typed protocol alone (the
    fields every record's ``protocol`` copies; plug-ins and the tag's fields are checked apart).
    Left-out keys took their defaults (:data:`PROTOCOL_DEFAULTS`), named under ``defaults``."""
    return {
        "id": spec.id,
        "version": spec.version,
        "sha256": psha,
        "path": path,
        "preregistered": spec.preregistered,
        "tag": spec.tag_name if spec.preregistered else None,
        "interval_level": spec.interval_level,
        "hypotheses": _resolved_tests(spec.hypotheses),
        "max_attempts": spec.max_attempts,
        "launcher": spec.launcher,
        "device": spec.device,
        "compile": spec.compile,
        "corpus": _corpus_summary(spec.corpus),
        "budget_device_seconds": spec.budget_device_seconds,
        **({"schedule": spec.schedule} if spec.schedule != "in_order" else {}),
        **({"replicates": dict(spec.replicates)} if spec.replicates else {}),
        **({"defaults": list(spec.defaults)} if spec.defaults else {}),
        "studies": [_study_summary(st, schema) for st in spec.studies],
    }


def _study_summary(st: Study, schema: int) -> dict[str, object]:
    """One study's entry of the protocol summary (:func:`expected_summary`)."""
    declared: dict[str, object] = {}
    if st.commands and st.metric is not None:  # the reader made sure a command study has one
        declared = {"commands": commands_of(st.arms), "metric": metric_of(st.metric)}
    arms = st.design.summary_arms(st, list(ROLES) if st.commands else st.arms)
    if arms is None:
        raise ValueError(f"study {st.name}: a paired study names its two arms (arms)")
    return {
        "name": st.name,
        "design": st.design.recorded_as(schema),
        "arms": list(arms),
        "configs": list(st.configs),
        "seeds": list(st.seeds),
        "interval_level": st.interval_level,
        "steps": st.steps,
        **st.design.summary_fields(st),
        **({"planted": dict(st.planted)} if st.planted else {}),
        **({"warmup_steps": st.warmup_steps} if st.warmup_steps else {}),
        **declared,
    }


def _corpus_summary(corpus: str | Mapping[str, Any]) -> str | dict[str, object]:
    """The protocol summary's ``corpus``: its name, or its name, files and split."""
    if isinstance(corpus, str):
        return corpus
    c: dict[str, object] = {"name": corpus["name"]}
    for k in ("file", "train", "valid", "test"):
        if k in corpus:
            c[k] = {"path": corpus[k]["path"], "size": corpus[k]["size"], "sha256": corpus[k]["sha256"]}
    if "split" in corpus:
        c["split"] = {s: float(corpus["split"][s]) for s in ("train", "valid", "test")}
    return c


class TallyRow(TypedDict):
    """One (study, configuration, arm) of :func:`tally`: its planned runs and what became of them."""

    study: str
    config: str
    arm: str
    planned: int
    ok: int
    failed: int
    interrupted: int
    missing: int
    superseded: int


def tally(
    plan: list[dict[str, Any]], records: list[dict[str, Any]], open_: list[dict[str, Any]] | None = None
) -> tuple[list[TallyRow], int, list[str]]:
    """Per (study, configuration, arm): planned, ok (in the analysed unit attempt), failed, interrupted
    (recorded, or started with no record), missing, superseded; and out-of-order runs."""
    statuses, interrupted, superseded = _run_outcomes(records, open_ or [])
    rows: dict[tuple[str, str, str], TallyRow] = {}
    missing_total = 0
    for s in plan:
        key = (s["study"], s["config"], s["arm"])
        row = rows.setdefault(key, _empty_row(*key))
        st = statuses.get(s["run_id"], [])
        row["planned"] += 1
        row["interrupted"] += interrupted.get(s["run_id"], 0)
        row["superseded"] += superseded.get(s["run_id"], 0)
        if "ok" in st:
            row["ok"] += 1
        elif "failed" in st:
            row["failed"] += 1
        if "ok" not in st:
            row["missing"] += 1
            missing_total += 1
    return list(rows.values()), missing_total, _out_of_order(plan, records)


def _empty_row(study: str, config: str, arm: str) -> TallyRow:
    """A :class:`TallyRow` before its first run is counted."""
    return TallyRow(
        study=study, config=config, arm=arm, planned=0, ok=0, failed=0, interrupted=0, missing=0, superseded=0
    )


def _run_outcomes(
    records: list[dict[str, Any]], open_: list[dict[str, Any]]
) -> tuple[dict[str, list[str]], dict[str, int], dict[str, int]]:
    """By run id: each record's status (``superseded`` for one outside the analysed unit attempt,
    :func:`prereg.attempts.analysed`), how many attempts were interrupted (recorded so, or started
    with no record: ``open_``) and how many were superseded."""
    statuses: dict[str, list[str]] = {}
    interrupted: dict[str, int] = {}
    superseded: dict[str, int] = {}
    current = {id(r) for r in analysed(records)}
    for r in records:
        rid = r["spec"]["run_id"]
        statuses.setdefault(rid, []).append(r["status"] if id(r) in current else "superseded")
        interrupted[rid] = interrupted.get(rid, 0) + (r["status"] == "interrupted")
        if id(r) not in current:
            superseded[rid] = superseded.get(rid, 0) + 1
    for u in open_:
        interrupted[u["run_id"]] = interrupted.get(u["run_id"], 0) + 1
    return statuses, interrupted, superseded


def _out_of_order(plan: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[str]:
    """Each first attempt that the chain shows ran after a run later in the plan's order, within its
    replicate: a replicated protocol runs one replicate per ``harness run --replicate K``, in plan
    order among its own runs, and its runs interleave with the other replicates' in the plan."""
    order = {s["run_id"]: (s.get("replicate"), s["order"]) for s in plan}
    flagged: list[str] = []
    highest: dict[Any, int] = {}
    linked = sorted(
        (r for r in records if "ledger" in r and r["attempt"] == 1), key=lambda r: r["ledger"]["seq"]
    )
    for r in linked:
        rep, o = order.get(r["spec"]["run_id"], (None, -1))
        top = highest.get(rep, -1)
        if o < top:
            where = "" if rep is None else f" of replicate {rep}"
            flagged.append(f"{r['spec']['run_id']} (plan position {o}) ran after plan position {top}{where}")
        highest[rep] = max(top, o)
    return flagged


def plan_notes(
    directory: str, plan: list[dict[str, Any]], records: list[dict[str, Any]], open_: list[dict[str, Any]]
) -> list[str]:
    """Per study, configuration and arm: planned, ok, failed, interrupted, missing and superseded runs;
    runs out of plan order; units that ran again whole; whether the study is incomplete."""
    table, missing, flagged = tally(plan, records, open_)
    notes = [
        f"{directory}: {t['study']} / {t['config']} / {t['arm']}: planned {t['planned']}, "
        f"ok {t['ok']}, failed {t['failed']}, interrupted {t['interrupted']}, "
        f"missing {t['missing']}, superseded {t['superseded']}"
        for t in table
    ]
    notes.extend(f"{directory}: out of plan order: {x}" for x in flagged)
    notes.extend(f"{directory}: {x}" for x in _again_notes(records))
    if missing:
        notes.append(f"{directory}: {_incomplete_text(records, missing, len(plan))}")
    return notes


def _again_notes(records: list[dict[str, Any]]) -> list[str]:
    """The runs drawn again: each unit that ran again whole (analysed from its latest unit attempt),
    and the runs analysed from a later attempt (:func:`prereg.attempts.redrawn`)."""
    notes = []
    latest = latest_unit(records)
    for unit in sorted(u for u, k in latest.items() if k > 1):
        n = sum(1 for r in records if r["spec"]["unit"] == unit and r.get("unit_attempt", 1) < latest[unit])
        notes.append(
            f"unit {unit} ran again whole: analysed from its unit attempt "
            f"{latest[unit]}; {n} superseded attempt(s) kept"
        )
    again = redrawn(records)
    if again:
        shown = ", ".join(again[:3]) + (f" and {len(again) - 3} more" if len(again) > 3 else "")
        notes.append(
            f"REDRAWN: {len(again)} run(s) analysed from a later attempt ({shown}): an "
            "earlier attempt of each started and is not the one analysed, so its outcome (the "
            "checkpoint, the log) could have been seen before the run was drawn again"
        )
    return notes


def _incomplete_text(records: Sequence[Mapping[str, object]], missing: int, planned: int) -> str:
    """Why ``missing`` of ``planned`` runs have no ok record: the summary's completeness text where a
    rule explains the stop (STOPPED BY THE BUDGET RULE, AT A LOOK) and counts the same runs, else
    INCOMPLETE."""
    from prereg.recompute import recompute  # the completeness the summary states, a sequential stop's too

    done = recompute(records)["completeness"] if records else None
    text = done["text"] if done and done["missing_runs"] == missing else None
    return text or f"INCOMPLETE: {missing} of {planned} planned runs have no ok record"

"""What the protocol file alone implies: the plan (the rule's one home: :func:`plan_from_protocol`,
which ``harness.plan.make_plan`` calls and the audit runs on the tagged file), the protocol summary
every record copies, and the tally of planned runs against their records."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prereg.attempts import analysed, latest_unit, redrawn
from prereg.commands import ROLES, commands_of, is_command_study, label_sha256, metric_of
from prereg.designs import study_design
from prereg.designs.base import STEPS_SECOND
from prereg.hypotheses import Family
from prereg.records import SCHEMA_VERSION
from prereg.replicates import replicate_of
from prereg.sequential import looks_problems

#: The top-level protocol keys that may be left out, and what each then is (docs/your-change.md,
#: "A minimal protocol"). The one home of these defaults: ``harness plan`` and ``harness run``
#: (:func:`harness.protocol.load_protocol`) and the audit's reader of the tagged file
#: (:func:`with_defaults`, in :func:`plan_from_protocol`, :func:`expected_summary` and
#: ``prereg.tag.load_truth``) fill in the same values, and every record names the keys that took
#: them (``protocol.defaults``). Each claims nothing a user did not write: no preregistration, no
#: hypothesis tested, the CPU, eager mode, the embedded corpus (no download; read only by built-in
#: arms). The budget has no safe default (it is the study's stop) and stays required.
PROTOCOL_DEFAULTS: dict[str, Any] = {
    "version": 1,
    "description": "",
    "preregistered": False,
    "corpus": "pydoc-topics",
    "device": "cpu",
    "compile": False,
    "interval_level": 0.95,
    "hypotheses": {"descriptive": "no hypotheses declared: intervals only, no decision (the default)"},
    "order_seed": 0,
}


def with_defaults(doc: dict[str, Any]) -> dict[str, Any]:
    """The protocol document with each left-out key of :data:`PROTOCOL_DEFAULTS` filled in, and
    ``defaults`` listing those keys (sorted; absent when none was left out). Applying it twice
    gives the same document."""
    if "defaults" in doc:
        return doc
    missing = sorted(k for k in PROTOCOL_DEFAULTS if k not in doc)
    if not missing:
        return doc
    import copy

    return {**doc, **{k: copy.deepcopy(PROTOCOL_DEFAULTS[k]) for k in missing}, "defaults": missing}


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
    doc: dict[str, Any], protocol_sha: str, config_sha: dict[str, Any], schema: int = SCHEMA_VERSION
) -> list[dict[str, Any]]:
    """The plan: balanced pair orders, lockstep orders (build order crossed with who steps first,
    all four combinations per group of four pairs), Williams-balanced blocks (harness.plan's
    docstring says how); each run as the JSON of a ``prereg.records.RunSpec``, as records schema
    ``schema`` writes it (its ``design``: :meth:`prereg.designs.base.Design.recorded_as`)."""
    import random

    doc = with_defaults(doc)

    def rng(*parts: object) -> random.Random:
        return random.Random(":".join(str(p) for p in (doc["order_seed"], *parts)))

    runs: list[dict[str, Any]] = []
    for st in doc["studies"]:
        _study_runs(doc, st, rng, protocol_sha, config_sha, runs, schema)
    if doc.get("schedule", "in_order") == "interleaved":
        runs = _interleaved(runs, rng("interleaved"))
    return runs


def _seeds(st: dict[str, Any]) -> list[Any]:
    """A study's seeds: its list, or ``count`` seeds from ``base``."""
    seeds = st["seeds"]
    if isinstance(seeds, dict):
        return list(range(seeds["base"], seeds["base"] + seeds["count"]))
    return list(seeds)


def _study_runs(
    doc: dict[str, Any],
    st: dict[str, Any],
    rng: Callable[..., Any],
    protocol_sha: str,
    config_sha: dict[str, Any],
    runs: list[dict[str, Any]],
    schema: int,
) -> None:
    """Append one study's runs to ``runs`` (seed by seed, config by config, in each unit's order)."""
    seeds = _seeds(st)
    command = is_command_study(st)
    target = metric_of(st["metric"])["target"] if command else st["val_target_bpb"]
    targets = {c: float(target[c] if isinstance(target, dict) else target) for c in st["configs"]}
    arms: Any = list(ROLES) if command else st.get("arms")
    commands = (
        {role: {"command": arm, "metric": metric_of(st["metric"])} for role, arm in commands_of(st).items()}
        if command
        else {}
    )
    design = study_design(st)
    orders = {config: design.orders(st, config, len(seeds), rng) for config in st["configs"]}
    for si, seed in enumerate(seeds):
        for config in st["configs"]:
            unit = design.unit_id(st["name"], config, si)
            roles = [r for r in orders[config][si] if r != STEPS_SECOND]
            second = STEPS_SECOND in orders[config][si]
            for pos, role in enumerate(roles):
                arm = design.arm_of(st, role, arms)
                runs.append(
                    {
                        **design.run_fields(st, unit, roles, pos, second),
                        **_run_extra(doc, st, role, si, len(seeds)),
                        **commands.get(role, {}),
                        "run_id": f"{unit}.{role}",
                        "protocol_id": doc["id"],
                        "protocol_sha256": protocol_sha,
                        "study": st["name"],
                        "design": design.recorded_as(schema),
                        "config": config,
                        "config_sha256": label_sha256(config) if command else config_sha[config],
                        "arm": arm,
                        "role": role,
                        "seed": seed,
                        "unit": unit,
                        "position": pos,
                        "order": len(runs),
                        **_run_common(doc, st, command, targets[config]),
                    }
                )


#: A planned run's optional fields (:func:`_run_extra`): a record may hold one only where its plan does.
OPTIONAL_SPEC = ("planted", "warmup_steps", "replicate")


def _run_extra(doc: dict[str, Any], st: dict[str, Any], role: str, si: int, n_seeds: int) -> dict[str, Any]:
    """A run's optional fields (:data:`OPTIONAL_SPEC`): the candidate's plant, the warm-up steps,
    the replicate."""
    return {
        **({"planted": dict(st["planted"])} if st.get("planted") and role == "candidate" else {}),
        **({"warmup_steps": st["warmup_steps"]} if st.get("warmup_steps") else {}),
        **(
            {"replicate": replicate_of(si, n_seeds, doc["replicates"]["count"])}
            if doc.get("replicates")
            else {}
        ),
    }


def _run_common(doc: dict[str, Any], st: dict[str, Any], command: bool, target: float) -> dict[str, Any]:
    """A run's fields that every run of the study shares (its steps, target, corpus, machine)."""
    return {
        "steps": st["steps"],
        "val_every": st["steps"] if command else st["val_every"],
        "val_target_bpb": target,
        "corpus": doc["corpus"]["name"] if isinstance(doc["corpus"], dict) else doc["corpus"],
        "data_dir": doc.get("data_dir"),
        "device": doc["device"],
        "compile": doc["compile"],
        "threads": doc.get("threads"),
    }


def _interleaved(runs: list[dict[str, Any]], r: Any) -> list[dict[str, Any]]:
    """``schedule: interleaved``: the units of every study in one seeded random order (each unit's
    runs kept together and in their order), so that the studies meet the machine's load of one time
    window alike; ``order`` numbered again."""
    units: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        units.setdefault(run["unit"], []).append(run)
    order = list(units)
    r.shuffle(order)
    out = [run for u in order for run in units[u]]
    return [{**run, "order": i} for i, run in enumerate(out)]


def _resolved_tests(h: dict[str, Any], studies: list[dict[str, Any]]) -> dict[str, Any]:
    if "descriptive" in h:
        return {"descriptive": h["descriptive"]}
    by_name = {s["name"]: s for s in studies}
    tests = []
    for t in h["tests"]:
        cfg = t.get("config")
        if cfg is None:
            cfg = by_name[t["study"]]["configs"][0]
        tests.append(
            {
                "id": t["id"],
                "study": t["study"],
                "config": cfg,
                "endpoint": t["endpoint"],
                "estimand": t["estimand"],
                "type": t["type"],
                "margin": float(t.get("margin", 0.0)),
                "better": t["better"],
                "censoring": t.get("censoring"),
                "period_adjusted": t.get("period_adjusted", False),
                "restriction_s": float(t["restriction_s"]) if t.get("restriction_s") is not None else None,
                **({"test": t["test"]} if t.get("test") is not None else {}),
            }
        )
    out = {
        "procedure": h["procedure"],
        "family_alpha": float(h["family_alpha"]),
        "min_pairs": h["min_pairs"],
        "decide_time_after_budget_stop": bool(h.get("decide_time_after_budget_stop", False)),
        "tests": tests,
        **({"sequential": h["sequential"]} if h.get("sequential") is not None else {}),
    }
    if h.get("sequential") is not None:
        wrong = looks_problems(
            h["sequential"],
            [len(by_name[t["study"]]["seeds"]) for t in tests],
            int(h["min_pairs"]),
            [t["study"] for t in tests],
        )
        if wrong:
            key = wrong[0][0] if wrong[0][0] == "sequential" else f"sequential.{wrong[0][0]}"
            raise ValueError(f"hypotheses: {key}: {wrong[0][1]}")
    Family.of(out)  # refuses (ValueError, naming the hypothesis and key) what harness plan refuses
    return out


def expected_summary(
    doc: dict[str, Any], psha: str, path: str, schema: int = SCHEMA_VERSION
) -> dict[str, Any]:
    """``harness.protocol.Protocol.summary()``, derived here from the protocol file alone (the
    fields every record's ``protocol`` copies; plug-ins and the tag's fields are checked apart), as
    records schema ``schema`` writes it. Left-out keys take :data:`PROTOCOL_DEFAULTS`, named under
    ``defaults``."""
    doc = with_defaults(doc)
    top_level = float(doc["interval_level"])
    studies = [_study_summary(st, top_level, schema) for st in doc["studies"]]
    corpus = _corpus_summary(doc["corpus"])
    prereg = doc["preregistered"]
    return {
        "id": doc["id"],
        "version": doc["version"],
        "sha256": psha,
        "path": path,
        "preregistered": prereg,
        "tag": f"protocol-{doc['id']}" if prereg else None,
        "interval_level": top_level,
        "hypotheses": _resolved_tests(doc["hypotheses"], studies),
        "max_attempts": doc.get("max_attempts", 1),
        "launcher": doc.get("launcher", "spawn"),
        "device": doc["device"],
        "compile": doc["compile"],
        "corpus": corpus,
        "budget_device_seconds": float(doc["budget_device_seconds"]),
        **({"schedule": doc["schedule"]} if doc.get("schedule", "in_order") != "in_order" else {}),
        **({"replicates": dict(doc["replicates"])} if doc.get("replicates") else {}),
        **({"defaults": list(doc["defaults"])} if doc.get("defaults") else {}),
        "studies": studies,
    }


def _study_summary(st: dict[str, Any], top_level: float, schema: int) -> dict[str, Any]:
    """One study's entry of the protocol summary (:func:`expected_summary`)."""
    seeds = _seeds(st)
    arms = list(ROLES) if is_command_study(st) else st.get("arms")
    declared: dict[str, Any] = {}
    if is_command_study(st):
        declared = {"commands": commands_of(st), "metric": metric_of(st["metric"])}
    design = study_design(st)
    arms = design.summary_arms(st, arms)
    if arms is None:
        raise ValueError(f"study {st['name']}: a paired study names its two arms (arms)")
    return {
        "name": st["name"],
        "design": design.recorded_as(schema),
        "arms": list(arms),
        "configs": list(st["configs"]),
        "seeds": list(seeds),
        "interval_level": study_level(st.get("interval_level"), top_level),
        "steps": st["steps"],
        **design.summary_fields(st),
        **({"planted": dict(st["planted"])} if st.get("planted") else {}),
        **({"warmup_steps": st["warmup_steps"]} if st.get("warmup_steps") else {}),
        **declared,
    }


def _corpus_summary(corpus: Any) -> Any:
    """The protocol summary's ``corpus``: its name, or its name, files and split."""
    if isinstance(corpus, dict):
        c: dict[str, Any] = {"name": corpus["name"]}
        for k in ("file", "train", "valid", "test"):
            if k in corpus:
                c[k] = {"path": corpus[k]["path"], "size": corpus[k]["size"], "sha256": corpus[k]["sha256"]}
        if "split" in corpus:
            c["split"] = {s: float(corpus["split"][s]) for s in ("train", "valid", "test")}
        corpus = c
    return corpus


def tally(
    plan: list[dict[str, Any]], records: list[dict[str, Any]], open_: list[dict[str, Any]] | None = None
) -> tuple[list[dict[str, Any]], int, list[str]]:
    """Per (study, configuration, arm): planned, ok (in the analysed unit attempt), failed, interrupted
    (recorded, or started with no record), missing, superseded; and out-of-order runs."""
    by_run: dict[str, Any] = {}
    interrupted: dict[str, Any] = {}
    superseded: dict[str, Any] = {}
    current = {id(r) for r in analysed(records)}
    for r in records:
        rid = r["spec"]["run_id"]
        by_run.setdefault(rid, []).append(r["status"] if id(r) in current else "superseded")
        interrupted[rid] = interrupted.get(rid, 0) + (r["status"] == "interrupted")
        if id(r) not in current:
            superseded[rid] = superseded.get(rid, 0) + 1
    for u in open_ or []:
        interrupted[u["run_id"]] = interrupted.get(u["run_id"], 0) + 1
    rows: dict[Any, Any] = {}
    missing_total = 0
    for s in plan:
        row = rows.setdefault(
            (s["study"], s["config"], s["arm"]),
            {
                "study": s["study"],
                "config": s["config"],
                "arm": s["arm"],
                "planned": 0,
                "ok": 0,
                "failed": 0,
                "interrupted": 0,
                "missing": 0,
                "superseded": 0,
            },
        )
        st = by_run.get(s["run_id"], [])
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
    order = {s["run_id"]: s["order"] for s in plan}
    flagged, highest = [], -1
    linked = sorted(
        (r for r in records if "ledger" in r and r["attempt"] == 1), key=lambda r: r["ledger"]["seq"]
    )
    for r in linked:
        o = order.get(r["spec"]["run_id"], -1)
        if o < highest:
            flagged.append(f"{r['spec']['run_id']} (plan position {o}) ran after plan position {highest}")
        highest = max(highest, o)
    return list(rows.values()), missing_total, flagged


def plan_notes(
    directory: str, plan: list[dict[str, Any]], records: list[dict[str, Any]], open_: list[dict[str, Any]]
) -> list[str]:
    """Per study, configuration and arm: planned, ok, failed, interrupted, missing and superseded runs;
    runs out of plan order; units that ran again whole; whether the study is incomplete."""
    notes = []
    table, missing, flagged = tally(plan, records, open_)
    for t in table:
        notes.append(
            f"{directory}: {t['study']} / {t['config']} / {t['arm']}: planned {t['planned']}, "
            f"ok {t['ok']}, failed {t['failed']}, interrupted {t['interrupted']}, "
            f"missing {t['missing']}, superseded {t['superseded']}"
        )
    notes.extend(f"{directory}: out of plan order: {x}" for x in flagged)
    latest = latest_unit(records)
    for unit in sorted(u for u, k in latest.items() if k > 1):
        n = sum(1 for r in records if r["spec"]["unit"] == unit and r.get("unit_attempt", 1) < latest[unit])
        notes.append(
            f"{directory}: unit {unit} ran again whole: analysed from its unit attempt "
            f"{latest[unit]}; {n} superseded attempt(s) kept"
        )
    again = redrawn(records)
    if again:
        shown = ", ".join(again[:3]) + (f" and {len(again) - 3} more" if len(again) > 3 else "")
        notes.append(
            f"{directory}: REDRAWN: {len(again)} run(s) analysed from a later attempt ({shown}): an "
            "earlier attempt of each started and is not the one analysed, so its outcome (the "
            "checkpoint, the log) could have been seen before the run was drawn again"
        )
    if missing:  # INCOMPLETE, STOPPED BY THE BUDGET RULE or AT A LOOK where a rule explains the stop
        from prereg.recompute import recompute  # the completeness the summary states, a sequential stop's too

        done = recompute(records)["completeness"] if records else None
        text = done["text"] if done and done["missing_runs"] == missing else None
        notes.append(
            f"{directory}: {text or f'INCOMPLETE: {missing} of {len(plan)} planned runs have no ok record'}"
        )
    return notes

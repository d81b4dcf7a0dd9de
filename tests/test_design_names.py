"""Lockstep records say lockstep (records schema 6), and every committed study's plan and protocol
summary are recomputed under its records' schema byte for byte (``prereg/formats/record.py``'s format log,
``docs/decisions.md`` "A design's name in its records")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, design_doc

from audit.freeze import FROZEN_FIELDS
from prereg.designs import FACTORIAL, LOCKSTEP, PAIRED, design_named, study_design
from prereg.designs.base import OWN_NAME_FROM_SCHEMA
from prereg.formats.ledger import SCHEMAS, canonical, sha256, study_schema, with_snapshot
from prereg.formats.record import SCHEMA_VERSION
from prereg.plan import expected_summary, plan_from_protocol
from prereg.protocol.read import protocol_from_data, protocol_from_text
from prereg.yamlsub import yaml_subset


def test_a_new_lockstep_study_says_lockstep_in_its_plan_and_summary():
    """Fails on the code before schema 6, which wrote ``paired`` for a lockstep study."""
    assert SCHEMA_VERSION == OWN_NAME_FROM_SCHEMA == SCHEMAS[-1]
    plan = plan_from_protocol(protocol_from_data(design_doc("lockstep")), "0" * 64, {"c": "1" * 64})
    assert {r["design"] for r in plan} == {"lockstep"} and all(r["block_steps"] == 2 for r in plan)
    study = expected_summary(protocol_from_data(design_doc("lockstep")), "0" * 64, "p.yaml")["studies"][0]
    assert study["design"] == "lockstep" and study["lockstep"] == {"block_steps": 2}
    # the analysis reads it as a pair, in the one place that says so (the registry)
    assert study_design(study) is LOCKSTEP and design_named(plan[0]["design"]).pairwise
    assert LOCKSTEP.analysed_as == PAIRED.name


@pytest.mark.parametrize("schema", [s for s in SCHEMAS if s < OWN_NAME_FROM_SCHEMA])
def test_an_earlier_schema_plans_a_lockstep_study_as_before(schema):
    """Under schema 5 and earlier the plan and summary say ``paired``; only the name differs."""
    old = plan_from_protocol(protocol_from_data(design_doc("lockstep")), "0" * 64, {"c": "1" * 64}, schema)
    new = plan_from_protocol(protocol_from_data(design_doc("lockstep")), "0" * 64, {"c": "1" * 64})
    assert {r["design"] for r in old} == {"paired"}
    assert [{**r, "design": "lockstep"} for r in old] == new
    study = expected_summary(protocol_from_data(design_doc("lockstep")), "0" * 64, "p.yaml", schema)[
        "studies"
    ][0]
    assert study["design"] == "paired" and study_design(study) is LOCKSTEP


@pytest.mark.parametrize("design", ["paired", "factorial"])
def test_a_design_analysed_as_itself_plans_alike_under_every_schema(design):
    doc = design_doc(design)
    if design == "factorial":
        doc["studies"][0].pop("arms")  # the default factors and cells
    spec = protocol_from_data(doc)
    plans = {s: canonical(plan_from_protocol(spec, "0" * 64, {"c": "1" * 64}, s)) for s in SCHEMAS}
    assert len(set(plans.values())) == 1
    assert PAIRED.recorded_as(1) == PAIRED.recorded_as(SCHEMA_VERSION) == "paired"
    assert FACTORIAL.recorded_as(SCHEMA_VERSION) == "factorial"


def test_a_studys_schema_is_its_oldest_records():
    assert study_schema([{"schema_version": 5}, {"schema_version": 6}]) == 5
    assert study_schema([{}, {"schema_version": 3}]) == 1  # a record before the field: version 1
    assert study_schema([{"schema_version": "6"}, {"schema_version": 4}]) == 4  # not a version: none
    assert study_schema([]) == SCHEMAS[-1]


def _folders() -> list[Path]:
    return sorted(p for p in (ROOT / "records").iterdir() if (p / "MANIFEST").is_file())


def _records(folder: Path) -> list[dict[str, Any]]:
    snaps = {
        p.name[len("protocol.") : -len(".json")]: json.loads(p.read_text())
        for p in folder.glob("protocol.*.json")
    }
    out = []
    for f in sorted(folder.glob("*.record.json")):
        r = json.loads(f.read_text())
        if r.get("schema_version", 1) >= 4:
            r["protocol"] = with_snapshot(r["protocol"], snaps)
        out.append(r)
    return out


@pytest.mark.parametrize("folder", _folders(), ids=lambda p: p.name)
def test_every_committed_study_plans_and_summarises_byte_for_byte_under_its_schema(folder):
    """The oracle: the committed protocol file (where the checkout's is the one the records name),
    its plan's sha256 as every record says and each record's spec, and the protocol summary every
    record copies, recomputed under the records' schema; at the current schema only a lockstep
    study's ``design`` would differ."""
    records = _records(folder)
    schema = study_schema(records)
    proto = records[0]["protocol"]
    path = ROOT / proto["path"]
    if not path.is_file() or sha256(path.read_bytes()) != proto["sha256"]:
        pytest.skip(f"{proto['path']} in this checkout is not the protocol {folder.name}'s records name")
    doc = yaml_subset(path.read_text())
    spec = protocol_from_text(path.read_bytes(), proto["path"])
    shas = {r["spec"]["config"]: r["spec"]["config_sha256"] for r in records}
    plan = plan_from_protocol(spec, proto["sha256"], shas, schema)
    assert {r["plan_sha256"] for r in records} == {sha256(canonical(plan))}
    by_id = {p["run_id"]: p for p in plan}
    assert all(
        {k: r["spec"][k] for k in by_id[r["spec"]["run_id"]]} == by_id[r["spec"]["run_id"]] for r in records
    )
    want = expected_summary(spec, proto["sha256"], proto["path"], schema)
    for r in records:
        assert {
            k: v for k, v in r["protocol"].items() if k not in FROZEN_FIELDS
        } == want  # as the audit compares
    now = plan_from_protocol(spec, proto["sha256"], shas)
    lockstep = {st["name"] for st in doc["studies"] if st.get("design") == "lockstep"}
    assert now == [{**p, "design": "lockstep"} if p["study"] in lockstep else p for p in plan]

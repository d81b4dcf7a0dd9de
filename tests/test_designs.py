"""Designs as objects (prereg/designs/): the registry, what each built-in design answers, the one
label, and a design that exists only in this test: registered here, it is planned, run, summarised
and reported by the code as it is, with no edit anywhere else."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import design_doc, init_study, tiny_protocol
from fake_trainer import FakeTrainer

from harness.execute.inprocess import InProcessExecutor
from harness.execute.runner import Runner
from harness.plan import make_plan
from harness.protocol import load_protocol
from prereg.budget import plan_units
from prereg.designs import (
    FACTORIAL,
    LOCKSTEP,
    PAIRED,
    DesignError,
    design_label,
    design_named,
    design_names,
    register,
    study_design,
    unregister,
)
from prereg.designs.base import BASELINE_FIRST, Rng
from prereg.designs.paired import Paired
from prereg.errors import InputError
from prereg.formats.record import load_records
from prereg.formats.summary import records_json
from prereg.plan import expected_summary, plan_from_protocol
from prereg.protocol.read import protocol_from_data
from prereg.recompute import recompute
from prereg.render.page import published_texts
from prereg.results import PairedResult, Summary


class BaselineFirst(Paired):
    """A pair whose baseline always runs first (no balancing: a design no one should use, which is
    why it lives only here)."""

    name = "baseline-first"
    analysed_as = "paired"

    def orders(self, study: Mapping[str, Any], config: str, n: int, rng: Rng) -> list[tuple[str, ...]]:
        return [BASELINE_FIRST] * n

    def label(self, block_steps: int | None = None, commands: bool = False, brief: bool = False) -> str:
        return "baseline first, a process per arm"


@pytest.fixture
def baseline_first() -> Iterator[BaselineFirst]:
    design = register(BaselineFirst())
    yield design
    unregister(design.name)


def test_the_registry_names_the_three_designs_and_refuses_others():
    assert design_names()[:3] == ("paired", "lockstep", "factorial")
    assert (design_named("paired"), design_named("lockstep"), design_named("factorial")) == (
        PAIRED,
        LOCKSTEP,
        FACTORIAL,
    )
    with pytest.raises(DesignError, match=r"unknown design 'crossed' \(known: paired, lockstep, factorial"):
        design_named("crossed")
    with pytest.raises(DesignError, match="registered already"):
        register(type("Other", (Paired,), {"name": "paired"})())
    with pytest.raises(DesignError, match="analysed as 'nothing', which is not a design"):
        register(type("Odd", (Paired,), {"name": "odd", "analysed_as": "nothing"})())
    assert "odd" not in design_names()


def test_lockstep_is_analysed_as_paired_in_both_forms_of_a_study():
    """The protocol file's ``design: lockstep`` and the summary's ``design: paired`` with its
    ``lockstep`` entry are the same design; a pair without the entry is a pair."""
    assert study_design({"design": "lockstep", "block_steps": 5}) is LOCKSTEP
    assert study_design({"design": "paired", "lockstep": {"block_steps": 5}}) is LOCKSTEP
    assert study_design({"design": "paired"}) is PAIRED
    assert LOCKSTEP.analysed_as == PAIRED.name and FACTORIAL.analysed_as == FACTORIAL.name
    assert LOCKSTEP.block_steps({"design": "lockstep", "block_steps": 5}) == 5
    assert LOCKSTEP.block_steps({"design": "paired", "lockstep": {"block_steps": 7}}) == 7
    assert PAIRED.block_steps({"design": "paired"}) is None


def test_each_design_answers_what_the_plan_and_summary_ask():
    summary = expected_summary(protocol_from_data(design_doc("factorial")), "0" * 64, "p.yaml")["studies"][0]
    assert [
        d.runs_per_unit(summary if d is FACTORIAL else {"arms": ["a", "b"]})
        for d in (PAIRED, LOCKSTEP, FACTORIAL)
    ] == [
        2,
        2,
        4,
    ]
    assert [d.unit for d in (PAIRED, LOCKSTEP, FACTORIAL)] == ["pair", "pair", "block"]
    assert [d.pairwise for d in (PAIRED, LOCKSTEP, FACTORIAL)] == [True, True, False]
    assert [d.shares_process for d in (PAIRED, LOCKSTEP, FACTORIAL)] == [False, True, False]
    assert PAIRED.roles({"arms": ["a", "b"]}) == [("baseline", "a"), ("candidate", "b")]
    assert FACTORIAL.roles(summary) == [(c, c) for c in ("native", "bucketed", "packed", "cotangent")]


def test_the_plan_asks_the_design_for_its_schedule():
    """A pair's orders are balanced (half baseline first); lockstep's cross who steps first with the
    build order, all four per group of four; every lockstep run names its partner."""
    for design in ("paired", "lockstep"):
        runs = plan_from_protocol(protocol_from_data(design_doc(design, seeds=8)), "0" * 64, {"c": "1" * 64})
        assert {r["design"] for r in runs} == {design}  # its own name (records schema 6 on)
        firsts = [r["role"] for r in runs if r["position"] == 0]
        assert sorted(firsts) == ["baseline"] * 4 + ["candidate"] * 4
    lock = plan_from_protocol(protocol_from_data(design_doc("lockstep", seeds=8)), "0" * 64, {"c": "1" * 64})
    cells = {(r["role"], r["steps_first"]) for r in lock if r["position"] == 0}
    assert len(cells) == 4
    assert all(r["partner"].rsplit(".", 1)[0] == r["unit"] for r in lock)


@pytest.mark.parametrize(
    "study, label",
    [
        (None, "a process per arm"),
        ({"design": "paired"}, "a process per arm"),
        ({"design": "factorial"}, "a process per arm"),
        (
            {"design": "paired", "lockstep": {"block_steps": 1}},
            "lockstep, both arms in one process, alternating blocks of 1 step",
        ),
        (
            {"design": "paired", "lockstep": {"block_steps": 10}, "commands": {}},
            "lockstep, two processes (one per arm) taking turns in blocks of 10 steps",
        ),
        (
            {"name": "x", "lockstep": {"block_steps": 10}},
            "lockstep, both arms in one process, alternating blocks of 10 steps",
        ),
    ],
)
def test_one_design_label_for_the_page(study, label):
    assert design_label(study) == label


def test_the_brief_label_is_the_planted_rows_one():
    assert (
        design_label({"design": "paired", "lockstep": {"block_steps": 10}}, brief=True)
        == "lockstep, blocks of 10"
    )
    assert design_label({"design": "paired"}, brief=True) == "a process per arm"


def test_a_design_registered_in_a_test_is_planned_by_the_code_as_it_is(baseline_first):
    runs = plan_from_protocol(
        protocol_from_data(design_doc("baseline-first", seeds=6)), "0" * 64, {"c": "1" * 64}
    )
    assert [r["role"] for r in runs] == ["baseline", "candidate"] * 6  # its schedule, not the balanced one
    assert {r["design"] for r in runs} == {"baseline-first"}  # its own name (records schema 6 on)
    study = expected_summary(protocol_from_data(design_doc("baseline-first")), "0" * 64, "p.yaml")["studies"][
        0
    ]
    assert study["design"] == "baseline-first" and study["arms"] == ["native", "cotangent"]
    assert study_design(study) is baseline_first and design_named(study["design"]).pairwise
    assert plan_units([study]) == [(f"s.c.pair{i:03d}", 2) for i in range(4)]
    assert design_label({"design": "baseline-first"}) == "baseline first, a process per arm"


def test_a_design_registered_in_a_test_runs_and_is_summarised(tmp_path: Path, baseline_first):
    """Through the harness' reader, its plan, the runner (in process, the fake trainer), the
    summary and the published texts: nothing but this test knows the design."""
    text = tiny_protocol(steps=5).replace("design: paired", "design: baseline-first")
    repo = init_study(tmp_path / "study", protocol=text.replace("seeds: [1, 2]", "seeds: [1, 2, 3, 4]"))
    proto = load_protocol(repo / "protocols" / "tiny.yaml")
    assert proto.studies[0].kind is baseline_first and proto.studies[0].design == "paired"
    assert [r.role for r in make_plan(proto)] == ["baseline", "candidate"] * 4
    end = Runner(proto, echo=lambda _: None, executor=InProcessExecutor(train=FakeTrainer())).run()
    assert (end.planned, end.left, end.failed) == (8, 0, 0)
    records = load_records(repo / "records" / "tiny")
    summary = Summary.read(recompute(records_json(records)), "the summary")
    (study,) = summary.studies
    (config,) = study.configs
    assert isinstance(config, PairedResult) and config.pairs_used == 4
    assert [p.first for p in config.pairs] == ["baseline"] * 4
    manifest = (repo / "records" / "tiny" / "MANIFEST").read_text()
    texts = published_texts(summary.to_json(), "summary.json", "records/tiny", json.loads(manifest))
    assert "pairs / tiny_conv (cotangent over native)" in texts["report.md"]


def test_an_unregistered_design_is_refused_naming_the_key_and_line(tmp_path: Path):
    text = tiny_protocol(steps=5).replace("design: paired", "design: baseline-first")
    repo = init_study(tmp_path / "study", protocol=text)
    with pytest.raises(InputError, match=r"studies\[0\]\.design.*must be one of paired, lockstep, factorial"):
        load_protocol(repo / "protocols" / "tiny.yaml")
    # the audit reads the tagged file with the same reader: refused naming the key
    with pytest.raises(InputError, match=r"studies\[0\]\.design.*must be one of paired, lockstep, factorial"):
        protocol_from_data(design_doc("baseline-first"))


def test_a_summary_whose_study_names_no_design_is_refused_naming_it():
    from prereg.results import SummaryFormatError

    data = json.loads((Path(__file__).parent / "fixtures" / "summary-pagedemo.json").read_text())
    data["studies"][0]["design"] = "crossed"
    with pytest.raises(SummaryFormatError, match=r"x\.json: study \S+: unknown design 'crossed'"):
        Summary.read(data, "x.json")


class Duo(Paired):
    """A pair under another word in its units' ids (``s.c.duo003``)."""

    name = "duo"
    analysed_as = "paired"
    unit = "duo"


@pytest.fixture
def duo() -> Iterator[Duo]:
    design = register(Duo())
    yield design
    unregister(design.name)


def test_a_units_id_and_index_are_the_designs(duo):
    """The plan's unit ids, and the index each ends with, for every registered design; an id of
    another design's word is refused by name."""
    for name in design_names():
        d = design_named(name)
        doc = design_doc(name)
        if not d.pairwise:
            doc["studies"][0].pop("arms")  # a factorial's default factors and cells
        runs = plan_from_protocol(protocol_from_data(doc), "0" * 64, {"c": "1" * 64})
        assert {r["unit"] for r in runs} == {d.unit_id("s", "c", i) for i in range(4)}
        assert sorted({d.unit_index(r["unit"]) for r in runs}) == [0, 1, 2, 3]
    assert duo.unit_id("a.b", "c", 12) == "a.b.c.duo012" and duo.unit_index("a.b.c.duo012") == 12
    for bad in ("s.c.pair003", "s.c.duo", "s.c.duo1x", "s.c.duo٣"):
        with pytest.raises(ValueError, match="is not a duo study's duo<i>"):
            duo.unit_index(bad)


def test_the_runners_looks_ask_the_design_for_a_units_index(duo):
    """harness/execute/looks.py reads a unit's index through its design: a ``duo`` unit before the
    first look starts (the code before this split the id at ``.pair`` and raised IndexError)."""
    from types import SimpleNamespace

    from harness.execute.looks import SequentialLooks

    spec = SimpleNamespace(hypotheses={"sequential": {"looks": [6, 12]}, "tests": [{"study": "s"}]})
    proto = SimpleNamespace(spec=spec)
    looks = SequentialLooks(proto, "host", echo=lambda _: None)  # type: ignore[arg-type]
    unit = [SimpleNamespace(design="duo", unit="s.c.duo003", study="s")]
    ledger = SimpleNamespace(looks=lambda: [])
    assert looks.allows(unit, ledger, None) is True  # type: ignore[arg-type]
    assert looks.waits(unit, ledger) is False  # type: ignore[arg-type]

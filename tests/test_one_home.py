"""Rules with one home, read alike by the harness and the core: a factorial cell's place in
standard order (:func:`prereg.factorial.cell_index`) and a study's interval level
(:func:`prereg.plan.study_level`)."""

from __future__ import annotations

import itertools
import random

import pytest
from conftest import tiny_protocol
from hypothesis import given
from hypothesis import strategies as st

from harness.factorial import parse
from prereg.factorial import cell_index, from_yaml
from prereg.plan import expected_summary, study_level


@st.composite
def declared_designs(draw: st.DrawFn) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """1 to 3 factors with two levels each, and their cells declared in a drawn order."""
    k = draw(st.integers(1, 3))
    factors = {f"f{j}": [f"lo{j}", f"hi{j}"] for j in range(k)}
    combos = list(itertools.product(*factors.values()))
    order = draw(st.permutations(range(len(combos))))
    cells = {f"c{i}": dict(zip(factors, combos[i])) for i in order}
    return factors, cells


@given(declared_designs())
def test_harness_and_core_place_each_cell_alike(design):
    factors, cells = design
    ours = parse(factors, cells)
    core_factors, core_cells, core_arms, declared = from_yaml(
        {"design": "factorial", "factors": factors, "cells": cells}
    )
    assert declared and list(ours.cells) == core_cells and list(ours.arms) == core_arms
    # standard order, worked out apart from both: factor j alternates every 2**j cells, the first
    # factor fastest (Yates' order), each cell at the index of its levels
    for name, spec in cells.items():
        i = ours.cells.index(name)
        assert [spec[f] for f in factors] == [factors[f][(i >> j) & 1] for j, f in enumerate(factors)]
        assert cell_index(spec, [(f, levels) for f, levels in factors.items()]) == i


def test_cell_index_of_the_default_two_by_two():
    factors = [("bucketed", ("off", "on")), ("packed", ("off", "on"))]
    got = [cell_index({"bucketed": b, "packed": p}, factors) for p in ("off", "on") for b in ("off", "on")]
    assert got == [0, 1, 2, 3]


def test_a_study_level_is_its_own_else_the_protocols():
    assert study_level(None, 0.9) == 0.9
    assert study_level(0.99, 0.9) == 0.99
    rng = random.Random(0)
    for _ in range(20):
        own, top = rng.uniform(0.51, 0.999), rng.uniform(0.51, 0.999)
        assert study_level(own, top) == own and study_level(None, top) == top


@pytest.mark.parametrize("own", [None, 0.8])
def test_harness_study_and_summary_read_the_same_level(repo, own):
    """The harness's Study and the core's protocol summary give a study the same level: its own
    where it sets one, else the protocol's (0.9 in the tiny protocol)."""
    from harness.protocol import load_protocol

    text = tiny_protocol()
    if own is not None:
        text = text.replace(
            "    val_target_bpb: 7.9\n", f"    val_target_bpb: 7.9\n    interval_level: {own}\n"
        )
        assert f"interval_level: {own}" in text
    path = repo / "protocols" / "tiny.yaml"
    path.write_text(text)
    proto = load_protocol(path)
    summary = expected_summary(proto.spec, proto.sha256, "protocols/tiny.yaml")
    (study,) = proto.studies
    assert study.interval_level == summary["studies"][0]["interval_level"] == (own or 0.9)

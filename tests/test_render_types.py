"""The renderers on typed results: a sentence names the level its result carries (issue 60), and
the JSON the renderers read as ``object`` is narrowed, a value of another shape read as absent."""

from __future__ import annotations

import math

import scipy.stats

from prereg.descriptive import PairedInterval, paired_interval
from prereg.formats.record import SCHEMA_VERSION
from prereg.render.answer import clock_disagreement, commands_protocol
from prereg.render.page import page_manifest
from prereg.render.result import interval_points, sentence, study_block

BASE = [10.0, 10.4, 9.8, 10.1, 10.3, 9.9]
CAND = [9.7, 10.1, 9.6, 9.9, 9.9, 9.8]


def test_a_sentence_names_the_level_its_interval_carries_and_scipy_s_ends() -> None:
    iv = paired_interval(BASE, CAND, 0.99, "log_ratio")
    assert "99% interval" in sentence(iv)
    at90 = iv.interval(0.90)
    said = sentence(at90)
    logs = [math.log(c / b) for b, c in zip(BASE, CAND)]
    ref = scipy.stats.ttest_1samp(logs, 0.0).confidence_interval(confidence_level=0.90)
    assert "90% interval" in said
    assert f"{100 * ref.low:+.2f} to {100 * ref.high:+.2f}" in said
    assert said.startswith(f"{100 * at90.estimate:+.2f} points")


def test_a_sentence_without_an_estimate_or_an_interval_says_so() -> None:
    class Open:
        estimate, low, high, level = -0.01, None, None, 0.95

    class Empty:
        estimate = low = high = level = None

    assert "no interval" in sentence(Open())
    assert sentence(Empty()) == "n/a"


def test_json_of_another_shape_reads_as_absent() -> None:
    assert commands_protocol({"studies": [{"name": "a", "commands": {}}]})
    assert not commands_protocol({"studies": [{"name": "a"}, {"name": "b", "commands": {}}]})
    assert not commands_protocol({"studies": "a"}) and not commands_protocol({})
    assert not commands_protocol({"studies": ["commands"]})  # a string holding the word is no study
    assert study_block({"lockstep": {"block_steps": 8}}) == 8
    assert study_block({"lockstep": None}) is None and study_block(None) is None
    assert study_block({"lockstep": {"block_steps": "8"}}) is None
    ok = {"schema_version": SCHEMA_VERSION, "records": {}}
    assert page_manifest(ok) == ok
    assert page_manifest({**ok, "schema_version": SCHEMA_VERSION + 1}) == {}
    assert page_manifest([ok]) == {} and page_manifest(None) == {}
    assert clock_disagreement(None) is None


def test_points_of_a_reduction_without_a_positive_ratio_are_none() -> None:
    iv = paired_interval(BASE, CAND, 0.95, "relative_reduction")
    e, lo, hi = interval_points(iv)
    assert e is not None and lo is not None and hi is not None and lo < e < hi
    bad = PairedInterval("relative_reduction", 1.0, 0.5, 1.5, 5, 6, 0.2, 0.95, None, 0.9, 1.1)
    assert interval_points(bad) == (None, None, None)
    assert interval_points(None) == (None, None, None)


def test_the_answer_s_reduction_names_the_level_its_result_carries() -> None:
    """The answer's effect in percent reads the level from its result (``iv.interval(level)``), not
    from a level passed beside it: an interval taken at 80% is said at 80%, with its own ends."""
    from dataclasses import replace
    from pathlib import Path

    from prereg.formats.record import load_records, load_started
    from prereg.formats.summary import derive
    from prereg.render.answer import answer_lines

    d = Path(__file__).resolve().parent.parent / "records" / "cpu1-pilot"
    s = derive(load_records(d), load_started(d))
    study = next(st for st in s.studies if st.paired_configs())
    c = study.paired_configs()[0]
    iv = c.training_time.interval
    assert iv is not None and iv.level != 0.8
    at80 = iv.interval(0.8)
    moved = replace(c, training_time=replace(c.training_time, interval=at80))
    studies = [replace(st, configs=[moved if x is c else x for x in st.configs]) for st in s.studies]
    said = "\n".join(answer_lines(replace(s, studies=studies)))
    assert f"{at80.estimate:.2f}% (80% interval {at80.low:.2f} to {at80.high:.2f}%) on the wall clock" in said
    before = "\n".join(answer_lines(s))
    assert f"{iv.estimate:.2f}% ({100 * iv.level:.4g}% interval {iv.low:.2f} to {iv.high:.2f}%)" in before

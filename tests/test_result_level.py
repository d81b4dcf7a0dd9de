"""A result carries its interval level: built once at the level its study preregistered, it gives
that interval by default and another level's on request, as scipy's result objects do
(``res.confidence_interval(confidence_level=...)``); checked against scipy."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from prereg.descriptive import Rows, TResult, paired_interval
from prereg.order import two_groups

times = st.lists(st.floats(0.5, 2.0, allow_nan=False), min_size=3, max_size=12)
levels = st.sampled_from([0.8, 0.9, 0.95, 0.99, 0.999])


def _pairs(draw_b: list[float], spread: list[float]) -> tuple[list[float], list[float]]:
    n = min(len(draw_b), len(spread))
    return draw_b[:n], [b * s for b, s in zip(draw_b[:n], spread[:n])]


@settings(max_examples=60, deadline=None)
@given(times, times, levels, levels)
def test_a_paired_interval_at_another_level_is_scipys(
    b0: list[float], s0: list[float], built: float, asked: float
) -> None:
    b, c = _pairs(b0, s0)
    if len(b) < 2 or max(math.log(y / x) for x, y in zip(b, c)) == min(math.log(y / x) for x, y in zip(b, c)):
        return
    diff = paired_interval(b, c, built, "difference")
    assert diff.interval() is diff and diff.interval(built) is diff
    lo, hi = stats.ttest_rel(c, b).confidence_interval(confidence_level=asked)
    got = diff.interval(asked)
    assert got.level == asked and got.estimate == diff.estimate and got.standard_error == diff.standard_error
    assert (got.low, got.high) == (
        pytest.approx(lo, rel=1e-9, abs=1e-12),
        pytest.approx(hi, rel=1e-9, abs=1e-12),
    )
    logs = [math.log(y) - math.log(x) for x, y in zip(b, c)]
    llo, lhi = stats.ttest_1samp(logs, 0.0).confidence_interval(confidence_level=asked)
    ratio = paired_interval(b, c, built, "log_ratio").interval(asked)
    assert (ratio.low, ratio.high) == (
        pytest.approx(llo, rel=1e-9, abs=1e-12),
        pytest.approx(lhi, rel=1e-9, abs=1e-12),
    )
    assert ratio.ratio_low == pytest.approx(math.exp(llo), rel=1e-9)
    red = paired_interval(b, c, built, "relative_reduction").interval(asked)
    assert red.estimand == "relative_reduction" and red.level == asked
    assert red.low == pytest.approx(-100 * math.expm1(lhi), rel=1e-9, abs=1e-9)
    assert red.high == pytest.approx(-100 * math.expm1(llo), rel=1e-9, abs=1e-9)
    again = paired_interval(b, c, asked, "relative_reduction")
    for name in ("estimate", "low", "high", "ratio", "ratio_low", "ratio_high", "standard_error"):
        assert getattr(red, name) == pytest.approx(getattr(again, name), rel=1e-9, abs=1e-9), name


@settings(max_examples=60, deadline=None)
@given(times, times, levels, levels, st.booleans())
def test_the_pooled_two_sample_result_carries_its_level(
    a: list[float], b: list[float], built: float, asked: float, half: bool
) -> None:
    if len(set(a)) < 2 and len(set(b)) < 2:
        return
    res = two_groups(a, b, half, Rows([], built))
    k = 0.5 if half else 1.0
    ref = stats.ttest_ind(a, b, equal_var=True)
    lo, hi = ref.confidence_interval(confidence_level=asked)
    assert res.level == built and res.as_dict()["level"] == built
    assert (res.as_dict()["low"], res.as_dict()["high"]) == res.interval()
    got = res.interval(asked)
    assert got == (pytest.approx(k * lo, rel=1e-9, abs=1e-12), pytest.approx(k * hi, rel=1e-9, abs=1e-12))
    assert res.p_value == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-15)


def test_a_level_outside_the_open_range_is_refused() -> None:
    res = TResult(0.0, 1.0, 5, 0.99)
    for bad in (0.5, 1.0, 1.5, 0.2):
        with pytest.raises(ValueError, match="level must be in"):
            res.interval(bad)
        with pytest.raises(ValueError, match="level must be in"):
            paired_interval([1.0, 2.0, 3.0], [1.1, 2.3, 2.9]).interval(bad)


def test_the_rows_carry_the_study_s_level_into_every_interval() -> None:
    rows = Rows([1, 2, 3], 0.9)
    assert rows.keep(["a"]).level == 0.9 and len(rows) == 3 and list(rows) == [1, 2, 3]
    assert rows.mean([1.0, 2.0, 4.0]).level == 0.9
    assert rows.endpoint([1.0, 2.0, 3.0], [1.5, 2.0, 3.4], "difference").interval.level == 0.9  # type: ignore[union-attr]


@pytest.mark.parametrize("folder", ["cpu1-pilot", "calibration-cpu-pilot"])
def test_a_summary_s_intervals_carry_the_level_their_study_preregistered(folder: str) -> None:
    from pathlib import Path

    from prereg.formats.record import load_records, load_started
    from prereg.formats.summary import derive

    d = Path(__file__).resolve().parent.parent / "records" / folder
    s = derive(load_records(d), load_started(d))
    level_of = {st["name"]: st["interval_level"] for st in s.protocol["studies"]}
    seen = 0
    for study in s.studies:
        for c in study.paired_configs():
            assert c.level == level_of[study.name]
            for ep in (c.training_time, c.total_time, c.test_bpb):
                if ep.interval is not None:
                    assert ep.interval.level == c.level
                    assert ep.interval.interval(0.95).level == 0.95
                    seen += 1
    assert seen

"""The stall rule (``prereg/interference.py``) against a plain account of it, and its place in the
report: a lockstep arm's blocks, its stall, the pairs flagged, and report.md and index.html naming
them (nothing at all for summaries of records from before the rule)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prereg.interference import STALL_LIMIT, block_times, flagged_pairs, share_gap, spread, stall_s
from prereg.render.page import markdown, render
from prereg.results import Summary

FIXTURE = Path(__file__).parent / "fixtures" / "summary-pagedemo.json"
ROOT = Path(__file__).resolve().parents[1]

STEPS = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=0, max_size=60)


@settings(max_examples=200, deadline=None)
@given(steps=STEPS, block=st.integers(1, 9), warmup=st.integers(0, 12))
def test_the_stall_is_each_blocks_wall_less_cpu_where_positive(steps, block, warmup):
    """Against a step-by-step account: step i belongs to block i // block; warm-up steps count in
    no block; a block's gap counts only where its wall exceeds its CPU time."""
    wall = [w for w, _ in steps]
    cpu = [c for _, c in steps]
    gaps: dict[int, int] = {}
    for i, (w, c) in enumerate(steps):
        if i >= warmup:
            gaps[i // block] = gaps.get(i // block, 0) + w - c
    assert stall_s(wall, cpu, block, warmup) == sum(max(0, g) for g in gaps.values()) / 1e6
    blocks = block_times(wall, cpu, block, warmup)
    assert [w - c for w, c in blocks] == [gaps[k] for k in sorted(gaps)]
    assert sum(w for w, _ in blocks) == sum(wall[warmup:])


def test_a_block_is_at_least_one_step():
    with pytest.raises(ValueError, match="at least one step"):
        block_times([1], [1], 0)


def _t(training: float, stall: float) -> dict:
    return {"training_s": training, "stall_s": stall}


@settings(max_examples=200, deadline=None)
@given(
    fb=st.floats(0.0, 0.99),
    fc=st.floats(0.0, 0.99),
    tb=st.floats(0.01, 100.0),
    tc=st.floats(0.01, 100.0),
)
def test_a_pair_is_flagged_when_its_cpu_shares_part_on_the_log_scale(fb, fc, tb, tc):
    judged = flagged_pairs([("u", _t(tb, fb * tb), _t(tc, fc * tc))])
    assert judged is not None and judged["pairs_judged"] == 1 and judged["limit"] == STALL_LIMIT
    gap = math.log(1 - fc * tc / tc) - math.log(1 - fb * tb / tb)
    assert bool(judged["flagged"]) == (abs(gap) > STALL_LIMIT)
    swapped = flagged_pairs([("u", _t(tc, fc * tc), _t(tb, fb * tb))])
    assert swapped is not None and bool(swapped["flagged"]) == bool(judged["flagged"])  # symmetric


def test_what_the_rule_cannot_judge():
    assert flagged_pairs([("u", {"training_s": 1.0}, _t(1.0, 0.5))]) is None  # a record from before
    stalled_through = flagged_pairs([("u", _t(1.0, 1.0), _t(1.0, 0.0))])
    assert stalled_through and stalled_through["flagged"][0]["log_share_difference"] is None
    no_time = flagged_pairs([("u", _t(0.0, 0.0), _t(1.0, 0.0))])
    assert no_time and no_time["flagged"][0]["baseline_stall_fraction"] is None
    assert share_gap(None, 0.1) is None and share_gap(0.5, 0.5) == 0.0


def test_the_limit_is_above_every_committed_honest_lockstep_pair():
    """Where the limit comes from (the module's text): twice the largest difference, rounded up."""
    worst = 0.0
    for folder in ("cpu2", "cpu2-pilot", "calibration-cpu"):
        files = sorted((ROOT / "records" / folder).glob("*.record.json"))
        n, gap = spread(json.loads(f.read_text()) for f in files)
        assert n > 60, folder
        worst = max(worst, gap)
    assert 0.14 < worst < 0.15 and STALL_LIMIT >= 2 * worst


def _summary(interference: dict | None) -> Summary:
    data = json.loads(FIXTURE.read_text())
    data.pop("sha256", None)
    if interference is not None:
        data["studies"][0]["configs"][0]["interference"] = interference
    return Summary.read(data)


def test_the_report_and_the_page_name_each_flagged_pair_and_nothing_before_the_rule():
    before = _summary(None)
    assert "Interference" not in markdown(before)
    flagged = {
        "limit": STALL_LIMIT,
        "pairs_judged": 3,
        "flagged": [
            {
                "unit": "pairs.tiny.pair002",
                "baseline_stall_fraction": 0.9,
                "candidate_stall_fraction": 0.1,
                "log_share_difference": math.log(0.9 / 0.1),
            }
        ],
    }
    s = _summary(flagged)
    md = markdown(s)
    assert "## Interference: lockstep arms' wall against CPU time" in md
    assert "pairs.tiny.pair002 (0.900, 0.100; 2.197)" in md and "| 3 | 1 |" in md
    html = render(s, "records/pagedemo")
    assert "id=interference" in html and "pairs.tiny.pair002" in html
    clean = _summary({"limit": STALL_LIMIT, "pairs_judged": 3, "flagged": []})
    assert "| 3 | 0 | none |" in markdown(clean)

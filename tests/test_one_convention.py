"""One sign convention in every study rendered from now on (docs/decisions.md, "One sign
convention"): points of 100 x ln(T_candidate / T_baseline), positive: the candidate slower, in every
table, plot and sentence (the answer, the detail tables, every pair, the factorial cells, the study
beside an earlier one, the first screen's table with its sign in the change column's header), for
built-in arms as for command arms; the committed studies published before keep their sealed form
(``prereg.render.answer.PUBLISHED_BEFORE``; tests/test_published.py renders each committed folder
again byte for byte). A study "from now on" is a committed study's sealed figures under a protocol
hash not in that list: the figures are the records' own, only the convention differs. The numbers
are checked against values computed here from the summary's pairs (scipy's t quantile), not read
back through the renderer's helpers."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
from test_compare_signs import _t_points  # one home: the scipy t interval over ln(c/b) in points

ROOT = Path(__file__).resolve().parent.parent
SIGN = "points of 100 x ln(T_candidate / T_baseline); positive: the candidate slower"
NEW_SHA = "0" * 64  # a protocol published from now on: no committed study's hash


def _data(folder: str, new: bool = True) -> dict:
    """A committed folder's sealed summary, as a study from now on (``new``: another protocol hash)."""
    data = json.loads((ROOT / "records" / folder / "summary.json").read_text())
    if new:
        data["protocol"]["sha256"] = NEW_SHA
    return data


def _texts(data: dict, cal=None, beside=None) -> tuple[str, str]:
    from prereg.render.model import to_md
    from prereg.render.page import document
    from prereg.render.sections import sections
    from prereg.results import Summary

    summary = Summary.read(copy.deepcopy(data), "records/x/summary.json")
    parts = sections(summary, beside, cal=cal)
    return to_md(parts), document(summary, parts)


def _config(data: dict, study: str = "pairs", config: str = "tiny_transformer") -> dict:
    st = next(s for s in data["studies"] if s["name"] == study)
    return next(c for c in st["configs"] if c["config"] == config)


def _no_reduction(text: str) -> list[str]:
    """Each line that still speaks of a reduction (a hypothesis' estimand named ``relative_reduction``
    is its preregistered name, not a figure's convention)."""
    return [x for x in text.splitlines() if "reduction" in x.lower().replace("relative_reduction", "")]


def test_a_new_built_in_study_gives_every_change_in_points():
    """cpu2's figures under a new protocol: built-in arms, no calibration. The wall and CPU time
    tables hold 100 x the pairs' mean ln(c / b) and its t interval (scipy), every pair its own
    100 ln(c / b), the costs table the time to the target in points, the answer and the decisions
    the same convention; no line of either text speaks of a reduction."""
    data = _data("cpu2")
    md, page = _texts(data)
    c = _config(data)
    e, lo, hi = _t_points(
        [p["candidate_training_s"] / p["baseline_training_s"] for p in c["pairs"]], c["level"]
    )
    assert e < 0  # cpu2's candidate was faster: negative points
    assert f"| {e:+.2f} | {lo:+.2f}–{hi:+.2f} | " in md
    assert f"<td>{e:+.2f}</td><td>{lo:+.2f} to {hi:+.2f}</td>" in page
    cpu = c["training_cpu_time"]["log_ratio"]
    assert f"| {100 * cpu['estimate']:+.2f} | {100 * cpu['low']:+.2f}–{100 * cpu['high']:+.2f} |" in md
    for p in c["pairs"]:
        change = 100 * math.log(p["candidate_training_s"] / p["baseline_training_s"])
        assert f"| {p['baseline_training_s']:.3f} | {p['candidate_training_s']:.3f} | {change:+.2f} |" in md
        assert (
            f"<td>{p['baseline_training_s']:.3f}</td><td>{p['candidate_training_s']:.3f}</td><td>{change:+.2f}</td>"
            in page
        )
    both = [p for p in c["pairs"] if p["baseline_time_to_target_s"] and p["candidate_time_to_target_s"]]
    t = _t_points(
        [p["candidate_time_to_target_s"] / p["baseline_time_to_target_s"] for p in both], c["level"]
    )
    assert f"| {t[0]:+.2f} | {t[1]:+.2f}–{t[2]:+.2f} |" in md
    for head in ("Time change (points)", "CPU-time change (points)", "Time-to-target change (points)"):
        assert head in md and head in page, head
    assert f"each change is in {SIGN}, as the answer" in md
    answer = md.split("## The answer")[1].split("\n## ")[0]
    assert f"Each change is in {SIGN}" in answer and "training-time change" in answer
    line = next(x for x in answer.splitlines() if x.startswith("* pairs / tiny_transformer "))
    assert f"{e:+.2f} points (" in line and "faster by" in line
    decisions = md.split("## Decisions")[1].split("\n## ")[0]
    assert " points (faster by " in decisions and "% reduction" not in decisions
    assert _no_reduction(md) == [] and _no_reduction(page) == []


def test_the_same_figures_published_before_keep_their_reductions():
    """The rule is the protocol's hash, nothing else: cpu2's own summary renders its reductions, as
    committed (and byte for byte: tests/test_published.py)."""
    md, page = _texts(_data("cpu2", new=False))
    assert "| Time reduction |" in md or "Time reduction" in md
    assert "Time change (points)" not in md and "right of the dashed line the candidate is faster" in page


def test_the_plots_of_a_new_study_are_in_points_and_say_which_side_is_slower():
    """The page's forest plots (each study's, the answer's) and every pair's dot plot: points, the
    dashed line's slower side named, the study's interval from the pairs (scipy)."""
    data = _data("cpu2")
    _, page = _texts(data)
    c = _config(data)
    e, lo, hi = _t_points(
        [p["candidate_training_s"] / p["baseline_training_s"] for p in c["pairs"]], c["level"]
    )
    forest = re.search(r'<svg[^>]*aria-labelledby="forest0-t forest0-d".*?</svg>', page, re.S)
    assert forest and f"tiny_transformer: {e:+.2f} points ({lo:+.2f} to {hi:+.2f})" in forest.group(0)
    caps = re.findall(r"<figcaption>(.*?)</figcaption>", page, re.S)
    said = [x for x in caps if "Training-time change" in x or "The answer in one figure" in x]
    assert len(said) >= 2 and all("right of the dashed line the candidate is slower" in x for x in said)
    assert not any("candidate is faster" in x for x in caps), caps
    assert (
        "Every pair&#x27;s training-time change in points" in page
        or "Every pair's training-time change in points" in page
    )


def test_the_study_beside_an_earlier_one_is_in_points_whatever_the_earlier_form():
    """cpu2's figures from now on beside cpu1 (published in reductions): both studies' changes in
    points, from each one's log ratio, with the half-width of each interval in points."""
    from prereg.render.beside import read_beside
    from prereg.results import Summary

    data = _data("cpu2")
    shown = read_beside(Summary.read(copy.deepcopy(data)), ROOT / "records" / "cpu1", "records/cpu1")
    md, page = _texts(data, beside=shown)
    earlier = _config(_data("cpu1", new=False), "pairs")["training_time"]["log_ratio"]
    e, lo, hi = (100 * earlier[k] for k in ("estimate", "low", "high"))
    section = md.split("## Beside cpu1")[1].split("\n## ")[0]
    assert "Time change, points (interval)" in section and f"Changes in {SIGN}." in section
    row = next(x for x in section.splitlines() if x.startswith("| tiny_transformer | pairs |"))
    assert row.endswith(f"| {e:+.2f} ({lo:+.2f} to {hi:+.2f}) |"), row
    assert f"<td>{e:+.2f}</td><td>{lo:+.2f} to {hi:+.2f}</td><td>±{(hi - lo) / 2:.2f}</td>" in page
    assert _no_reduction(section) == []


def test_a_factorial_study_from_now_on_gives_its_effects_in_points():
    """cpu1's factorial figures under a new protocol: each within-block effect 100 x its log contrast
    with its interval, in report.md's and the page's tables and in the answer, not a reduction."""
    data = _data("cpu1")
    md, page = _texts(data)
    fact = next(s for s in data["studies"] if s["name"] == "factorial")
    effects = fact["configs"][0]["effects"]
    for name, eff in effects.items():
        if not eff:
            continue
        e, lo, hi = (100 * eff[k] for k in ("estimate", "low", "high"))
        assert f"| {e:+.2f} | {lo:+.2f}–{hi:+.2f} |" in md, name
        assert f"<td>{e:+.2f}</td><td>{lo:+.2f} to {hi:+.2f}</td>" in page, name
        assert f"{name.replace('_', ' ')} {e:+.2f} points (" in md, name
    assert "within-block training-time change" in md and "Time change (points)" in md
    assert _no_reduction(md) == [] and _no_reduction(page) == []


def test_a_relative_reduction_decision_reads_in_points():
    """A hypothesis preregistered on the relative reduction: its decision cells in points, the
    reduction r mapped to 100 ln(1 - r / 100) and its ends swapped, the same figures as the log
    ratio it was computed from."""
    from prereg.render.answer import decision_cells
    from prereg.results import Summary

    summary = Summary.read(_data("cpu2"))
    d = next(
        x.decision
        for x in summary.hypotheses.decisions
        if x.decision.estimand == "log_ratio" and x.decision.low is not None
    )
    red = [100 * (1 - math.exp(v)) for v in (d.estimate, d.high, d.low)]
    rr = dataclasses.replace(
        d,
        hypothesis=dataclasses.replace(d.hypothesis, estimand="relative_reduction"),
        estimate_of="relative_reduction",
        estimate=red[0],
        low=red[1],
        high=red[2],
    )
    est, rng = decision_cells(rr, True, True, True)
    got = re.fullmatch(r"([+-]\d+\.\d\d) points \((faster|slower) by \d+\.\d\d%\)", est)
    assert got and abs(float(got.group(1)) - 100 * d.estimate) < 0.006, est
    ends = re.fullmatch(r"([+-]\d+\.\d\d) to ([+-]\d+\.\d\d) \(\d+(\.\d+)?%\)", rng)
    assert (
        ends
        and abs(float(ends.group(1)) - 100 * d.low) < 0.006
        and abs(float(ends.group(2)) - 100 * d.high) < 0.006
    )
    assert decision_cells(rr, True, True, False)[0] == f"{red[0]:+.4g}"  # published before: as it was


def test_the_list_names_the_committed_folders_published_before_by_their_hashes_and_not_cpu3():
    """Each hash in the list is the protocol of the committed folder it names (so no stray hash keeps
    a new study in reductions), the list is the ten folders published before, and cpu3 (the study
    being published now, which takes the convention) is not in it."""
    from prereg.render.answer import PUBLISHED_BEFORE

    if not (ROOT / "records" / "cpu3" / "summary.json").is_file():
        pytest.skip("no committed records in this checkout")
    for sha, name in PUBLISHED_BEFORE.items():
        assert json.loads((ROOT / "records" / name / "summary.json").read_text())["protocol"]["sha256"] == sha
    before = {"cpu1", "cpu2", "cpu1-pilot", "cpu2-pilot", "calibration-cpu-pilot", "calibration-cpu"}
    before |= {"calibration-cpu-coverage", "calibration-classes", "calibration-classes-loaded"}
    assert set(PUBLISHED_BEFORE.values()) == before | {"calibration-tost-loaded"}
    cpu3 = json.loads((ROOT / "records" / "cpu3" / "summary.json").read_text())["protocol"]["sha256"]
    assert cpu3 not in PUBLISHED_BEFORE


def test_cpu3_renders_in_points_with_the_sign_in_the_first_screens_header():
    """cpu3, with its own calibration: the first screen's change column says its sign; every table's
    bias line reads in the table's own points; no line speaks of a reduction."""
    from prereg.calibrated import find_calibration
    from prereg.render.page import published_texts

    folder = ROOT / "records" / "cpu3"
    if not (folder / "summary.json").is_file():
        pytest.skip("records/cpu3 is not in this checkout")
    data = json.loads((folder / "summary.json").read_text())
    assert find_calibration(str(folder), data["protocol"]) is not None
    texts = published_texts(data, str(folder / "summary.json"), "records/cpu3", {})
    md, page = texts["report.md"], texts["index.html"]
    head = md.split("## The answer")[0]
    assert "| Training time (s) | Change, points (negative: faster) | Interval | In words |" in head
    assert (
        "<th scope=col>Change, points (negative: faster)</th>" in page
        or "Change, points (negative: faster)" in page
    )
    lines = [x for x in md.splitlines() if x.startswith("Calibrated bias beside")]
    assert lines and all(x.endswith(f"In {SIGN}, as this table.") for x in lines), lines
    assert "reads the reduction" not in md and _no_reduction(md) == [] and _no_reduction(page) == []
    c = _config(data)
    log = c["training_time"]["log_ratio"]
    assert f"| {100 * log['estimate']:+.2f} | {100 * log['low']:+.2f}–{100 * log['high']:+.2f} |" in md


def test_the_png_plots_of_a_new_study_are_in_points(tmp_path, monkeypatch):
    """analysis/plots.py: the forest (plot_forest.png) and every pair's dots (plot_time.png) of a
    study from now on plot 100 x ln(c / b) and name the convention on their axis; the same figures
    published before plot as they were."""
    import analysis.plots as plots
    from prereg.results import Summary

    seen: dict[str, list] = {}

    class Axis:
        def __getattr__(self, name):
            return lambda *a, **k: seen.setdefault(name, []).append((a, k))

    class Fig:
        def tight_layout(self):
            pass

        def savefig(self, *a, **k):
            pass

    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "subplots", lambda *a, **k: (Fig(), [[Axis() for _ in range(16)]]))
    monkeypatch.setattr(plt, "close", lambda *a: None)
    for new in (True, False):
        data = _data("cpu2", new)
        summary = Summary.read(data)
        c = _config(data)
        paired = [x for s in summary.studies for x in s.paired_configs() if x.pairs]
        study_of = {id(x): s.name for s in summary.studies for x in s.configs}
        first = next(x for x in paired if x.config == "tiny_transformer")
        seen.clear()
        plots._pairs_plot("time", [first], study_of, {}, tmp_path, plots.points_throughout(summary.protocol))
        (xs, ys), _ = seen["scatter"][0]
        want = [
            100 * math.log(p["candidate_training_s"] / p["baseline_training_s"])
            if new
            else p["time_reduction_pct"]
            for p in c["pairs"]
        ]
        assert all(abs(a - b) < 1e-9 for a, b in zip(ys, want)) and len(ys) == len(want)
        label = seen["set_ylabel"][0][0][0]
        assert ("points (positive: slower)" in label) is new, label
        seen.clear()
        monkeypatch.setattr(plt, "subplots", lambda *a, **k: (Fig(), Axis()))
        plots._forest(summary, tmp_path)
        monkeypatch.setattr(plt, "subplots", lambda *a, **k: (Fig(), [[Axis() for _ in range(16)]]))
        k = 100 if new else 1
        log = c["training_time"]["log_ratio"]
        dots = [a[0][0] for a, _ in seen["plot"] if len(a) == 3 and a[2] == "o"]
        assert any(abs(x - k * log["estimate"]) < 1e-12 for x in dots), (dots, log)
        assert (SIGN in seen["set_xlabel"][0][0][0]) is new

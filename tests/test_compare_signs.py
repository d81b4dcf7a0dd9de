"""One sign convention in a study of command arms (what ``harness compare`` writes): its detail
tables (training and CPU time, time to the target, every pair) and its forest plots give each change
in points of 100 x ln(T_candidate / T_baseline), positive: the candidate slower, as its answer does,
and their captions say so. The figures are checked against values computed here from the summary's
pairs with scipy's t quantile, not read back from the renderer's own helpers."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIGN = "points of 100 x ln(T_candidate / T_baseline); positive: the candidate slower"


def _texts(commands: bool) -> tuple[str, str, dict]:
    """report.md and index.html of cpu2's sealed figures, its studies' arms as commands when
    ``commands`` (the summary's pairs, intervals and decisions are cpu2's own)."""
    from prereg.render.model import to_md
    from prereg.render.page import document
    from prereg.render.sections import sections
    from prereg.results import Summary

    data = json.loads((ROOT / "records" / "cpu2" / "summary.json").read_text())
    if commands:
        for s in data["protocol"]["studies"]:
            s["commands"] = {"baseline": ["python", "train.py"], "candidate": ["python", "train.py"]}
    summary = Summary.read(data, "records/x/summary.json")
    parts = sections(summary)
    return to_md(parts), document(summary, parts), data


def _config(data: dict, study: str = "pairs", config: str = "tiny_transformer") -> dict:
    st = next(s for s in data["studies"] if s["name"] == study)
    return next(c for c in st["configs"] if c["config"] == config)


def _t_points(ratios: list[float], level: float) -> tuple[float, float, float]:
    """100 x the mean of ln(ratio) over the pairs and its two-sided Student-t interval's ends
    (scipy's t quantile)."""
    from scipy import stats

    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return 100 * mean, 100 * (mean - half), 100 * (mean + half)


def test_time_to_target_is_in_points_from_the_pairs_log_ratios():
    md, page, data = _texts(True)
    c = _config(data)
    both = [p for p in c["pairs"] if p["baseline_time_to_target_s"] and p["candidate_time_to_target_s"]]
    ratios = [p["candidate_time_to_target_s"] / p["baseline_time_to_target_s"] for p in both]
    e, lo, hi = _t_points(ratios, c["level"])
    assert e < 0  # cpu2's candidate reached the target sooner: faster, negative points
    row = next(x for x in md.splitlines() if x.startswith("| tiny_transformer | 50 (unreached"))
    cells = [x.strip() for x in row.strip("|").split("|")]
    assert cells[2] == f"{e:+.2f}" and cells[3] == f"{lo:+.2f}–{hi:+.2f}", row
    assert "Time-to-target change (points)" in md and "Time-to-target reduction" not in md
    assert "Time to the target and total time are in " + SIGN in md
    assert f"{e:+.2f} ({lo:+.2f} to {hi:+.2f})" in page


def test_training_time_tables_and_every_pair_are_in_points():
    md, page, data = _texts(True)
    c = _config(data)
    log = c["training_time"]["log_ratio"]
    assert f"| {100 * log['estimate']:+.2f} | {100 * log['low']:+.2f}–{100 * log['high']:+.2f} |" in md
    cpu = c["training_cpu_time"]["log_ratio"]
    assert f"| {100 * cpu['estimate']:+.2f} | {100 * cpu['low']:+.2f}–{100 * cpu['high']:+.2f} |" in md
    p = c["pairs"][0]
    change = 100 * math.log(p["candidate_training_s"] / p["baseline_training_s"])
    assert f"| {p['baseline_training_s']:.3f} | {p['candidate_training_s']:.3f} | {change:+.2f} |" in md
    assert change < 0 < p["time_reduction_pct"]  # the opposite sign of the old reduction
    for head in ("Time change (points)", "CPU-time change (points)"):
        assert head in md and head in page
    assert "Time reduction" not in md and "CPU-time reduction" not in md
    assert f"each change is in {SIGN}, as the answer" in md


def test_the_forest_plots_are_in_points_and_say_which_side_is_slower():
    md, page, data = _texts(True)
    log = _config(data)["training_time"]["log_ratio"]
    e, lo, hi = (100 * log[k] for k in ("estimate", "low", "high"))
    forest = re.search(r'<svg[^>]*aria-labelledby="forest0-t forest0-d".*?</svg>', page, re.S)
    assert forest, "no forest plot for the first study"
    assert f"tiny_transformer: {e:+.2f} points ({lo:+.2f} to {hi:+.2f})" in forest.group(0)
    assert 'fill="#1f5fa8"' in forest.group(0)  # wholly faster (all below 0 points): blue
    answer = re.search(r'<svg[^>]*aria-labelledby="answer-t answer-d".*?</svg>', page, re.S)
    assert answer and f"{e:+.2f} points" in answer.group(0)
    caps = re.findall(r"<figcaption>(.*?)</figcaption>", page, re.S)
    said = [x for x in caps if "Training-time change" in x or "The answer in one figure" in x]
    assert said and all("right of the dashed line the candidate is slower" in x for x in said), said
    assert not any("candidate is faster" in x for x in caps), caps


@pytest.mark.parametrize("commands", [False])
def test_a_built_in_study_keeps_its_reductions(commands):
    """The same figures without command arms render as before: reductions, positive faster (the
    committed folders' byte-for-byte test, tests/test_published.py, holds every committed one)."""
    md, page, _ = _texts(commands)
    assert "Time-to-target reduction" in md and "Time change (points)" not in md
    assert "right of the dashed line the candidate is faster" in page


def test_the_png_forest_of_a_command_study_is_in_points(tmp_path, monkeypatch):
    """analysis/plots.py's forest (plot_forest.png): a study of command arms plots each log ratio
    times 100 and names the convention on its axis; a built-in study's rows are as before."""
    import analysis.plots as plots
    from prereg.results import Summary

    seen: dict[str, list] = {}

    class Axis:
        def __getattr__(self, name):
            return lambda *a, **k: seen.setdefault(name, []).append(a)

    class Fig:
        def tight_layout(self):
            pass

        def savefig(self, *a, **k):
            pass

    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "subplots", lambda *a, **k: (Fig(), Axis()))
    monkeypatch.setattr(plt, "close", lambda *a: None)
    for commands in (True, False):
        seen.clear()
        data = json.loads((ROOT / "records" / "cpu2" / "summary.json").read_text())
        if commands:
            for s in data["protocol"]["studies"]:
                s["commands"] = {"baseline": ["python", "train.py"], "candidate": ["python", "train.py"]}
        summary = Summary.read(data, "records/x/summary.json")
        plots._forest(summary, tmp_path)
        log = _config(data)["training_time"]["log_ratio"]
        k = 100 if commands else 1
        dots = [a[0][0] for a in seen["plot"] if len(a) == 3 and a[2] == "o"]
        assert any(abs(x - k * log["estimate"]) < 1e-12 for x in dots), (dots, log)
        label = seen["set_xlabel"][0][0]
        assert (SIGN in label) is commands, label

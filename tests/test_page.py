"""The study page (prereg/render/page.py): escaping, and checks that can fail.

``tests/fixtures/summary-pagedemo.json`` is the summary of a real run of ``protocols/demo.yaml`` cut to
3 seeds and 30 steps (id ``pagedemo``); the demo's end-to-end test renders a fresh one in Chromium."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from pagecheck import check_page, check_static, require_browser

from prereg.render.page import render, write_page
from prereg.results import Summary

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "summary-pagedemo.json").read_text())
SUMMARY = Summary.read(FIXTURE)


def test_page_is_valid_and_accessible(tmp_path):
    path = write_page(SUMMARY, tmp_path, records_rel="runs/pagedemo/records")
    check_static(path.read_text())
    html = path.read_text()
    assert "python analysis/public_audit.py runs/pagedemo/records" in html
    for d in FIXTURE["hypotheses"]["decisions"]:
        assert d["id"] in html


def test_every_pair_is_listed_and_adverse_pairs_are_marked():
    """Each pair's change in points, 100 x ln(candidate / baseline) of its own times (the demo is a
    study from now on: docs/decisions.md, "One sign convention"), adverse ones marked."""
    import math

    html = render(SUMMARY, "r")
    pairs = [
        p for s in FIXTURE["studies"] if s["design"] == "paired" for c in s["configs"] for p in c["pairs"]
    ]
    adverse = [p for p in pairs if p["time_reduction_pct"] < 0]
    assert html.count('<tr class="adverse">') == len(adverse) > 0
    for p in pairs:
        change = 100 * math.log(p["candidate_training_s"] / p["baseline_training_s"])
        assert f"<td>{change:+.2f}</td>" in html
        assert (change > 0) == (p["time_reduction_pct"] < 0)  # adverse: slower, positive points


def test_text_from_the_records_is_escaped():
    s = copy.deepcopy(FIXTURE)
    s["protocol"]["id"] = "<script>alert(1)</script>"
    s["studies"][0]["configs"][0]["config"] = 'x"><img src=http://127.0.0.1:9/a>'
    html = render(Summary.read(s), "r")
    assert "<script>" not in html and "<img" not in html
    check_static(html)


@pytest.mark.parametrize(
    "mutation",
    [
        lambda h: h.replace("<caption>", "<caption hidden>", 1).replace(
            "<caption hidden>", "", 1
        ),  # no caption
        lambda h: h.replace(' role="img"', "", 1),
        lambda h: h.replace("</main>", '<img src="data:,">x</main>'),
        lambda h: h.replace("</main>", "<p><b>x</p></b></main>"),  # misnested: a parse error
        lambda h: h.replace('<html lang="en">', "<html>"),
        lambda h: h.replace("</main>", '<a href="https://example.invalid/">x</a></main>'),
    ],
)
def test_the_static_checks_can_fail(mutation):
    with pytest.raises(Exception):  # noqa: B017 - html5lib's ParseError or an assertion
        check_static(mutation(render(SUMMARY, "r")))


@pytest.mark.process
def test_the_browser_check_sees_a_request(tmp_path):
    require_browser()
    page = write_page(SUMMARY, tmp_path, records_rel="r")
    check_page(page, expect_studies=("pairs", "factorial"))
    bad = tmp_path / "bad.html"
    bad.write_text(
        page.read_text().replace("</main>", '<object data="http://127.0.0.1:9/x.svg"></object></main>')
    )
    with pytest.raises(AssertionError):
        check_page(bad, expect_studies=())


def test_written_files_follow_the_umask_so_a_hosted_page_is_readable(tmp_path):
    """Atomic writes (records, reports, the page) get open()'s mode, not mkstemp's 0600."""
    import os
    import stat

    from prereg.files import atomic_write

    mask = os.umask(0)
    os.umask(mask)
    path = tmp_path / "site" / "index.html"
    atomic_write(path, b"<!DOCTYPE html>", overwrite=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def _paired_configs(fixture):
    return [
        (s["name"], c)
        for s in fixture["studies"]
        if s["design"] == "paired"
        for c in s["configs"]
        if c["training_time"]["interval"]
    ]


def _points_from_pairs(c):
    """100 x the mean of ln(c / b) over the pairs' own times (points, positive: the candidate slower)
    and the arms' times: computed here with numpy, not by the renderer's code."""
    import numpy as np

    b = np.array([p["baseline_training_s"] for p in c["pairs"]])
    k = np.array([p["candidate_training_s"] for p in c["pairs"]])
    return 100 * np.mean(np.log(k / b)), b, k


def test_report_md_opens_with_each_configurations_effect_in_points_and_its_decisions():
    import math

    from prereg.render.page import markdown

    lines = markdown(SUMMARY).splitlines()
    assert lines[2].startswith("# Protocol pagedemo") and lines[4] == "## The answer"
    assert lines[6].startswith("Each change is in points of 100 x ln(T_candidate / T_baseline)")
    bullets = [line for line in lines[5:20] if line.startswith("* ")]
    for study, c in _paired_configs(FIXTURE):
        line = next(b for b in bullets if b.startswith(f"* {study} / {c['config']} ("))
        est, _, _ = _points_from_pairs(c)
        iv = c["training_time"]["log_ratio"]
        pct = 100 * math.expm1(est / 100)
        words = f"{'faster' if pct < 0 else 'slower'} by {abs(pct):.2f}%"
        assert (
            f"training-time change {est:+.2f} points ({iv['level'] * 100:g}% interval "
            f"{100 * iv['low']:+.2f} to {100 * iv['high']:+.2f}; {words}) on the wall clock" in line
        ), line
        for d in FIXTURE["hypotheses"]["decisions"]:
            if (d["study"], d["config"]) == (study, c["config"]):
                assert f"{d['id']} {d['status']}" in line

    # the details (protocol hash, tables) come after the answer
    assert min(i for i, x in enumerate(lines) if x.startswith("Protocol sha256")) > max(
        i for i, x in enumerate(lines) if x in bullets
    )


def test_the_page_opens_with_the_same_answer_before_any_table_or_plot():
    import html as h

    page = render(SUMMARY, "r")
    start, end = page.index("<ul class=answer>"), page.index("</ul>", page.index("<ul class=answer>"))
    assert start < page.index("<table") and start < page.index("<svg")
    items = [h.unescape(x) for x in page[start:end].split("<li>")[1:]]
    from prereg.render.page import markdown

    bullets = [line[2:] for line in markdown(SUMMARY).splitlines() if line.startswith("* ")]
    assert [x.strip().removesuffix("</li>") for x in items] == bullets[: len(items)] and len(items) >= 5


def test_times_beside_a_change_are_geometric_means_and_decisions_read_in_points():
    """100 x ln(candidate / baseline) of the geometric means shown is the change shown (an arithmetic
    mean's ratio is not), and a log-ratio decision reads as the same points, in words beside them
    (computed here from the decision's own log ratio)."""
    import math

    from scipy.stats import gmean

    page = render(SUMMARY, "r")
    for _study, c in _paired_configs(FIXTURE):
        est, b, k = _points_from_pairs(c)
        assert abs(100 * math.log(gmean(k) / gmean(b)) - est) < 1e-9
        assert f"{gmean(b):.3f} / {gmean(k):.3f} s" in page
        mb, mk = (
            [p[f"{r}_peak_memory_bytes"] / 2**20 for p in c["pairs"]] for r in ("baseline", "candidate")
        )
        assert f"{gmean(mb):.1f} / {gmean(mk):.1f} MiB" in page
    for d in FIXTURE["hypotheses"]["decisions"]:
        if d["estimand"] == "log_ratio" and d["low"] is not None:
            pts = [100 * d[x] for x in ("estimate", "low", "high")]
            pct = 100 * math.expm1(pts[0] / 100)
            words = f"{'faster' if pct < 0 else 'slower'} by {abs(pct):.2f}%"
            assert f"<td>{pts[0]:+.2f} points ({words})</td><td>{pts[1]:+.2f} to {pts[2]:+.2f}</td>" in page


@pytest.mark.process
def test_the_browser_check_sees_a_clipped_label_and_an_answer_below_the_first_screen(tmp_path, monkeypatch):
    """The rendered labels are measured: with the label column sized as the plots once were (190 px
    whatever the label), the long labels run past the plot's edge and the check says which; an answer
    pushed below the first screen fails too."""
    import prereg.render.svg as svg

    require_browser()
    import re

    named = re.sub(
        r'("(?:study|name)": )"pairs"',
        r'\1"a_study_with_a_long_name_like_design_block25"',
        json.dumps(FIXTURE),
    )
    s = json.loads(named)
    long = write_page(Summary.read(s), tmp_path, records_rel="r")
    check_page(long, expect_studies=("a_study_with", "factorial"))  # drawn whole: passes
    monkeypatch.setattr(svg, "label_width", lambda labels: svg.LEFT)
    clipped = write_page(Summary.read(s), tmp_path / "clipped", records_rel="r")
    with pytest.raises(AssertionError, match="a_study_with_a_long_name"):
        check_page(clipped, expect_studies=())
    monkeypatch.undo()
    low = tmp_path / "low.html"
    low.write_text(
        long.read_text().replace("<p class=lede>", '<div style="height:900px"></div><p class=lede>')
    )
    with pytest.raises(AssertionError, match="training-time change"):
        check_page(low, expect_studies=())


def test_a_protocol_of_planted_studies_says_where_its_answer_is():
    """A calibration protocol plants a known cost in every study: no configuration's effect is an
    answer (its planted section is), and report.md says so rather than printing an empty list."""
    from prereg.render.answer import CONVENTION, answer_lines

    folder = Path(__file__).parent.parent / "records" / "calibration-cpu"
    if not (folder / "summary.json").is_file():
        pytest.skip("records/calibration-cpu is not in this checkout")
    summary = Summary.read(json.loads((folder / "summary.json").read_text()))
    assert all(st.get("planted") for st in summary.protocol["studies"])
    (line,) = answer_lines(summary)
    assert line.startswith("Every study of this protocol plants a known cost")
    report = (folder / "report.md").read_text()
    assert f"## The answer\n\n{CONVENTION}\n\n* {line}\n" in report


@pytest.mark.parametrize("command", [False, True], ids=["built-in-arms", "command-arms"])
def test_a_lockstep_study_says_how_its_arms_took_turns_and_compares_no_total_time(command):
    """Lockstep of built-in arms is one process; of command arms, two processes taking turns (each
    one's total time holds the other's turns); neither compares total time, and a peak-memory table
    with no row says why instead of showing an empty table."""
    from prereg.render.page import markdown

    s = copy.deepcopy(FIXTURE)
    study = s["protocol"]["studies"][0]
    study["lockstep"] = {"block_steps": 10}
    if command:
        study["commands"] = {"baseline": ["python", "a.py"], "candidate": ["python", "b.py"]}
    for c in s["studies"][0]["configs"]:
        c["peak_memory"] = None
    summary = Summary.read(s)
    page, md = render(summary, "r"), markdown(summary)
    how = (
        "lockstep, two processes (one per arm) taking turns in blocks of 10 steps"
        if command
        else "lockstep, both arms in one process, alternating blocks of 10 steps"
    )
    assert f"pairs ran in {how}." in page and f"pairs ran in {how}." in md
    total = "two processes took turns" if command else "one process ran both arms"
    assert md.count(f"n/a (lockstep: {total}") == page.count(f"n/a (lockstep: {total}") == 4
    study_md = md.split("## Study pairs", 1)[1].split("## Study", 1)[0]
    # every study from now on shows its changes in points (docs/decisions.md, "One sign convention")
    head = "Total-time change (points) |"
    assert f"| {head}" in study_md and "%" not in study_md.split(head)[1].split("\n")[2].split("|")[-2]
    assert "No peak memory per arm" in study_md and "peak |" not in study_md
    assert "No peak memory per arm" in page.split("Peak memory (pairs)", 1)[1].split("<h2", 1)[0]

"""A study beside an earlier one (``harness report --beside FOLDER``): the page's answer figure and a
side-by-side table, and report.md's, hold the earlier study's training-time reductions of the same
configurations and arms, read from its sealed summary.json; a folder without one is refused."""

from __future__ import annotations

import shutil

import pytest
from conftest import ROOT

from analysis.report import write_report
from prereg.render.beside import read_beside
from prereg.results import Summary


def test_the_earlier_study_stands_beside_this_one(tmp_path):
    here = tmp_path / "cpu1"
    shutil.copytree(ROOT / "records" / "cpu1", here)
    out = write_report(here, beside=ROOT / "records" / "cpu1", beside_rel="records/cpu1")
    import json

    this = Summary.read(json.loads((here / "summary.json").read_text()))
    beside = read_beside(this, ROOT / "records" / "cpu1", "records/cpu1")
    configs = {"tiny_transformer", "tiny_medium", "tiny_gqa", "tiny_conv", "small_transformer"}
    assert {r.config for r in beside.rows} == configs and beside.protocol_id == "cpu1"
    for r in beside.rows:  # the same study beside itself: derived again, equal to the last digits
        a, b = r.result.training_time.interval, r.earlier.training_time.interval
        assert (a.estimate, a.low, a.high) == pytest.approx((b.estimate, b.low, b.high), rel=1e-12)
        assert r.earlier_design == "a process per arm" and r.result.pairs_used == r.earlier.pairs_used
    page = out.page_path.read_text()
    assert "<h2>Beside cpu1</h2>" in page and all(
        f"cpu1 {r.earlier_study} / {r.config}, wall" in page for r in beside.rows
    )
    assert (
        "## Beside cpu1" in out.markdown
        and "| tiny_conv | pairs | 20 | -3.73% (-17.71 to 8.58%) | 20 |" in out.markdown
    )


@pytest.mark.process  # the real CLI, in a subprocess
def test_a_folder_without_a_summary_is_refused(tmp_path):
    from conftest import harness

    r = harness(ROOT, "report", "protocols/cpu1.yaml", "--beside", str(tmp_path), "--quiet")
    assert r.returncode == 2 and "no summary.json there" in r.stderr and "Traceback" not in r.stderr


def test_an_earlier_result_beside_several_studies_is_drawn_once():
    """cpu2 runs tiny_transformer in three studies (pairs, design_paired, design_block25); cpu1's one
    result of it stands beside all three in the table but is one row of the answer's figure."""
    import json
    import re

    from prereg.render.page import render

    folder = ROOT / "records" / "cpu2"
    this = Summary.read(json.loads((folder / "summary.json").read_text()))
    beside = read_beside(this, ROOT / "records" / "cpu1", "records/cpu1")
    assert sum(r.config == "tiny_transformer" for r in beside.rows) == 3
    figure = render(this, "records/cpu2", None, None, beside).split('id="answer-t"', 1)[1].split("</svg>")[0]
    labels = re.findall(r'text-anchor="end">([^<]+)</text>', figure)
    assert labels.count("cpu1 pairs / tiny_transformer, wall") == 1
    assert len(labels) == len(set(labels))


@pytest.mark.process
def test_a_forged_beside_study_and_files_the_study_did_not_write_are_named(tagged_done_study, tmp_path):
    """Issue 59, cases 4 and 8: a page written beside a bare ``summary.json`` (no records, no
    MANIFEST, no tag) was re-rendered from it and passed; a README.md or an extra plot added to a
    records folder was not named. Each is now a problem (exit 1) naming the file or the folder; the
    untouched study audits as before (exit 3: not signed)."""
    from conftest import harness, private_copy
    from test_integrity import PROTO, RECS, audit

    r = private_copy(tagged_done_study, tmp_path / "copy")
    assert audit(r).returncode == 3
    fake = r / "fake"
    fake.mkdir()
    shutil.copy(r / RECS / "summary.json", fake / "summary.json")
    written = harness(r, "report", PROTO, "--beside", "fake", "--quiet")
    assert written.returncode == 0, written.stderr
    forged = audit(r)
    assert forged.returncode == 1, forged.stdout[-3000:]
    assert (
        "which is not a sealed, tagged study's records folder (no MANIFEST and no TAG there)" in forged.stdout
    )
    assert harness(r, "report", PROTO, "--quiet").returncode == 0  # the page as it was
    assert audit(r).returncode == 3
    for name, data in (("README.md", b"# The method halves training time\n"), ("plot_extra.png", b"\x89PNG")):
        (r / RECS / name).write_bytes(data)
        added = audit(r)
        assert added.returncode == 1, added.stdout[-3000:]
        assert f"{RECS}/{name}: a file the study did not write" in added.stdout
        (r / RECS / name).unlink()
    assert "PNG plots (not verified)" in audit(r).stdout or not list((r / RECS).glob("plot_*.png"))

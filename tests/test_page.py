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
    html = render(SUMMARY, "r")
    pairs = [
        p for s in FIXTURE["studies"] if s["design"] == "paired" for c in s["configs"] for p in c["pairs"]
    ]
    adverse = [p for p in pairs if p["time_reduction_pct"] < 0]
    assert html.count('<tr class="adverse">') == len(adverse) > 0
    for p in pairs:
        assert f"{p['time_reduction_pct']:.2f}%" in html


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

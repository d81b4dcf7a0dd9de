"""Checks of a study page (prereg/render/page.py) as a reader's browser sees it: parsed by a conforming
HTML parser, rendered by headless Chromium with every request and console message watched."""

from __future__ import annotations

import io
import os
import re
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

#: What a run without the browser is told, plainly: the page was not rendered, and how to enable it.
NO_BROWSER = (
    "BROWSER CHECK SKIPPED: no chromium on PATH, so the study page was checked as HTML only and never "
    "rendered; install Debian's chromium (apt-get install chromium, as .ci/run does) to run it"
)


def require_browser() -> None:
    """Skip, saying so plainly, where no chromium is installed; fail in CI (``CI=true``), where
    .ci/run installs it, so the browser check is never skipped there."""
    if CHROMIUM is not None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(NO_BROWSER.replace("SKIPPED", "MISSING IN CI"))
    pytest.skip(NO_BROWSER)


SECTIONS = (
    "The question and the answer",
    "Every pair, including adverse ones",
    "Flow of planned runs",
    "Order diagnostics",
    "How to verify",
    "What is and is not claimed",
)


def check_static(html: str) -> None:
    """HTML validity (html5lib in strict mode raises on any parse error) and basic accessibility:
    a language, one h1, no skipped heading level, tables with captions and header cells, every
    image (inline SVG) with a role and a text alternative, no script and no external resource."""
    import html5lib

    doc = html5lib.HTMLParser(
        tree=html5lib.getTreeBuilder("etree"), strict=True, namespaceHTMLElements=False
    ).parse(html)
    assert doc.get("lang") == "en"
    assert html.startswith("<!DOCTYPE html>")
    levels = [
        int(e.tag[1])
        for e in doc.iter()
        if isinstance(e.tag, str) and len(e.tag) == 2 and e.tag[0] == "h" and e.tag[1].isdigit()
    ]
    assert levels.count(1) == 1 and levels[0] == 1
    assert all(b - a <= 1 for a, b in zip(levels, levels[1:])), levels
    tables = list(doc.iter("table"))
    assert tables
    for t in tables:
        assert t.find("caption") is not None and (t.find("caption").text or "").strip()
        assert t.findall("./thead/tr/th[@scope='col']")
    svgs = [e for e in doc.iter() if isinstance(e.tag, str) and e.tag.endswith("svg")]
    assert svgs
    for s in svgs:
        assert s.get("role") == "img" and s.get("aria-labelledby")
        titles = [e for e in s.iter() if isinstance(e.tag, str) and e.tag.endswith("title")]
        assert titles and (titles[0].text or "").strip()
    assert not list(doc.iter("script")) and not list(doc.iter("link")) and not list(doc.iter("img"))
    for e in doc.iter():
        for attr in ("src", "href"):
            assert not e.get(attr), (e.tag, attr, e.get(attr))


def check_labels(page) -> None:
    """Every text of every plot is drawn whole inside its plot: a label that runs past the SVG's
    edge is clipped by the browser (the forest plot's long study / configuration labels were)."""
    for svg in page.locator("svg[role=img]").all():
        box = svg.bounding_box()
        for text in svg.locator("text").all():
            t = text.bounding_box()
            inside = box["x"] - 0.5 <= t["x"] and t["x"] + t["width"] <= box["x"] + box["width"] + 0.5
            assert inside, (text.text_content(), t, box)


#: An effect in the answer: points with their interval (a paired study's change: every study from
#: now on, and the calibrated ones), or a reduction in percent with its interval (the studies
#: published before, and their factorial effects).
EFFECT = (
    r"[-+]\d+\.\d\d points \(\d+(\.\d+)?% interval [-+]\d+\.\d\d to [-+]\d+\.\d\d"
    r"|-?\d+\.\d\d% \(\d+(\.\d+)?% interval -?\d+\.\d\d to -?\d+\.\d\d%\)"
)


def check_answer_first(page, height: int) -> None:
    """The answer, each configuration's effect with its interval and decisions, is on the first
    screen (``height`` pixels), before any table or plot."""
    items = page.locator("ul.answer li").all()
    assert items, "no answer list on the page"
    seed = page.locator("main table caption", has_text="calibrated bias")
    if seed.count():  # a calibrated study: the seed page's table is the first screen, the answer after it
        box = seed.first.bounding_box()
        assert box is not None and box["y"] <= height, (
            "the calibrated result table is not on the first screen",
            box,
        )
        for li in items:
            assert re.search(EFFECT, li.text_content()), li.text_content()
        return
    for li in items:
        box = li.bounding_box()
        assert box["y"] + box["height"] <= height, (li.text_content(), box)
        assert re.search(EFFECT, li.text_content()), li.text_content()
    first_table = page.locator("main table").first.bounding_box()
    assert first_table is None or first_table["y"] > items[-1].bounding_box()["y"]


def check_page(path: Path, expect_studies: tuple[str, ...]) -> None:
    html = path.read_text(encoding="utf-8")
    check_static(html)
    require_browser()
    from PIL import Image
    from playwright.sync_api import sync_playwright

    requests: list[str] = []
    console: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900}, java_script_enabled=False)
            page.on("request", lambda r: requests.append(r.url))
            page.on(
                "console",
                lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None,
            )
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(path.resolve().as_uri())
            page.wait_for_load_state("load")
            headings = [h.strip() for h in page.locator("h2").all_inner_texts()]
            for section in SECTIONS:
                assert any(h.startswith(section) for h in headings), (section, headings)
            for study in expect_studies:
                assert any(h.startswith(f"Study {study}") for h in headings), (study, headings)
            assert page.locator("table").count() >= 6
            assert page.locator("main table caption").count() == page.locator("main table").count()
            assert page.locator("svg[role=img]").count() >= 2
            assert page.locator("svg circle").count() > 0  # the plots drew their points
            check_labels(page)
            check_answer_first(page, 900)
            shot = page.screenshot(full_page=True)
        finally:
            browser.close()
    assert requests == [path.resolve().as_uri()], requests  # nothing but the page itself
    assert console == [], console
    img = Image.open(io.BytesIO(shot)).convert("L")
    assert img.size[0] == 1280
    lo, hi = img.getextrema()
    assert hi - lo > 100  # not blank
    colors = img.getcolors(maxcolors=1 << 16)
    assert colors is None or len(colors) > 20

"""Every published figure audited: ``report.md`` and ``index.html`` rendered again from the verified
``summary.json`` and compared byte for byte with the committed files (docs/provenance.md).

The renderer is the core's (:mod:`prereg.render`), the one that ``harness report`` writes with, so
a change of wording or format happens once; like all of the core it is standard library only. What the published files say about their own inputs (the folder
named in the page's audit command, the earlier study shown beside this one) is read from them: any
other value renders other text, and the figures come from verified summaries either way. The PNG
plots are not checked (images; the page's SVG figures are, as part of the page)."""

from __future__ import annotations

import html
import os
import re
from typing import Any

from prereg.bounded import InputLimitError, read_regular
from prereg.calibrated import changed_pins, cited_pins
from prereg.render.page import published_texts

#: ``report.md`` ends with these links when matplotlib made the plots (``harness report``).
_PLOT_LINKS = re.compile(r"\n(?:!\[[A-Za-z0-9_.-]+\]\([A-Za-z0-9_.-]+\.png\)\n)+")
_RECORDS_REL = re.compile(r"<pre><code>python analysis/public_audit\.py (\S+)")
_BESIDE_MD = re.compile(
    r"^The same configurations and arms in \S+ \(.*; records `([^`]+)`, read from its sealed", re.M
)
_BESIDE_HTML = re.compile(r"its records: <code>(.*?)</code>")


def _first_difference(published: str, rendered: str) -> str:
    a, b = published.splitlines(), rendered.splitlines()
    for i, (x, y) in enumerate(zip(a, b), 1):
        if x != y:
            col = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            at = max(0, col - 30)
            return (
                f"line {i}, column {col + 1}: published {x[at : at + 100]!r}, rendered {y[at : at + 100]!r}"
            )
    n = min(len(a), len(b)) + 1
    return f"line {n}: the published file {'goes on' if len(a) > len(b) else 'ends'} where the rendered one {'ends' if len(a) > len(b) else 'goes on'}"


def _beside(directory: str, root: str | None, label: str) -> str:
    for base in ([root] if root else []) + [os.getcwd(), os.path.dirname(os.path.abspath(directory))]:
        path = label if os.path.isabs(label) else os.path.join(base, label)
        if os.path.isfile(os.path.join(path, "summary.json")):
            return path
    return label


def _published_texts(directory: str) -> tuple[dict[str, str], str | None]:
    """The folder's ``report.md`` and ``index.html`` (those present), or why one cannot be read (a
    link, a FIFO, a device: named, never opened; not UTF-8)."""
    texts = {}
    for name in ("report.md", "index.html"):
        path = os.path.join(directory, name)
        if os.path.lexists(path):
            try:
                texts[name] = read_regular(path).decode("utf-8")
            except InputLimitError as e:
                return {}, str(e)
            except UnicodeDecodeError as e:
                return {}, f"{path}: cannot be read ({e})"
    return texts, None


def _beside_refused(directory: str, beside_dir: str | None, label: str | None) -> str | None:
    """Why the study the texts show beside this one is not a sealed, tagged study's records folder
    (no MANIFEST, no kept TAG: a bare summary.json), or None."""
    if beside_dir is None:
        return None
    missing = [n for n in ("MANIFEST", "TAG") if not os.path.isfile(os.path.join(beside_dir, n))]
    if not missing:
        return None
    return (
        f"{directory}: its texts show the study in {label} beside it, which is not a sealed, tagged "
        f"study's records folder (no {' and no '.join(missing)} there): its figures are not verified"
    )


def check_published(
    directory: str,
    root: str | None,
    summary: dict[str, Any],
    manifest: object,
    source: str = "the verified summary.json",
    besides: list[str] | None = None,
) -> tuple[list[str], str]:
    """``report.md`` and ``index.html`` of ``directory`` against what ``summary`` (already verified,
    or the audit's own recomputation: ``source`` says which) renders; returns problems and a
    description. An earlier study the texts show beside this one must be a sealed, tagged records
    folder (a MANIFEST and a kept TAG); its folder is added to ``besides``, to be audited as its own."""
    texts, unreadable = _published_texts(directory)
    if unreadable:
        return [unreadable], "unreadable"
    if not texts:
        return [], "no report.md or index.html: nothing published to compare"
    page = texts.get("index.html", "")
    m = _RECORDS_REL.search(page)
    records_rel = html.unescape(m.group(1)) if m else directory
    b = _BESIDE_MD.search(texts.get("report.md", "")) or _BESIDE_HTML.search(page)
    label = html.unescape(b.group(1)) if b else None
    beside_dir = None if label is None else _beside(directory, root, label)
    refused = _beside_refused(directory, beside_dir, label)
    if refused:
        return [refused], "an unverified study beside it"
    if beside_dir is not None and besides is not None:
        besides.append(beside_dir)
    try:
        rendered = published_texts(
            summary,
            os.path.join(directory, "summary.json"),
            records_rel,
            manifest,
            beside_dir=beside_dir,
            beside_label=label,
        )
    except Exception as e:  # noqa: BLE001 - any failure to render is named, never a traceback
        return [
            f"{directory}: report.md and index.html cannot be rendered again from summary.json to "
            f"check them ({type(e).__name__}: {e})"
        ], "not rendered"
    problems = []
    for name, text in texts.items():
        want = rendered[name]
        ok = text == want or (
            name == "report.md" and text.startswith(want) and _PLOT_LINKS.fullmatch(text[len(want) :])
        )
        if not ok:
            problems.append(
                f"{os.path.join(directory, name)}: not what {source} renders "
                f"({_first_difference(text, want)}); harness report writes it again"
            )
    shown = " and ".join(sorted(texts))
    return problems, f"{shown} byte for byte as {source} renders them" + (
        f" (beside {label})" if label else ""
    )


def check_calibration(directory: str, summary: dict[str, Any]) -> tuple[list[str], str] | None:
    """The calibration a study's texts cite, each folder's sealed summary pinned by its sha256,
    against the summary there now (:func:`prereg.calibrated.changed_pins`): a changed calibration
    refused by name; None when the texts cite none (a study without a calibration)."""
    texts, unreadable = _published_texts(directory)
    text = "\n".join(texts.values())
    cited = cited_pins(text)
    if unreadable or not cited:
        return None
    protocol = summary.get("protocol") if isinstance(summary, dict) else None
    problems = changed_pins(directory, protocol if isinstance(protocol, dict) else {}, text)
    said = "; ".join(f"{folder} summary.json sha256 {sha}" for folder, sha in sorted(cited.items()))
    return problems, f"the calibration the texts cite, as pinned: {said}"

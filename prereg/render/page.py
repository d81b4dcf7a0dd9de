"""The published texts of a study: ``report.md`` (before its plot links) and the study page
``index.html``, both written from one list of sections (:mod:`prereg.render.sections`, written by
:mod:`prereg.render.model`); :func:`published_texts` renders both from a sealed ``summary.json``, as
the public audit does again (:mod:`audit.published`) to compare them with the committed files.

The page is one self-contained static HTML file: no script, no external stylesheet, font or image;
plots are inline SVG with text alternatives; every table has a caption and header cells. ``harness
publish PROTOCOL [--out DIR]``; ``harness run`` and ``harness report`` write both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from prereg.calibrated import Calibration, find_calibration
from prereg.files import atomic_write
from prereg.formats.ledger import read_json
from prereg.formats.record import SCHEMA_VERSION
from prereg.render.beside import Beside, read_beside
from prereg.render.model import Section, esc, to_md, write
from prereg.render.sections import sections
from prereg.results import Summary
from prereg.stalls import folder_stalls

PAGE_NAME = "index.html"

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem;
color:#1b1b1b;background:#fff;line-height:1.45}
h1{font-size:1.9rem;margin-bottom:.2rem}h2{margin-top:2.4rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
.lede{font-size:1.15rem;color:#333}.status{font-weight:600}
table{border-collapse:collapse;margin:.8rem 0 1.2rem;font-size:.92rem}
caption{text-align:left;font-weight:600;padding:.3rem 0}
th,td{border:1px solid #ccc;padding:.25rem .55rem;text-align:right}
th[scope=row],td.l,th.l{text-align:left}thead th{background:#f2f2f2}
tr.adverse td,tr.adverse th{background:#fff1ef}
code{background:#f4f4f4;padding:.05rem .25rem;border-radius:3px;word-break:break-all}
pre{background:#f4f4f4;padding:.6rem;overflow-x:auto}
figure{margin:1rem 0}figcaption{font-size:.88rem;color:#444}
"""


def markdown(
    summary: Summary, beside: Beside | None = None, cal: Calibration | None = None, stalls: Sequence[str] = ()
) -> str:
    """``report.md`` before its plot links, for ``summary``, the study ``beside`` it, its
    calibration ``cal`` and the runs that stalled (:func:`prereg.stalls.folder_stalls`)."""
    return to_md(sections(summary, beside, cal=cal, stalls=stalls))


def render(
    summary: Summary,
    records_rel: str,
    manifest: Mapping[str, object] | None = None,
    summary_sha256: str | None = None,
    beside: Beside | None = None,
    cal: Calibration | None = None,
    stalls: Sequence[str] = (),
) -> str:
    """The page's HTML for ``summary`` (``prereg.formats.summary.derive``); ``records_rel`` is the records
    folder as the audit command should name it; ``manifest`` the folder's MANIFEST (ledger head);
    ``summary_sha256`` the sealed ``summary.json``'s hash; ``cal`` the study's calibration; ``stalls``
    the runs that stalled."""
    return document(summary, sections(summary, beside, records_rel, manifest, summary_sha256, cal, stalls))


def document(summary: Summary, parts: list[Section]) -> str:
    """The page around the sections' HTML: its title, style and main element."""
    title = f"Protocol {summary.protocol['id']} (version {summary.protocol['version']})"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n<body><main>\n"
        + "\n".join(write(parts, False))
        + "\n</main></body></html>\n"
    )


def page_manifest(raw: object) -> Mapping[str, object]:
    """The MANIFEST as the page reads it: empty when it is not one this version can read (the page
    then shows no manifest details)."""
    if not isinstance(raw, dict):
        return {}
    version = raw.get("schema_version", 1)
    return raw if isinstance(version, int) and version <= SCHEMA_VERSION else {}


def write_page(
    summary: Summary,
    records_dir: Path,
    out_dir: Path | None = None,
    records_rel: str | None = None,
    summary_sha256: str | None = None,
    beside: Beside | None = None,
) -> Path:
    """Write ``index.html`` for ``summary`` into ``out_dir`` (default: the records folder), atomically;
    ``summary_sha256`` is the sealed ``summary.json``'s hash, which the page shows. The study's
    calibration is found from its own protocol (:func:`prereg.calibrated.find_calibration`)."""
    raw = read_json(str(Path(records_dir) / "MANIFEST"))  # bounded; none read: no MANIFEST facts
    cal = find_calibration(str(records_dir), summary.protocol)
    stalls = folder_stalls(str(records_dir))
    rel = records_rel or str(records_dir)
    html = render(summary, rel, page_manifest(raw), summary_sha256, beside, cal, stalls)
    path = Path(out_dir or records_dir) / PAGE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, html.encode("utf-8"), overwrite=True)
    return path


def published_texts(
    summary_json: Mapping[str, object],
    where: str,
    records_rel: str,
    manifest: object,
    beside_dir: str | None = None,
    beside_label: str | None = None,
) -> dict[str, str]:
    """``report.md`` (without the plot links) and ``index.html`` as ``harness report`` renders them
    from the sealed summary ``summary_json`` (read from ``where``), the folder named ``records_rel``
    in the page's audit command, its ``manifest`` and, with ``beside_dir``, the earlier study shown
    beside it under ``beside_label``, and the calibration its own protocol names
    (:func:`prereg.calibrated.find_calibration`, from the folder of ``where``): one list of
    sections, written both ways."""
    summary = Summary.read(summary_json, where)
    shown = read_beside(summary, Path(beside_dir), beside_label) if beside_dir is not None else None
    folder = os.path.dirname(where) or "."
    cal, stalls = find_calibration(folder, summary.protocol), folder_stalls(folder)
    sealed = summary_json.get("sha256")
    sha = sealed if isinstance(sealed, str) else None
    parts = sections(summary, shown, records_rel, page_manifest(manifest), sha, cal, stalls)
    return {"report.md": to_md(parts), "index.html": document(summary, parts)}

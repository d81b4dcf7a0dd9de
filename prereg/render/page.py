"""The study page: one self-contained static HTML file, generated from the summary and the records alone.

Its sections follow the original study's public page: the question and one sentence of answer per
hypothesis, a table per study (baseline / candidate time, reduction, interval, faster / slower pairs),
quality and total-time costs, peak memory, the factorial decomposition, every pair including adverse
ones, the flow of planned runs, order diagnostics, how to verify, and what is and is not claimed.
Here the page is put together and written; the per-study sections are :mod:`prereg.render.page_studies`,
the protocol-wide ones :mod:`prereg.render.page_protocol`, their HTML helpers :mod:`prereg.render.page_html`.

The file makes no request: no script, no external stylesheet, font or image; plots are inline SVG with
text alternatives; every table has a caption and header cells. It reads without JavaScript.

``harness publish PROTOCOL [--out DIR]``; ``harness run`` and ``harness report`` write ``index.html``
beside ``report.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prereg.files import atomic_write
from prereg.ledger import read_json
from prereg.records import SCHEMA_VERSION
from prereg.render.beside import Beside
from prereg.render.lockstep_report import model_html
from prereg.render.page_html import esc
from prereg.render.page_protocol import answers_section, claims_section, flow_section, verify_section
from prereg.render.page_studies import (
    answer_figure,
    beside_section,
    every_pair_section,
    factorial_section,
    order_section,
    paired_section,
)
from prereg.render.planted_report import planted_html, planted_names
from prereg.results import Summary

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


def render(
    summary: Summary,
    records_rel: str,
    manifest: dict[str, Any] | None = None,
    summary_sha256: str | None = None,
    beside: Beside | None = None,
) -> str:
    """The page's HTML for ``summary`` (``prereg.summary.derive``); ``records_rel`` is the records
    folder as the audit command should name it; ``manifest`` the folder's MANIFEST (ledger head);
    ``summary_sha256`` the sealed ``summary.json``'s hash."""
    p = summary.protocol
    done = summary.completeness
    title = f"Protocol {p['id']} (version {p['version']})"
    body = [
        f"<h1>{esc(title)}</h1>",
        f"<p class=lede>{esc(p.get('description') or '')}</p>",
        f'<p class="status">{esc(done.text)}.</p>',
    ]
    answers = answers_section(summary.hypotheses)  # the sentences, then the answer's figure, then the tables
    cut = answers.index("</ul>") + 1 if "</ul>" in answers else len(answers)
    on_cpu = p.get("device") == "cpu"  # CPU time measures a CPU run's work, not a GPU's
    planted = planted_names(summary)
    studies = [s for s in summary.studies if s.name not in planted]  # planted ones: their own section
    body += answers[:cut] + answer_figure(studies, p["studies"], on_cpu, beside) + answers[cut:]
    body += beside_section(beside) if beside else []
    body += planted_html(summary) + model_html(summary)
    by_name = {s["name"]: s for s in p["studies"]}
    n = 0
    for study in studies:
        if not study.configs:
            continue
        if study.design == "paired":
            body += paired_section(study, n, by_name.get(study.name), on_cpu)
            n += 1
        else:
            body += factorial_section(study, by_name[study.name])
    body += every_pair_section(studies) + flow_section(summary.flow) + order_section(studies)
    body += verify_section(summary, summary_sha256, records_rel, manifest or {}) + claims_section(summary)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n<body><main>\n"
        + "\n".join(body)
        + "\n</main></body></html>\n"
    )


def page_manifest(raw: Any) -> dict[str, Any]:
    """The MANIFEST as the page reads it: empty when it is not one this version can read (the page
    then shows no manifest details)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("schema_version", 1), int):
        return {}
    return raw if raw.get("schema_version", 1) <= SCHEMA_VERSION else {}


def write_page(
    summary: Summary,
    records_dir: Path,
    out_dir: Path | None = None,
    records_rel: str | None = None,
    summary_sha256: str | None = None,
    beside: Beside | None = None,
) -> Path:
    """Write ``index.html`` for ``summary`` into ``out_dir`` (default: the records folder), atomically;
    ``summary_sha256`` is the sealed ``summary.json``'s hash, which the page shows."""
    records_dir = Path(records_dir)
    raw: Any = read_json(str(records_dir / "MANIFEST")) or {}  # bounded; none read: no MANIFEST facts
    manifest = page_manifest(raw)
    target = Path(out_dir or records_dir)
    target.mkdir(parents=True, exist_ok=True)
    path = target / PAGE_NAME
    html = render(summary, records_rel or str(records_dir), manifest, summary_sha256, beside)
    atomic_write(path, html.encode("utf-8"), overwrite=True)
    return path

"""The published texts of a records folder, rendered from its verified ``summary.json``: what
``harness report`` writes as ``report.md`` (before its plot links) and ``index.html``.

The public audit imports this module (its one import of the project's code outside
``prereg/``; :mod:`audit.published`) and compares the committed files with what
it returns, byte for byte. Its import closure is the standard library, ``analysis`` and
``prereg.records``/``jsonfields``/``files``/``errors`` (checked by ``.ci/gates``): nothing here
imports torch, numpy or matplotlib.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prereg.render.beside import read_beside
from prereg.render.model import to_md
from prereg.render.page import document, page_manifest
from prereg.render.sections import sections
from prereg.results import Summary

__all__ = ["published_texts"]


def published_texts(
    summary_json: dict[str, Any],
    where: str,
    records_rel: str,
    manifest: Any,
    beside_dir: str | None = None,
    beside_label: str | None = None,
) -> dict[str, str]:
    """``report.md`` (without the plot links) and ``index.html`` as ``harness report`` renders them
    from the sealed summary ``summary_json`` (read from ``where``), the folder named ``records_rel``
    in the page's audit command, its ``manifest`` and, with ``beside_dir``, the earlier study shown
    beside it under ``beside_label``: one list of sections, written both ways."""
    summary = Summary.read(summary_json, where)
    shown = read_beside(summary, Path(beside_dir), beside_label) if beside_dir is not None else None
    parts = sections(summary, shown, records_rel, page_manifest(manifest), summary_json.get("sha256"))
    return {"report.md": to_md(parts), "index.html": document(summary, parts)}

"""The report: ``summary.json`` (every number shown), ``report.md`` (the study's tables), PNG plots,
the study page ``index.html`` (:mod:`prereg.render.page`), and the per-run table as CSV or Parquet for
users' own analysis.

``python -m analysis report records/<id>`` or ``harness report PROTOCOL``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from analysis.plots import plots
from prereg.calibrated import find_calibration
from prereg.files import atomic_write
from prereg.formats.record import load_started, seal, write_json
from prereg.formats.summary import derive, load_records
from prereg.render.answer import terminal_answer
from prereg.render.beside import read_beside
from prereg.render.page import markdown, write_page
from prereg.results import Summary
from prereg.stalls import folder_stalls


@dataclass
class ReportOutput:
    summary_path: Path
    report_path: Path
    export_path: Path | None
    plots: list[Path]
    markdown: str
    page_path: Path | None = None
    answer: str = ""  # the terminal's last lines: each configuration's effect and decisions


#: The PNG plots in the order :func:`analysis.plots.plots` draws them (the report's links).
PLOT_ORDER = ("forest", "drift", "time", "quality", "validation")


def _kept_plots(records_dir: Path) -> list[Path]:
    """The PNG plots already in the folder, in the order the report links them."""
    return [records_dir / f"plot_{k}.png" for k in PLOT_ORDER if (records_dir / f"plot_{k}.png").is_file()]


def write_report(
    records_dir: Path,
    export: str | None = None,
    records_rel: str | None = None,
    beside: Path | None = None,
    beside_rel: str | None = None,
    keep_plots: bool = False,
) -> ReportOutput:
    """Derive the summary from ``records_dir`` and write summary.json, report.md, plots, the study page
    and the export; ``records_rel`` is how the page's audit command names the folder; ``beside`` an
    earlier study's records folder, shown beside this one (named ``beside_rel``). ``keep_plots``
    (a signed result head seals them): the PNG plots there are left as they are, not redrawn."""
    records_dir = Path(records_dir)
    records = load_records(records_dir)
    if not records:
        raise FileNotFoundError(f"no records in {records_dir}")
    sealed = seal(derive(records, load_started(records_dir)).to_json())
    summary_path = records_dir / "summary.json"
    write_json(summary_path, sealed, pretty=True)
    # the texts are rendered from what summary.json holds, as the audit renders them again
    # (prereg.render.page): its key order, not the in-memory one
    summary = Summary.read(json.loads(summary_path.read_text(encoding="utf-8")), str(summary_path))
    shown = read_beside(summary, beside, beside_rel) if beside is not None else None
    cal = find_calibration(str(records_dir), summary.protocol)  # as the audit finds it again
    md = markdown(summary, shown, cal, folder_stalls(str(records_dir)))
    made = _kept_plots(records_dir) if keep_plots else plots(summary, records, records_dir)
    if made:
        md += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in made) + "\n"
    report_path = records_dir / "report.md"
    atomic_write(report_path, md.encode("utf-8"), overwrite=True)
    page_path = write_page(
        summary, records_dir, records_rel=records_rel, summary_sha256=sealed["sha256"], beside=shown
    )
    export_path = None
    if export:
        import pandas as pd

        frame = pd.DataFrame(summary.runs)
        export_path = records_dir / f"runs.{export}"
        if export == "csv":
            frame.to_csv(export_path, index=False)
        else:
            frame.to_parquet(export_path, index=False)
    answer = terminal_answer(summary, {"report": report_path, "page": page_path}, cal)
    return ReportOutput(summary_path, report_path, export_path, made, md, page_path, answer)

"""The report: ``summary.json`` (every number shown), ``report.md`` (the study's tables), PNG plots,
the study page ``index.html`` (:mod:`analysis.page`), and the per-run table as CSV or Parquet for
users' own analysis.

``python -m analysis report records/<id>`` or ``harness report PROTOCOL``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from analysis.beside import Beside, read_beside
from analysis.lockstep_report import model_md
from analysis.page import write_page
from analysis.planted_report import planted_md, planted_names
from analysis.plots import plots
from analysis.report_md import md_table
from analysis.report_protocol import decisions_section, flow_section, header_section, runs_section
from analysis.report_studies import factorial_study_section, paired_study_section
from analysis.results import Summary
from analysis.summary import derive, load_records
from harness.files import atomic_write
from harness.records import load_started, seal, write_json


def markdown(summary: Summary, beside: Beside | None = None) -> str:
    """``report.md``: the completeness line, the records, the decisions, the flow of planned runs,
    the study beside an earlier one (``beside``), each study's tables and every run attempt."""
    out = header_section(summary)
    out += decisions_section(summary.hypotheses) + flow_section(summary.flow)
    out += _beside(beside) if beside and beside.rows else []
    planted = planted_names(summary)
    out += planted_md(summary) + model_md(summary)
    for study in summary.studies:
        if not study.configs or study.name in planted:
            continue
        out += (
            paired_study_section(study)
            if study.design == "paired"
            else factorial_study_section(
                study, next(st for st in summary.protocol["studies"] if st["name"] == study.name)
            )
        )
    out += runs_section(summary.runs)
    return "\n".join(out).rstrip() + "\n"


def _beside(beside: Beside) -> list[str]:
    """The training-time reductions of the configurations both studies ran, side by side."""
    rows = []
    for b in beside.rows:
        cells = [b.config, b.study]
        for r in (b.result, b.earlier):
            iv = r.training_time.interval
            cells += [
                str(r.pairs_used),
                "n/a" if iv is None else f"{iv.estimate:.2f}% ({iv.low:.2f} to {iv.high:.2f}%)",
            ]
        rows.append(cells)
    return [
        f"## Beside {beside.protocol_id}",
        "",
        f"The same configurations and arms in {beside.protocol_id} ({beside.rows[0].earlier_design}; "
        f"records `{beside.folder}`, read from its sealed summary.json).",
        "",
        *md_table(
            [
                "Configuration",
                "Study",
                "Pairs",
                "Time reduction (interval)",
                f"{beside.protocol_id} pairs",
                f"{beside.protocol_id}",
            ],
            rows,
        ),
        "",
    ]


@dataclass
class ReportOutput:
    summary_path: Path
    report_path: Path
    export_path: Path | None
    plots: list[Path]
    markdown: str
    page_path: Path | None = None


def write_report(
    records_dir: Path,
    export: str | None = None,
    records_rel: str | None = None,
    beside: Path | None = None,
    beside_rel: str | None = None,
) -> ReportOutput:
    """Derive the summary from ``records_dir`` and write summary.json, report.md, plots, the study page
    and the export; ``records_rel`` is how the page's audit command names the folder; ``beside`` an
    earlier study's records folder, shown beside this one (named ``beside_rel``)."""
    records_dir = Path(records_dir)
    records = load_records(records_dir)
    if not records:
        raise FileNotFoundError(f"no records in {records_dir}")
    sealed = seal(derive(records, load_started(records_dir)).to_json())
    summary_path = records_dir / "summary.json"
    write_json(summary_path, sealed, pretty=True)
    # the texts are rendered from what summary.json holds, as the audit renders them again
    # (analysis.render): its key order, not the in-memory one
    summary = Summary.read(json.loads(summary_path.read_text(encoding="utf-8")), str(summary_path))
    shown = read_beside(summary, beside, beside_rel) if beside is not None else None
    md = markdown(summary, shown)
    made = plots(summary, records, records_dir)
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
    return ReportOutput(summary_path, report_path, export_path, made, md, page_path)

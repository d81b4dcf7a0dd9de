"""``report.md`` as ``harness report`` writes it before its plot links, from the summary: the
completeness line, the records, the decisions, the flow, the study beside an earlier one, each
study's tables and every run attempt (the page, :mod:`prereg.render.page`, renders the same)."""

from __future__ import annotations

from prereg.render.beside import Beside
from prereg.render.lockstep_report import interference_md, model_md
from prereg.render.planted_report import planted_md, planted_names
from prereg.render.report_md import md_table
from prereg.render.report_protocol import decisions_section, flow_section, header_section, runs_section
from prereg.render.report_studies import factorial_study_section, paired_study_section
from prereg.results import Summary


def markdown(summary: Summary, beside: Beside | None = None) -> str:
    """``report.md``: the completeness line, the records, the decisions, the flow of planned runs,
    the study beside an earlier one (``beside``), each study's tables and every run attempt."""
    out = header_section(summary)
    out += decisions_section(summary.hypotheses) + flow_section(summary.flow)
    out += _beside(beside) if beside and beside.rows else []
    planted = planted_names(summary)
    out += planted_md(summary) + model_md(summary) + interference_md(summary)
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

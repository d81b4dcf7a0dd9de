"""The study page's sections on the protocol as a whole: the question and the preregistered answers,
the flow of planned runs, how to verify the records, and what is and is not claimed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prereg.attempts import FLOW_COUNTS
from prereg.render.page_html import esc, html_table, num
from prereg.render.report_protocol import LOOK_HEAD, look_rows, sequential_text
from prereg.results import Descriptive, Hypotheses, Summary

__all__ = ["answers_section", "claims_section", "flow_section", "verify_section"]


def answers_section(hyp: Hypotheses | Descriptive) -> list[str]:
    """The question and the answer: one sentence per preregistered decision and the decisions' table
    (or a descriptive protocol's statement).

    Parameters
    ----------
    hyp : Hypotheses or Descriptive
        The summary's hypotheses.

    Returns
    -------
    list of str
        The section's HTML blocks.
    """
    out = ["<h2>The question and the answer</h2>"]
    if isinstance(hyp, Descriptive):
        return [
            *out,
            f"<p>This protocol is descriptive: no hypothesis is decided. {esc(hyp.descriptive)}</p>",
        ]
    out.append(
        f"<p>{len(hyp.decisions)} preregistered hypotheses, {esc(hyp.procedure.replace('_', ' '))} "
        f"procedure at a one-sided family-wise error rate of {hyp.family_alpha:g}.</p><ul>"
    )
    for d in (x.decision for x in hyp.decisions):
        out.append(f'<li><span class="status">{esc(d.status)}</span>: {esc(d.text)}</li>')
    rows = []
    for d in (x.decision for x in hyp.decisions):
        t = d.test or {}
        iv = f"{d.low:+.4g} to {d.high:+.4g}" if d.low is not None and d.high is not None else "n/a"
        rows.append(
            [
                d.id,
                f"{d.study} / {d.config or 'all'}",
                f"{d.endpoint} ({d.estimand})",
                d.type.replace("_", "-") + (f", margin {d.margin:g}" if d.margin else ""),
                str(t.get("n", "n/a")),
                num(t.get("estimate"), "+.4g"),
                iv,
                num(t.get("p_value"), ".3g"),
                num(d.alpha, ".3g"),
                d.status + (f" ({d.reason})" if d.reason else ""),
            ]
        )
    out.append("</ul>")
    out.append(
        html_table(
            "Preregistered decisions",
            [
                "Hypothesis",
                "Study / configuration",
                "Endpoint",
                "Type",
                "n",
                "Estimate",
                "Interval",
                "p",
                "alpha",
                "Decision",
            ],
            rows,
        )
    )
    if hyp.sequential is not None:
        out.append(f"<p>{esc(sequential_text(hyp.sequential))}</p>")
        out.append(html_table("Sequential looks", LOOK_HEAD, look_rows(hyp.sequential)))
    return out


def flow_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The flow of planned runs: per study, configuration and arm, planned to analysed.

    Parameters
    ----------
    rows : sequence of mapping
        The summary's ``flow`` rows (:func:`prereg.attempts.flow`).

    Returns
    -------
    list of str
        The section's HTML blocks.
    """
    table = [
        [
            f"{r['study']} / {r['config']} / {r['role']} ({r['arm']})",
            *(str(r.get(k, "n/a")) for k, _ in FLOW_COUNTS),
        ]
        for r in rows
    ]
    return [
        "<h2>Flow of planned runs</h2>",
        html_table(
            "Per arm: planned, started, ok, failed, interrupted attempts, attempts superseded by a re-run "
            "of their unit, missing, analysed, excluded",
            [
                "Study / configuration / arm",
                *(heading for _, heading in FLOW_COUNTS),
            ],
            table,
        ),
    ]


def verify_section(
    summary: Summary, summary_sha256: str | None, records_rel: str, manifest: dict[str, Any]
) -> list[str]:
    """How to verify: what the records are bound to (protocol, tag, freeze, ledger head, summary) and the
    audit command.

    Parameters
    ----------
    summary : Summary
        The study's summary.
    summary_sha256 : str or None
        The sealed ``summary.json``'s hash.
    records_rel : str
        The records folder as the audit command should name it.
    manifest : dict
        The folder's MANIFEST (its ledger head), or empty.

    Returns
    -------
    list of str
        The section's HTML blocks.
    """
    p = summary.protocol
    head = manifest.get("ledger_head") or {}
    facts = [
        ["Protocol file", p.get("path") or "n/a"],
        ["Protocol sha256", p["sha256"]],
        ["Tag", p.get("tag") or "none (not preregistered)"],
        ["Tag commit", p.get("tag_commit") or "n/a"],
        ["Tag created", p.get("tag_created") or "n/a"],
        ["Freeze manifest sha256", p.get("freeze_sha256") or "n/a"],
        ["Ledger head", f"{head.get('seq', 'n/a')}:{head.get('sha256', 'n/a')}" if head else "n/a"],
        ["Summary sha256", summary_sha256 or "n/a"],
    ]
    signers = " --allowed-signers ~/trusted/allowed_signers" if p.get("tag") else ""
    cmd = f"python analysis/public_audit.py {records_rel}{signers} --head SEQ:SHA256"
    return [
        "<h2>How to verify</h2>",
        "<p>The tag is the source of truth. The standard-library audit checks every record's hash, the "
        "ledger's chain, the freeze against the tag, and recomputes every statistic on this page.</p>",
        html_table("What the records are bound to", ["Item", "Value"], facts),
        "<p>The two trust roots must come from outside this repository, which a forger would rewrite "
        "with the records: the maintainers' allowed-signers file and the ledger head as published "
        "with the study (keep your copies from the first time you verify). The head above is what "
        "the records say, to compare with yours, not to paste: given a signers file inside the "
        "repository, or a head that its README or docs print, the audit says TRUST ROOTS FROM THE "
        "REPOSITORY and exits 3.</p>",
        f"<pre><code>{esc(cmd)}</code></pre>",
    ]


def claims_section(summary: Summary) -> list[str]:
    """What is and is not claimed: the decisions only, on the devices and settings the records name;
    every attempt kept.

    Parameters
    ----------
    summary : Summary
        The study's summary.

    Returns
    -------
    list of str
        The section's HTML blocks.
    """
    runs = summary.runs
    devices = sorted({r.get("device") or "unknown" for r in runs if r.get("device")})
    p = summary.protocol
    rec = summary.records
    lines = [
        "<h2>What is and is not claimed</h2><ul>",
        f"<li>Claimed: only the decisions listed above, at the stated error rate, for protocol "
        f"{esc(p['id'])} as {'tagged before its first run' if p.get('preregistered') else 'run without preregistration (descriptive)'}"
        "; other intervals are descriptive.</li>",
        f"<li>Measured on: {esc(', '.join(devices) or 'the devices named in the records')}, device "
        f"{esc(p.get('device'))}, {'compiled' if p.get('compile') else 'eager'} training, corpus {esc(p.get('corpus'))}."
        "</li>",
        "<li>Not claimed: a CPU result does not predict MPS or CUDA. There the gradient phase is a different share "
        "of the step and runs other kernels; the method's exactness there is checked by <code>harness verify "
        "--device cuda|mps</code>, and its speed only by a study on that device.</li>",
        "<li>Not claimed: other model sizes, batch sizes, thread counts, PyTorch versions or CPUs than those in "
        "the records; distributed training.</li>",
        f"<li>Every attempt stays in the record set: {rec.files} attempts ({rec.ok} ok, {rec.failed} "
        f"failed, {rec.interrupted} interrupted, {rec.superseded} superseded by a re-run of their "
        f"unit); {len(rec.unfinished or [])} started attempt(s) have no record yet.</li></ul>",
    ]
    return lines

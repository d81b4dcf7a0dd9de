"""The study page: one self-contained static HTML file, generated from the summary and the records alone.

Its sections follow the original study's public page: the question and one sentence of answer per
hypothesis, a table per study (baseline / candidate time, reduction, interval, faster / slower pairs),
quality and total-time costs, peak memory, the factorial decomposition, every pair including adverse
ones, the flow of planned runs, order diagnostics, how to verify, and what is and is not claimed.

The file makes no request: no script, no external stylesheet, font or image; plots are inline SVG with
text alternatives; every table has a caption and header cells. It reads without JavaScript.

``harness publish PROTOCOL [--out DIR]``; ``harness run`` and ``harness report`` write ``index.html``
beside ``report.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from analysis.results import Descriptive, Hypotheses, StudyResult, Summary
from analysis.stats import PairedInterval
from analysis.svg import forest_svg, pairs_svg
from harness.files import atomic_write
from harness.records import SCHEMA_VERSION

MIB = 1024 * 1024
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


def _e(x: Any) -> str:
    return escape(str(x), quote=True)


def _f(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _iv(iv: PairedInterval | None, fmt: str = ".2f", unit: str = "%") -> tuple[str, str]:
    """(estimate, 'low to high') of an interval, or n/a."""
    if not iv:
        return "n/a", "n/a"
    return _f(iv.estimate, fmt) + unit, f"{_f(iv.low, fmt)} to {_f(iv.high, fmt)}{unit}"


def _table(caption: str, header: list[str], rows: list[list[str]], row_class: list[str] | None = None) -> str:
    """A table with a caption, column header cells, and the first cell of each row as its row header."""
    head = "".join(
        f'<th scope="col"{" class=l" if i == 0 else ""}>{_e(h)}</th>' for i, h in enumerate(header)
    )
    body = []
    for i, r in enumerate(rows):
        cls = f' class="{row_class[i]}"' if row_class and row_class[i] else ""
        cells = f'<th scope="row">{_e(r[0])}</th>' + "".join(f"<td>{_e(c)}</td>" for c in r[1:])
        body.append(f"<tr{cls}>{cells}</tr>")
    if not rows:
        body.append(f'<tr><td class="l" colspan="{len(header)}">none</td></tr>')
    return (
        f"<table><caption>{_e(caption)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


# ----------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------


def _answers(hyp: Hypotheses | Descriptive) -> list[str]:
    out = ["<h2>The question and the answer</h2>"]
    if isinstance(hyp, Descriptive):
        return [*out, f"<p>This protocol is descriptive: no hypothesis is decided. {_e(hyp.descriptive)}</p>"]
    out.append(
        f"<p>{len(hyp.decisions)} preregistered hypotheses, {_e(hyp.procedure.replace('_', ' '))} "
        f"procedure at a one-sided family-wise error rate of {hyp.family_alpha:g}.</p><ul>"
    )
    for d in (x.decision for x in hyp.decisions):
        out.append(f'<li><span class="status">{_e(d.status)}</span>: {_e(d.text)}</li>')
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
                _f(t.get("estimate"), "+.4g"),
                iv,
                _f(t.get("p_value"), ".3g"),
                _f(d.alpha, ".3g"),
                d.status + (f" ({d.reason})" if d.reason else ""),
            ]
        )
    out.append("</ul>")
    out.append(
        _table(
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
    return out


def _paired(study: StudyResult, n: int) -> list[str]:
    cfgs = study.paired_configs()
    first = cfgs[0]
    base, cand = first.baseline_arm, first.candidate_arm
    lvl = f"{first.level * 100:g}%"
    out = [
        f"<h2>Study {_e(study.name)}: {_e(cand)} versus {_e(base)}</h2>",
        f"<p>Fixed-budget training time. Intervals are two-sided {lvl} paired Student-t intervals; a positive "
        "reduction means the candidate was faster.</p>",
    ]
    rows: list[list[str]] = []
    forest: list[tuple[str, float | None, float | None, float | None]] = []
    for c in cfgs:
        tt = c.training_time
        est, rng = _iv(tt.interval)
        rows.append(
            [
                c.config,
                _f((c.parameters or 0) / 1e6, ".2f") + "M",
                f"{_f(tt.baseline_mean, '.3f')} / {_f(tt.candidate_mean, '.3f')} s",
                est,
                rng,
                f"{c.counts['faster']} / {c.counts['slower']}",
            ]
        )
        iv = tt.interval
        forest.append(
            (c.config, None, None, None) if iv is None else (c.config, iv.estimate, iv.low, iv.high)
        )
    out.append(
        _table(
            f"Training time, {base} / {cand}",
            [
                "Configuration",
                "Parameters",
                f"{base} / {cand}",
                "Time reduction",
                f"{lvl} interval",
                "Faster / slower pairs",
            ],
            rows,
        )
    )
    svg = forest_svg(f"forest{n}", f"Training-time reduction of {cand} over {base}, {lvl} intervals", forest)
    if svg:
        out.append(
            f"<figure>{svg}<figcaption>Training-time reduction per configuration with its {lvl} interval; "
            "right of the dashed line the candidate is faster.</figcaption></figure>"
        )
    out.append(f"<h3>Quality and completion costs ({_e(study.name)})</h3>")
    rows = []
    for c in cfgs:
        q, tot, ttt = c.test_bpb, c.total_time, c.time_to_target
        qe, qr = _iv(q.interval, "+.5f", "")
        te, tr = _iv(tot.interval)
        re_, rr = _iv(ttt.interval)
        rows.append(
            [
                c.config,
                f"{_f(q.baseline_mean, '.4f')} / {_f(q.candidate_mean, '.4f')}",
                qe,
                qr,
                f"{te} ({tr})",
                f"{re_} ({rr}); {ttt.pairs} pairs reached, unreached {ttt.unreached['baseline']}"
                f" / {ttt.unreached['candidate']}",
            ]
        )
    out.append(
        _table(
            "Full-test bits per byte (lower is better; a positive difference means the candidate was "
            "worse), total completion time and time to the validation target",
            [
                "Configuration",
                f"{base} / {cand} BPB",
                "Difference",
                f"{lvl} interval",
                "Total-time reduction",
                "Time-to-target reduction",
            ],
            rows,
        )
    )
    out.append(f"<h3>Peak memory ({_e(study.name)})</h3>")
    rows = []
    for c in cfgs:
        m = c.peak_memory
        if m and m.baseline_mean is not None and m.candidate_mean is not None:
            rows.append(
                [
                    c.config,
                    f"{m.baseline_mean / MIB:.1f} / {m.candidate_mean / MIB:.1f} MiB",
                    _iv(m.interval)[0],
                ]
            )
    out.append(
        _table(
            "Peak resident memory of the run's process",
            ["Configuration", f"{base} / {cand}", "Reduction"],
            rows,
        )
    )
    return out


def _factorial(study: StudyResult) -> list[str]:
    out = [f"<h2>Study {_e(study.name)}: factorial decomposition</h2>"]
    for c in study.factorial_configs():
        lvl = f"{c.level * 100:g}%"
        means = c.cell_mean_training_s or {}
        out.append(
            f"<p>{_e(c.config)}: {c.blocks_used} blocks; mean training time per cell: "
            + ", ".join(f"{_e(k)} {_f(v, '.3f')} s" for k, v in means.items())
            + ".</p>"
        )
        rows = []
        for name, e in (c.effects or {}).items():
            if e:
                rows.append(
                    [
                        name.replace("_", " "),
                        f"{e['reduction_pct']:.2f}%",
                        f"{e['reduction_low_pct']:.2f} to {e['reduction_high_pct']:.2f}%",
                    ]
                )
        out.append(
            _table(
                f"Within-block effects on log training time, {c.config}",
                ["Effect", "Time reduction", f"{lvl} interval"],
                rows,
            )
        )
    return out


def _every_pair(studies: Sequence[StudyResult]) -> list[str]:
    out = [
        "<h2>Every pair, including adverse ones</h2>",
        "<p>Adverse pairs (the candidate was slower) are marked. A positive quality difference means the "
        "candidate was worse.</p>",
    ]
    for n, study in enumerate(s for s in studies if s.design == "paired" and s.configs):
        rows, cls, dots = [], [], []
        for c in study.paired_configs():
            dots.append(
                (c.config, [p["time_reduction_pct"] for p in c.pairs if p["time_reduction_pct"] is not None])
            )
            for p in c.pairs:  # a damaged (null or non-finite) endpoint shows as n/a
                adverse = (p["time_reduction_pct"] or 0.0) < 0
                rows.append(
                    [
                        f"{c.config} seed {p['seed']}",
                        p["first"],
                        _f(p["baseline_training_s"], ".3f"),
                        _f(p["candidate_training_s"], ".3f"),
                        "n/a" if p["time_reduction_pct"] is None else f"{p['time_reduction_pct']:.2f}%",
                        _f(p["test_bpb_difference"], "+.5f"),
                        "slower" if adverse else "faster",
                    ]
                )
                cls.append("adverse" if adverse else "")
        svg = pairs_svg(f"pairs{n}", f"Every pair's training-time reduction, study {study.name}", dots)
        if svg:
            out.append(
                f"<figure>{svg}<figcaption>Each mark is one pair; red squares are adverse pairs."
                "</figcaption></figure>"
            )
        first = study.paired_configs()[0]
        out.append(
            _table(
                f"Study {study.name}: every pair",
                [
                    "Pair",
                    "First",
                    f"{first.baseline_arm} (s)",
                    f"{first.candidate_arm} (s)",
                    "Time reduction",
                    "Test Δ BPB",
                    "Candidate",
                ],
                rows,
                cls,
            )
        )
    return out


def _flow(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    table = [
        [
            f"{r['study']} / {r['config']} / {r['role']} ({r['arm']})",
            *(
                str(r.get(k, "n/a"))
                for k in (
                    "planned",
                    "started",
                    "ok",
                    "failed",
                    "interrupted_attempts",
                    "superseded_attempts",
                    "missing",
                    "analysed",
                    "excluded",
                )
            ),
        ]
        for r in rows
    ]
    return [
        "<h2>Flow of planned runs</h2>",
        _table(
            "Per arm: planned, started, ok, failed, interrupted attempts, attempts superseded by a re-run "
            "of their unit, missing, analysed, excluded",
            [
                "Study / configuration / arm",
                "Planned",
                "Started",
                "OK",
                "Failed",
                "Interrupted",
                "Superseded",
                "Missing",
                "Analysed",
                "Excluded",
            ],
            table,
        ),
    ]


def _order(studies: Sequence[StudyResult]) -> list[str]:
    out = [
        "<h2>Order diagnostics</h2>",
        "<p>AB/BA period effect and treatment-by-period check (log time), and "
        "drift of the log ratio over execution order.</p><ul>",
    ]
    items = 0
    for study in studies:
        if study.design != "paired":
            continue
        for c in study.paired_configs():
            oe = c.order_effects or {}
            if oe.get("crossover"):
                p, k = oe["crossover"]["period"], oe["crossover"]["carryover"]
                out.append(
                    f"<li>{_e(study.name)} / {_e(c.config)}: period effect {p['estimate']:+.4f} "
                    f"[{p['low']:+.4f}, {p['high']:+.4f}], p = {p['p_value']:.3g}; treatment-by-period "
                    f"p = {k['p_value']:.3g}.</li>"
                )
                items += 1
            if oe.get("drift"):
                d = oe["drift"]
                out.append(
                    f"<li>{_e(study.name)} / {_e(c.config)}: drift per plan position "
                    f"{d['slope']:+.3g} [{d['low']:+.3g}, {d['high']:+.3g}], p = {d['p_value']:.3g}.</li>"
                )
                items += 1
    if not items:
        out.append("<li>Too few pairs for order diagnostics.</li>")
    return [*out, "</ul>"]


def _verify(
    summary: Summary, summary_sha256: str | None, records_rel: str, manifest: dict[str, Any]
) -> list[str]:
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
    cmd = f"python analysis/public_audit.py {records_rel}"
    if head.get("sha256"):
        cmd += f" --head {head.get('seq')}:{head['sha256']}"
    return [
        "<h2>How to verify</h2>",
        "<p>The tag is the source of truth. The standard-library audit checks every record's hash, the "
        "ledger's chain, the freeze against the tag, and recomputes every statistic on this page.</p>",
        _table("What the records are bound to", ["Item", "Value"], facts),
        f"<pre><code>git verify-tag {_e(p.get('tag') or 'protocol-ID')}  # where the tag is signed\n"
        f"{_e(cmd)}</code></pre>",
    ]


def _claims(summary: Summary) -> list[str]:
    runs = summary.runs
    devices = sorted({r.get("device") or "unknown" for r in runs if r.get("device")})
    p = summary.protocol
    rec = summary.records
    lines = [
        "<h2>What is and is not claimed</h2><ul>",
        f"<li>Claimed: only the decisions listed above, at the stated error rate, for protocol "
        f"{_e(p['id'])} as {'tagged before its first run' if p.get('preregistered') else 'run without preregistration (descriptive)'}"
        "; other intervals are descriptive.</li>",
        f"<li>Measured on: {_e(', '.join(devices) or 'the devices named in the records')}, device "
        f"{_e(p.get('device'))}, {'compiled' if p.get('compile') else 'eager'} training, corpus {_e(p.get('corpus'))}."
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


def render(
    summary: Summary,
    records_rel: str,
    manifest: dict[str, Any] | None = None,
    summary_sha256: str | None = None,
) -> str:
    """The page's HTML for ``summary`` (``analysis.summary.derive``); ``records_rel`` is the records
    folder as the audit command should name it; ``manifest`` the folder's MANIFEST (ledger head);
    ``summary_sha256`` the sealed ``summary.json``'s hash."""
    p = summary.protocol
    done = summary.completeness
    title = f"Protocol {p['id']} (version {p['version']})"
    body = [
        f"<h1>{_e(title)}</h1>",
        f"<p class=lede>{_e(p.get('description') or '')}</p>",
        f'<p class="status">{_e(done.text)}.</p>',
    ]
    body += _answers(summary.hypotheses)
    n = 0
    for study in summary.studies:
        if not study.configs:
            continue
        if study.design == "paired":
            body += _paired(study, n)
            n += 1
        else:
            body += _factorial(study)
    body += _every_pair(summary.studies) + _flow(summary.flow) + _order(summary.studies)
    body += _verify(summary, summary_sha256, records_rel, manifest or {}) + _claims(summary)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{STYLE}</style></head>\n<body><main>\n"
        + "\n".join(body)
        + "\n</main></body></html>\n"
    )


def write_page(
    summary: Summary,
    records_dir: Path,
    out_dir: Path | None = None,
    records_rel: str | None = None,
    summary_sha256: str | None = None,
) -> Path:
    """Write ``index.html`` for ``summary`` into ``out_dir`` (default: the records folder), atomically;
    ``summary_sha256`` is the sealed ``summary.json``'s hash, which the page shows."""
    records_dir = Path(records_dir)
    try:
        manifest: dict[str, Any] = json.loads((records_dir / "MANIFEST").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = {}
    if not isinstance(manifest, dict) or manifest.get("schema_version", 1) > SCHEMA_VERSION:
        manifest = {}  # not a MANIFEST this version can read: the page shows no manifest details
    target = Path(out_dir or records_dir)
    target.mkdir(parents=True, exist_ok=True)
    path = target / PAGE_NAME
    html = render(summary, records_rel or str(records_dir), manifest, summary_sha256)
    atomic_write(path, html.encode("utf-8"), overwrite=True)
    return path

"""The published texts' sections, built once from the summary (:func:`sections`): the protocol and its
records, the decisions, the flow of planned runs, the study beside an earlier one, the findings of one
table each (:mod:`prereg.render.findings`), each study (:mod:`prereg.render.studies`), every run
attempt, how to verify and what is claimed. :mod:`prereg.render.model` writes them as report.md and
index.html."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prereg.attempts import FLOW_COUNTS
from prereg.calibrated import SIGN, Calibration, bias_text
from prereg.designs import design_named
from prereg.plan import defaults_text
from prereg.render.answer import (
    answer_lines,
    commands_study,
    convention,
    decision_cells,
    in_points,
    planted_names,
    points_throughout,
)
from prereg.render.beside import Beside
from prereg.render.findings import interference_section, model_section, planted_section, replicates_section
from prereg.render.model import Section, Table, Text, cells, cols, esc, level_pct, num, para, raw
from prereg.render.result import CLOCKS, block_steps, interval_points, point_cells, result_section
from prereg.render.studies import answer_figure, every_pair, factorial, order_html, paired
from prereg.results import Decided, Descriptive, PairedResult, Summary
from prereg.stalls import STALL_FLOOR_S, STALL_RUN_TIMES, STALL_STEP_TIMES

#: The columns of the looks' table.
LOOK_HEAD = cols(
    "Look | Pairs | Hypothesis | Test | n | p (stage-wise) | Level | Nominal | At this look | Stop"
)
ANSWER = "The question and the answer"
DECISION_HEAD = cols(
    "Hypothesis | Study / configuration | Endpoint | Type | n | Estimate | Interval | p | alpha | Decision"
)


def sections(
    summary: Summary,
    beside: Beside | None = None,
    records_rel: str = "",
    manifest: Mapping[str, object] | None = None,
    summary_sha256: str | None = None,
    cal: Calibration | None = None,
    stalls: Sequence[str] = (),
) -> list[Section]:
    """Both texts' sections, in order (each output skips the other's): ``beside`` an earlier study
    shown beside this one; ``records_rel``, ``manifest`` and ``summary_sha256`` what the page's
    verification names (the folder as the audit command should name it, its MANIFEST, the sealed
    summary's hash); ``cal`` the study's calibration (:func:`prereg.calibrated.find_calibration`):
    with it, the first screen is the result table with the calibrated bias, every change in points
    (:mod:`prereg.render.result`); ``stalls`` the runs whose steps show a stall
    (:func:`prereg.stalls.folder_stalls`), named in a section of their own when there are any."""
    p, done = summary.protocol, summary.completeness
    every = points_throughout(p)  # every table and plot in points (docs/decisions.md, "One sign convention")
    lede: list[Text | Table] = [
        raw(f"<p class=lede>{esc(p.get('description') or '')}</p>"),
        raw(f'<p class="status">{esc(done.text)}.</p>'),
    ]
    bullets = Text("\n".join(f"* {line}" for line in answer_lines(summary, cal)))
    out = [
        Section(None, [Text(f"**{done.text}.**")], only="md"),
        Section(f"Protocol {p['id']} (version {p['version']})", lede, 1),
        *([] if cal is None else [result_section(summary, cal, every)]),
        Section("The answer", [para(convention(summary, cal)), bullets], only="md"),
        Section(None, [Text("\n".join(_header(summary)))], only="md"),
    ]
    planted = planted_names(summary)
    studies = [s for s in summary.studies if s.name not in planted]  # planted ones: their own section
    figure = answer_figure(studies, p, beside)
    out += [*_decisions(summary, figure, cal), _flow(summary.flow, True), *_beside(beside, every)]
    out += [f(summary) for f in (planted_section, model_section, interference_section)]
    out += [replicates_section(summary, cal)]
    out += [_stalls(stalls)] if stalls else []
    by_name = {s["name"]: s for s in p["studies"]}
    n = 0
    for study in (s for s in studies if s.configs):
        if design_named(study.design).pairwise:  # a CPU run's CPU time measures its work, not a GPU's
            out += paired(study, n, by_name.get(study.name), p.get("device") == "cpu", cal, every)
            n += 1
        else:
            out += factorial(study, by_name[study.name], every)
    out += [
        every_pair(studies, cal, by_name, every),
        _flow(summary.flow, False),
        order_html(studies),
        _runs(summary.runs, commands_study(summary)),
    ]
    return out + [_verify(summary, summary_sha256, records_rel, manifest or {}), _claims(summary)]


def _header(summary: Summary) -> list[str]:
    """report.md's lines on the protocol and its tag, the records (superseded, unfinished), exclusions."""
    p, rec = summary.protocol, summary.records
    tag = f", tag `{p['tag']}`" if p.get("tag") else ", not preregistered"
    left = (
        f" Defaults for the keys it leaves out: {defaults_text(p['defaults'])}." if p.get("defaults") else ""
    )
    out = [
        f"Protocol sha256 `{p['sha256']}`{tag}.{left}",
        f"Records: {rec.files} run attempts ({rec.ok} ok, {rec.failed} failed, "
        f"{rec.interrupted} interrupted); {rec.device_seconds:.1f} device seconds in all.",
    ]
    if rec.superseded:
        out.append(
            f"Superseded: {rec.superseded} attempts of units that ran again whole (kept, not analysed; "
            "each unit is analysed from its latest unit attempt)."
        )
    out += [
        f"Interrupted, no record yet: {u['run_id']} attempt {u['attempt']} started at {u['started_at']} "
        f"on {u['node']} (ledger seq {u['seq']})."
        for u in rec.unfinished
    ]
    if summary.exclusions:
        out.append(
            "Excluded units: " + "; ".join(f"{e['unit']} ({e['reason']})" for e in summary.exclusions) + "."
        )
    return out


def _stalls(stalls: Sequence[str]) -> Section:
    """The runs whose first step, or a later step, came later than the stall rule allows."""
    rule = (
        f"A run stalled where no step came for more than {STALL_STEP_TIMES} times its median step time "
        f"(and {STALL_FLOOR_S:g} s), or its first step came later than {STALL_RUN_TIMES} times the median "
        "run's whole time (and that floor) after its start (set-up, warm-up steps and a command's "
        "start-up included), as the progress line shows it live (prereg/stalls.py). Its "
        "times count as measured; a stall from outside (a stopped process, a busy machine) slows the arm "
        "that stalled."
    )
    items = Text(
        "\n".join(f"* {line}" for line in stalls),
        "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in stalls) + "</ul>",
    )
    return Section("Stalls", [para(rule), items], anchor="stalls")


def _decisions(summary: Summary, figure: list[Text], cal: Calibration | None = None) -> list[Section]:
    """The preregistered decisions: report.md's table (with each failed-arm sensitivity analysis) and
    the page's answer (one sentence per configuration, the answer's figure, the table), or a
    descriptive protocol's statement; a group-sequential family's looks."""
    hyp = summary.hypotheses
    lines = (raw(f"<li>{esc(line)}</li>") for line in answer_lines(summary, cal))
    conv = convention(summary, cal)
    answer = [raw("<ul class=answer>"), *lines, raw("</ul>"), *figure]
    if isinstance(hyp, Descriptive):
        said = raw(
            f"<p>This protocol is descriptive: no hypothesis is decided. {esc(hyp.descriptive)} "
            f"{esc(conv)}</p>"
        )
        none = para(f"Descriptive protocol: no hypothesis is decided. {hyp.descriptive}")
        return [Section("Decisions", [none], only="md"), Section(ANSWER, [said, *answer], only="html")]
    fam = (
        f"{len(hyp.decisions)} preregistered hypotheses, {hyp.procedure.replace('_', ' ')} procedure at a "
        f"one-sided family-wise error rate of {hyp.family_alpha:g}"
    )
    md_rows, html_rows = ([_decision_row(x, md, summary, cal) for x in hyp.decisions] for md in (True, False))
    head = DECISION_HEAD + ([] if cal is None else ["Calibrated bias, points (95%)"])
    md: list[Text | Table] = [
        para(f"{fam}; a decision needs at least {hyp.min_pairs} pairs."),
        Table("", [*head, "Failed arm as adverse"], md_rows),
    ]
    out = [Section("Decisions", md, only="md")]
    decided = Table("Preregistered decisions", head, html_rows)
    html: list[Text | Table] = [raw(f"<p>{esc(fam)}. {esc(conv)}</p>"), *answer, decided]
    if hyp.sequential is not None:
        looks = Table("Sequential looks", LOOK_HEAD, look_rows(hyp.sequential))
        bullets = Text("\n".join(f"* {x.decision.text}" for x in hyp.decisions))
        design = sequential_text(hyp.sequential)
        out.append(Section("Sequential looks", [para(design), looks, bullets], 3, "md"))
        html += [para(design), looks]
    return [*out, Section(ANSWER, html, only="html")]


def _decision_row(x: Decided, md: bool, summary: Summary, cal: Calibration | None = None) -> list[str]:
    """A decision's row: report.md's (``md``) names its interval's level and the failed-arm
    sensitivity analysis; with the study's calibration ``cal``, the change in points and the
    design's calibrated bias beside it."""
    d, sens, t = x.decision, x.sensitivity, x.decision.test or {}
    kind = d.type.replace("_", "-") + (f", margin {d.margin:g}" if d.margin else "")
    where = [d.id, f"{d.study} / {d.config or 'all'}", f"{d.endpoint} ({d.estimand})"]
    status = d.status + (f" ({d.reason})" if d.reason else "")
    row = [
        *where,
        kind,
        str(t.get("n", "n/a")),
        *decision_cells(d, md, in_points(summary, cal), points_throughout(summary.protocol)),
    ]
    p = t.get("p_value")
    row += [num(p if isinstance(p, (int, float)) else None, ".3g"), num(d.alpha, ".3g"), status]
    if cal is not None:
        timed = d.endpoint in CLOCKS and d.estimand == "log_ratio"
        row.append(bias_text(cal, block_steps(summary, d.study), d.endpoint) if timed else "n/a (not a time)")
    failed = f"p = {sens['p_value']:.3g} ({sens['pairs_with_a_failed_arm']} failed pairs)" if sens else "none"
    return [*row, failed] if md else row


def sequential_text(seq: Mapping[str, Any]) -> str:
    """The design in one sentence: its looks, spending, futility bound and where it stopped."""
    fut = (
        f", non-binding futility below z = {seq['futility_z']:g}" if seq.get("futility_z") is not None else ""
    )
    stop = "; the records stop before its next look"
    if seq.get("stop") in ("efficacy", "futility"):
        stop = f"; the rule stopped the study at look {seq['stopped_at']} ({seq['stop']})"
    elif seq.get("stop") == "final":
        stop = "; it ran to its last look"
    return (
        f"Group-sequential design: looks at {', '.join(map(str, seq['looks_planned']))} pairs, "
        f"Lan-DeMets {seq['spending'].replace('_', '-')} alpha spending{fut}{stop}. Each look tests the "
        "pairs so far against its boundary's nominal level (the decision's interval is the repeated "
        "confidence interval at that level)."
    )


def look_rows(seq: Mapping[str, Any]) -> list[list[str]]:
    """One row per look and hypothesis: its test on the pairs so far, the stage-wise p-value, the
    hypothesis' level share, its boundary's nominal level, what the look found, and the stop."""
    rows = []
    for lk, h in ((x, y) for x in seq["looks"] for y in x["hypotheses"]):
        found = (
            f"established (crossed at look {h['crossed_at']})"
            if h["established"]
            else "below the futility bound"
            if h["futile"]
            else "not reached" + (f" ({h['why']})" if h["why"] else "")
            if h["p_value"] is None
            else "not yet"
        )
        test = [h["id"], h["method"] or "n/a", "n/a" if h["n"] is None else str(h["n"])]
        test += [num(h[k], ".3g") for k in ("p_value", "level", "nominal")]
        rows.append([str(lk["look"]), str(lk["pairs"]), *test, found, lk["stop"] or "go on"])
    return rows


#: The page's beside-table columns of each study, after its pairs.
HALF = cols("Reduction | Interval | Half-width")
HALF_POINTS = cols("Change, points | Interval | Half-width")
FLOW_MD = (
    "Per arm: planned, started, ok, failed, interrupted attempts, superseded attempts (of a unit that "
    "ran again whole), missing (no ok record), analysed (in a complete pair or block) and excluded (ok, "
    "but its partner was not)."
)
FLOW_CAPTION = (
    "Per arm: planned, started, ok, failed, interrupted attempts, attempts superseded by a re-run "
    "of their unit, missing, analysed, excluded"
)


def _flow(flow: Sequence[Mapping[str, Any]], md: bool) -> Section:
    """The flow of planned runs: per study, configuration and arm, planned to analysed and excluded
    (report.md's, ``md``, or the page's)."""
    arms = [[r["study"], r["config"], f"{r['role']} ({r['arm']})"] for r in flow]
    counts = [[str(r.get(k, 0 if md else "n/a")) for k, _ in FLOW_COUNTS] for r in flow]
    rows = [[*a, *c] if md else [" / ".join(a), *c] for a, c in zip(arms, counts)]
    head = cols("Study | Configuration | Arm") if md else ["Study / configuration / arm"]
    table = Table(FLOW_CAPTION, [*head, *(h for _, h in FLOW_COUNTS)], rows)
    return Section("Flow of planned runs", [para(FLOW_MD, "md"), table], only="md" if md else "html")


def _beside(beside: Beside | None, points: bool = False) -> list[Section]:
    """The training-time reductions of the configurations both studies ran, side by side (estimate,
    interval and, on the page, its half-width), so what the designs resolve reads side by side; in
    ``points`` (:func:`prereg.render.answer.points_throughout`) each study's change in points, from
    its log ratio's interval, whatever form the earlier study was published in."""
    if beside is None or not beside.rows:
        return []
    bid, design, folder = beside.protocol_id, beside.rows[0].earlier_design, beside.folder
    md_rows, html_rows = [], []
    for b in beside.rows:
        md_rows.append([b.config, b.study])
        html_rows.append([b.config])
        for name, r in ((b.study, b.result), (f"{bid} {b.earlier_study}", b.earlier)):
            est, rng, width = _beside_cells(r, points)
            md_rows[-1] += [str(r.pairs_used), "n/a" if width is None else f"{est} ({rng})"]
            html_rows[-1] += [f"{esc(name)}: {r.pairs_used}", est, rng, f"±{width or 'n/a'}"]

    lvl = level_pct(beside.rows[0].result.level)
    what, unit = ("change in points", "points") if points else ("reduction", "percentage points")
    caption = f"Training-time {what}, this study beside {bid} ({lvl} intervals, half-widths in {unit})"
    change = "Time change, points" if points else "Time reduction"
    said = f" Changes in {SIGN}." if points else ""
    md_head = [*cols(f"Configuration | Study | Pairs | {change} (interval)"), f"{bid} pairs", bid]
    md = (
        f"The same configurations and arms in {bid} ({design}; records `{folder}`, read from its sealed "
        "summary.json)." + said
    )
    html = raw(
        f"<p>The same configurations and arms in the earlier study {esc(bid)} ({esc(design)}; its records: "
        f"<code>{esc(folder)}</code>, audited on their own), read from its sealed summary.json.{esc(said)}</p>",
    )
    half = HALF_POINTS if points else HALF
    html_head = ["Configuration", *(h for w in ("This study", bid) for h in (f"{w}: pairs", *half))]
    blocks: list[Text | Table] = [para(md, "md"), Table("", md_head, md_rows, only="md"), html]
    return [Section(f"Beside {bid}", [*blocks, Table(caption, html_head, html_rows, only="html")])]


def _beside_cells(r: PairedResult, points: bool) -> tuple[str, str, str | None]:
    """A study's training-time cells beside another's: the estimate, the interval and its half-width
    (None without an interval), as a reduction in percent or in ``points`` (its log ratio's)."""
    if points:
        iv = r.training_time.log_ratio
        _, lo, hi = interval_points(iv)
        est, rng = point_cells(iv)
    else:
        iv = r.training_time.interval
        lo, hi = (None, None) if iv is None else (iv.low, iv.high)
        est, rng = cells(iv)
    return est, rng, None if iv is None or lo is None or hi is None else f"{(hi - lo) / 2:.2f}"


def _runs(runs: Sequence[Mapping[str, Any]], commands: bool = False) -> Section:
    """Every run attempt, failures and interruptions included, in plan order (report.md's); the test
    BPB column only where a study's arms are built in (not ``commands``)."""
    rows = [
        [r["run_id"], str(r["attempt"]), r["status"], r["arm"], str(r["seed"]), num(r["training_s"], ".3f")]
        + ([] if commands else [num(r["test_bpb"], ".4f")])
        + [(r["reason"] or "").replace("|", "\\|").replace("\n", " ")]  # one cell
        for r in runs
    ]
    head = cols(
        "Run | Attempt | Status | Arm | Seed | Training (s) | "
        + ("" if commands else "Test BPB | ")
        + "Reason"
    )
    said = para(f"{len(runs)} attempts, failures and interruptions included.")
    return Section("Every run attempt", [said, Table("", head, rows)], only="md")


def _verify(
    summary: Summary, summary_sha256: str | None, records_rel: str, manifest: Mapping[str, object]
) -> Section:
    """How to verify (the page's): what the records are bound to (protocol, tag, freeze, ledger head,
    summary) and the audit command."""
    p = summary.protocol
    got = manifest.get("ledger_head")
    head = got if isinstance(got, Mapping) else {}
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
    truth, roots = (
        "<p>The tag is the source of truth. The standard-library audit checks every record's hash, the "
        "ledger's chain, the freeze against the tag, and recomputes every statistic on this page.</p>",
        "<p>The two trust roots must come from outside this repository, which a forger would rewrite "
        "with the records: the maintainers' allowed-signers file and the ledger head as published "
        "with the study (keep your copies from the first time you verify). The head above is what "
        "the records say, to compare with yours, not to paste: given a signers file inside the "
        "repository, or a head that its README or docs print, the audit says TRUST ROOTS FROM THE "
        "REPOSITORY and exits 3.</p>",
    )
    bound = Table("What the records are bound to", ["Item", "Value"], facts)
    blocks: list[Text | Table] = [raw(truth), bound, raw(roots), raw(f"<pre><code>{esc(cmd)}</code></pre>")]
    return Section("How to verify", blocks, only="html")


def _claims(summary: Summary) -> Section:
    """What is and is not claimed (the page's): the decisions only, on the devices and settings the
    records name; every attempt kept."""
    devices = sorted({r.get("device") or "unknown" for r in summary.runs if r.get("device")})
    p, rec = summary.protocol, summary.records
    how = (
        "tagged before its first run"
        if p.get("preregistered")
        else "run without preregistration (descriptive)"
    )
    items = [
        "<h2>What is and is not claimed</h2><ul>",
        f"<li>Claimed: only the decisions listed above, at the stated error rate, for protocol "
        f"{esc(p['id'])} as {how}; other intervals are descriptive.</li>",
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
    return Section(None, [raw(x) for x in items], only="html")

"""A calibrated study's report and page (a protocol that names ``design_calibration``): the first
screen's table in the seed page's form with the design's calibrated bias beside each change, one
sign convention, the calibration's machine named, and the audit rendering the same texts again;
a calibration from another machine refused where a user applies it to theirs."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, private_copy

QUIET = ROOT / "records" / "calibration-classes"
LOADED = ROOT / "records" / "calibration-classes-loaded"
XEON = "Intel(R) Xeon(R) Processor @ 2.80GHz"
EPYC = "AMD EPYC 7B13"

CALIBRATED = """\
design_calibration: protocols/calibration-classes.yaml
effect_class: cache-heavy
replicates: {count: 2, min_gap_s: 0}
"""
SPEED = """\
    - {id: H0-cpu, study: pairs, endpoint: training_cpu_time, estimand: log_ratio, type: superiority, better: lower}
"""


def _calibration_copy(repo: Path, machine: str) -> None:
    """The committed class calibration's protocol and sealed summaries, with one record each naming
    ``machine`` as its CPU model (the field the harness writes: ``env.device_name``)."""
    shutil.copy(ROOT / "protocols" / "calibration-classes.yaml", repo / "protocols")
    for src in (QUIET, LOADED):
        dst = repo / "records" / src.name
        dst.mkdir(parents=True)
        shutil.copy(src / "summary.json", dst)
        (dst / "x.pair000.baseline.a1.record.json").write_text(
            json.dumps({"env": {"host": "h", "device_name": machine}}, indent=1)
        )


def calibrated_study(
    tmp_path: Path, machine: str = XEON, calibrated: bool = True, stall: bool = False
) -> Path:
    """A tiny replicated study (native against cotangent, a process per arm, a CPU-clock speed
    hypothesis) whose protocol names the committed class calibration, run in process over two
    replicates with times that vary by seed and arm, then reported with ``harness report``."""
    from conftest import git, init_study, tiny_protocol
    from fake_trainer import FakeTrainer

    from harness.execute.inprocess import InProcessExecutor
    from harness.execute.runner import Runner
    from harness.protocol import load_protocol

    text = tiny_protocol(steps=5).replace("seeds: [1, 2]", "seeds: [1, 2, 3, 4, 5, 6, 7, 8]")
    text = text.replace("  tests:\n", "  tests:\n" + SPEED, 1).replace(
        "procedure: fixed_sequence", "procedure: holm"
    )
    if calibrated:
        text = text.replace("order_seed:", CALIBRATED + "order_seed:", 1)
    else:
        text = text.replace("order_seed:", "replicates: {count: 2, min_gap_s: 0}\norder_seed:", 1)
    repo = tmp_path / "study"
    repo.mkdir()
    (repo / "protocols").mkdir()
    _calibration_copy(repo, machine)
    init_study(repo, protocol=text)

    class Varied(FakeTrainer):
        def __call__(self, job, partial):
            cand = job.spec.role == "candidate"
            self.device_s = (1.0 + (job.spec.seed % 3) / 10) * (
                (0.97 - job.spec.seed / 1000) if cand else 1.0
            )
            super().__call__(job, partial)
            partial.note(env={"device_name": XEON}, parameters=3_350_000)
            if stall and job.spec.seed == 2 and cand:  # stopped from outside for 40 s before step 3
                partial.curve = [[s, v, t + (40.0 if s >= 3 else 0.0)] for s, v, t in partial.curve]
            if stall and job.spec.seed == 3 and not cand:  # 500 s before its first step
                partial.note(timings={**partial.result.timings, "setup_s": 500.0})

    for k in (1, 2):
        Runner(
            load_protocol(repo / "protocols" / "tiny.yaml"),
            echo=lambda _: None,
            executor=InProcessExecutor(train=Varied()),
            replicate=k,
        ).run()
    git(repo, "add", "-A")
    return repo


def _report(repo: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, dict]:
    from harness.cli import main

    monkeypatch.chdir(repo)  # in process: this checkout's harness, whatever is installed
    assert main(["report", "protocols/tiny.yaml", "--quiet"]) == 0
    folder = repo / "records" / "tiny"
    summary = json.loads((folder / "summary.json").read_text())
    return (folder / "report.md").read_text(), (folder / "index.html").read_text(), summary


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, dict]:
    """The calibrated study (:func:`calibrated_study`'s default) run and reported once for the
    module: its repository, report.md, index.html and summary. The tests that only read it share
    it; a test that edits a file works on its own copy (:func:`private_copy`)."""
    repo = calibrated_study(tmp_path_factory.mktemp("calibrated"))
    with pytest.MonkeyPatch.context() as mp:
        md, page, summary = _report(repo, mp)
    return repo, md, page, summary


@pytest.fixture(scope="module")
def uncalibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, dict]:
    """The same study without a ``design_calibration`` (``calibrated=False``), run and reported
    once for the module; the tests only read it."""
    repo = calibrated_study(tmp_path_factory.mktemp("uncalibrated"), calibrated=False)
    with pytest.MonkeyPatch.context() as mp:
        md, page, summary = _report(repo, mp)
    return repo, md, page, summary


def _expected_bias(endpoint_clock: str, design: str) -> str:
    """The bias text computed here from the sealed summaries' rows, not by the code under test:
    every cache-heavy plant (matmul, gather) of ``design`` on the clock, quiet then loaded."""
    parts = []
    for cond, src in (("quiet", QUIET), ("loaded", LOADED)):
        rows = [
            r
            for r in json.loads((src / "summary.json").read_text())["planted"]
            if r["kind"] in ("matmul", "gather")
            and r["clock"] == endpoint_clock
            and r["design"] == design
            and not r.get("reference")
        ]
        assert rows, (cond, design)
        each = "; ".join(
            f"{r['plant']} {r['bias']:+.2f} ({r['bias_lo']:+.2f} to {r['bias_hi']:+.2f})"
            for r in sorted(rows, key=lambda r: r["plant"])
        )
        parts.append(f"{cond} {each}")
    return ", ".join(parts)


def test_the_first_screen_is_the_seed_pages_table_with_the_calibrated_bias(calibrated):
    _, md, page, summary = calibrated
    head = md.split("## The answer")[0]
    assert (
        "## The result" in head
        and "| Configuration | Parameters | Clock | Training time (s) | Change, points (negative: faster) |"
        in head
    )
    bias = _expected_bias("CPU", "a process per arm")
    assert f"{bias} (calibrated on {XEON})" in head
    # the change is the decision's (over the replicates), in points, and in words the same way
    d = next(x for x in summary["hypotheses"]["decisions"] if x["id"] == "H0-cpu")
    pts = 100 * d["estimate"]
    words = f"{'faster' if pts < 0 else 'slower'} by {abs(100 * math.expm1(d['estimate'])):.2f}%"
    row = f"| tiny_conv | 3.35M | CPU | native {{}} / cotangent {{}} | {pts:+.2f} | {100 * d['low']:+.2f} to {100 * d['high']:+.2f} (90%) | {words} |"
    tt = summary["studies"][0]["configs"][0]["training_cpu_time"]
    assert row.format(f"{tt['baseline_mean']:.2f}", f"{tt['candidate_mean']:.2f}") in head
    assert pts < 0 and words.startswith("faster")  # the candidate was planted 3% faster
    assert "positive: the candidate slower" in head
    # the page's first screen: the same table before the answer
    first = page.split("<h2")[1]
    assert first.startswith(">The result") or "The result" in first.split("</h2>")[0]
    assert "Calibrated bias, points (95%)" in first and bias.split(";")[0] in first
    # every speed result printed beside its bias: the answer's sentence and the decisions' table
    answer = md.split("## The answer")[1].split("##")[0]
    assert "calibrated bias" in answer and "reduction" not in answer
    decisions = md.split("## Decisions")[1].split("##")[0]
    assert "Calibrated bias, points (95%)" in decisions and bias in decisions


def test_the_audit_renders_the_calibrated_texts_again_and_a_changed_bias_fails(calibrated, tmp_path):
    from audit.published import check_published

    repo = private_copy(calibrated[0], tmp_path / "study")  # reported; this test edits its report.md
    folder = str(repo / "records" / "tiny")
    summary = json.loads((repo / "records" / "tiny" / "summary.json").read_text())
    manifest = json.loads((repo / "records" / "tiny" / "MANIFEST").read_text())
    problems, said = check_published(folder, str(repo), summary, manifest)
    assert problems == [], problems
    md = repo / "records" / "tiny" / "report.md"
    first = _expected_bias("CPU", "a process per arm").split(" ")[3]  # the first plant's bias
    md.write_text(md.read_text().replace(first, "+0.00", 1))
    problems, _ = check_published(folder, str(repo), summary, manifest)
    assert problems and "report.md: not what" in problems[0]


def test_a_study_run_on_another_machine_than_its_calibration_names_both(tmp_path, monkeypatch):
    repo = calibrated_study(tmp_path, machine=EPYC)
    md, page, _ = _report(repo, monkeypatch)
    head = md.split("## The answer")[0]
    assert f"(calibrated on {EPYC})" in head
    assert f"calibrated on {EPYC}; this study ran on {XEON}" in head
    assert "The study ran on a CPU model its calibration was not made on" in head
    assert "AMD EPYC 7B13" in page


def test_a_study_without_a_calibration_has_no_bias_and_gives_its_changes_in_points(uncalibrated):
    """No first-screen table and no bias line without a calibration; the convention is the one every
    study from now on uses (docs/decisions.md, "One sign convention")."""
    _, md, page, _ = uncalibrated
    assert "## The result" not in md and "Calibrated bias" not in md and "## Stalls" not in md
    assert (
        "Each change is in points of 100 x ln(T_candidate / T_baseline); positive: the candidate slower" in md
    )
    assert "reduction in percent" not in md and "Time change (points)" in md


def test_a_run_that_stalled_is_named_in_the_report_and_the_audit_renders_it_again(tmp_path, monkeypatch):
    """A step 40 s late (a step takes about 0.1 s) and a first step 500 s after the start (runs take
    about 1 s whole): each run named, by the progress line's rule (prereg/stalls.py)."""
    from audit.published import check_published

    repo = calibrated_study(tmp_path, calibrated=False, stall=True)
    md, page, summary = _report(repo, monkeypatch)
    stalls = md.split("## Stalls")[1].split("\n## ")[0]
    runs = {x.split(" (attempt")[0].lstrip("* ") for x in stalls.splitlines() if x.startswith("* ")}
    assert runs == {"pairs.tiny_conv.pair001.candidate", "pairs.tiny_conv.pair002.baseline"}, stalls
    assert (
        "no step for 40 s before step 3" in stalls and "its first step came 500 s after its start" in stalls
    )
    assert "id=stalls" in page and "no step for 40 s before step 3" in page
    folder = str(repo / "records" / "tiny")
    manifest = json.loads((repo / "records" / "tiny" / "MANIFEST").read_text())
    assert check_published(folder, str(repo), summary, manifest)[0] == []


def test_the_stall_rule_is_the_progress_lines(tmp_path):
    from harness.execute.state import STALL_FLOOR_S, first_step_limit
    from prereg.stalls import step_stall

    assert first_step_limit([4.0, 5.0, 6.0]) == STALL_FLOOR_S == 30.0
    assert step_stall([0.1 * k for k in range(1, 20)]) is None
    assert step_stall([1.0, 2.0, 3.0, 34.0, 35.0]) == (4, 31.0, 1.0)
    assert step_stall([1.0, 2.0, 3.0, 7.5, 8.5]) is None  # 4.5 steps: under five, and under 30 s
    assert step_stall([10.0, 20.0, 30.0, 75.0]) is None  # 45 s: over 30 s, under five 10 s steps
    assert step_stall([10.0, 20.0, 30.0, 40.0, 95.0]) == (5, 55.0, 10.0)


def test_a_protocol_file_changed_after_its_records_renders_without_a_calibration(calibrated, tmp_path):
    """The calibration is read from the study's own protocol only when its sha256 is the records':
    an edited file (a design_calibration added afterwards) changes nothing the audit renders."""
    from prereg.calibrated import find_calibration

    repo = private_copy(calibrated[0], tmp_path / "study")  # this test edits its protocol file
    summary = json.loads((repo / "records" / "tiny" / "MANIFEST").read_text())
    proto = json.loads(next((repo / "records" / "tiny").glob("*.record.json")).read_text())["protocol"]
    assert find_calibration(str(repo / "records" / "tiny"), {**proto, "path": "protocols/tiny.yaml"})
    p = repo / "protocols" / "tiny.yaml"
    p.write_text(p.read_text() + "\n")
    assert find_calibration(str(repo / "records" / "tiny"), {**proto, "path": "protocols/tiny.yaml"}) is None
    assert summary  # the MANIFEST is there: the folder is a sealed one


def test_the_bias_is_the_rows_calibration_verdict_ranks(tmp_path):
    """One home: the design's bias the report shows is the row set ``harness calibration-verdict``
    ranks (``prereg.planted.verdicts``) for the class, design and clock."""
    from prereg.calibrated import bias_text, find_calibration
    from prereg.planted import verdicts

    rows = json.loads((QUIET / "summary.json").read_text())["planted"]
    v = next(
        x
        for x in verdicts(rows)
        if x.effect_class == "cache-heavy" and x.design == "lockstep, blocks of 1, steps after its own"
    )
    from prereg.calibrated import Calibration, Condition

    cal = Calibration("cache-heavy", "p.yaml", (Condition("q", "quiet", tuple(rows), (XEON,)),))
    text = bias_text(cal, 1, "own_step_cpu_time")
    for r in v.rows:
        assert f"{r['plant']} {r['bias']:+.2f} ({r['bias_lo']:+.2f} to {r['bias_hi']:+.2f})" in text
    assert bias_text(cal, 1, "training_cpu_time") != text  # the whole times' estimator: other rows
    wall_only = Calibration(
        "wall-only", "p.yaml", (Condition("q", "quiet", tuple(r for r in rows if r["kind"] != "sleep"), ()),)
    )
    assert bias_text(wall_only, 1, "own_step_time").startswith("bias not calibrated for this class")
    assert find_calibration(str(tmp_path), {"path": "none.yaml", "sha256": "0" * 64}) is None
    unrun = Calibration("cache-heavy", "p.yaml", ())
    assert bias_text(unrun, 1, "own_step_cpu_time") == (
        "bias not calibrated for this class (no records of p.yaml here: harness run p.yaml)"
    )


# --- a calibration from another machine, applied to this one: refused by name ---------------------


def _machine_folder(folder: Path, machine: str) -> Path:
    """A records folder with two run records naming ``machine`` as their CPU model."""
    folder.mkdir(parents=True)
    for k in (0, 1):
        (folder / f"s.c.pair00{k}.baseline.a1.record.json").write_text(
            json.dumps({"spec": {"run_id": "x"}, "env": {"host": "h", "device_name": machine}}, indent=1)
        )
    return folder


def test_a_calibration_from_another_cpu_model_is_refused_naming_file_key_and_line(tmp_path):
    from prereg.calibrated import refuse_other_machine
    from prereg.errors import InputError

    folder = _machine_folder(tmp_path / "cal", EPYC)
    refuse_other_machine([str(folder)], EPYC)  # its own machine: nothing to say
    with pytest.raises(InputError) as e:
        refuse_other_machine([str(folder)], XEON)
    first = sorted(folder.glob("*.record.json"))[0]
    line = (
        first.read_text()
        .splitlines()
        .index(next(x for x in first.read_text().splitlines() if "device_name" in x))
        + 1
    )
    assert e.value.file == str(first) and e.value.key == "env.device_name" and e.value.line == line
    assert str(e.value).startswith(f"{first}:{line}, key env.device_name: 'AMD EPYC 7B13'")
    assert "\n" not in str(e.value)
    xeon = _machine_folder(tmp_path / "cal2", XEON)
    refuse_other_machine([str(xeon), str(xeon)], None)  # one machine's calibrations
    with pytest.raises(InputError, match="made on different CPU models"):
        refuse_other_machine([str(xeon), str(folder)], None)


def test_calibration_verdict_refuses_two_machines_mixed_and_writes_nothing(tmp_path, capsys):
    from harness.cli import main

    a = tmp_path / "a"
    shutil.copytree(QUIET, a, ignore=shutil.ignore_patterns("*.png", "index.html", "report.md"))
    b = tmp_path / "b"
    shutil.copytree(LOADED, b, ignore=shutil.ignore_patterns("*.png", "index.html", "report.md"))
    rec = sorted(b.glob("*.record.json"))[0]
    rec.write_text(rec.read_text().replace(XEON, EPYC))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["calibration-verdict", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{rec}:" in err and "env.device_name" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_power_refuses_and_compare_names_the_committed_calibration_on_another_cpu_model(monkeypatch, capsys):
    """The committed calibrations ran on an Intel Xeon: on a machine that says it is an AMD EPYC,
    ``harness power --calibration`` (a calibration the user names) refuses them by name, and
    ``harness compare`` (whose calibration is built in) keeps its choice and says where its bias
    was measured."""
    import harness.machine
    from harness.cli import main
    from harness.compare_cmd import calibrated_choice

    monkeypatch.setattr(harness.machine, "cpu_model", lambda: XEON)
    own = calibrated_choice("cache-heavy")
    assert own[1].startswith("bias: ") and "another CPU model" not in own[1]  # its own machine
    monkeypatch.setattr(harness.machine, "cpu_model", lambda: EPYC)
    there = calibrated_choice("cache-heavy")
    assert there[0] == own[0] and there[1].startswith(own[1])
    assert "measured on another CPU model" in there[1] and "records/calibration-classes" in there[1]
    monkeypatch.chdir(ROOT)
    code = main(
        [
            "power",
            "protocols/cpu2-pilot.yaml",
            "--target",
            "protocols/cpu3.yaml",
            "--calibration",
            "protocols/calibration-classes.yaml",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "records/calibration-classes/" in err and "key env.device_name" in err, err
    assert err.count("\n") == 1


def test_cpu2_with_a_calibration_opens_with_the_seed_pages_table():
    """cpu2's sealed summary (no design_calibration: it renders as committed) rendered with the class
    calibration beside it: one row per configuration and speed decision, the decision's figures in
    points and in words, the whole-times design's bias (lockstep, blocks of 1), a valid page."""
    from pagecheck import check_static

    from prereg.calibrated import Calibration, Condition
    from prereg.render.page import document
    from prereg.render.sections import sections
    from prereg.results import Summary

    data = json.loads((ROOT / "records" / "cpu2" / "summary.json").read_text())
    summary = Summary.read(data, "records/cpu2/summary.json")
    conds = tuple(
        Condition(
            str(src.relative_to(ROOT)),
            cond,
            tuple(json.loads((src / "summary.json").read_text())["planted"]),
            (XEON,),
        )
        for cond, src in (("quiet", QUIET), ("loaded", LOADED))
    )
    cal = Calibration("cache-heavy", "protocols/calibration-classes.yaml", conds, (XEON,))
    parts = sections(summary, cal=cal)
    page = document(summary, parts)
    check_static(page)
    from prereg.render.model import to_md

    md = to_md(parts)
    head = md.split("## The answer")[0]
    rows = [x for x in head.splitlines() if x.startswith("| ") and not x.startswith("| Configuration")]
    speed = [
        d
        for d in data["hypotheses"]["decisions"]
        if d["endpoint"] in ("training_time", "training_cpu_time") and d["study"] != "null_aa"  # A/A: no row
    ]
    assert len(rows) == len(speed) == 10
    whole_cpu = _expected_bias("CPU", "lockstep, blocks of 1")
    for d in speed:
        pts = 100 * d["estimate"]
        pct = abs(100 * math.expm1(d["estimate"]))
        row = next(
            r
            for r in rows
            if r.startswith(f"| {d['config']} |") and ("| CPU |" in r) == ("cpu" in d["endpoint"])
        )
        assert f"| {pts:+.2f} | {100 * d['low']:+.2f} to {100 * d['high']:+.2f}" in row
        assert f"{'faster' if pts < 0 else 'slower'} by {pct:.2f}%" in row
        if "cpu" in d["endpoint"]:
            assert whole_cpu in row
    assert "| small_transformer | 3.35M |" in head  # the seed page's published-size model
    assert md.index("## The result") < md.index("## The answer") < md.index("## Decisions")
    assert page.index(">The result</h2>") < page.index("<ul class=answer>")


# --- the bias under every speed table, the calibration pinned, one convention ----------------------


def _line_after(text: str, table_head: str, beside: str) -> str:
    """The line starting "Calibrated bias beside ``beside``" that comes after the table whose header
    starts ``table_head``, before the next heading: the bias stands under its own table."""
    at = text.index(table_head)
    end = min([i for i in (text.find("\n#", at), text.find("<h2", at)) if i >= 0] or [len(text)])
    start = text.index(f"Calibrated bias beside {beside}", at)
    assert start < end, (table_head, beside)
    return text[start : text.index("\n", start)]


def test_every_speed_table_carries_the_bias_read_from_the_calibration_summary(calibrated):
    """The wall and CPU time tables, report.md's every-pair table, the page's every-pair table and the
    replicates table each have the design's bias under them: the cache-heavy rows of the committed
    calibration's two summaries, read here, quiet then loaded, with the calibration's machine; the
    folders cited with their summaries' sha256."""
    import hashlib
    import html as html_

    _, md, page, _ = calibrated
    page = html_.unescape(page)
    wall, cpu = (f"{_expected_bias(c, 'a process per arm')} (calibrated on {XEON})." for c in ("wall", "CPU"))
    design = "(a process per arm, {} clock, a cache-heavy change): "
    for text, head in (
        (md, "| Configuration | Parameters | native / cotangent"),
        (page, "<caption>Training time,"),
    ):
        line = _line_after(text, head, "the training times")
        assert line.startswith(
            f"Calibrated bias beside the training times of study pairs {design.format('wall')}{wall}"
        )
        assert (
            "In points of 100 x ln(T_candidate / T_baseline); positive: the candidate slower, as this table."
            in line
        )
        assert "reads the reduction" not in line
    line = _line_after(
        md, "| Configuration | native / cotangent (geometric mean) | CPU-time change (points)", "the CPU"
    )
    assert line.startswith(f"Calibrated bias beside the CPU times of study pairs {design.format('CPU')}{cpu}")
    line = _line_after(md, "| Configuration | Seed | First |", "every pair")
    assert line.startswith(f"Calibrated bias beside every pair's time change {design.format('wall')}{wall}")
    line = _line_after(page, "Study pairs: every pair</caption>", "the pairs")
    assert line.startswith(f"Calibrated bias beside the pairs of study pairs {design.format('wall')}{wall}")
    for text in (md, page):
        at = text.index("Replicates: the effect across times and machines")
        for clock, bias in (("wall", wall), ("CPU", cpu)):
            said = f"Calibrated bias beside the replicates of study pairs {design.format(clock)}{bias}"
            assert said in text[at:], clock
    for src, cond in ((QUIET, "quiet"), (LOADED, "loaded")):
        sha = hashlib.sha256((src / "summary.json").read_bytes()).hexdigest()
        assert f"records/{src.name} ({cond}, summary.json sha256 {sha})" in md


def _audit(repo: Path) -> subprocess.CompletedProcess[str]:
    import sys

    cmd = [sys.executable, "-I", "-S", "-B", str(ROOT / "analysis" / "public_audit.py"), "records/tiny"]
    return subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=300)


def test_a_changed_calibration_summary_is_refused_by_the_audit_by_name(calibrated, tmp_path):
    """The texts pin each calibration folder's summary.json by sha256; the audit shows the pin in a
    row of its own, and a calibration summary changed after the study's texts were written (one
    bias figure edited, the file still valid) fails it: exit 1, the folder and both hashes named."""
    import hashlib

    repo = private_copy(calibrated[0], tmp_path / "study")  # this test edits a calibration summary
    out = _audit(repo)
    pinned = hashlib.sha256(
        (repo / "records" / "calibration-classes" / "summary.json").read_bytes()
    ).hexdigest()
    # (the fake trainer's study fails one unrelated row, its clocks' rounding: exit 1 either way;
    # the pin's own row and the texts' row are what is checked here)
    row = next(x for x in out.stdout.splitlines() if x.startswith("calibration "))
    assert "ok: the calibration the texts cite, as pinned" in row and pinned in row, out.stdout[-3000:]
    assert "ok: index.html and report.md byte for byte" in out.stdout
    assert "calibration changed" not in out.stdout
    summary = repo / "records" / "calibration-classes" / "summary.json"
    data = json.loads(summary.read_text())
    data["planted"][0]["bias"] += 0.5
    summary.write_text(json.dumps(data, indent=1))
    now = hashlib.sha256(summary.read_bytes()).hexdigest()
    out = _audit(repo)
    assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr, out.stdout[-3000:]
    said = next(x for x in out.stdout.splitlines() if x.startswith("calibration "))
    assert "FAILED" in said and "records/calibration-classes" in said and pinned in said and now in said
    problems = out.stdout.split("problem(s):")[1]
    assert (
        "- records/tiny: its texts cite the calibration records/calibration-classes at summary.json "
        f"sha256 {pinned}, but that summary now has sha256 {now}: the calibration changed after the "
        "study's texts were written" in problems
    ), problems


def test_a_study_with_no_calibration_cites_none_and_its_audit_has_no_calibration_row(uncalibrated):
    from prereg.calibrated import changed_pins, cited_pins

    repo, md, page, summary = uncalibrated
    assert cited_pins(md + page) == {}
    assert changed_pins(str(repo / "records" / "tiny"), summary["protocol"], md) == []


def test_cpu1_and_cpu2_carry_the_bias_of_their_design_applied_after_the_study():
    """The committed cpu1 (a process per arm) and cpu2 (lockstep, blocks of 1): their texts, as
    committed, carry their design's cache-heavy bias from the class calibration's summaries, say it
    was applied after the study, and are what the audit renders (test_published audits them)."""
    for study, design in (("cpu1", "a process per arm"), ("cpu2", "lockstep, blocks of 1")):
        md = (ROOT / "records" / study / "report.md").read_text()
        wall = f"{_expected_bias('wall', design)} (calibrated on {XEON})"
        assert f"Calibrated bias beside the training times of study pairs ({design}, wall clock" in md
        assert wall in md.split("## Study pairs")[1], study
        assert "The calibration was measured after this study" in md


@pytest.mark.parametrize("first,endpoint", [("pairs", "training_cpu_time"), ("published", "training_time")])
def test_a_compare_studys_report_says_the_change_as_the_terminal_verdict_does(first, endpoint):
    """A study of command arms (what harness compare writes; here cpu2's sealed figures with its
    studies' arms as commands): report.md's answer and decisions give the change in compare's
    convention, points of 100 x ln(T_candidate / T_baseline), positive: the candidate slower, the
    same figure, sign and words as the terminal's change and verdict (harness.compare_cmd.answer_of
    and headline, compare's own code): faster, established (tiny_transformer, CPU), and slower,
    unresolved (small_transformer, wall)."""
    import re

    from test_compare_cmd import _compare

    from harness.compare_cmd import answer_of, headline
    from prereg.render.model import to_md
    from prereg.render.sections import sections
    from prereg.results import Summary

    data = json.loads((ROOT / "records" / "cpu2" / "summary.json").read_text())
    for s in data["protocol"]["studies"]:
        s["commands"] = {"baseline": ["python", "train.py"], "candidate": ["python", "train.py"]}
    data["studies"].sort(key=lambda s: s["name"] != first)
    summary = Summary.read(data, "records/x/summary.json")
    c = _compare(endpoint=endpoint)
    a = answer_of(summary, c)
    term = headline(a, c)
    said = re.match(r"head against base: (faster|slower) by (\d+\.\d)%", term[0])
    assert said or term[0].startswith("head against base: no difference resolved"), term[0]
    md = to_md(sections(summary))
    answer = md.split("## The answer")[1].split("\n## ")[0]
    assert (
        "Each change is in points of 100 x ln(T_candidate / T_baseline); positive: the candidate slower"
        in answer
    )
    assert "reduction" not in answer
    config = summary.studies[0].configs[0].config
    clock = "CPU" if "cpu" in endpoint else "wall"
    line = next(x for x in answer.splitlines() if x.startswith(f"* {first} / {config} "))
    got = re.search(
        rf"([+-]\d+\.\d\d) points \([^;]*; (faster|slower) by (\d+\.\d\d)%\) on the {clock} clock", line
    )
    assert got, line
    assert got.group(1) == f"{a.points:+.2f}" == term[1].split()[1]  # "change: +1.14 (95% ..."
    assert got.group(2) == ("slower" if a.points > 0 else "faster")
    if said:  # a resolved verdict: its words and percentage are the report's
        assert got.group(2) == said.group(1) and abs(float(got.group(3)) - float(said.group(2))) <= 0.051
    decisions = md.split("## Decisions")[1].split("\n## ")[0]
    assert "% reduction" not in decisions and " points (faster by " in decisions


def test_time_to_target_and_total_time_say_the_calibration_measures_no_bias_for_them():
    """Issue 57: a speed figure of a calibrated study has its bias beside it, or says why none: the
    calibration reads its plants on the training clocks only, so the time to the target and the
    total time (report.md's costs table, the page's costs table) say so; an uncalibrated study's
    texts do not."""
    from prereg.render.studies import UNCALIBRATED

    root = Path(__file__).resolve().parent.parent / "records"
    for calibrated in ("cpu1", "cpu2", "cpu3"):
        md = (root / calibrated / "report.md").read_text()
        page = (root / calibrated / "index.html").read_text()
        assert md.count(UNCALIBRATED) >= 1 and page.count(UNCALIBRATED.replace("'", "&#x27;")) >= 1
        assert md.count(UNCALIBRATED) == md.count("Time to the fixed validation target")
    for plain in ("cpu2-pilot", "calibration-cpu"):
        assert UNCALIBRATED not in (root / plain / "report.md").read_text()


def test_machines_reads_a_folder_once_until_a_record_changes(tmp_path, monkeypatch):
    """A calibration folder's CPU models are parsed once per process; a record rewritten, added or
    removed is read again (its size, modification time or inode changed)."""
    import json
    import os

    import prereg.calibrated as cal

    def write(name: str, cpu: str, pad: str = "") -> None:
        (tmp_path / f"{name}.record.json").write_text(json.dumps({"env": {"device_name": cpu}, "pad": pad}))

    write("a", "CPU A")
    write("b", "CPU A")
    parsed = []
    real = cal.parse_json
    monkeypatch.setattr(cal, "parse_json", lambda raw: parsed.append(1) or real(raw))
    folder = str(tmp_path)
    assert list(cal.machines(folder)) == ["CPU A"] and len(parsed) == 2
    assert list(cal.machines(folder)) == ["CPU A"] and len(parsed) == 2  # kept: nothing parsed again
    write("b", "CPU B", pad="x")  # rewritten: another size
    assert list(cal.machines(folder)) == ["CPU A", "CPU B"] and len(parsed) == 4
    st = os.stat(tmp_path / "b.record.json")
    write("b", "CPU C", pad="y")  # the same size: its modification time tells
    os.utime(tmp_path / "b.record.json", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert list(cal.machines(folder)) == ["CPU A", "CPU C"]
    (tmp_path / "b.record.json").unlink()
    assert list(cal.machines(folder)) == ["CPU A"]
    got = cal.machines(folder)
    got.clear()  # a caller's copy: what is kept is not changed through it
    assert list(cal.machines(folder)) == ["CPU A"]

"""``harness compare`` (harness/compare_cmd.py): its flags resolved and refused before anything is
written, the study it writes (a protocol ``harness plan`` accepts: lockstep at blocks of 1, warm-up,
the effect class's clock, Holm over head-faster and head-slower with Pocock looks), the verdict
and its one sign convention, the calibrated bias against the calibration's own planted row, and
the pull-request comment (rendered in a browser). The process tier runs it end to end in a
repository cloned from a bare one, with a planted slowdown and an A/A change."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, git, init_study

from harness.cliargs import parser
from harness.compare_cmd import (
    CALIBRATION,
    SLOWER_THAN_ALLOWED,
    Compare,
    answer_of,
    clocks_disagree,
    from_args,
    headline,
    looks_for,
    markdown,
    parse_percent,
    protocol_text,
    steps_of,
    verdict,
)
from prereg.errors import InputError

#: A script of the user's own: ``WORK`` seconds of CPU a step (its own thread's clock), the
#: reporter's four calls; the head commit changes WORK.
SCRIPT = textwrap.dedent(
    """\
    import argparse, time
    from harness.reporter import Reporter

    WORK = 0.0020
    SLEEP = 0.0
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int)
    args = ap.parse_args()
    r = Reporter.from_env()
    loss = 4.0 + args.seed % 3 / 10
    for step in range(1, args.steps + 1):
        t = time.thread_time()
        while time.thread_time() - t < WORK:
            pass
        if SLEEP:
            time.sleep(SLEEP)
        loss *= 0.9
        r.step(step, loss)
    with r.untimed():
        r.eval(args.steps, {"val_loss": loss})
    r.done()
    """
)


def two_commits(tmp_path: Path, change: tuple[str, str] | None = ("WORK = 0.0020", "WORK = 0.0021")) -> Path:
    """A repository of the user's own: train.py committed, then (``change``) edited and committed."""
    r = tmp_path / "mine"
    r.mkdir()
    (r / "train.py").write_text(SCRIPT)
    init_study(r, copy=())
    if change is not None:
        (r / "train.py").write_text(SCRIPT.replace(*change))
        git(r, "commit", "-qam", "the change")
    return r


def args(*argv: str) -> SimpleNamespace:
    return parser().parse_args(["compare", *argv])  # type: ignore[return-value]


def test_refs_that_do_not_exist_and_a_dirty_head_are_refused_before_anything_is_written(tmp_path):
    r = two_commits(tmp_path)
    before = sorted(p.name for p in r.iterdir())
    with pytest.raises(InputError, match=r"--base nope: no such commit .*nothing was written"):
        from_args(r, args("--base", "nope", "--head", "HEAD", "--", "python", "train.py", "--steps", "9"))
    with pytest.raises(InputError, match=r"--head deadbeef: no such commit"):
        from_args(r, args("--base", "main", "--head", "deadbeef", "--", "python", "train.py", "--steps", "9"))
    (r / "train.py").write_text(SCRIPT + "# edited\n")
    with pytest.raises(
        InputError, match=r"--head HEAD: the working tree has uncommitted changes \(train.py\)"
    ):
        from_args(r, args("--base", "HEAD~1", "--head", "HEAD", "--", "python", "train.py", "--steps", "9"))
    # an earlier commit as the head is not what is on disk either way: allowed
    c = from_args(r, args("--base", "HEAD~1", "--head", "HEAD~1", "--", "python", "train.py", "--steps", "9"))
    assert c.base_ref == c.head_ref == git(r, "rev-parse", "HEAD~1").strip()
    for bad, msg in (
        ((), "give either --base-cmd and --head-cmd"),
        (("--base-cmd", "python train.py --steps 3"), "go together"),
        (("--base", "HEAD"), "give the command after --"),
        (("--base-cmd", "python train.py", "--head-cmd", "python train.py"), "how many steps"),
        (("--base-cmd", 'python "train.py', "--head-cmd", "python train.py"), "--base-cmd"),
        (("--base-cmd", "python t.py --steps 5", "--head-cmd", "python t.py", "--pairs", "3"), "--pairs 3"),
        (("--base-cmd", "python t.py --steps 5", "--head-cmd", "python t.py", "--id", "../x"), "--id"),
        (
            ("--base-cmd", "python t.py --steps 5", "--head-cmd", "python t.py", "--fail-above", "x"),
            "--fail-above",
        ),
    ):
        with pytest.raises(InputError, match=msg):
            from_args(r, args(*bad))
    assert sorted(p.name for p in r.iterdir()) == before  # nothing written


def test_cli_errors_are_one_line_and_write_nothing(tmp_path):
    """Through the command line (this checkout's harness): a missing ref, a dirty head, a missing
    script: exit 2, one line naming the flag or file, no traceback, no runs/ folder."""
    r = two_commits(tmp_path)
    (r / "train.py").write_text(SCRIPT + "# edited\n")
    cases = [
        (["--base", "nope", "--", "python", "train.py", "--steps", "5"], "--base nope"),
        (["--base", "HEAD~1", "--", "python", "train.py", "--steps", "5"], "uncommitted changes"),
        (["--base-cmd", "python train.py --steps 5", "--head-cmd", "python gone.py --steps 5"], "gone.py"),
    ]
    for argv, needle in cases:
        out = cli(r, "compare", *argv)
        assert out.returncode == 2, out.stdout + out.stderr
        assert needle in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""
        assert not (r / "runs").exists()
    bare = tmp_path / "not-a-repository"
    bare.mkdir()
    out = cli(bare, "compare", "--base-cmd", "python t.py --steps 5", "--head-cmd", "python t.py --steps 5")
    assert out.returncode == 2 and "not in a git repository" in out.stderr and "Traceback" not in out.stderr
    assert list(bare.iterdir()) == []


def test_steps_and_percent_and_looks():
    assert steps_of(["python", "t.py", "--steps", "300"], None) == 300
    assert steps_of(["python", "t.py", "--steps=40"], None) == 40
    assert steps_of(["python", "t.py", "--steps", "{steps}"], 7) == 7
    with pytest.raises(InputError, match="how many steps"):
        steps_of(["python", "t.py", "--steps", "{steps}"], None)
    assert parse_percent("1%") == parse_percent("1") == 1.0
    for bad in ("0", "-1%", "100", "nan", "1 %%"):
        with pytest.raises(InputError):
            parse_percent(bad)
    assert looks_for(12) == (4, 8, 12) and looks_for(8) == (5, 8) and looks_for(4) == ()
    assert looks_for(24) == (8, 16, 24)


def _compare(**kw) -> Compare:
    base = dict(
        id="compare-t",
        base=["python", "train.py", "--seed", "{seed}", "--steps", "20"],
        head=["python", "train.py", "--seed", "{seed}", "--steps", "20"],
        base_ref=None,
        head_ref=None,
        label=("base", "head"),
        steps=20,
        warmup_steps=2,
        pairs=12,
        looks=(4, 8, 12),
        effect_class="cache-heavy",
        endpoint="training_cpu_time",
        bias="bias: (a test's)",
        fail_above=None,
        timeout_s=60.0,
        metric="val_loss",
    )
    return Compare(**{**base, **kw})


@pytest.mark.parametrize(
    "effect_class,clock",
    [
        ("cache-heavy", "training_cpu_time"),
        ("cache-heavy", "own_step_cpu_time"),
        ("wall-only", "training_time"),
        ("wall-only", "own_step_time"),
    ],
)
def test_the_protocol_plans_as_the_calibrated_design(tmp_path, effect_class, clock):
    """The written protocol is one ``harness plan`` accepts: lockstep at blocks of 1 with warm-up
    steps, both hypotheses on the effect class's clock, the --fail-above threshold as the slower
    hypothesis' margin in log units, Pocock looks, not preregistered."""
    from harness.plan import make_plan
    from harness.protocol import load_protocol

    r = two_commits(tmp_path, change=None)
    c = _compare(effect_class=effect_class, endpoint=clock, fail_above=1.0)
    (r / "p.yaml").write_text(protocol_text(c))
    proto = load_protocol(r / "p.yaml")
    s = proto.summary()
    (study,) = s["studies"]
    assert study["lockstep"]["block_steps"] == 1 and study["design"] == "lockstep"  # records schema 6
    assert study["warmup_steps"] == 2 and not s["preregistered"]
    tests = {t["id"]: t for t in s["hypotheses"]["tests"]}
    assert {t["endpoint"] for t in tests.values()} == {clock}
    assert tests["H1-faster"]["better"] == "lower" and tests["H2-slower"]["better"] == "higher"
    assert math.isclose(tests["H2-slower"]["margin"], math.log(1.01))
    assert s["hypotheses"]["sequential"]["looks"] == [4, 8, 12]
    assert len(make_plan(proto)) == 24
    assert "defaults" not in s  # every key written out


def test_the_calibrations_are_read_once_per_process(monkeypatch):
    """Every ``harness compare`` resolution asks for the calibrated choice; the two calibrations'
    summary.json files are read once, then kept (a class asked again reads nothing)."""
    from harness import compare_cmd

    reads: list[str] = []
    real = Path.read_text

    def counting(self: Path, *a, **kw) -> str:
        if self.name == "summary.json":
            reads.append(self.parent.name)
        return real(self, *a, **kw)

    compare_cmd.calibration_rows.cache_clear()
    monkeypatch.setattr(Path, "read_text", counting)
    first = [compare_cmd.calibrated_choice(cls) for cls in ("cache-heavy", "wall-only", "cache-heavy")]
    assert sorted(reads) == ["calibration-classes", "calibration-classes-loaded"]
    assert first[0] == first[2] and compare_cmd.calibrated_choice("wall-only") == first[1]
    assert len(reads) == 2


def test_the_estimator_and_bias_are_the_calibrations_verdict_for_the_class():
    """``calibrated_choice``: of lockstep at blocks of 1's two estimators, the one the committed
    calibration's verdict ranks first for the class (its bias rows, read here straight from the
    sealed summary.json), with each plant's bias; a class it did not plant is not calibrated."""
    from analysis.calibration_study import verdicts
    from harness.compare_cmd import AFTER_OWN, CALIBRATIONS, WHOLE, calibrated_choice

    planted = [
        {**r, "condition": cond}
        for c, cond in zip(CALIBRATIONS, ("quiet", "loaded"))
        for r in json.loads((ROOT / c / "summary.json").read_text())["planted"]
    ]
    for cls in ("cache-heavy", "wall-only"):
        best = next(v for v in verdicts(planted) if v.effect_class == cls and v.design in (WHOLE, AFTER_OWN))
        endpoint, text = calibrated_choice(cls)
        own = best.design == AFTER_OWN
        assert (
            endpoint
            == {
                ("cache-heavy", False): "training_cpu_time",
                ("cache-heavy", True): "own_step_cpu_time",
                ("wall-only", False): "training_time",
                ("wall-only", True): "own_step_time",
            }[cls, own]
        )
        for r in best.rows:
            assert (
                f"{r['plant']} {r['condition']} {r['bias']:+.2f} ({r['bias_lo']:+.2f} to {r['bias_hi']:+.2f})"
                in text
            )
        assert f"from {CALIBRATION} and its loaded twin ({best.design}" in text


def test_verdicts_and_the_sign_convention():
    """Points of 100 ln(T_head/T_base), positive: slower; the verdict in words and percent."""
    p = 100 * math.log(0.969)  # 3.1% faster
    assert verdict(p, p - 0.5, p + 0.5, True, False).startswith("faster by 3.1% (")
    assert verdict(p, p - 0.5, p + 0.5, True, False).endswith(", established")
    assert verdict(3.0, 2.5, 3.5, False, True).startswith("slower by 3.0% (2.5 to 3.6)")
    assert verdict(0.1, -0.8, 0.7, False, False) == "no difference resolved: at most 0.8% either way"
    assert "not established" in verdict(1.0, 0.2, 1.8, False, False)


def _iv(est: float, lo: float, hi: float, n: int = 8) -> SimpleNamespace:
    return SimpleNamespace(estimate=est, low=lo, high=hi, n=n)


def _summary(cpu: tuple, wall: tuple, decided: dict[str, str]) -> SimpleNamespace:
    config = SimpleNamespace(
        training_cpu_time=SimpleNamespace(log_ratio=_iv(*cpu)),
        training_time=SimpleNamespace(log_ratio=_iv(*wall)),
        final_metric=object(),
    )
    decisions = [SimpleNamespace(decision=SimpleNamespace(id=k, status=v)) for k, v in decided.items()]
    proto = {"hypotheses": {"descriptive": "x"}, "studies": []}
    return SimpleNamespace(
        studies=[SimpleNamespace(configs=[config], paired_configs=lambda: [config])],
        hypotheses=SimpleNamespace(decisions=decisions),
        protocol=proto,
    )


def test_a_wall_only_cost_is_flagged_and_the_gate_reads_the_slower_decision():
    """A wall clock reading a change the CPU clock does not (a sleep) is flagged with its likely
    reason; --fail-above fires only on the established slower hypothesis."""
    s = _summary((0.004, -0.001, 0.009), (0.21, 0.18, 0.24), {"H1-faster": "not established"})
    a = answer_of(s, _compare(fail_above=1.0))
    assert a.other_clock and "wall-only cost (sleep, I/O, waiting)" in a.other_clock
    assert "--effect-class wall-only" in a.other_clock
    assert not a.slower_established and a.verdict.startswith("no difference resolved")
    lines = headline(a, _compare())
    assert lines[0].startswith("head against base: no difference resolved")
    assert lines[1].startswith(
        "change: +0.40 (95% interval -0.10 to +0.90) points of 100 x ln(T_head / T_base)"
    )
    assert any(line.startswith("warning: the clocks disagree") for line in lines)
    slow = _summary((0.03, 0.025, 0.035), (0.03, 0.02, 0.04), {"H2-slower": "established"})
    a = answer_of(slow, _compare(fail_above=1.0))
    assert a.slower_established and "beyond 1%: established" in a.verdict and a.other_clock is None
    assert clocks_disagree(None, "training_cpu_time") is None
    # decided on the steps after each arm's own: the warning says its figures are whole times
    own = clocks_disagree(s.studies[0].configs[0], "own_step_cpu_time") or ""
    assert "both from whole training times; the change above is the steps after each arm's own" in own
    assert "wall-only cost" in own and "--effect-class wall-only" in own


def _comment_html() -> str:
    """The pull-request comment of a planted slowdown, rendered as GitHub renders markdown
    (CommonMark with tables: markdown-it-py)."""
    from markdown_it import MarkdownIt

    s = _summary((0.03, 0.025, 0.035), (0.03, 0.02, 0.04), {"H2-slower": "established"})
    c = _compare(fail_above=1.0, label=("main", "HEAD"))
    text = markdown(answer_of(s, c), c, "ledger head: seq 9 sha256 ab", "runs/compare/x/records/report.md")
    return MarkdownIt("commonmark").enable("table").render(text)


def test_the_comment_has_its_table_and_verdict():
    """The verdict in bold, one table row with the change, interval and bias, the ledger head."""
    html = _comment_html()
    assert "<table>" in html and html.count("<tr>") == 2 and "<strong>slower by 3.0%" in html
    assert "+3.00" in html and "+2.50 to +3.50" in html and "ledger head: seq 9 sha256 ab" in html


@pytest.mark.process
def test_the_comment_renders_in_a_browser(tmp_path):
    """In Chromium the rendered comment shows the verdict and the table's cells."""
    from pagecheck import CHROMIUM, require_browser

    page = tmp_path / "comment.html"
    body = _comment_html()
    page.write_text(
        f'<!DOCTYPE html><html lang="en"><meta charset="utf-8"><title>c</title><body>{body}</body></html>'
    )
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            view = browser.new_page(java_script_enabled=False)
            view.goto(page.as_uri())
            assert view.locator("strong").first.inner_text().startswith("slower by 3.0%")
            cells = view.locator("table tr").nth(1).locator("td").all_inner_texts()
            assert cells[:5] == ["main", "HEAD", "CPU", "lockstep, blocks of 1", "8"]
            assert cells[5] == "+3.00" and view.locator("table").bounding_box()["height"] > 20
        finally:
            browser.close()


def cli(repo: Path, *argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """This checkout's ``harness`` command line, run in ``repo`` (the user's repository), with no
    ``PYTHONPATH`` (which ``harness run`` refuses)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    boot = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from harness.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", boot, *argv],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def ci_clone(tmp_path: Path, change: tuple[str, str]) -> Path:
    """What a CI job checks out: the user's two commits pushed to a bare repository and cloned."""
    work = two_commits(tmp_path, change)
    bare = tmp_path / "origin.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    clone = tmp_path / "ci"
    subprocess.run(["git", "clone", "-q", str(bare), str(clone)], check=True)
    return clone


COMMAND = ("--", "python", "train.py", "--seed", "{seed}", "--steps", "30")


@pytest.mark.process
def test_a_planted_slowdown_fails_the_gate_and_the_study_audits(tmp_path):
    """The head commit spins 3% longer a step: harness compare --fail-above 1% prints the verdict
    first, exits non-zero, writes the comment, and harness audit on its records exits 3 with
    "Integrity: everything matched."."""
    r = ci_clone(tmp_path, ("WORK = 0.0020", "WORK = 0.00206"))
    out = cli(
        r,
        "compare",
        "--base",
        "HEAD~1",
        "--head",
        "HEAD",
        "--pairs",
        "8",
        "--fail-above",
        "1%",
        "--markdown",
        str(tmp_path / "comment.md"),
        "--timeout",
        "120",
        *COMMAND,
    )
    assert out.returncode == SLOWER_THAN_ALLOWED, out.stdout + out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("HEAD against HEAD~1: slower by ") and "beyond 1%: established" in first
    assert out.stdout.splitlines()[2].startswith("bias: ")
    assert "Traceback" not in out.stderr
    comment = (tmp_path / "comment.md").read_text()
    assert "beyond 1%: established" in comment and "ledger head: seq" in comment
    (records,) = (r / "runs" / "compare").glob("*/records")
    audit = cli(r, "audit", str(records.relative_to(r)))
    assert audit.returncode == 3 and "Integrity: everything matched." in audit.stdout, (
        audit.stdout + audit.stderr
    )


@pytest.mark.process
def test_an_aa_change_passes_the_gate(tmp_path):
    """A commit that changes nothing the clock sees (a comment): exit 0 (no slowdown beyond 1%
    established) and an estimate within 2% either way.

    Not "nothing established": the head-faster test is allowed a 2.5% false-positive rate by
    design (Holm at 5%, Pocock looks), and CI drew one (faster by about 0.7%, 0.3 to 1.1). What an
    A/A change must never do is fire the gate, whose margin of 1% puts its false-positive rate far
    below that, or read a difference the spin cannot have: 2% is five times the interval's
    half-width at 8 pairs on this script, so a defect of the instrument, not chance, fails it."""
    import re

    r = ci_clone(tmp_path, ("SLEEP = 0.0\n", "SLEEP = 0.0  # a comment\n"))
    out = cli(
        r, "compare", "--base", "HEAD~1", "--pairs", "8", "--fail-above", "1%", "--timeout", "120", *COMMAND
    )
    assert out.returncode == 0, out.stdout + out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("HEAD against HEAD~1: ") and "beyond 1%: established" not in first
    (read,) = re.findall(r"(?:by|at most) (\d+\.\d)%", first)
    assert float(read) < 2.0, first


@pytest.mark.parametrize("design", ["lockstep", "paired"])
def test_init_lockstep_writes_a_cpu_clock_hypothesis_with_warmup(tmp_path, design):
    """harness init --design lockstep: the speed hypothesis on the CPU clock (training_cpu_time),
    the calibrated design's, with warm-up steps and their origin; a process per arm keeps the wall
    clock and no warm-up."""
    from harness.protocol import load_protocol

    r = two_commits(tmp_path, change=None)
    out = cli(r, "init", "protocols/x.yaml", "--design", design, "--steps", "40", "--pairs", "4")
    assert out.returncode == 0, out.stdout + out.stderr
    s = load_protocol(r / "protocols" / "x.yaml").summary()
    (h,) = s["hypotheses"]["tests"]
    (study,) = s["studies"]
    if design == "lockstep":
        assert h["endpoint"] == "training_cpu_time" and study["warmup_steps"] == 4
        assert "warmup_steps:" in (r / "protocols" / "x.yaml").read_text().split("studies:")[0]  # its origin
    else:
        assert h["endpoint"] == "training_time" and "warmup_steps" not in study


def test_the_example_workflow_runs_the_gate_this_parser_accepts():
    """examples/compare-workflow.yml: a pull-request workflow whose harness compare line is one
    this command line accepts, with the gate and the comment, at the pull request's base."""
    import shlex

    import yaml

    doc = yaml.safe_load((ROOT / "examples" / "compare-workflow.yml").read_text())
    assert doc[True] == "pull_request"  # YAML 1.1 reads the key `on` as true
    steps = doc["jobs"]["compare"]["steps"]
    assert steps[0]["with"]["fetch-depth"] == 0
    (line,) = [s["run"] for s in steps if "harness compare" in s.get("run", "")]
    argv = shlex.split(line.replace("${{ github.base_ref }}", "main"))
    a = parser().parse_args(argv[1:])
    assert a.command == "compare" and a.base == "origin/main" and a.head == "HEAD"
    assert parse_percent(a.fail_above) == 1.0 and a.markdown == "comment.md"
    assert steps_of(a.command_argv[1:], a.steps) == 300
    assert any("--body-file comment.md" in s.get("run", "") for s in steps)


@pytest.mark.process
def test_a_wall_only_cost_is_flagged_in_the_answer_and_the_report(tmp_path):
    """The head commit sleeps 2 ms a step (a wall-only cost, as I/O or a data-loader wait would be):
    decided on the CPU clock, which cannot see it, and flagged, with the likely reason, in the
    answer and in report.md's answer."""
    r = ci_clone(tmp_path, ("SLEEP = 0.0\n", "SLEEP = 0.002\n"))
    out = cli(r, "compare", "--base", "HEAD~1", "--pairs", "8", "--timeout", "120", *COMMAND)
    assert out.returncode == 0, out.stdout + out.stderr
    warning = next(
        line for line in out.stdout.splitlines() if line.startswith("warning: the clocks disagree")
    )
    assert "wall-only cost (sleep, I/O, waiting)" in warning and "--effect-class wall-only" in warning
    (records,) = (r / "runs" / "compare").glob("*/records")
    assert "warning: the clocks disagree" in (records / "report.md").read_text()


def test_a_run_with_no_step_for_a_few_step_times_shows_as_stalled():
    """StallWatch: steps every 0.5 s (the reporter file growing), then none: stalled after 5 step
    times, at least 30 s; before its first step, after 3 times an earlier run's whole time."""
    from harness.execute.state import StallWatch, first_step_limit

    w = StallWatch(first_step_limit([4.0, 5.0, 6.0]))
    assert w.first_step_s == 30.0 and first_step_limit([20.0]) == 60.0 and first_step_limit([]) == 120.0
    assert all(w.see(t, 100 * (i + 1)) is None for i, t in enumerate([2.0, 2.5, 3.0, 3.5]))
    assert w.see(33.0, 400) is None
    said = w.see(34.0, 400)
    assert said is not None and said.startswith("STALLED: no step for 30 s (a step took about 0.50 s)")
    assert w.see(35.0, 500) is None  # a step came: no longer stalled
    fresh = StallWatch(60.0)  # the case: a process stopped from outside before its first step
    assert fresh.see(59.0, 0) is None
    assert fresh.see(61.0, 0) == "STALLED: no step in 61 s (earlier runs took about 20 s whole)"


def test_the_heartbeat_says_stalled_once_and_on_the_live_line(tmp_path, monkeypatch):
    """The launcher's beat for a command arm: STALLED on the live line, and once as a line of its
    own; a built-in arm (no reporter file) is never called stalled."""
    import harness.execute.local as local

    lines: list[str] = []
    runner = SimpleNamespace(live=True, echo=lines.append, progress=SimpleNamespace(executed_s=[]))
    clock = [0.0]
    monkeypatch.setattr(local.time, "monotonic", lambda: clock[0])
    (tmp_path / "x.a1.report.jsonl").write_text("{}\n")
    beat = local._heartbeat(runner, "u.pair000", tmp_path, 0.0, True)
    builtin = local._heartbeat(runner, "u.pair001", tmp_path / "none", 0.0, False)
    for t in (1.0, 50.0, 200.0, 201.0):
        clock[0] = t
        beat()
        builtin()
    own = [line for line in lines if not line.startswith("\r")]
    assert len(own) == 1 and own[0].startswith("  u.pair000: STALLED: no step for")
    assert lines[-2].startswith("\r  running u.pair000  201.0s  STALLED")
    assert not any("u.pair001" in line and "STALLED" in line for line in lines)


@pytest.mark.process
def test_two_commands_and_a_declared_wall_only_class(tmp_path):
    """Two commands (--base-cmd, --head-cmd), the head's script sleeping 2 ms a step, declared
    --effect-class wall-only: decided on the wall clock, slower established, its bias the
    calibration's sleep plant's; the study audits."""
    r = two_commits(tmp_path, change=None)
    (r / "slow.py").write_text(SCRIPT.replace("SLEEP = 0.0\n", "SLEEP = 0.002\n"))
    git(r, "add", "slow.py")
    git(r, "commit", "-qm", "a slow copy")
    out = cli(
        r,
        "compare",
        "--base-cmd",
        "python train.py --seed {seed} --steps 30",
        "--head-cmd",
        "python slow.py --seed {seed} --steps 30",
        "--effect-class",
        "wall-only",
        "--pairs",
        "8",
        "--timeout",
        "120",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("python slow.py --seed {seed} --steps 30 against python train.py")
    assert ": slower by " in lines[0] and lines[0].endswith(", established")
    assert "wall clock, lockstep at blocks of 1" in lines[1]
    assert lines[2].startswith("bias: sleep 50 us/step ") and CALIBRATION in lines[2]  # the wall-only plant
    (records,) = (r / "runs" / "compare").glob("*/records")
    audit = cli(r, "audit", str(records.relative_to(r)))
    assert audit.returncode == 3 and "Integrity: everything matched." in audit.stdout, audit.stdout

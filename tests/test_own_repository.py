"""A user's own training script in a repository of their own, through the command line as they would
use it: the README's and docs/your-change.md's minimal protocols plan (and run) as printed, the keys
they leave out take the one set of defaults (``prereg.plan.PROTOCOL_DEFAULTS``) that the harness and
the audit both apply, ``harness init`` writes a complete protocol that runs and never overwrites a
file, and ``harness audit`` / ``python -m audit`` work where ``analysis/public_audit.py`` does not
exist, without the lines that belong to the built-in arms."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, git, harness, init_study

from audit.cli import NOT_VERIFIED
from harness.protocol import load_protocol
from prereg.plan import PROTOCOL_DEFAULTS, expected_summary, plan_from_protocol

#: A training script of the user's own: the reporter's four calls, any extra flag accepted (the
#: candidate's change), a little work a step so the steps take time.
SCRIPT = textwrap.dedent(
    """\
    import argparse, time
    from harness.reporter import Reporter

    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int)
    ap.add_argument("--steps", type=int)
    args, change = ap.parse_known_args()
    r = Reporter.from_env()
    loss = 4.0 + args.seed % 3 / 10
    for step in range(1, args.steps + 1):
        t = time.monotonic()
        while time.monotonic() - t < (0.002 if change else 0.003):
            pass
        loss *= 0.9
        r.step(step, loss)
    with r.untimed():
        r.eval(args.steps, {"val_loss": loss})
    r.done()
    """
)


def yaml_block(text: str, after: str) -> str:
    """The first ```yaml block after the line holding ``after``, its indentation removed."""
    start = text.index(after)
    m = re.search(r"^( *)```yaml\n(.*?)^\1```", text[start:], re.S | re.M)
    assert m, f"no yaml block after {after!r}"
    return textwrap.dedent(m.group(2))


def readme_protocol() -> str:
    return yaml_block((ROOT / "README.md").read_text(), "## Your own change")


def docs_protocol() -> str:
    return yaml_block((ROOT / "docs" / "your-change.md").read_text(), "2. **Name the commands.**")


def own_repo(tmp_path: Path, protocol: str | None = None) -> Path:
    """A fresh git repository of the user's own: train.py, .gitignore and, if given,
    protocols/mine.yaml; nothing of this project copied in."""
    r = tmp_path / "mine"
    (r / "protocols").mkdir(parents=True)
    (r / "train.py").write_text(SCRIPT)
    if protocol is not None:
        (r / "protocols" / "mine.yaml").write_text(protocol)
    return init_study(r, copy=())


@pytest.mark.parametrize("source", [readme_protocol, docs_protocol], ids=["README", "docs"])
def test_the_documented_minimal_protocol_plans_as_printed(tmp_path, source):
    """The snippet, byte for byte as printed, is a whole protocol: harness plan lists its 40 runs
    and names each key that took a default."""
    text = source()
    assert text.startswith("id: mine\n") and "studies:" in text
    r = own_repo(tmp_path, text)
    plan = harness(r, "plan", "protocols/mine.yaml")
    assert plan.returncode == 0 and "Traceback" not in plan.stderr, plan.stdout + plan.stderr
    assert "\n40 runs; protocol mine sha256" in plan.stdout
    note = next(line for line in plan.stdout.splitlines() if line.startswith("defaults ("))
    for key in PROTOCOL_DEFAULTS:
        assert key in note, (key, note)
    assert "device cpu" in note and "preregistered false" in note and "order_seed 0" in note
    assert sorted(p.name for p in r.iterdir()) == [".git", ".gitignore", "protocols", "train.py"]


def test_defaults_have_one_home_the_harness_and_the_audit_read_alike(tmp_path):
    """The harness's protocol, its plan and the audit's reading of the bare file (the core's
    expected_summary and plan over what the standard-library YAML reader gives) agree, the defaults
    named under ``defaults``; a protocol that writes every default out has no ``defaults``, and a
    key written with another value than the default is that value, not the default."""
    from harness.plan import make_plan
    from prereg.protocol.read import protocol_from_text

    r = own_repo(tmp_path, docs_protocol())
    proto = load_protocol(r / "protocols" / "mine.yaml")
    bare = protocol_from_text((r / "protocols" / "mine.yaml").read_bytes(), "protocols/mine.yaml")
    audit_view = expected_summary(bare, proto.sha256, "protocols/mine.yaml")
    assert proto.summary() == {**audit_view, "plugins": {}}
    assert audit_view["defaults"] == sorted(PROTOCOL_DEFAULTS)
    assert audit_view["device"] == "cpu" and audit_view["preregistered"] is False
    assert audit_view["hypotheses"] == {"descriptive": PROTOCOL_DEFAULTS["hypotheses"]["descriptive"]}
    assert [s.to_json() for s in make_plan(proto)] == plan_from_protocol(bare, proto.sha256, {})
    assert bare.defaults == tuple(sorted(PROTOCOL_DEFAULTS)) and bare == proto.spec

    written = {k: v for k, v in PROTOCOL_DEFAULTS.items() if k != "hypotheses"}
    full = "".join(f"{k}: {json.dumps(v)}\n" for k, v in written.items())
    full += 'hypotheses: {descriptive: "no hypotheses declared: intervals only, no decision (the default)"}\n'
    (r / "protocols" / "full.yaml").write_text(full + docs_protocol().replace("id: mine\n", "id: full\n"))
    assert "defaults" not in load_protocol(r / "protocols" / "full.yaml").summary()
    (r / "protocols" / "other.yaml").write_text("interval_level: 0.9\n" + docs_protocol())
    other = load_protocol(r / "protocols" / "other.yaml").summary()
    assert other["interval_level"] == 0.9 and "interval_level" not in other["defaults"]


def test_harness_init_writes_a_complete_protocol_and_never_overwrites(tmp_path):
    """harness init, flags only: every top-level key written out (no default left to apply), each
    commented, the plan accepted; run again it refuses (exit 2, the file untouched); a bad flag
    writes nothing."""
    r = own_repo(tmp_path)
    out = harness(
        r,
        "init",
        "protocols/mine.yaml",
        "--candidate-command",
        "python train.py --seed {seed} --steps {steps} --my-change",
        "--margin",
        "0.05",
        "--pairs",
        "4",
        "--steps",
        "6",
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout + out.stderr
    text = (r / "protocols" / "mine.yaml").read_text()
    proto = load_protocol(r / "protocols" / "mine.yaml")
    assert proto.spec.defaults == ()  # every key written out
    for key in PROTOCOL_DEFAULTS:
        assert re.search(rf"^{key}:", text, re.M), key
    assert all("#" in line for line in text.splitlines() if line.startswith(("version", "device", "budget")))
    assert [t["id"] for t in proto.spec.hypotheses["tests"]] == ["H1-speed", "H2-quality"]
    assert proto.spec.budget_device_seconds == 8 * 600  # every run at its timeout: the stated origin
    assert "8 runs x 600 s timeout" in text
    plan = harness(r, "plan", "protocols/mine.yaml")
    assert plan.returncode == 0 and "\n8 runs;" in plan.stdout and "defaults (" not in plan.stdout

    again = harness(r, "init", "protocols/mine.yaml", "--pairs", "9")
    assert again.returncode == 2 and "already exists" in again.stderr and "Traceback" not in again.stderr
    assert (r / "protocols" / "mine.yaml").read_text() == text
    bad = harness(r, "init", "protocols/bad.yaml", "--command", 'python "train.py')
    assert bad.returncode == 2 and "--command" in bad.stderr and "Traceback" not in bad.stderr
    missing = harness(r, "init", "protocols/gone.yaml", "--command", "python nowhere.py --seed {seed}")
    assert missing.returncode == 2 and "nowhere.py" in missing.stderr and "was not written" in missing.stderr
    assert not (r / "protocols" / "bad.yaml").exists() and not (r / "protocols" / "gone.yaml").exists()


def _audits(r: Path, records: str) -> list[subprocess.CompletedProcess[str]]:
    """``harness audit`` and ``python -m audit`` on ``records``, from the user's repository."""
    return [
        harness(r, "audit", records),
        subprocess.run(
            [sys.executable, "-m", "audit", records], cwd=r, capture_output=True, text=True, timeout=300
        ),
    ]


@pytest.mark.process
def test_the_readme_protocol_and_init_run_and_audit_in_ones_own_repository(tmp_path):
    """The README's protocol (seeds and steps made small) and harness init's output run in the
    user's repository; harness audit and python -m audit pass there, where analysis/public_audit.py
    does not exist, with no corpus or PackedAdamW lines; the records name the defaults."""
    small = re.sub(r"count: \d+", "count: 3", readme_protocol()).replace("steps: 200", "steps: 6")
    r = own_repo(tmp_path, small)
    assert not (r / "analysis").exists()
    run = harness(r, "run", "protocols/mine.yaml", "--quiet")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "defaults (keys this protocol leaves out" in run.stdout
    snapshot = json.loads(next((r / "records" / "mine").glob("protocol.*.json")).read_text())
    assert snapshot["defaults"] == sorted(PROTOCOL_DEFAULTS) and snapshot["device"] == "cpu"
    report = (r / "records" / "mine" / "report.md").read_text()
    assert (
        "not preregistered. Defaults for the keys it leaves out: compile false, corpus pydoc-topics" in report
    )
    for a in _audits(r, "records/mine"):
        assert a.returncode == NOT_VERIFIED and "Integrity: everything matched" in a.stdout, (
            a.stdout + a.stderr
        )
        assert "command runs' evidence" in a.stdout
        assert "corpus" not in a.stdout and "PackedAdamW" not in a.stdout and "phase kernel" not in a.stdout

    init = harness(r, "init", "protocols/init.yaml", "--pairs", "2", "--steps", "5", "--timeout", "60")
    assert init.returncode == 0, init.stdout + init.stderr
    git(r, "add", "-A")
    git(r, "commit", "-qm", "init's protocol")
    run = harness(r, "run", "protocols/init.yaml", "--quiet")
    assert run.returncode == 0 and "defaults (" not in run.stdout, run.stdout + run.stderr
    for a in _audits(r, "records/init"):
        assert a.returncode == NOT_VERIFIED and "Integrity: everything matched" in a.stdout, (
            a.stdout + a.stderr
        )


def test_the_failure_rule_reads_only_early_failures_of_an_arm_with_no_ok_run():
    """prereg.failstop: an arm stops the study only while every record of it failed before its
    first training step; an ok run, or a failure after training began, clears it; an interrupted
    attempt counts neither way; each arm of each study on its own."""
    from prereg.failstop import attempt_of, failing_arms

    def rec(arm: str, status: str, curve: list | None, study: str = "s") -> dict:
        return {
            "spec": {"study": study, "arm": arm, "run_id": f"{study}.{arm}.{len(curve or [])}"},
            "status": status,
            "curve": curve,
            "reason": f"{arm} {status}",
        }

    early = rec("cand", "failed", None)
    assert [a for _, a, _ in failing_arms([attempt_of(early)])] == ["cand"]
    assert failing_arms([attempt_of(early), attempt_of(rec("cand", "ok", [[1, 2.0, 0.1]]))]) == []
    late = rec("cand", "failed", [[1, 2.0, 0.1]])
    assert (
        failing_arms([attempt_of(late)]) == [] and failing_arms([attempt_of(early), attempt_of(late)]) == []
    )
    assert failing_arms([attempt_of(rec("cand", "interrupted", None))]) == []
    both = [
        attempt_of(early),
        attempt_of(rec("base", "ok", [[1, 2.0, 0.1]])),
        attempt_of(rec("cand", "failed", None, "t")),
    ]
    assert [(s, a) for s, a, _ in failing_arms(both)] == [("s", "cand"), ("t", "cand")]


FAILING = """\
id: broken
budget_device_seconds: 600
studies:
  - name: mine
    design: paired
    arms:
      baseline:  {command: [python, train.py, --seed, "{seed}", --steps, "{steps}"], timeout_s: 120}
      candidate: {command: [python, train.py, --seed, "{seed}", --steps, "{steps}", --needs-package], timeout_s: 120}
    metric: {name: val_loss, target: 3.0}
    configs: [small]
    seeds: {count: 4, base: 1}
    steps: 5
"""


@pytest.mark.process
def test_an_arm_that_fails_at_start_up_stops_the_study_after_its_first_pair(tmp_path):
    """The candidate needs a package that is not installed (as the Hugging Face example without
    transformers): the study stops after the first failed run, never runs a baseline whose partner
    already failed the pair, prints the reason and the log's path, exits 1; the audit recomputes
    the stop; a rerun stops at once; after the fix, --retry-failed runs everything."""
    r = own_repo(tmp_path, FAILING)
    (r / "train.py").write_text(
        "import sys\nif '--needs-package' in sys.argv:\n    import needed_package_xyz  # noqa\n" + SCRIPT
    )
    git(r, "commit", "-qam", "the candidate needs a package")
    run = harness(r, "run", "protocols/mine.yaml", "--quiet")
    out = run.stdout + run.stderr
    assert run.returncode == 1 and "Traceback (most recent call last)" not in run.stderr, out
    assert "STOPPED BY THE FAILURE RULE" in out and "needed_package_xyz" in out, out
    assert re.search(r"log: runs/broken/work/\S+\.log", out), out
    records = r / "records" / "broken"
    recs = [json.loads(p.read_text()) for p in sorted(records.glob("*.record.json"))]
    assert {x["spec"]["unit"] for x in recs} == {"mine.small.pair000"}
    failed = [x for x in recs if x["status"] == "failed"]
    assert [x["spec"]["role"] for x in failed] == ["candidate"] and not failed[0].get("curve")
    first = min(recs, key=lambda x: x["spec"]["position"])
    assert len(recs) == (
        2 if first["spec"]["role"] == "baseline" else 1
    )  # no baseline after its partner failed
    for a in _audits(r, "records/broken"):
        assert a.returncode == NOT_VERIFIED and "STOPPED BY THE FAILURE RULE" in a.stdout, a.stdout + a.stderr
    summary = json.loads((records / "summary.json").read_text())
    assert summary["completeness"]["text"].startswith("STOPPED BY THE FAILURE RULE: ")

    # run again without the fix: one more pair, stopped the same way
    again = harness(r, "run", "protocols/mine.yaml", "--quiet")
    assert again.returncode == 1 and "STOPPED BY THE FAILURE RULE" in again.stdout + again.stderr
    units = {json.loads(p.read_text())["spec"]["unit"] for p in records.glob("*.record.json")}
    assert units == {"mine.small.pair000", "mine.small.pair001"}

    # after the fix the same command goes on; the two failed pairs stay failed (recorded)
    (r / "needed_package_xyz.py").write_text("")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "the package")
    fixed = harness(r, "run", "protocols/mine.yaml", "--quiet")
    assert fixed.returncode == 1 and "FAILURE RULE" not in fixed.stdout, fixed.stdout + fixed.stderr
    assert "2 failed" in fixed.stdout
    for a in _audits(r, "records/broken"):
        assert a.returncode == NOT_VERIFIED and "FAILURE RULE" not in a.stdout, a.stdout + a.stderr


def test_the_readme_is_short_and_quotes_no_figure_that_drifts():
    """At most 150 lines (the rest is in docs/), and no test count or suite time, which change with
    every commit: the README points at the command instead."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert not re.search(r"\b\d+ (tests|passed|process tests)\b", text), "a test count in the README"
    assert "pytest's last line gives the count" in text

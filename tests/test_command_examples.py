"""The command-arm examples end to end through the CLI, as a user runs them (at a tiny size): the
nanoGPT-style ``train.py`` (paired and lockstep) and the Hugging Face ``Trainer`` script, each run,
reported, paged and audited; then a repository the test makes, whose arms are one script at two
commits (``ref``), tagged, run and audited, and the hostile checks: the script changed after the
tag, a ref changed, an evidence file edited.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, git, harness, init_study

from audit.cli import NOT_VERIFIED

pytestmark = pytest.mark.long


def _audit(repo: Path, records: str) -> tuple[int, str]:
    import subprocess

    r = subprocess.run(
        [sys.executable, str(ROOT / "analysis" / "public_audit.py"), records],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return r.returncode, r.stdout + r.stderr


def _tiny(text: str, count: int, steps: int) -> str:
    text = re.sub(r"count: \d+", f"count: {count}", text)
    return re.sub(r"\n    steps: \d+", f"\n    steps: {steps}", text).replace("min_pairs: 5", "min_pairs: 3")


@pytest.mark.parametrize("name", ["protocol", "lockstep"])
def test_the_nanogpt_example_runs_reports_and_audits(tmp_path, name):
    r = init_study(tmp_path / "s", copy=("examples",))
    proto = f"examples/nanogpt/{name}.yaml"
    (r / proto).write_text(_tiny((ROOT / proto).read_text(), 3, 10))
    git(r, "commit", "-qam", "tiny")
    run = harness(r, "run", proto, "--quiet")
    assert run.returncode == 0, run.stdout + run.stderr
    rid = "example-nanogpt" + ("-lockstep" if name == "lockstep" else "")
    records = r / "runs" / rid / "records"
    status = harness(r, "status", proto)
    assert status.returncode == 0 and re.search(r"nanogpt +tiny +6 +6 +0 ", status.stdout), status.stdout
    report = (records / "report.md").read_text()
    assert "final_metric (difference)" in report and "val_bpb at each arm's last evaluation" in report
    assert (records / "index.html").is_file() and "val_bpb" in (records / "index.html").read_text()
    kept = sorted(p.name for p in records.glob("*.report.jsonl"))
    assert len(kept) == 6
    for rec in records.glob("*.record.json"):
        data = json.loads(rec.read_text())
        assert data["evidence"]["file"] in kept and data["timings"]["training_s"] > 0
    rc, out = _audit(r, str(records))
    assert (
        rc == NOT_VERIFIED and "command runs' evidence" in out and "Integrity: everything matched" in out
    ), out


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="the clients extra (transformers) is not installed",
)
def test_the_hugging_face_trainer_example_runs_and_audits(tmp_path):
    r = init_study(tmp_path / "s", copy=("examples",))
    proto = "examples/hf_trainer/protocol.yaml"
    (r / proto).write_text(_tiny((ROOT / proto).read_text(), 3, 6))
    git(r, "commit", "-qam", "tiny")
    run = harness(r, "run", proto, "--quiet")
    assert run.returncode == 0, run.stdout + run.stderr
    records = r / "runs" / "example-hf-trainer" / "records"
    report = (records / "report.md").read_text()
    assert "eval_loss at each arm's last evaluation" in report
    rc, out = _audit(r, str(records))
    assert rc == NOT_VERIFIED and "Integrity: everything matched" in out, out


SCRIPT = textwrap.dedent(
    """\
    # a training script of its own: {work} spins per step (a slower or faster version of it)
    import argparse, time
    from harness.reporter import Reporter

    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int)
    ap.add_argument("--steps", type=int)
    args = ap.parse_args()
    r = Reporter.from_env()
    loss = 4.0 + args.seed % 3 / 10
    for step in range(1, args.steps + 1):
        t = time.monotonic()
        while time.monotonic() - t < {work}:
            pass
        loss *= 0.9
        r.step(step, loss)
    with r.untimed():
        r.eval(args.steps, {{"loss": loss}})
    r.done()
    """
)

REF_PROTOCOL = """\
id: mine
version: 1
description: my train.py before and after my change, at two commits
preregistered: true
corpus: pydoc-topics
device: cpu
compile: false
threads: 1
budget_device_seconds: 300
interval_level: 0.95
hypotheses:
  procedure: holm
  family_alpha: 0.05
  min_pairs: 3
  tests:
    - {{id: H1, study: change, endpoint: training_time, estimand: log_ratio, type: superiority, better: lower}}
order_seed: 7
origins:
  seeds: "a test"
studies:
  - name: change
    design: paired
    arms:
      baseline:  {{command: [python, train.py, --seed, "{{seed}}", --steps, "{{steps}}"], timeout_s: 60, ref: {before}}}
      candidate: {{command: [python, train.py, --seed, "{{seed}}", --steps, "{{steps}}"], timeout_s: 60, ref: {after}}}
    metric: {{name: loss, target: 3.0}}
    configs: [tiny]
    seeds: [1, 2, 3]
    steps: 8
"""


def test_one_script_at_two_commits_tagged_run_audited_and_attacked(tmp_path):
    r = tmp_path / "mine"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "test@example.invalid")
    git(r, "config", "user.name", "Test")
    (r / ".gitignore").write_text("runs/\n__pycache__/\n")
    (r / "train.py").write_text(SCRIPT.format(work=0.02))
    git(r, "add", "-A")
    git(r, "commit", "-qm", "before")
    before = git(r, "rev-parse", "HEAD").strip()
    (r / "train.py").write_text(SCRIPT.format(work=0.01))
    git(r, "commit", "-qam", "after: half the work a step")
    after = git(r, "rev-parse", "HEAD").strip()
    (r / "protocols").mkdir()
    (r / "protocols" / "mine.yaml").write_text(REF_PROTOCOL.format(before=before, after=after))
    git(r, "add", "-A")
    git(r, "commit", "-qm", "protocol")
    tag = harness(r, "tag", "protocols/mine.yaml")
    assert tag.returncode == 0, tag.stdout + tag.stderr
    manifest = git(r, "for-each-ref", "--format=%(contents)", "refs/tags/protocol-mine")
    assert before in manifest and after in manifest and '"packages"' in manifest
    run = harness(r, "run", "protocols/mine.yaml", "--quiet")
    assert run.returncode == 0, run.stdout + run.stderr
    records = r / "records" / "mine"
    if not records.is_dir():
        records = next(p.parent for p in r.rglob("MANIFEST"))
    summary = json.loads((records / "summary.json").read_text())
    h1 = summary["hypotheses"]["results"][0] if "results" in summary["hypotheses"] else None
    pairs = summary["studies"][0]["configs"][0]["pairs"]
    assert all(p["candidate_training_s"] < p["baseline_training_s"] for p in pairs)  # the ref's change ran
    assert h1 is None or h1
    assert not list(r.glob("../harness-ref-*"))
    assert git(r, "worktree", "list").count("\n") == 1  # every worktree the runs made is gone
    rc, out = _audit(r, str(records))
    assert rc == NOT_VERIFIED and "Integrity: everything matched" in out, out

    # the audit checks each ref's tree against the tag's manifest (a clone missing a commit says so)
    assert "what ran is what was frozen" in out

    # an evidence file edited after the run is named by the audit
    kept = sorted(records.glob("*.report.jsonl"))[0]
    raw = kept.read_text()
    kept.write_text(raw.replace('"kind": "step"', '"kind": "step" ', 1))
    rc, out = _audit(r, str(records))
    assert rc != 0 and f"{kept.name}: sha256" in out and "edited after the run" in out
    kept.write_text(raw)

    # the script changed after the tag: nothing runs
    (r / "train.py").write_text(SCRIPT.format(work=0.001))
    git(r, "commit", "-qam", "a change after the tag")
    again = harness(r, "run", "protocols/mine.yaml", "--quiet", "--retry-failed")
    assert again.returncode != 0 and "train.py: changed after the tag" in again.stdout + again.stderr
    git(r, "reset", "-q", "--hard", "HEAD~1")

    # a ref changed after the tag: the protocol is not the tagged one
    text = (r / "protocols" / "mine.yaml").read_text()
    (r / "protocols" / "mine.yaml").write_text(text.replace(after, before))
    git(r, "commit", "-qam", "another ref")
    again = harness(r, "run", "protocols/mine.yaml", "--quiet")
    assert again.returncode != 0 and "differ from the tagged protocol" in again.stdout + again.stderr

"""The README's first command as a user runs it, in a temporary copy of the repository.

By default (``long``: CI runs it at reduced size) the copy's ``protocols/demo.yaml`` is shrunk
before the run: every study and configuration stays, with 3 seeds (the hypotheses' ``min_pairs``)
instead of 4 and 30 steps (validation every 10) instead of 90, 48 runs instead of 64.
``HARNESS_TEST_FULL_SIZE=1`` runs the demo exactly as shipped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FULL_SIZE, ROOT, git, harness, record_dicts
from pagecheck import check_page

from audit.cli import NOT_VERIFIED

pytestmark = pytest.mark.process  # the demo's 48 runs in real workers, and the browser

#: the reduced demo's size (see the module's docstring); the shipped demo's where FULL_SIZE
STEPS = 90 if FULL_SIZE else 30


def reduced(text: str) -> str:
    """``protocols/demo.yaml`` at the reduced size: each replacement must apply (the demo's shape)."""
    for old, new, n in (
        ("seeds: {count: 4, ", "seeds: {count: 3, ", 4),
        ("    steps: 90\n", f"    steps: {STEPS}\n", 4),
        ("    val_every: 15\n", "    val_every: 10\n", 4),
    ):
        assert text.count(old) == n, (old, text.count(old))
        text = text.replace(old, new)
    return text


def working_clone(dest: Path, *, full_size: bool) -> Path:
    """A clone of this repository at ``dest`` holding the working tree as it is now, committed;
    its demo at the reduced size unless ``full_size``."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    # the working tree as it is now (tests run before a commit too)
    for rel in (
        git(ROOT, "ls-files").split() + git(ROOT, "ls-files", "--others", "--exclude-standard").split()
    ):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(src.read_bytes())
    if not full_size:
        demo = dest / "protocols" / "demo.yaml"
        demo.write_text(reduced(demo.read_text()))
    git(dest, "config", "user.email", "t@example.invalid")
    git(dest, "config", "user.name", "T")
    git(dest, "add", "-A")
    git(dest, "commit", "-qm", "working tree", "--allow-empty")
    return dest


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    return working_clone(tmp_path_factory.mktemp("demo") / "repo", full_size=FULL_SIZE)


@pytest.fixture(scope="module")
def demo(clone) -> tuple[Path, subprocess.CompletedProcess[str], float]:
    """The README's first command, run once for the module."""
    t0 = time.monotonic()
    r = harness(clone, "run", "protocols/demo.yaml", "--quiet", timeout=900)
    return clone, r, time.monotonic() - t0


@pytest.mark.long
def test_demo_writes_a_study_page_that_a_browser_renders(demo):
    clone, r, _ = demo
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    page = clone / "runs" / "demo" / "records" / "index.html"
    assert page.is_file() and str(page.relative_to(clone)) in r.stdout
    check_page(page, expect_studies=("pairs", "per_process", "factorial", "null_aa"))


@pytest.mark.long
def test_demo_runs_reports_audits_and_detects_tampering(demo):
    clone, r, elapsed = demo
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for heading in (
        "Time change (points)",
        "Full-test quality",
        "2x2 factorial",
        "native versus native",
        "Every pair",
    ):
        assert heading in r.stdout
    print(f"demo took {elapsed:.1f} s")
    records = clone / "runs" / "demo" / "records"
    assert not (clone / "records" / "demo").exists()  # a demo never touches records/
    # the design the calibration chose: lockstep at blocks of 1, decided on the CPU clock; the
    # per-process study beside it for contrast
    recs = record_dicts(records)
    designs = {(x["spec"]["study"], x["spec"].get("block_steps")) for x in recs}
    assert designs == {("pairs", 1), ("null_aa", 1), ("per_process", None), ("factorial", None)}
    assert "H1-speed | pairs / tiny_transformer | training_cpu_time" in (records / "report.md").read_text()
    audit = [sys.executable, "-I", "-S", "analysis/public_audit.py", "runs/demo/records"]
    ok = subprocess.run(audit, cwd=clone, capture_output=True, text=True)
    assert ok.returncode == NOT_VERIFIED, ok.stdout
    victim = sorted(records.glob("*.record.json"))[3]
    victim.write_text(victim.read_text().replace('"status":"ok"', '"status":"ok" ', 1))
    bad = subprocess.run(audit, cwd=clone, capture_output=True, text=True)
    assert bad.returncode == 1 and victim.name in bad.stdout


@pytest.mark.long
def test_edited_tagged_protocol_is_refused(clone):
    frozen = clone / "protocols" / "frozen.yaml"
    text = (clone / "protocols" / "demo.yaml").read_text()
    frozen.write_text(
        text.replace("id: demo", "id: frozen")
        .replace("preregistered: false", "preregistered: true")
        .replace("records_dir: runs/demo/records\n", "")
    )
    git(clone, "add", "protocols/frozen.yaml")
    git(clone, "commit", "-qm", "freeze")
    assert harness(clone, "tag", "protocols/frozen.yaml").returncode == 0
    frozen.write_text(frozen.read_text().replace(f"steps: {STEPS}", f"steps: {STEPS + 1}", 1))
    r = harness(clone, "run", "protocols/frozen.yaml")
    assert r.returncode == 2 and "differ from the tagged protocol" in r.stderr
    assert not (clone / "records" / "frozen").exists()


@pytest.mark.long
def test_the_demo_finishes_with_its_runs_slowed_threefold(tmp_path):
    """The demo as shipped (64 runs, full size) with every run taking three times its device time
    (the test knob ``HARNESS_TEST_SLOWDOWN=3``: the worker sleeps the difference), as on a machine
    three times slower than this one: it finishes within its budget, which ``harness calibrate
    --slower 3`` sized for that (protocols/demo.yaml's origins)."""
    import yaml

    dest = working_clone(tmp_path / "repo", full_size=True)
    env = {**os.environ, "HARNESS_TEST_SLOWDOWN": "3"}
    r = harness(dest, "run", "protocols/demo.yaml", "--quiet", "--no-report", timeout=3000, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "all 64 runs finished ok" in r.stdout and "HARNESS_TEST_SLOWDOWN=3" in r.stdout
    recs = record_dicts(dest / "runs" / "demo" / "records")
    assert len(recs) == 64 and all(x["status"] == "ok" and x["env"]["test_slowdown"] == 3.0 for x in recs)
    spent = sum(x["timings"]["device_s"] for x in recs)
    budget = yaml.safe_load((dest / "protocols" / "demo.yaml").read_text())["budget_device_seconds"]
    print(f"the demo slowed threefold spent {spent:.1f} of its {budget} device seconds")

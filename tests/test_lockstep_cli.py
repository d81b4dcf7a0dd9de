"""Lockstep pairs through the real CLI, as a user runs them: ``harness tag`` then ``harness run`` of a
preregistered lockstep protocol, every pair in one fresh worker process, then ``harness status``, the
report and page, and ``python analysis/public_audit.py`` on the records; each arm's trajectory
bitwise that of the same run in a process of its own (a paired study of the same seeds); a pair's
process killed mid-run leaves both arms' attempts recorded, and the pair runs again whole.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import harness, init_study, record_dicts, tiny_protocol
from safetensors.torch import load_file

from audit.cli import NOT_VERIFIED

pytestmark = pytest.mark.long

PROTO = "protocols/tiny.yaml"
RECS = "records/tiny"


def text(design: str, prereg: bool) -> str:
    t = tiny_protocol(prereg="true" if prereg else "false", steps=6)
    t = t.replace("configs: [tiny_conv]", "configs: [tiny_conv, tiny_gqa]").replace(
        "study: pairs\n", "study: pairs\n      config: tiny_gqa\n"
    )
    t = t.replace("seeds: [1, 2]", "seeds: [1, 2, 3, 4]")
    if design == "lockstep":
        t = t.replace("design: paired", "design: lockstep\n    block_steps: 2")
        t = t.replace("order_seed: 1\n", 'order_seed: 1\norigins:\n  block_steps: "2: a test"\n')
    return t


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tagged lockstep study (harness and analysis copied in, as a user's repository holds them)
    and the same seeds as a paired study, both run to the end through the CLI."""
    from test_integrity import make_study

    base = tmp_path_factory.mktemp("lockstep-cli")
    lock = make_study(base, text=text("lockstep", prereg=True), name="lock")
    r = harness(lock, "run", PROTO, "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    solo = init_study(base / "solo", protocol=text("paired", prereg=False))
    r = harness(solo, "run", PROTO, "--quiet", "--no-report")
    assert r.returncode == 0, r.stdout + r.stderr
    return lock, solo


def test_a_tagged_lockstep_study_runs_reports_and_audits(studies):
    lock, _ = studies
    recs = record_dicts(lock / RECS)
    assert len(recs) == 16 and {r["status"] for r in recs} == {"ok"}
    assert set(Counter(r["spec"]["unit"] for r in recs).values()) == {2}  # both arms of each pair
    status = harness(lock, "status", PROTO)
    for config in ("tiny_conv", "tiny_gqa"):  # runs, done, failed, interrupted, superseded, pending
        assert re.search(rf"pairs\s+{config}\s+8\s+8\s+0\s+0\s+0\s+0\b", status.stdout), status.stdout
    summary = json.loads((lock / RECS / "summary.json").read_text())
    config = summary["studies"][0]["configs"][0]
    assert config["pairs_used"] == 4 and "training_cpu_time" in config
    page = (lock / RECS / "index.html").read_text()
    answer = page.index("The answer in one figure")  # after the decisions' sentences, before the tables
    assert page.index("</ul>") < answer < page.index("Preregistered decisions")
    assert "pairs / tiny_gqa, CPU" in page and "alternating blocks of 2 steps" in page
    assert "Training CPU time" in page and "Training CPU time" in (lock / RECS / "report.md").read_text()
    audit = subprocess.run(
        [sys.executable, "analysis/public_audit.py", RECS],
        cwd=lock,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert audit.returncode == NOT_VERIFIED, audit.stdout + audit.stderr
    assert "plan recomputed from the protocol" in audit.stdout and "summary.json recomputed" in audit.stdout


def test_each_arm_in_lockstep_is_bitwise_the_run_in_a_process_of_its_own(studies):
    lock, solo = studies
    a = {r["spec"]["run_id"]: r for r in record_dicts(solo / RECS)}
    b = {r["spec"]["run_id"]: r for r in record_dicts(lock / RECS)}
    assert set(a) == set(b) and len(a) == 16
    for rid in a:
        x, y = a[rid], b[rid]
        assert [c[:2] for c in x["curve"]] == [c[:2] for c in y["curve"]], rid
        assert [v[:2] for v in x["val_curve"]] == [v[:2] for v in y["val_curve"]], rid
        assert (x["val_bpb"], x["test_bpb"]) == (y["val_bpb"], y["test_bpb"]), rid
        wa, wb = load_file(x["checkpoint"]["path"]), load_file(y["checkpoint"]["path"])
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), rid
        assert "lockstep" not in x["env"] and y["env"]["lockstep"]["block_steps"] == 2


def _wait_for(cond, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_pair_whose_process_dies_leaves_both_attempts_and_runs_again_whole(tmp_path):
    repo = init_study(tmp_path / "s", protocol=text("lockstep", prereg=False))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", PROTO, "--quiet", "--no-report"],
        cwd=repo,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "HARNESS_TEST_SLOWDOWN": "30"},  # the pair's process lives on 30x its run
    )
    work = repo / "runs" / "tiny" / "work"
    _wait_for(lambda: work.is_dir() and any(work.glob("*/worker.pid")))
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)  # runner and the pair's process die together
    proc.wait()
    r = harness(repo, "run", PROTO, "--quiet", "--no-report")
    assert r.returncode == 0, r.stdout + r.stderr
    recs = record_dicts(repo / RECS)
    hit = [x for x in recs if x["status"] == "interrupted"]
    assert len(hit) == 2 and hit[0]["spec"]["unit"] == hit[1]["spec"]["unit"], hit
    again = [x for x in recs if x["spec"]["unit"] == hit[0]["spec"]["unit"] and x["status"] == "ok"]
    assert sorted((x["attempt"], x["unit_attempt"]) for x in again) == [(2, 2), (2, 2)]
    assert Counter(x["status"] for x in recs) == {"ok": 16, "interrupted": 2}

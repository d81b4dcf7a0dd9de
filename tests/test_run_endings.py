"""Every way ``harness run`` can end, each with its message and exit status (``harness run --help``
and docs/decisions.md list them: :data:`harness.cliargs.RUN_ENDINGS`), driven through the real CLI.

None of these outcomes depends on the machine's speed: budgets are far below any run's device
seconds, and a signal that must land mid-run is sent to a run slowed by the test knob
``HARNESS_TEST_SLOWDOWN`` (the worker sleeps 30x its own run before it reports). The scenarios that
run a study are in the process tier; tests/test_runner_scenarios.py drives each in process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, git, harness, record_dicts, tiny_protocol
from filelock import FileLock

from audit.cli import NOT_VERIFIED
from harness.cliargs import RUN_ENDINGS

RECS = Path("records") / "tiny"


def write(repo: Path, text: str) -> str:
    (repo / "protocols" / "tiny.yaml").write_text(text)
    return "protocols/tiny.yaml"


@pytest.mark.process
def test_budget_stop_is_a_result_with_its_report(repo):
    p = write(repo, tiny_protocol(budget=0.01, steps=10))
    r = harness(repo, "run", p, "--quiet")
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    # the report is written and printed: its banner first, then the decisions
    md = (repo / RECS / "report.md").read_text()
    assert md.startswith("**STOPPED BY THE BUDGET RULE: 2 of 4 planned runs have no ok record; ")
    assert (repo / RECS / "index.html").is_file() and (repo / RECS / "summary.json").is_file()
    assert md.splitlines()[0] in r.stdout and "H1" in r.stdout
    assert "STOPPED BY THE BUDGET RULE: 2 of 4 runs done, 2 not started" in r.stdout
    assert "raise budget_device_seconds in a new version of the protocol" in r.stdout
    assert "run the same command again" not in out
    summary = json.loads((repo / RECS / "summary.json").read_text())
    assert summary["completeness"]["budget_stop"] is True
    # again: it stops at once, the same way, and runs nothing
    again = harness(repo, "run", p, "--quiet")
    assert again.returncode == 3 and "2 of 4 runs done, 2 not started" in again.stdout
    assert len(record_dicts(repo / RECS)) == 2
    # the audit agrees that the budget rule explains the stop
    a = subprocess.run(
        [sys.executable, str(ROOT / "analysis" / "public_audit.py"), str(RECS)],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert a.returncode == NOT_VERIFIED and "STOPPED BY THE BUDGET RULE" in a.stdout, a.stdout + a.stderr


@pytest.mark.process
def test_complete_run_shows_progress_and_exits_0(repo):
    p = write(repo, tiny_protocol(steps=6))
    r = harness(repo, "run", p, "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[1/4] " in r.stdout and "0 done, 4 left; budget 0 of 600 s spent, 600 s left; ETA ?" in r.stdout
    last = next(line for line in r.stdout.splitlines() if line.startswith("[4/4] "))
    assert "3 done, 1 left; budget " in last and "; ETA " in last and "ETA ?" not in last
    assert "all 4 runs finished ok; records in" in r.stdout


@pytest.mark.process
def test_units_another_runner_holds_leave_exit_4(repo):
    p = write(repo, tiny_protocol(steps=6))
    locks = repo / "runs" / "tiny" / "locks"
    locks.mkdir(parents=True)
    with FileLock(str(locks / "pairs.tiny_conv.pair001.lock")):  # another runner's claim
        r = harness(repo, "run", p, "--quiet")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "2 of 4 runs not done: 2 of them in units another runner holds" in r.stdout
    assert not (repo / RECS / "report.md").exists()  # not a result yet: the study is still running
    done = harness(repo, "run", p, "--quiet")
    assert done.returncode == 0 and len(record_dicts(repo / RECS)) == 4


@pytest.mark.process
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_and_terminated_runs_resume(repo, sig, code):
    p = write(repo, tiny_protocol(steps=6))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", p, "--quiet"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HARNESS_TEST_SLOWDOWN": "30", "PYTHONUNBUFFERED": "1"},
        # as from a terminal: a test process (an xdist worker) may ignore SIGINT, which a child
        # inherits, and Python then installs no KeyboardInterrupt handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    work = repo / "runs" / "tiny" / "work"
    end = time.monotonic() + 300
    while not (work.is_dir() and any(work.glob("*/worker.pid"))):
        assert time.monotonic() < end and proc.poll() is None, "no run started"
        time.sleep(0.05)
    seen = time.monotonic()
    time.sleep(1.0)
    proc.send_signal(sig)  # the slowed worker lives on for 30x its run: this lands mid-run
    out, err = proc.communicate(timeout=300)
    ended = time.monotonic()
    assert proc.returncode == code, out + err
    assert "run the same command again to continue" in err and "Traceback" not in err
    # recorded before the runner exited, charged the attempt's own time (at least the second it ran
    # before the signal, at most until the runner ended), whatever the pause before the resume
    (stopped,) = [x for x in record_dicts(repo / RECS) if x["status"] == "interrupted"]
    assert 1.0 <= stopped["timings"]["device_s"] <= ended - seen + 1.0, stopped["timings"]
    assert f"stopped by {signal.Signals(sig).name}" in stopped["reason"]
    time.sleep(5.0)
    r = harness(repo, "run", p, "--quiet")
    assert r.returncode == 0 and "noted interrupted attempt" not in r.stdout, r.stdout + r.stderr
    recs = record_dicts(repo / RECS)
    assert Counter(x["status"] for x in recs) == {"ok": 4, "interrupted": 1}
    assert [x["timings"]["device_s"] for x in recs if x["status"] == "interrupted"] == [
        stopped["timings"]["device_s"]
    ]


def test_the_slowdown_knob_is_refused_for_preregistered_studies_and_bad_values(repo):
    p = write(repo, tiny_protocol(steps=6, prereg="true"))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "tiny")
    assert harness(repo, "tag", p).returncode == 0
    r = harness(repo, "run", p, "--quiet", env={**os.environ, "HARNESS_TEST_SLOWDOWN": "3"})
    assert r.returncode == 2 and "a test knob that slows every run, never for a preregistered" in r.stderr
    p = write(repo, tiny_protocol(steps=6, id="knob"))
    r = harness(repo, "run", p, "--quiet", env={**os.environ, "HARNESS_TEST_SLOWDOWN": "fast"})
    assert r.returncode == 2 and "HARNESS_TEST_SLOWDOWN='fast': a factor from 1 to 100" in r.stderr
    assert not any(repo.glob("records/*/*.record.json"))


def test_every_ending_is_in_the_help_and_the_docs():
    r = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--help"], capture_output=True, text=True, check=True
    )
    docs = (ROOT / "docs" / "decisions.md").read_text()
    for code, text in RUN_ENDINGS:
        assert f"  {code:<4} {text.split()[0]}" in r.stdout, code
        assert f"| {code} |" in docs, code


@pytest.mark.process
def test_a_report_that_cannot_be_written_exits_5_with_the_records_kept(repo, monkeypatch, capsys):
    """An error in the analysis after the runs (here injected into write_report) is named, without a
    traceback; the records stay, and ``harness report`` writes the report once it is fixed."""
    import analysis.report
    from harness.cli import main

    p = write(repo, tiny_protocol(steps=5))

    def broken(*args, **kwargs):
        raise KeyError("baseline_training_cpu_s")

    monkeypatch.chdir(repo)
    monkeypatch.setattr(analysis.report, "write_report", broken)
    assert main(["run", p, "--quiet"]) == 5
    err = capsys.readouterr().err
    assert "the report could not be written (KeyError: 'baseline_training_cpu_s')" in err
    assert f"harness report {p}" in err and "Traceback" not in err
    assert len(record_dicts(repo / RECS)) == 4 and not (repo / RECS / "summary.json").exists()
    monkeypatch.undo()
    r = harness(repo, "report", p, "--quiet")
    assert r.returncode == 0 and (repo / RECS / "summary.json").is_file(), r.stderr

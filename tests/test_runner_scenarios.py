"""The process tier's runner scenarios, in process: each ``harness run`` scenario of test_run_endings,
test_protocol_cli and test_attempts whose subject is the runner's logic (how a run ends and what it
says, resume, budget, failed and retried units, units another runner holds, an attempt cut off
mid-run, file times) driven through :class:`~harness.execute.inprocess.InProcessExecutor` with
:class:`fake_trainer.FakeTrainer`, then read as a user reads it: ``harness run``'s closing message
and exit status (:func:`harness.clirun.run_ending`), the report it writes, ``harness status`` and
the public audit (neither trains anything: their command lines' ``main`` in this process,
tests/in_process.py, and as processes of their own in the first scenario).

The subprocess versions stay in the process tier (``python -m pytest -q -m process``): they also
check what only real processes show (signals, kills, worker pipes, the fork server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, harness, init_study, record_dicts, tiny_protocol
from fake_trainer import FakeTrainer
from filelock import FileLock
from in_process import audit_here, harness_here

from audit.cli import NOT_VERIFIED
from harness.cliargs import RUN_BUDGET_STOP, RUN_COMPLETE, RUN_FAILED_RUNS, RUN_NOT_DONE
from harness.clirun import Terminated, report, run_ending
from harness.execute.inprocess import InProcessExecutor
from harness.execute.runner import Runner
from harness.protocol import load_protocol
from prereg.attempts import open_started
from prereg.formats.ledger import self_hash_ok
from prereg.formats.record import load_records, load_started, read_entry, record_files

PROTO = "protocols/tiny.yaml"
RECS = Path("records") / "tiny"
CANDIDATES = {"pairs.tiny_conv.pair000.candidate", "pairs.tiny_conv.pair001.candidate"}


def study(tmp_path: Path, **kw) -> Path:
    """The CLI tests' tiny study (one configuration, two pairs: four runs)."""
    return init_study(tmp_path / "study", protocol=tiny_protocol(steps=6, **kw))


def run(repo: Path, trainer: FakeTrainer, lines: list[str] | None = None, **kw) -> tuple[int, str]:
    """``harness run`` with the fake trainer in process: its exit status and closing message, and
    the report written where ``harness run`` writes one (a result: complete, failed runs, budget)."""
    out = lines if lines is not None else []
    proto = load_protocol(repo / PROTO)
    end = Runner(proto, echo=out.append, executor=InProcessExecutor(train=trainer), **kw).run()
    code, message = run_ending(proto, end)
    if code in (RUN_COMPLETE, RUN_FAILED_RUNS, RUN_BUDGET_STOP) and any(
        proto.records_path.glob("*.record.json")
    ):
        report(proto, fmt=None, quiet=True)
    return code, message


def audit_process(repo: Path) -> subprocess.CompletedProcess[str]:
    """The public audit as a reader runs it: ``python -I -S analysis/public_audit.py``."""
    return subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "analysis" / "public_audit.py"), str(RECS)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )


def audit(repo: Path) -> subprocess.CompletedProcess[str]:
    """The public audit's command line in this process (tests/in_process.py: its ``main``, output
    and exit status); the first scenario runs it as a process, as :func:`audit_process`."""
    return audit_here(repo, str(RECS))


def cut_off(repo: Path) -> list:
    """The started entries that no record ends."""
    ended = {(r.spec.run_id, r.attempt) for r in load_records(repo / RECS)}
    return open_started(ended, [e.to_json() for e in load_started(repo / RECS)])


def test_a_complete_run_shows_progress_exits_0_and_a_resume_runs_nothing(tmp_path):
    """As test_run_endings' complete run and test_protocol_cli's end to end and resume."""
    repo = study(tmp_path)
    lines: list[str] = []
    code, message = run(repo, FakeTrainer(device_s=1.0), lines)
    assert code == RUN_COMPLETE == 0 and message.startswith("all 4 runs finished ok; records in"), message
    text = "\n".join(lines)
    assert "[1/4] " in text and "0 done, 4 left; budget 0 of 600 s spent, 600 s left; ETA ?" in text
    last = next(x for x in lines if x.startswith("[4/4] "))
    assert "3 done, 1 left; budget 3 of 600 s spent, 597 s left; ETA 0m01s" in last, last
    recs = record_dicts(repo / RECS)
    assert len(recs) == 4 and all(x["status"] == "ok" for x in recs)
    assert all(self_hash_ok(read_entry(p)) for p in record_files(repo / RECS))
    manifest = json.loads((repo / RECS / "MANIFEST").read_text())
    assert len(manifest["records"]) == 4 and PROTO in manifest["sources"]
    md = (repo / RECS / "report.md").read_text()
    assert md.startswith("**complete: all 4 planned runs have an ok record.**"), md[:200]
    assert "## Decisions" in md and "## Flow of planned runs" in md
    again: list[str] = []
    assert run(repo, FakeTrainer(), again)[0] == RUN_COMPLETE
    assert not any(x.startswith("[") for x in again) and len(record_dicts(repo / RECS)) == 4
    st = harness(repo, "status", PROTO, "--json")
    assert st.returncode == 0, st.stderr
    row = json.loads(st.stdout)["rows"][0]
    assert row["done"] == 4 and row["pending"] == 0
    a = audit_process(repo)
    assert a.returncode == NOT_VERIFIED, a.stdout + a.stderr


def test_a_budget_stop_is_a_result_with_its_report_and_stops_again_the_same_way(tmp_path):
    """As test_run_endings' budget stop and test_protocol_cli's budget test: the first unit always
    starts; each run spends 1 s, far above the 0.01 s budget, so the second never does."""
    repo = study(tmp_path, budget=0.01)
    code, message = run(repo, FakeTrainer(device_s=1.0))
    assert code == RUN_BUDGET_STOP == 3
    assert message.startswith("STOPPED BY THE BUDGET RULE: 2 of 4 runs done, 2 not started"), message
    assert "raise budget_device_seconds in a new version of the protocol" in message
    assert "run the same command again" not in message
    recs = record_dicts(repo / RECS)
    assert len(recs) == 2 and {x["spec"]["unit"] for x in recs} == {"pairs.tiny_conv.pair000"}
    md = (repo / RECS / "report.md").read_text()
    assert md.startswith("**STOPPED BY THE BUDGET RULE: 2 of 4 planned runs have no ok record; "), md[:200]
    assert (repo / RECS / "index.html").is_file()
    assert json.loads((repo / RECS / "summary.json").read_text())["completeness"]["budget_stop"] is True
    fake = FakeTrainer()
    code, message = run(repo, fake)
    assert code == RUN_BUDGET_STOP and "2 of 4 runs done, 2 not started" in message and not fake.calls
    a = audit(repo)
    assert a.returncode == NOT_VERIFIED and "STOPPED BY THE BUDGET RULE" in a.stdout, a.stdout + a.stderr


def test_units_another_runner_holds_end_not_done_without_a_report(tmp_path):
    """As test_run_endings' exit 4: the units left are another runner's, so this is not a result."""
    repo = study(tmp_path)
    locks = repo / "runs" / "tiny" / "locks"
    locks.mkdir(parents=True)
    with FileLock(str(locks / "pairs.tiny_conv.pair001.lock")):  # another runner's claim
        code, message = run(repo, FakeTrainer())
    assert code == RUN_NOT_DONE == 4
    assert message.startswith("2 of 4 runs not done: 2 of them in units another runner holds"), message
    assert "once it ends" in message and not (repo / RECS / "report.md").exists()
    assert run(repo, FakeTrainer())[0] == RUN_COMPLETE and len(record_dicts(repo / RECS)) == 4


def test_failing_runs_are_recorded_and_counted_not_dropped(tmp_path):
    """As test_protocol_cli's failing arm: each candidate fails; its record says why, the run ends
    with exit 1, and the summary counts the failures and excludes their pairs."""
    repo = study(tmp_path)
    code, message = run(repo, FakeTrainer(fail=CANDIDATES))
    assert code == RUN_FAILED_RUNS == 1 and "all 4 runs ended; 2 failed" in message, message
    recs = record_dicts(repo / RECS)
    failed = [x for x in recs if x["status"] == "failed"]
    assert len(recs) == 4 and {x["spec"]["role"] for x in failed} == {"candidate"} and len(failed) == 2
    assert all(f"deliberate failure of {x['spec']['run_id']}" in x["reason"] for x in failed)
    summary = json.loads((repo / RECS / "summary.json").read_text())
    assert summary["records"]["failed"] == 2 and len(summary["runs"]) == 4 and len(summary["exclusions"]) == 2
    assert audit(repo).returncode == NOT_VERIFIED


def test_an_arm_failing_at_start_up_stops_after_its_first_pair_in_process(tmp_path):
    """The failure rule (prereg/failstop.py) in process: every candidate fails before its first
    step; the first failure stops the study (its partner runs only if it ran first), the message and
    the summary name the rule and the reason, and the audit recomputes the stop. Failures after
    training began (test_failing_runs_...) never stop a study."""
    repo = study(tmp_path)
    lines: list[str] = []
    code, message = run(repo, FakeTrainer(fail_early=CANDIDATES), lines)
    assert code == RUN_FAILED_RUNS and message.startswith("STOPPED BY THE FAILURE RULE: "), message
    assert "deliberate failure of pairs.tiny_conv.pair000.candidate at start-up" in message
    recs = record_dicts(repo / RECS)
    assert {x["spec"]["unit"] for x in recs} == {"pairs.tiny_conv.pair000"}
    first = min(recs, key=lambda x: x["spec"]["position"])["spec"]["role"]
    assert len(recs) == (2 if first == "baseline" else 1)
    assert any(line.startswith("failure rule: ") for line in lines)
    summary = json.loads((repo / RECS / "summary.json").read_text())
    missing = 4 - sum(x["status"] == "ok" for x in recs)
    assert summary["completeness"]["text"].startswith(f"STOPPED BY THE FAILURE RULE: {missing} of 4")
    a = audit(repo)
    assert a.returncode == NOT_VERIFIED and "The study was STOPPED BY THE FAILURE RULE" in a.stdout, a.stdout


def test_retry_reruns_whole_units_in_plan_order_up_to_max_attempts(tmp_path):
    """As test_protocol_cli's retry: every candidate fails every time; --retry-failed runs each unit
    again whole (both arms, back to back, in plan order) until max_attempts, then nothing."""
    repo = study(tmp_path)
    proto = repo / PROTO
    proto.write_text(proto.read_text().replace("order_seed: 1", "order_seed: 1\nmax_attempts: 2"))
    assert run(repo, FakeTrainer(fail=CANDIDATES))[0] == RUN_FAILED_RUNS
    assert len(record_dicts(repo / RECS)) == 4
    fake = FakeTrainer(fail=CANDIDATES)
    assert run(repo, fake, retry_failed=True)[0] == RUN_FAILED_RUNS
    recs = record_dicts(repo / RECS)
    assert len(recs) == 8 and Counter(x["attempt"] for x in recs) == {1: 4, 2: 4}
    assert Counter(x["unit_attempt"] for x in recs) == {1: 4, 2: 4}
    order = [(x["spec"]["unit"], x["spec"]["position"]) for x in recs if x["attempt"] == 2]
    assert order == sorted(order) and [c[1] for c in fake.calls] == [2, 2, 2, 2]
    again = FakeTrainer()
    run(repo, again, retry_failed=True)  # max_attempts reached: nothing runs
    assert not again.calls and len(record_dicts(repo / RECS)) == 8


@pytest.mark.parametrize("stop", [KeyboardInterrupt, Terminated], ids=["SIGINT", "SIGTERM"])
def test_a_run_cut_off_mid_run_is_recorded_interrupted_at_once_and_resumed(tmp_path, stop):
    """As test_run_endings' SIGINT and SIGTERM (``harness run`` turns SIGTERM into
    :class:`~prereg.errors.Terminated`): the exception leaves the runner mid-run; the attempt is
    recorded interrupted before the runner exits, charged its own time until the stop (measured
    here at about 0.3 s), not the pause before the resume (1 s here), and the same command then runs
    it again."""
    repo = study(tmp_path)

    class Cut(FakeTrainer):
        def __call__(self, job, partial):
            if len(self.calls) == 1:  # the second run, in progress
                self.calls.append((job.spec.run_id, job.attempt))
                time.sleep(0.3)
                raise stop()
            return super().__call__(job, partial)

    t0 = time.monotonic()
    with pytest.raises(stop):
        run(repo, Cut())
    ran = time.monotonic() - t0
    assert cut_off(repo) == []  # nothing left open: the stop was recorded at once
    stopped = [r for r in record_dicts(repo / RECS) if r["status"] == "interrupted"]
    assert len(stopped) == 1 and len(record_dicts(repo / RECS)) == 2
    name = "SIGINT" if stop is KeyboardInterrupt else "SIGTERM"
    assert f"was stopped by {name} after" in stopped[0]["reason"]
    assert 0.3 <= stopped[0]["timings"]["device_s"] <= ran
    time.sleep(1.0)  # the pause before the resume is charged nothing
    lines: list[str] = []
    assert run(repo, FakeTrainer(), lines)[0] == RUN_COMPLETE
    assert not any(x.startswith("noted interrupted attempt") for x in lines), lines
    recs = record_dicts(repo / RECS)
    assert Counter(x["status"] for x in recs) == {"ok": 4, "interrupted": 1}
    assert [x["timings"]["device_s"] for x in recs if x["status"] == "interrupted"] == [
        stopped[0]["timings"]["device_s"]
    ]


def test_an_attempt_cut_off_survives_runs_deleted_and_file_times_moved(tmp_path):
    """As test_attempts' peeked outcome and file times: a run in progress when everything stopped,
    then ``runs/`` deleted and every file time moved two hours back. ``harness status`` names the
    attempt with its start time; the resume records it interrupted, linked to its started entry and
    charged the ledger's time (never a file time); the report and the audit count it."""
    repo = study(tmp_path)

    class Stop(BaseException):
        pass

    class Cut(FakeTrainer):
        def __call__(self, job, partial):
            if len(self.calls) == 2:  # the third run, in progress
                self.calls.append((job.spec.run_id, job.attempt))
                raise Stop()
            return super().__call__(job, partial)

    with pytest.raises(Stop):
        run(repo, Cut())
    (started,) = cut_off(repo)
    run_id = started["run_id"]
    subprocess.run(["rm", "-rf", str(repo / "runs")], check=True)  # every marker and lock under runs/
    back = time.time() - 7200
    for f in (repo / "records").rglob("*"):
        os.utime(f, (back, back), follow_symlinks=False)
    st = harness_here(repo, "status", PROTO)
    assert st.returncode == 0, st.stderr
    assert f"interrupted: {run_id} attempt 1 started at {started['started_at']}" in st.stdout, st.stdout
    t0 = time.time()
    lines: list[str] = []
    assert run(repo, FakeTrainer(), lines)[0] == RUN_COMPLETE
    bound = time.time() - t0 + 60.0
    assert any(x.startswith(f"noted interrupted attempt 1 of {run_id}") for x in lines), lines
    recs = {(x["spec"]["run_id"], x["attempt"]): x for x in record_dicts(repo / RECS)}
    first = recs[(run_id, 1)]
    assert first["status"] == "interrupted" and first["started_at"] == started["started_at"]
    assert first["start"] == {"seq": started["ledger"]["seq"], "sha256": started["sha256"]}
    assert 0.0 <= first["timings"]["device_s"] < bound, first["timings"]
    assert first["timings"]["device_s_source"].startswith("ledger: from its started entry")
    assert recs[(run_id, 2)]["status"] == "ok"
    md = (repo / RECS / "report.md").read_text()
    assert md.startswith("**complete: all 4 planned runs have an ok record.**") and "1 interrupted" in md
    a = audit(repo)
    assert a.returncode == 4, a.stdout + a.stderr  # intact, and the cut-off run drawn again is named
    assert "interrupted 1" in a.stdout and "attempts in the ledger" in a.stdout
    assert "REDRAWN:" in a.stdout and run_id in a.stdout.split("REDRAWN:", 1)[1]


def test_a_manifest_behind_the_chain_is_reconciled_and_an_edited_record_is_not(tmp_path):
    """As test_attempts' kill between a record and the MANIFEST rewrite: MANIFEST left as it was
    after the first two runs while the chain went on (the runner rewrites it at most every 5 s and
    when it stops). The audit fails naming it; ``harness status`` brings MANIFEST back to the chain,
    and the audit passes. A listed record edited afterwards is not laundered into MANIFEST."""
    repo = study(tmp_path)
    locks = repo / "runs" / "tiny" / "locks"
    locks.mkdir(parents=True)
    with FileLock(str(locks / "pairs.tiny_conv.pair001.lock")):
        assert run(repo, FakeTrainer())[0] == RUN_NOT_DONE
    behind = (repo / RECS / "MANIFEST").read_bytes()  # two records, the head at seq 4
    assert run(repo, FakeTrainer())[0] == RUN_COMPLETE
    (repo / RECS / "MANIFEST").write_bytes(behind)
    a = audit(repo)
    assert a.returncode == 1 and "record not listed in MANIFEST" in a.stdout, a.stdout
    st = harness_here(repo, "status", PROTO)
    assert st.returncode == 0 and "MANIFEST reconciled with the chain: 4 entries after seq 4" in st.stderr, (
        st.stderr
    )
    a = audit(repo)
    assert a.returncode == NOT_VERIFIED, a.stdout
    rec = sorted((repo / RECS).glob("*.record.json"))[0]
    rec.write_text(rec.read_text().replace('"status":"ok"', '"status":"failed"'))
    st = harness_here(repo, "status", PROTO)
    assert "MANIFEST reconciled" not in st.stderr
    a = audit(repo)
    assert a.returncode == 1 and "differs from MANIFEST" in a.stdout, a.stdout

"""The harness as a user drives it: the real CLI in subprocesses, in temporary git repositories.

The tests that run a study are in the process tier (``-m process``); tests/test_runner_states.py
and tests/test_runner_scenarios.py drive the same runner logic in process. The refusals, which
train nothing, call the command line's ``main`` in this process (tests/in_process.py: the same
parser, messages and exit status); test_a_schema_error_is_refused_by_the_real_command_line, the
``--version`` check and the plan's determinism check start the real command, as a user does."""

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
from conftest import ROOT, failing_arm, git, harness, record_dicts, tiny_protocol
from in_process import harness_here

from harness.plan import make_plan
from harness.protocol import load_protocol
from prereg.factorial import williams
from prereg.formats.ledger import self_hash_ok
from prereg.formats.record import read_entry, record_files


def write(repo: Path, text: str, name: str = "tiny.yaml") -> Path:
    p = repo / "protocols" / name
    p.parent.mkdir(exist_ok=True)
    p.write_text(text)
    return p


def line_of(path: Path, needle: str) -> int:
    return next(i + 1 for i, s in enumerate(path.read_text().splitlines()) if needle in s)


@pytest.mark.parametrize(
    "edit, needle, message",
    [
        (("    steps: 10", "    stepz: 10"), "stepz", "unknown key 'stepz'"),
        (("    steps: 10", "    steps: ten"), "steps: ten", "'steps' must be int"),
        (
            ("hypotheses:\n", "quality_tolerance_bpb: 0.01\nhypotheses:\n"),
            "quality_tolerance_bpb",
            "'quality_tolerance_bpb' belongs to protocol schema 1 and was replaced by 'hypotheses'",
        ),
        (("      margin: 0.01\n", ""), "- id: H1", "needs a positive margin"),
        (
            ("      endpoint: test_bpb\n", "      endpoint: time_to_target\n"),
            "- id: H1",
            "censoring: worst_rank or restricted_mean",
        ),
        (("    seeds: [1, 2]", "    seeds: [1, 2, 1]"), "seeds:", "duplicate seed 1"),
        (
            ("    configs: [tiny_conv]", "    configs: [tiny_nope]"),
            "configs:",
            "unknown configuration 'tiny_nope'",
        ),
        (("    arms: [native, cotangent]", "    arms: [native, fastest]"), "arms:", "unknown arm 'fastest'"),
        (("id: tiny", "id: tiny tiny"), "id:", "letters, digits"),
        (
            ("corpus: pydoc-topics", "corpus: pydoc-topics\ncorpus: wikitext-2"),
            "corpus: wikitext-2",
            "duplicate key",
        ),
    ],
)
def test_schema_errors_name_file_key_line(repo, edit, needle, message):
    schema_refused(repo, harness_here, edit, needle, message)


def test_a_schema_error_is_refused_by_the_real_command_line(repo):
    """The first case above, through ``python -m harness.cli`` in a process of its own."""
    schema_refused(repo, harness, ("    steps: 10", "    stepz: 10"), "stepz", "unknown key 'stepz'")


def schema_refused(repo: Path, cli, edit: tuple[str, str], needle: str, message: str) -> None:
    """``harness plan`` and ``harness run`` (through ``cli``) of the tiny protocol with ``edit``:
    exit 2, ``message`` naming the file and the line of ``needle``, nothing written."""
    p = write(repo, tiny_protocol().replace(*edit))
    for cmd in ("plan", "run"):
        r = cli(repo, cmd, str(p))
        assert r.returncode == 2, r.stderr
        assert message in r.stderr
        assert str(p) in r.stderr
        assert "Traceback" not in r.stderr
        if needle:
            assert f"{p}:{line_of(p, needle)}" in r.stderr
    assert not (repo / "runs").exists() and not (repo / "records").exists()


def test_tag_refusals_and_frozen_checks(repo):
    p = write(repo, tiny_protocol(prereg="true"))
    r = harness_here(repo, "tag", str(p))
    assert r.returncode == 2 and "untracked" in r.stderr
    r = harness_here(repo, "run", str(p))
    assert r.returncode == 2 and "no tag protocol-tiny" in r.stderr
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "protocol")
    p.write_text(p.read_text() + "# edit\n")
    r = harness_here(repo, "tag", str(p))
    assert r.returncode == 2 and "modified" in r.stderr
    git(repo, "checkout", "--", str(p))
    r = harness_here(repo, "tag", str(p))
    assert r.returncode == 0, r.stderr
    msg = git(repo, "tag", "-n9", "protocol-tiny")
    assert load_protocol(p).sha256 in msg
    r = harness_here(repo, "tag", str(p))
    assert r.returncode == 2 and "already exists" in r.stderr
    # bytes differ from the tagged blob: refused, nothing written
    p.write_text(p.read_text().replace("steps: 10", "steps: 11"))
    git(repo, "commit", "-qam", "tamper")
    r = harness_here(repo, "run", str(p))
    assert r.returncode == 2 and "differ from the tagged protocol" in r.stderr
    assert not (repo / "records").exists()
    # the same bytes on a history that does not contain the tag: refused
    git(repo, "checkout", "-q", "-b", "elsewhere", "HEAD~2")
    write(repo, load_protocol_text(repo))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "same bytes, other history")
    r = harness_here(repo, "run", str(p))
    assert r.returncode == 2 and "not an ancestor of HEAD" in r.stderr


def load_protocol_text(repo: Path) -> str:
    return git(repo, "show", "protocol-tiny:protocols/tiny.yaml")


def test_tag_refused_when_records_exist_and_when_calibration_pending(repo):
    p = write(repo, tiny_protocol(prereg="true"))
    (repo / "records" / "tiny").mkdir(parents=True)
    (repo / "records" / "tiny" / "x.a1.record.json").write_text("{}")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "p")
    r = harness_here(repo, "tag", str(p))
    assert r.returncode == 2 and "records already exist" in r.stderr
    v5 = repo / "protocols" / "v5.yaml"
    v5.write_text((ROOT / "protocols" / "v5.yaml").read_text())
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "v5")
    r = harness_here(repo, "tag", str(v5))
    assert r.returncode == 2 and "calibration is pending" in r.stderr
    pilot_step = "first run its pilot and calibration: harness run protocols/v5-pilot.yaml"
    assert pilot_step in r.stderr and "Traceback" not in r.stderr
    r = harness_here(
        repo, "run", str(v5)
    )  # the first message a new user meets names the pilot, not `harness tag`
    assert r.returncode == 2 and "its calibration is pending" in r.stderr and pilot_step in r.stderr


def test_study_protocols_plan_sizes_and_balance():
    v5 = make_plan(load_protocol(ROOT / "protocols" / "v5.yaml"))
    v6 = make_plan(load_protocol(ROOT / "protocols" / "v6.yaml"))
    assert len(v5) == 200 and len(v6) == 128
    assert sum(r.study == "breadth" for r in v6) == 96 and sum(r.study == "factorial" for r in v6) == 32
    for runs in (v5, [r for r in v6 if r.design == "paired"]):
        firsts = Counter((r.config, r.role) for r in runs if r.position == 0)
        for config in {r.config for r in runs}:
            assert firsts[(config, "baseline")] == firsts[(config, "candidate")]
        units = Counter(r.unit for r in runs)
        assert set(units.values()) == {2}
        # back to back: each unit's runs are adjacent in the plan
        for u in units:
            orders = [r.order for r in runs if r.unit == u]
            assert orders[1] == orders[0] + 1
    blocks: dict[str, list[str]] = {}
    for r in v6:
        if r.design == "factorial":
            blocks.setdefault(r.unit, []).append(r.arm)
    seqs = list(blocks.values())
    assert len(seqs) == 8
    cells = ["native", "bucketed", "packed", "cotangent"]
    for g in range(0, 8, 4):
        group = seqs[g : g + 4]
        for pos in range(4):
            assert sorted(s[pos] for s in group) == sorted(cells)
        follows = Counter((s[i], s[i + 1]) for s in group for i in range(3))
        assert len(follows) == 12 and set(follows.values()) == {1}
    assert williams(4) == [
        (0, 1, 3, 2),
        (1, 2, 0, 3),
        (2, 3, 1, 0),
        (3, 0, 2, 1),
    ]  # the 4x4 the 2x2 has always used
    a = harness(ROOT, "plan", "protocols/v6.yaml", "--json")
    b = harness(ROOT, "plan", "protocols/v6.yaml", "--json")
    assert a.returncode == 0 and a.stdout == b.stdout and len(json.loads(a.stdout)["runs"]) == 128


@pytest.mark.process
def test_tiny_protocol_end_to_end_and_resume_noop(repo):
    p = write(repo, tiny_protocol())
    r = harness(repo, "run", str(p), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        "Time change (points)" in r.stdout
        and "## Decisions" in r.stdout
        and "## Flow of planned runs" in r.stdout
    )
    recs = record_dicts(repo / "records" / "tiny")
    assert len(recs) == 4 and all(x["status"] == "ok" for x in recs)
    assert all(self_hash_ok(read_entry(f)) for f in record_files(repo / "records" / "tiny"))
    rec = recs[0]
    for key in (
        "protocol",
        "plan_sha256",
        "spec",
        "env",
        "timings",
        "curve",
        "val_curve",
        "val_bpb",
        "test_bpb",
        "rescored_test_bpb",
        "memory",
        "checkpoint",
        "git",
    ):
        assert key in rec, key
    assert rec["rescore_identical"] is True and rec["rescored_test_bpb"] == rec["test_bpb"]
    assert Path(rec["checkpoint"]["path"]).is_file() and "runs" in Path(rec["checkpoint"]["path"]).parts
    manifest = json.loads((repo / "records" / "tiny" / "MANIFEST").read_text())
    assert len(manifest["records"]) == 4 and "protocols/tiny.yaml" in manifest["sources"]
    # pairs are bitwise: same test BPB for both arms of each pair
    by_unit: dict[str, set[float]] = {}
    for x in recs:
        by_unit.setdefault(x["spec"]["unit"], set()).add(x["test_bpb"])
    assert all(len(v) == 1 for v in by_unit.values())
    r = harness(repo, "run", str(p), "--quiet", "--no-report")
    assert r.returncode == 0 and "[" not in r.stdout  # nothing left to execute
    r = harness(repo, "status", str(p), "--json")
    row = json.loads(r.stdout)["rows"][0]
    assert row["done"] == 2 * 2 and row["pending"] == 0


def _wait_for(predicate, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


#: The test knob that makes each run take this many times its device time (the worker sleeps the
#: difference before it reports), so a kill that must land mid-run does on any machine, fast or busy:
#: the worker lives at least SLOW x its own run time after its pid file appears.
SLOW = {"HARNESS_TEST_SLOWDOWN": "30"}


@pytest.mark.process
@pytest.mark.parametrize("launcher", ["forkserver", "spawn"])
def test_resume_after_sigkill_mid_run(repo, launcher):
    p = write(repo, tiny_protocol(steps=10, launcher=launcher))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", str(p), "--quiet", "--no-report"],
        cwd=repo,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **SLOW},
    )
    work = repo / "runs" / "tiny" / "work"
    _wait_for(lambda: work.is_dir() and any(work.glob("*/worker.pid")))
    time.sleep(0.3)  # mid-run: the slowed worker lives on for 30x its run
    os.killpg(proc.pid, signal.SIGKILL)  # the machine "switches off": runner and worker die together
    proc.wait()
    r = harness(repo, "run", str(p), "--quiet", "--no-report")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "noted interrupted attempt 1" in r.stdout
    recs = record_dicts(repo / "records" / "tiny")
    statuses = Counter(x["status"] for x in recs)
    assert statuses["ok"] == 4 and statuses["interrupted"] == 1
    interrupted = next(x for x in recs if x["status"] == "interrupted")
    redo = next(
        x for x in recs if x["spec"]["run_id"] == interrupted["spec"]["run_id"] and x["status"] == "ok"
    )
    assert redo["attempt"] == 2 and "did not finish" in interrupted["reason"]


@pytest.mark.process
def test_worker_killed_is_recorded_failed(repo):
    p = write(repo, tiny_protocol(steps=10))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", str(p), "--quiet", "--no-report"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HARNESS_TEST_SLOWDOWN": "8"},
    )
    work = repo / "runs" / "tiny" / "work"
    _wait_for(lambda: work.is_dir() and any(work.glob("*/worker.pid")))
    time.sleep(0.3)  # the slowed worker lives on for 8x its run
    pid = int(next(work.glob("*/worker.pid")).read_text())
    os.kill(pid, signal.SIGKILL)  # only the run's process dies (as under the OOM killer)
    stdout, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, stdout  # finished, with a recorded failure
    recs = record_dicts(repo / "records" / "tiny")
    failed = [x for x in recs if x["status"] == "failed"]
    assert len(failed) == 1 and "SIGKILL" in failed[0]["reason"] and len(recs) == 4
    assert all(x["env"]["test_slowdown"] == 8.0 for x in recs if x["status"] == "ok")


@pytest.mark.process
def test_failing_runs_are_recorded_not_dropped(repo):
    """A plug-in arm that raises when the worker builds it: the failure is recorded with its
    reason, and the failure rule (prereg/failstop.py) stops the study after that first pair
    instead of failing every candidate (tests/test_runner_scenarios.py: failures after training
    began are counted and the study goes on)."""
    p = write(repo, failing_arm(repo))
    r = harness(repo, "run", str(p), "--quiet")
    assert r.returncode == 1 and "STOPPED BY THE FAILURE RULE" in r.stdout, r.stdout + r.stderr
    recs = record_dicts(repo / "records" / "tiny")
    failed = [x for x in recs if x["status"] == "failed"]
    assert len(failed) == 1 and {x["spec"]["role"] for x in failed} == {"candidate"}
    assert {x["spec"]["unit"] for x in recs} == {failed[0]["spec"]["unit"]}
    assert all("deliberate failure of this arm" in x["reason"] for x in failed)
    summary = json.loads((repo / "records" / "tiny" / "summary.json").read_text())
    assert summary["records"]["failed"] == 1 and len(summary["runs"]) == len(recs)


def test_unverified_corpus_refuses_before_any_run(repo):
    p = write(repo, tiny_protocol(corpus="wikitext-2", data_dir="data_dir: nowhere\n"))
    r = harness_here(repo, "run", str(p), "--quiet")
    assert (
        r.returncode == 2
        and "missing corpus file" in r.stderr
        and "harness data fetch wikitext-2" in r.stderr
    )
    assert not (repo / "records" / "tiny").exists() or not record_dicts(repo / "records" / "tiny")


@pytest.mark.process
def test_two_concurrent_runners_execute_each_run_once(repo):
    p = write(repo, tiny_protocol(steps=10).replace("seeds: [1, 2]", "seeds: [1, 2, 3]"))
    cmd = [sys.executable, "-m", "harness.cli", "run", str(p), "--quiet", "--no-report"]
    procs = [
        subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outs = [pr.communicate(timeout=600)[0] for pr in procs]
    recs = record_dicts(repo / "records" / "tiny")
    ids = Counter(x["spec"]["run_id"] for x in recs)
    assert len(ids) == 6 and set(ids.values()) == {1}, outs
    assert all(x["status"] == "ok" and x["attempt"] == 1 for x in recs)
    # timed runs never overlapped on the device
    spans = sorted((x["started_at"], x["finished_at"]) for x in recs)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


@pytest.mark.process
def test_budget_stops_new_runs(repo):
    # the first unit always starts (no ok run yet to predict from); any two runs spend more than
    # 0.01 device seconds, on any machine, so the second unit never does
    p = write(repo, tiny_protocol(budget=0.01, steps=10))
    r = harness(repo, "run", str(p), "--quiet", "--no-report")
    assert r.returncode == 3 and "no further run starts" in r.stdout
    recs = record_dicts(repo / "records" / "tiny")
    assert len(recs) == 2 and {x["spec"]["unit"] for x in recs} == {"pairs.tiny_conv.pair000"}


def failing_late_arm(repo: Path) -> str:
    """A tiny protocol whose candidate fails at its second training step: after training began,
    so the failure rule (prereg/failstop.py) lets the study go on and every unit runs."""
    (repo / "late.py").write_text(
        "from harness.arms import resolve\n\n\n"
        "def build(ctx):\n"
        "    arm = resolve('native')(ctx)\n"
        "    plain, calls = arm.phase, []\n\n"
        "    def phase():\n"
        "        calls.append(1)\n"
        "        if len(calls) > 1:\n"
        "            raise RuntimeError('deliberate failure of this arm at its second step')\n"
        "        return plain()\n\n"
        "    arm.phase = phase\n"
        "    return arm\n"
    )
    return tiny_protocol().replace("arms: [native, cotangent]", 'arms: [native, "late:build"]')


@pytest.mark.process
def test_retry_reruns_whole_units_up_to_max_attempts(repo):
    p = write(repo, failing_late_arm(repo).replace("order_seed: 1", "order_seed: 1\nmax_attempts: 2"))
    assert harness(repo, "run", str(p), "--quiet", "--no-report").returncode == 1
    assert len(record_dicts(repo / "records" / "tiny")) == 4
    r = harness(repo, "run", str(p), "--quiet", "--no-report", "--retry-failed")
    assert r.returncode == 1
    recs = record_dicts(repo / "records" / "tiny")
    assert len(recs) == 8 and Counter(x["attempt"] for x in recs) == {1: 4, 2: 4}
    order = [(x["spec"]["unit"], x["spec"]["position"]) for x in recs if x["attempt"] == 2]
    assert order == sorted(order)  # whole units, in plan order, each arm back to back
    harness(
        repo, "run", str(p), "--quiet", "--no-report", "--retry-failed"
    )  # max_attempts reached: nothing runs
    assert len(record_dicts(repo / "records" / "tiny")) == 8


def test_version_and_unknown_arms_are_clean_errors(repo, monkeypatch, capsys):
    """``harness --version`` names the installed version; an arm that is neither built in nor
    importable is an input error naming the argument, never a traceback. The arms go through the
    CLI's ``main`` in this process (the same parser and error handling as the command line; an
    exception it did not turn into a message fails the test), not a process of their own each."""
    from importlib.metadata import version

    from harness.cli import main

    r = harness(repo, "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"harness {version('cotangent-harness')}"
    monkeypatch.chdir(repo)
    monkeypatch.setattr(sys, "path", list(sys.path))  # compare-arms puts the study's root first
    for args, says in (
        (("native", "bogus"), "candidate arm: unknown arm 'bogus'"),
        (("bogus.mod:fn", "native"), "baseline arm 'bogus.mod:fn': cannot import it"),
        (("native", "harness.arms:nothere"), "has no function nothere"),
    ):
        code = main(["compare-arms", *args, "--config", "tiny_conv"])
        err = capsys.readouterr().err
        assert code == 2 and says in err, err
        assert "Traceback" not in err


def test_every_flag_has_help_and_device_choices_agree():
    import argparse

    from harness.cliargs import DEVICES, parser

    subs = parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, sp in subs.items():
        for action in sp._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"harness {name}: {action.dest} has no help"
            if action.dest == "device":
                assert list(action.choices) == DEVICES, name


def test_a_protocol_that_is_not_preregistered_is_never_tagged_nor_run_beside_a_tag(repo):
    """The audit reads any tag ``protocol-<id>`` as the study's definition, so the records of a
    protocol run untagged beside such a tag would all fail it: ``harness tag`` refuses a protocol
    that is not preregistered (naming file, key and line), and ``harness run`` refuses one whose
    id has a tag (made by git directly), before anything is written."""
    p = write(repo, tiny_protocol(prereg="false"))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "protocol")
    r = harness_here(repo, "tag", str(p))
    assert r.returncode == 2, r.stderr
    assert f"{p}:{line_of(p, 'preregistered: false')}, key preregistered: false" in r.stderr
    assert "nothing was tagged" in r.stderr and "Traceback" not in r.stderr
    assert git(repo, "tag", "-l") == ""
    git(repo, "tag", "-a", "protocol-tiny", "-m", "made by hand")
    r = harness_here(repo, "run", str(p))
    assert r.returncode == 2, r.stderr
    assert "but tag protocol-tiny exists" in r.stderr and "git tag -d protocol-tiny" in r.stderr
    assert not (repo / "records").exists()
    git(repo, "tag", "-d", "protocol-tiny")
    p.write_text(p.read_text().replace("preregistered: false\n", ""))
    git(repo, "commit", "-qam", "the default")
    r = harness_here(repo, "tag", str(p))
    assert r.returncode == 2 and "key preregistered is not set (default false)" in r.stderr

"""The stall rule from the records (``prereg/stalls.py``): the time before a run's first step is
measured from its start and never skipped (warm-up steps included, a command's start-up
included), and a real arm stopped from outside (SIGSTOP, then SIGCONT) is named in the report
that ``harness run`` writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, init_study

from prereg.stalls import STALL_FLOOR_S, first_step_limit, folder_stalls, step_stall


def _record(folder: Path, run: str, walls: list[float], warmup: int = 0, **timings: Any) -> dict[str, Any]:
    """A built-in run's record as the stall rule reads it: its training clock stays at 0 over its
    ``warmup`` steps (they are timed apart), its ``step_times`` hold every step's wall time."""
    clock, curve = 0.0, []
    for i, w in enumerate(walls):
        clock += w if i >= warmup else 0.0
        curve.append([i + 1, 4.0, clock])
    rec = {
        "spec": {"run_id": run, "warmup_steps": warmup or None},
        "attempt": 1,
        "timings": {"setup_s": 0.5, "compile_s": 0.0, "total_s": 0.5 + sum(walls) + 0.2, **timings},
        "curve": curve,
        "step_times": {"wall_us": [round(w * 1e6) for w in walls], "cpu_us": [round(w * 1e6) for w in walls]},
    }
    (folder / f"{run}.a1.record.json").write_text(json.dumps(rec))
    return rec


def _quiet(folder: Path, n: int = 4) -> None:
    for i in range(n):
        _record(folder, f"s.c.pair00{i}.baseline", [0.1] * 20, warmup=5)


def test_a_first_step_that_stalled_in_warm_up_is_named_from_the_runs_start(tmp_path):
    """The first step is a warm-up step, off the training clock (its curve says 0 s): the time
    before it is set-up, compile and that step's own wall time. The code before this counted
    set-up and compile alone and named nothing."""
    _quiet(tmp_path)
    _record(tmp_path, "s.c.pair009.candidate", [500.0] + [0.1] * 19, warmup=5)
    assert folder_stalls(str(tmp_path)) == [
        "s.c.pair009.candidate (attempt 1): its first step came 500 s after its start (the limit: 30 s)"
    ]


def test_a_gap_in_warm_up_is_a_gap():
    """Step 3 of 20, a warm-up step, came 40 s after step 2: the step times say so where the
    training clock (0 over the warm-up) cannot."""
    found = step_stall([0.1 * k for k in range(1, 3)] + [40.2 + 0.1 * k for k in range(18)])
    assert found is not None and found[0] == 3 and found[1:] == pytest.approx((40.0, 0.1))


def test_warm_up_steps_are_read_from_the_step_times(tmp_path):
    _quiet(tmp_path)
    _record(tmp_path, "s.c.pair009.candidate", [0.1, 0.1, 40.0] + [0.1] * 17, warmup=5)
    (line,) = folder_stalls(str(tmp_path))
    assert line.startswith("s.c.pair009.candidate (attempt 1): no step for 40 s before step 3"), line


def test_the_time_before_the_first_step_is_judged_once_by_the_first_step_rule(tmp_path):
    """A stall before step 1 is the first-step rule's (a few times a whole run), not a gap of the
    step-time rule too: one sentence, not two."""
    _quiet(tmp_path)
    _record(tmp_path, "s.c.pair009.candidate", [45.0] + [0.1] * 19)
    (line,) = folder_stalls(str(tmp_path))
    assert "its first step came 46 s after its start" in line
    assert step_stall([45.0 + 0.1 * k for k in range(20)]) is None


def _command_record(folder: Path, run: str, total_s: float, start_up: float) -> None:
    """A command run whose reporter file's start line came ``start_up`` s after its process started
    (the reporter's clock starts there; only the process's whole time says how long it took)."""
    t0 = 1000.0 + start_up
    lines = [{"kind": "start", "t": t0}]
    t = t0
    for s in range(1, 11):
        t += 0.1
        lines.append({"kind": "step", "step": s, "t": t})
    lines.append({"kind": "done", "t": t + 0.05})
    name = f"{run}.a1.report.jsonl"
    (folder / name).write_text("".join(json.dumps(x) + "\n" for x in lines))
    rec = {
        "spec": {"run_id": run, "command": {"argv": ["python", "train.py"]}},
        "attempt": 1,
        "timings": {"total_s": total_s},
        "curve": [[s, 4.0, 0.1 * s] for s in range(1, 11)],
        "evidence": {"kind": "reporter", "file": name},
    }
    (folder / f"{run}.a1.record.json").write_text(json.dumps(rec))


def test_a_commands_first_step_is_measured_from_its_process_start(tmp_path):
    """A command arm stopped for 200 s before its reporter's start line: its record's curve starts
    at the start line (0.1 s to step 1), its process took 201 s. The code before this measured from
    the start line and named nothing."""
    for i in range(4):
        _command_record(tmp_path, f"s.c.pair00{i}.baseline", total_s=1.2, start_up=0.1)
    _command_record(tmp_path, "s.c.pair009.candidate", total_s=201.2, start_up=200.1)
    (line,) = folder_stalls(str(tmp_path))
    assert line.startswith("s.c.pair009.candidate (attempt 1): its first step came 200 s after its start")
    assert first_step_limit([1.2] * 4 + [201.2]) == STALL_FLOOR_S


#: A user's script: a step every ``STEP`` s; at ``--hold-at``, it says its pid and waits a little
#: within that step, where the test stops it.
SCRIPT = textwrap.dedent(
    """\
    import argparse, os, time
    from harness.reporter import Reporter

    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int)
    ap.add_argument("--hold-at", type=int, default=0)
    ap.add_argument("--pid-file")
    args = ap.parse_args()
    r = Reporter.from_env()
    loss = 4.0
    for step in range(1, 13):
        t = time.perf_counter()
        while time.perf_counter() - t < 0.05:  # a step's work (a lockstep arm's partner waits)
            pass
        if step == args.hold_at and args.seed == 2:
            with open(args.pid_file + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(args.pid_file + ".tmp", args.pid_file)
            time.sleep(3)
        loss *= 0.9
        r.step(step, loss)
    with r.untimed():
        r.eval(12, {"val_loss": loss})
    r.done()
    """
)

PROTOCOL = """\
id: stall
version: 1
description: an arm stopped from outside
preregistered: false
device: cpu
threads: 1
budget_device_seconds: 600
order_seed: 1
studies:
  - name: s
    design: paired
    arms:
      baseline: {{command: [python, train.py, --seed, "{{seed}}"], timeout_s: 120}}
      candidate: {{command: [python, train.py, --seed, "{{seed}}", --hold-at, "5", --pid-file, "{pid}"], timeout_s: 120}}
    metric: {{name: val_loss, target: 0.1}}
    configs: [tiny]
    seeds: [1, 2, 3]
    steps: 12
"""


def _study_repo(tmp_path: Path, protocol: str) -> tuple[Path, dict[str, str], str]:
    """A user's study repository with the stall script committed, the environment the CLI runs in
    (this interpreter first on PATH, no PYTHONPATH) and the code that starts the CLI."""
    repo = init_study(tmp_path / "mine", copy=(), protocol=protocol)
    (repo / "train.py").write_text(SCRIPT)
    subprocess.run(["git", "add", "train.py"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "the script"], cwd=repo, check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    boot = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from harness.cli import main; sys.exit(main())"
    return repo, env, boot


def _program(held_file: Path) -> int:
    """The pid (as this test sees it) of the user's program holding at its step 5: the seed-2 run's
    ``train.py``, found in ``/proc`` (a lockstep arm runs in a PID namespace of its own, where its
    own pid names another process)."""
    want = f"train.py\0--seed\x002\0--hold-at\x005\0--pid-file\0{held_file}".encode()
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and want in (d / "cmdline").read_bytes():
                return int(d.name)
        except OSError:
            continue
    raise AssertionError("the held program is not in /proc")


def _run_on_a_terminal(
    argv: list[str], cwd: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], list[bytes]]:
    """``argv`` with its output on a pseudo-terminal (so the CLI writes its live line, as a user
    sees it), read by a thread into the returned list."""
    import pty
    import threading

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    got: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: every writer closed
                break
            if not chunk:
                break
            got.append(chunk)
        os.close(master)

    threading.Thread(target=read, daemon=True).start()
    return proc, got


@pytest.mark.process
@pytest.mark.parametrize("design", ["paired", "lockstep"])
def test_an_arm_stopped_from_outside_shows_as_stalled_live_and_in_the_report(tmp_path, design):
    """``harness run`` on a terminal, a study of a user's script: seed 2's candidate is stopped
    (SIGSTOP) from outside at its step 5 for longer than the stall rule's floor, then continued
    (SIGCONT). While it is stopped the live progress line says STALLED for that pair, and a line of
    its own says so; no other pair is called stalled; the report names the pair. The code before
    this never said STALLED in a real run: it took the time to the first beat that saw a step (the
    worker's start-up) as the step time, so five of them outlasted the stop."""
    pid_file = tmp_path / "held.pid"
    text = PROTOCOL.format(pid=pid_file)
    if design == "lockstep":
        text = text.replace("design: paired", "design: lockstep\n    block_steps: 1")
    repo, env, boot = _study_repo(tmp_path, text)
    run, got = _run_on_a_terminal([sys.executable, "-c", boot, "run", "protocols/tiny.yaml"], repo, env)
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists():
            assert run.poll() is None and time.monotonic() < deadline, "the held arm never reached its step 5"
            time.sleep(0.02)
        held = _program(pid_file)
        os.kill(held, signal.SIGSTOP)
        time.sleep(STALL_FLOOR_S + 8)
        os.kill(held, signal.SIGCONT)
        run.wait(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    time.sleep(0.5)
    out = b"".join(got).decode("utf-8", "replace")
    live = [x for x in out.split("\r") if x.startswith("  running ") and "STALLED" in x]
    assert live and all("pair001" in x for x in live), out
    assert all("STALLED: no step for " in x for x in live), live
    said = [
        x for x in out.replace("\r", "\n").splitlines() if "STALLED" in x and not x.startswith("  running ")
    ]
    assert len(said) == 1 and "pair001" in said[0] and "its timeout_s still ends it" in said[0], said
    report = (repo / "records" / "stall" / "report.md").read_text()
    assert "s.tiny.pair001.candidate" in report.split("## Stalls")[1].split("\n## ")[0], report


@pytest.mark.process
def test_an_arm_stopped_from_outside_is_named_in_the_report(tmp_path):
    """``harness run`` on a paired study of a user's script: seed 2's candidate is stopped (SIGSTOP)
    at its step 5 for longer than the stall rule's floor, then continued (SIGCONT). The report
    names that pair's candidate and no other run, and the audit renders the same report from the
    records."""
    pid_file = tmp_path / "held.pid"
    repo, env, boot = _study_repo(tmp_path, PROTOCOL.format(pid=pid_file))
    run = subprocess.Popen(
        [sys.executable, "-c", boot, "run", "protocols/tiny.yaml"],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists():
            assert run.poll() is None and time.monotonic() < deadline, "the held arm never said its pid"
            time.sleep(0.02)
        held = int(pid_file.read_text())
        os.kill(held, signal.SIGSTOP)
        time.sleep(STALL_FLOOR_S + 8)
        os.kill(held, signal.SIGCONT)
        out, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out
    report = (repo / "records" / "stall" / "report.md").read_text()
    stalls = report.split("## Stalls")[1].split("\n## ")[0]
    named = [x for x in stalls.splitlines() if x.startswith("* ")]
    assert len(named) == 1 and named[0].startswith("* s.tiny.pair001.candidate (attempt 1): no step for "), (
        stalls
    )
    gap = float(named[0].split("no step for ")[1].split(" s")[0])
    assert gap >= STALL_FLOOR_S + 7 and " s before step 5 (a step took about 0.05" in named[0], named[0]
    audit = subprocess.run(
        [sys.executable, "-c", boot, "audit", "records/stall"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    assert audit.returncode == 3 and "Integrity: everything matched." in audit.stdout, audit.stdout


def test_the_live_watch_takes_no_start_up_for_a_step_time():
    """The progress line's watch (``harness.execute.state.StallWatch``), as a real run feeds it: the
    worker and the script start for 13 s, the first beat that sees the reporter file grow sees four
    quick steps at once, then nothing. After the floor it says STALLED; the code before this took
    the 13 s to that first growth as the step time and waited five of them (65 s)."""
    from harness.execute.state import StallWatch

    watch = StallWatch(first_step_s=45.0)
    assert [watch.see(t, 0) for t in (1.0, 12.0)] == [None, None]
    assert watch.see(13.0, 400) is None
    assert watch.see(13.0 + STALL_FLOOR_S, 400) is None
    said = watch.see(14.0 + STALL_FLOOR_S, 400)
    assert said is not None and said.startswith(f"STALLED: no step for {STALL_FLOOR_S + 1:.0f} s"), said

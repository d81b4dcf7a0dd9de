"""Interference between the arms of a study, as a hostile arm would try it through real processes:
a process the command leaves behind (``setsid``, so its process group's kill misses it) that
could stall the runs after it, a child that rewrites the reporter file as the command exits, and
an arm that stops its lockstep partner (SIGSTOP) while the partner is timed. The harness ends and
names every process a command leaves (``harness/execute/reaper.py``), reads the reporter file only
after, and flags a lockstep pair whose arms' wall against CPU time part (``prereg/interference.py``).
"""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest
from test_command_arms import _job

from harness.execute.commands import run_command

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and the subreaper are Linux's"),
]

ATTACKS = textwrap.dedent(
    """\
    import os, subprocess, sys, time
    from harness.reporter import Reporter
    mode, steps = sys.argv[1], int(sys.argv[2])
    r = Reporter.from_env()
    for i in range(1, steps + 1):
        t = time.monotonic()
        while time.monotonic() - t < 0.01:
            pass
        r.step(i, 3.0 / i)
    with r.untimed():
        r.eval(steps, {"val_loss": 1.0})
    if mode == "setsid":  # a grandchild in a session of its own, sleeping on after the command
        p = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
        )
        open("survivor.pid", "w").write(str(p.pid))
    if mode == "joined":  # an honest helper: started, waited for
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    if mode == "rewrite":  # a child that rewrites the reporter file once its parent has gone
        out = os.environ["HARNESS_REPORT"]
        rfd, wfd = os.pipe()
        if os.fork() == 0:
            os.close(wfd)
            os.setsid()
            os.read(rfd, 1)  # returns when the parent has exited (its end of the pipe closes)
            r_text = open(out).read().replace('"loss": 3.0', '"loss": 0.5')
            open(out, "w").write(r_text)
            open("rewritten", "w").write("1")
            time.sleep(0.5)
            os._exit(0)
        os.close(rfd)
    r.done()
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _command(tmp_path, mode: str, steps: int = 4):
    (tmp_path / "attack.py").write_text(ATTACKS)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    job = _job(tmp_path, ["python", "attack.py", mode, str(steps)], steps=steps)
    cwd = os.getcwd()
    os.chdir(tmp_path)  # the script writes its notes (a pid, a flag) where it runs
    try:
        return run_command(job, work, tmp_path)
    finally:
        os.chdir(cwd)


def test_a_setsid_grandchild_that_outlives_its_command_is_killed_and_fails_the_run(tmp_path):
    result, _ = _command(tmp_path, "setsid")
    pid = int((tmp_path / "survivor.pid").read_text())
    try:
        assert not _alive(pid), "the grandchild outlived the run"
        assert result.status == "failed"
        assert f"pid {pid}" in (result.reason or "") and "outlived it" in (result.reason or ""), result.reason
        assert result.process and any(f"pid {pid}" in s for s in result.process["survivors"])
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def test_a_helper_the_command_waits_for_is_not_a_survivor(tmp_path):
    result, _ = _command(tmp_path, "joined")
    assert result.status == "ok", result.reason
    assert result.process and "survivors" not in result.process


def test_a_child_rewriting_the_reporter_file_as_the_command_exits_fails_the_run(tmp_path):
    """The child waits for its parent's exit and rewrites the file at once: the harness counts it
    (running or exited) before it reads the file, so the run fails, naming it, whichever wins."""
    for _ in range(3):
        (tmp_path / "rewritten").unlink(missing_ok=True)
        result, text = _command(tmp_path, "rewrite")
        assert result.status == "failed", "the rewriting child went unnoticed"
        assert "outlived it" in (result.reason or ""), result.reason
        time.sleep(0.05)

"""Interference between the arms of a study, as a hostile arm would try it through real processes:
a process the command leaves behind (``setsid``, so its process group's kill misses it) that
could stall the runs after it, a child that rewrites the reporter file as the command exits, and
an arm that stops its lockstep partner (SIGSTOP) while the partner is timed. The harness ends and
names every process a command leaves (``harness/execute/reaper.py``), reads the reporter file only
after, and flags a lockstep pair whose arms' wall against CPU time part (``prereg/interference.py``).
"""

from __future__ import annotations

import json
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
    if mode == "leave":  # as "setsid", noting the grandchild's pid in a folder of the test's
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        open(os.path.join(sys.argv[4], f"{sys.argv[3]}.{os.getpid()}.pid"), "w").write(str(p.pid))
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


STOPPER = textwrap.dedent(
    """\
    import os, signal, sys, threading, time
    from harness.reporter import Reporter
    mode, steps = sys.argv[1], int(sys.argv[2])
    halt = threading.Event()

    def victim():
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != os.getpid():
                try:
                    argv = open(f"/proc/{name}/cmdline", "rb").read().split(b"\\0")
                except OSError:
                    continue
                if b"stopper.py" in argv[1:2] and b"victim" in argv:
                    return int(name)

    def stop_the_partner():  # keeps the partner stopped most of the time, its timed blocks included
        pid = None
        while pid is None and not halt.is_set():
            pid = victim()
            time.sleep(0.001)
        while pid is not None and not halt.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.02)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.002)

    def spin():  # runs on while its partner is timed (a waiting arm should sleep in its hand-over)
        while not halt.is_set():
            pass

    def hunt():  # every way to name the partner, each tried; what it got is noted for the test
        import json, socket, struct
        seen = {"found": [], "peer": None, "killed": [], "pids": []}
        fd = int(os.environ["HARNESS_LOCKSTEP_FD"])
        s = socket.socket(fileno=os.dup(fd))
        seen["peer"] = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        s.detach()
        while not halt.is_set():
            pid = victim()
            seen["pids"] = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
            for target in {pid, seen["peer"]} - {None, 0, os.getpid()}:
                try:
                    os.kill(target, signal.SIGSTOP)
                    os.kill(target, signal.SIGCONT)
                    seen["killed"].append(target)
                except OSError:
                    pass
            seen["found"] = sorted(set(seen["found"]) | ({pid} - {None}))
            time.sleep(0.005)
        open("hunted.json", "w").write(json.dumps(seen))

    if mode in ("stopper", "spinner", "hunter"):
        target = {"stopper": stop_the_partner, "spinner": spin, "hunter": hunt}[mode]
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
    r = Reporter.from_env()
    for i in range(1, steps + 1):
        t = time.process_time()
        while time.process_time() - t < 0.01:  # 10 ms of the process's own CPU time a step
            pass
        r.step(i, 3.0 / i)
    with r.untimed():
        r.eval(steps, {"val_loss": 1.0})
    halt.set()
    if mode in ("stopper", "spinner", "hunter"):
        thread.join()
    r.done()
    """
)


@pytest.fixture
def shared_namespace(monkeypatch):
    """The arms in the worker's PID namespace, as where the kernel refuses each its own: what the
    kernel's view must still catch."""
    from harness.execute import isolate

    monkeypatch.setattr(isolate, "unavailable", lambda: f"{isolate.NOT_ISOLATED}: refused for this test")


def _pair(tmp_path, modes: tuple[str, str], steps: int = 12, block: int = 3, wrap: bool = False):
    from harness.execute.commands import run_pair

    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "stopper.py").write_text(STOPPER)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    jobs = [
        _job(
            tmp_path,
            (
                [
                    "sh",
                    "-c",
                    f"{sys.executable} stopper.py {mode} {steps}; true",
                ]  # a wrapper: sh's child is the arm
                if wrap and pos == 0
                else ["python", "stopper.py", mode, str(steps)]
            ),
            steps=steps,
            run_id=f"s.tiny.pair000.{role}",
            position=pos,
            block_steps=block,
            partner=f"s.tiny.pair000.{other}",
            steps_first=pos == 0,
        )
        for pos, (role, other, mode) in enumerate(
            (("baseline", "candidate", modes[0]), ("candidate", "baseline", modes[1]))
        )
    ]
    return run_pair((jobs[0], jobs[1]), work, tmp_path)


def _judged(ran):
    from prereg.interference import flagged_pairs

    (b, _), (c, _) = ran
    assert b.status == "ok" and c.status == "ok", (b.reason, c.reason)
    return flagged_pairs([("s.tiny.pair000", b.timings, c.timings)])


def _failed_by_the_kernel(ran):
    (b, _), (c, _) = ran
    assert b.status == "failed" and c.status == "failed", (b.status, c.status)
    assert "the kernel saw it stopped" in (b.reason or ""), b.reason
    assert "partner s.tiny.pair000.baseline failed" in (c.reason or ""), c.reason
    kernel = b.process["kernel"]
    assert kernel["stops"] >= 1 and kernel["stopped_s"] > 0, kernel
    assert c.process["kernel"]["stops"] == 0, c.process["kernel"]
    return kernel


def test_an_arm_that_stops_its_partner_while_timed_fails_the_pair(tmp_path, shared_namespace):
    """The candidate's thread SIGSTOPs the baseline over and over: the kernel reports each stop to
    the worker, the arms' parent, so the pair fails, the stopped arm's reason naming it (before
    this rule the pair was only flagged, by the stall rule, and analysed)."""
    _failed_by_the_kernel(_pair(tmp_path, ("victim", "stopper")))


def test_an_arm_that_runs_through_its_partners_turns_fails_the_pair(tmp_path, shared_namespace):
    """The candidate's thread spins while the baseline is timed (one core: the test is pinned): in
    the kernel's view the partner ran through the baseline's timed turns, so the pair fails."""
    (b, _), (c, _) = _pair(tmp_path, ("victim", "spinner"))
    assert b.status == "failed" and "starved by its partner" in (b.reason or ""), (
        b.reason,
        b.process["kernel"],
        c.process["kernel"],
    )
    k = b.process["kernel"]
    assert k["stops"] == 0 and k["partner_run_s"] > 0.26 * k["run_s"], k
    assert c.status == "failed", c.reason


@pytest.fixture
def load():
    """A busy loop beside the pair, on the CPUs this test may use (the pinned core under taskset)."""
    import subprocess

    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def test_a_stopped_partner_under_load_fails_the_pair_and_an_honest_one_does_not(
    tmp_path, shared_namespace, load
):
    """Under load both arms stall, so the arms' own clocks part by less than the stall rule's limit
    (the review's finding: 0 of 3 pairs flagged); the kernel's stop reports do not depend on load.
    The honest pair under the same load is not failed, and its kernel figures are there."""
    kernel = _failed_by_the_kernel(_pair(tmp_path / "stopped", ("victim", "stopper")))
    assert kernel["samples"] > 0
    (b, _), (c, _) = _pair(tmp_path / "honest", ("victim", "honest"))
    assert b.status == "ok" and c.status == "ok", (b.reason, c.reason)
    for r in (b, c):
        k = r.process["kernel"]
        assert k["stops"] == 0 and k["timed_s"] > 0 and k["run_s"] > 0, k
        assert k["partner_run_s"] < 0.26 * k["run_s"], k


def test_an_isolated_arm_cannot_find_signal_or_read_its_partner_and_the_pair_completes(tmp_path):
    """Each arm in a PID namespace of its own (harness/execute/isolate.py): the hunter scans /proc
    for its partner's command line, asks the lockstep socket for its peer's pid and SIGSTOPs what
    it finds; it finds nothing (its /proc lists itself alone, the peer's pid is 0), stops nothing,
    and the pair completes honestly, the kernel's view watching the programs, not the relays."""
    from harness.execute import isolate

    if isolate.unavailable():
        pytest.skip(isolate.unavailable())
    (b, _), (c, _) = _pair(tmp_path, ("victim", "hunter"))
    assert b.status == "ok" and c.status == "ok", (b.reason, c.reason)
    seen = json.loads((tmp_path / "hunted.json").read_text())
    assert seen == {"found": [], "peer": 0, "killed": [], "pids": [1]}, seen
    for r in (b, c):
        assert r.process["isolation"] == isolate.ISOLATED
        k = r.process["kernel"]
        # the program's run time (the relay only sleeps); whether the 5 ms samples covered half of its
        # short turns depends on the machine's load, so "observed" is not asserted here
        assert k["stops"] == 0 and k["run_s"] > 0, k


def test_where_isolation_is_refused_the_hunter_stops_its_partner_and_the_record_says_so(
    tmp_path, shared_namespace
):
    """The same hunter where the kernel refuses the namespaces: it finds and stops its partner (so
    the test above can fail), the kernel's view fails the pair, each record says "arms not
    isolated" and the audit's rule names it."""
    from harness.execute import isolate
    from prereg.interference import kernel_named

    (b, _), (c, _) = _pair(tmp_path, ("victim", "hunter"))
    seen = json.loads((tmp_path / "hunted.json").read_text())
    assert seen["found"] and seen["killed"] and seen["peer"] > 0, seen
    assert b.status == "failed" and "the kernel saw it stopped" in (b.reason or ""), b.reason
    records = []
    for r in (b, c):
        assert r.process["isolation"].startswith(isolate.NOT_ISOLATED), r.process
        records.append({"spec": {"run_id": "x"}, "attempt": 1, "status": "ok", "process": r.process})
    assert any(n.startswith("ARMS NOT ISOLATED: 2 arm(s)") for n in kernel_named(records))


def test_a_wrapped_arm_stopped_below_its_wrapper_fails_the_pair(tmp_path, shared_namespace):
    """The baseline is ``sh -c "python stopper.py ...; true"``: the partner stops sh's child, not sh.
    The watch samples the arm's process tree, so the stop is seen and the pair fails, and an honest
    wrapped pair is not failed. Before, only sh was watched: the stop went unseen, and sh's own run
    time (near nothing) made every wrapped arm, the honest one too, look starved by its partner."""
    (b, _), (c, _) = _pair(tmp_path / "stopped", ("victim", "stopper"), wrap=True)
    assert b.status == "failed" and "the kernel saw it stopped" in (b.reason or ""), (b.reason, b.process)
    assert c.status == "failed", c.reason
    (b, _), (c, _) = _pair(tmp_path / "honest", ("victim", "honest"), wrap=True, steps=24, block=6)
    assert b.status == "ok" and c.status == "ok", (b.reason, c.reason)
    # the tree's child spins through its turns: over the sample intervals inside them it was running
    # or runnable nearly all the time (sh alone sleeps: near nothing). How much of the turns the 5 ms
    # samples covered ("observed") depends on the machine's load, so it is not asserted here.
    k = b.process["kernel"]
    assert k["timed_s"] > 0 and k["run_s"] + k["runqueue_s"] >= 0.8 * k["timed_s"], k


UNPRIVILEGED = """
import importlib.util, json, os, subprocess, sys
spec = importlib.util.spec_from_file_location("isolate", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
why = m.unavailable()
if why:
    print(json.dumps({"why": why}))
    raise SystemExit(0)
probe = "import os; print(os.getpid(), sorted(n for n in os.listdir('/proc') if n.isdigit()), os.getuid())"
r, w = os.pipe()
p = subprocess.Popen([sys.executable, "-S", "-c", probe + "; raise SystemExit(7)"], stdout=subprocess.PIPE,
                     pass_fds=(w,), preexec_fn=m.launcher(w), start_new_session=True)
os.close(w)
events, tree = [], []
m.read_reports(r, events, tree)
out, _ = p.communicate()
print(json.dumps({"why": None, "out": out.decode().split(" ", 2), "rc": p.returncode, "tree": tree,
                  "relay": p.pid, "uid": os.getuid()}))
"""


def test_an_unprivileged_worker_puts_each_arm_in_its_own_pid_namespace():
    """The claim for a normal user, not root: through ``setpriv`` as uid 65534, the launcher puts
    the program in a PID namespace of its own (it is process 1 there, its /proc lists it alone, its
    uid is unchanged), the relay reports the program's pid and passes its exit status on; where the
    kernel refuses, the reason names the settings."""
    import shutil
    import subprocess

    from harness.execute import isolate

    setpriv, python = shutil.which("setpriv"), "/usr/bin/python3"
    if setpriv is None or not os.path.exists(python) or os.getuid() != 0:
        pytest.skip("needs setpriv, /usr/bin/python3 and root to drop to uid 65534")
    got = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-I", "-c", UNPRIVILEGED]
        + [isolate.__file__],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert got.returncode == 0, got.stderr
    seen = json.loads(got.stdout)
    if seen["why"]:
        assert seen["why"].startswith(isolate.NOT_ISOLATED) and "max_user_namespaces" in seen["why"], seen
        pytest.skip(seen["why"])
    pid, procs, uid = seen["out"]
    assert (pid, procs.strip(), uid.strip()) == ("1", "['1']", "65534"), seen
    assert seen["rc"] == 7 and seen["uid"] == 65534, seen
    assert len(seen["tree"]) == 1 and seen["tree"][0] != seen["relay"], seen


def test_an_honest_lockstep_pair_of_commands_is_not_flagged(tmp_path):
    judged = _judged(_pair(tmp_path, ("victim", "honest")))
    assert judged is not None and judged["flagged"] == [], judged


GIL_HOG = '''
import threading, time
from harness.arms import ArmContext, resolve

SEEN = []
STOP = threading.Event()  # the test's, when it is done: no thread of this module outlives it
THREADS = []


class Hog:
    """Native, and (built second) a thread that holds the interpreter's lock in long C calls
    whenever its partner trains: only during the partner's blocks. It learns whose turn it is from
    the arms' own calls (``set_lr`` starts each step), never by reading a tensor the training thread
    may be writing with the lock released (a backward's gradients)."""

    def __init__(self, ctx: ArmContext) -> None:
        self.inner = resolve("native")(ctx)
        self.optimizer = self.inner.optimizer
        self.turn = threading.Event()  # set as each of this arm's steps starts
        SEEN.append(self)
        if len(SEEN) % 2 == 0:
            THREADS.append(threading.Thread(target=self.hog, args=(SEEN[-2],), daemon=True))
            THREADS[-1].start()

    def hog(self, partner) -> None:
        while not STOP.is_set():  # the test's, once the pair has ended
            if not partner.turn.wait(0.05):
                continue
            self.turn.clear()  # the partner's block: hold the lock until this arm's next step
            deadline = time.monotonic() + 2.0
            while not self.turn.is_set() and time.monotonic() < deadline and not STOP.is_set():
                sum(range(100_000))  # one C call: the lock is not let go until it returns
            partner.turn.clear()  # its block is over: wait for its next one

    def phase(self):
        return self.inner.phase()

    def set_lr(self, lr):  # the first thing a training step does: this arm's turn has come
        self.turn.set()
        self.inner.set_lr(lr)

    def zero_grad(self):
        self.inner.zero_grad()


def build(ctx):
    return Hog(ctx)
'''


def test_a_plugin_thread_holding_the_gil_in_its_partners_blocks_gets_the_pair_flagged(tmp_path, monkeypatch):
    """Built-in lockstep, one process: the arm built second starts a thread that holds the GIL
    while its partner trains. The partner's training thread waits for the lock off its CPU clock
    (the thread's), so its blocks' wall time parts from its CPU time; its record holds the stall,
    the audit derives it again from the step times, and the report names the pair."""
    from conftest import init_study, record_dicts
    from test_lockstep import FAMILIES, RECS, protocol, run

    from prereg.evidence import stall_problems
    from prereg.formats.record import load_records
    from prereg.formats.summary import derive
    from prereg.render.page import markdown

    text = protocol("lockstep", steps=16, block=4, seeds="[1, 2]").replace(
        "[bucketed, packed]", "[gilhog:build, gilhog:build]"
    )
    text = text.replace(f"configs: {FAMILIES}", "configs: [tiny_conv]")
    repo = tmp_path / "s"
    repo.mkdir()
    (repo / "gilhog.py").write_text(GIL_HOG)
    init_study(repo, protocol=text)
    monkeypatch.syspath_prepend(str(repo))
    try:
        assert run(repo).left == 0
    finally:
        hog = sys.modules.get("gilhog")
        if hog is not None:
            hog.STOP.set()
            for t in hog.THREADS:
                t.join()
    recs = record_dicts(repo / RECS)
    assert all(r["status"] == "ok" for r in recs), [r.get("reason") for r in recs]
    assert all("stall_s" in r["timings"] for r in recs)
    assert stall_problems(recs) == ([], len(recs))
    summary = derive(load_records(repo / RECS))
    studies = {s.name: s for s in summary.studies}
    hogged = studies["others"].configs[0].interference
    honest = studies["pairs"].configs[0].interference
    # at least one hogged pair is flagged: the hog's thread is scheduled by a loaded machine, so
    # how much of each partner block it takes varies (one of two was under the limit in one run)
    assert hogged and hogged["pairs_judged"] == 2 and len(hogged["flagged"]) >= 1, hogged
    assert (
        honest and honest["pairs_judged"] == 2
    )  # judged; tiny runs on a shared machine vary too much to assert more
    report = markdown(summary)
    assert "Interference: lockstep arms' wall against CPU time" in report
    assert all(f["unit"] in report for f in hogged["flagged"])
    edited = [dict(r, timings={**r["timings"], "stall_s": 0.0}) if i == 0 else r for i, r in enumerate(recs)]
    found, _ = stall_problems(edited)
    assert len(found) == 1 and "its step times say" in found[0]


def test_no_process_of_a_run_is_alive_after_harness_run_exits(tmp_path):
    """Through the CLI: every run's command leaves a setsid grandchild sleeping on; each is killed
    before its run's record is written, each run fails naming it, and none is alive after."""
    from conftest import harness, init_study, record_dicts
    from test_command_arms import PROTOCOL

    repo = init_study(tmp_path / "s", copy=())
    notes = tmp_path / "notes"
    notes.mkdir()
    (repo / "attack.py").write_text(ATTACKS)
    arm = f'{{command: [python, attack.py, leave, "{{steps}}", "{{seed}}", "{notes}"], timeout_s: 60}}'
    candidate = 'candidate: {command: [python, train.py, --seed, "{seed}"], timeout_s: 60}'
    text = PROTOCOL.format(baseline=arm, endpoint="training_time")
    assert candidate in text
    text = text.replace(candidate, f"candidate: {arm}")
    (repo / "protocols" / "leave.yaml").write_text(text)
    run = harness(repo, "run", "protocols/leave.yaml", "--quiet")
    pids = {p.name: int(p.read_text()) for p in notes.glob("*.pid")}
    try:
        # each failed run fails before a step the record keeps, so the failure rule stops the study
        # after its first (prereg/failstop.py): every run that started left one survivor
        assert 1 <= len(pids) <= 6, (pids, run.stdout + run.stderr)
        assert [n for n, pid in pids.items() if _alive(pid)] == []
        recs = record_dicts(next(p.parent for p in repo.rglob("MANIFEST")))
        assert len(recs) == len(pids) and all(r["status"] == "failed" for r in recs)
        for r in recs:
            named = [pid for pid in pids.values() if f"pid {pid} " in r["reason"]]
            assert len(named) == 1 and "outlived it" in r["reason"], r["reason"]
    finally:
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, 9)

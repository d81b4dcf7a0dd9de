"""A command arm's run (``harness/commandarm.py``): the user's program, in a process of its own,
timed by this worker's clock, its figures derived from its evidence.

The worker process (:mod:`harness.execute.worker`) runs it: a ref arm's clean checkout (a git
worktree of the commit, made here and removed after), the argument list with its placeholders
replaced (``python`` and ``python3`` as the program are this interpreter, the one the freeze
binds), the allow-listed environment (:data:`harness.execute.launchers.ALLOWED`, the protocol's
threads, the arm's ``env``, ``HARNESS_REPORT``), no shell, its own process group, killed at its
wall-clock limit. Its CPU time is the kernel's (``wait4``). When it has ended, every process it
left (one that left its group too: ``setsid``) is killed and named, and the run fails
(:mod:`harness.execute.reaper`); only then is its reporter file read and hashed. Its figures are
:func:`prereg.evidence.derive`'s from the reporter file or, for ``reporter: false``, from its
output; the evidence travels to the runner with the result and is kept beside the record.

A lockstep pair (``design: lockstep``) runs both programs at once over a socket pair: each
reporter hands the turn to the other at the end of each turn (blocks of ``block_steps`` steps in
ABBA order, an arm's consecutive blocks one turn: ``harness/reporter.py``), so one trains while
the other waits; each arm's record keeps its steps' times (``step_times``, from its reporter file,
which the audit derives again) for the after-own endpoints. If one fails, the other is stopped and both runs fail. Each arm's
stall (its blocks' wall less CPU time, from its reporter file: ``prereg/interference.py``) is in
its record, so a pair one of whose arms was stopped or starved while timed is flagged; the kernel's
view of each arm (:mod:`harness.execute.watch`: a stop the kernel reported, its partner's CPU time
within its timed turns) fails the pair, whatever the machine's load.

Every way a command goes wrong is a failed run with its reason: not found, a non-zero exit, past
its limit, no reporter file, a refused one (torn, gaps, a clock that runs backwards, no ``done``,
a non-finite loss), or a traceback printed.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import gitutil
from harness.codepath import recorded_environment
from harness.commandarm import substitute
from harness.execute import isolate
from harness.execute.job import Job
from harness.execute.launchers import ALLOWED
from harness.execute.reaper import Reaper, Survivor
from harness.execute.watch import Watch, kernel_view
from harness.freeze import code_sha256
from harness.machine import cpu_model
from harness.reporter import ENV_BLOCK_STEPS, ENV_LOCKSTEP_FD, ENV_PLANT, ENV_REPORT, ENV_STEPS_FIRST
from prereg.evidence import EVIDENCE_SUFFIX, MAX_EVIDENCE_BYTES, Derived, EvidenceError, derive
from prereg.formats.record import RunSpec, WorkerResult
from prereg.interference import kernel_reason

if TYPE_CHECKING:
    import resource

#: What a printed traceback starts with: a run whose output holds it failed, whatever its exit.
TRACEBACK = "Traceback (most recent call last):"
#: Where a result carries its evidence's text to the runner (not a record field: the runner writes
#: the file beside the record and the record names its sha256).
EVIDENCE_TEXT = "evidence_text"


@dataclass
class _Proc:
    """One command's process, as it runs and ends."""

    spec: RunSpec
    attempt: int
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    out: Path
    log: Path
    pass_fds: tuple[int, ...] = ()
    popen: subprocess.Popen[bytes] | None = None
    t0: float = 0.0
    wall_s: float | None = None
    status: int | None = None
    rusage: resource.struct_rusage | None = None  # os.wait4's, once it ended
    killed: str | None = None  # why the harness killed it
    survivors: list[Survivor] = field(default_factory=list)  # processes of it left at its end
    failed: str | None = None  # why it could not start
    done: threading.Event = field(default_factory=threading.Event)
    stops: list[tuple[float, str]] = field(default_factory=list)  # the kernel's stop/continue reports
    isolate: bool = False  # a lockstep arm: run in namespaces of its own (harness/execute/isolate.py)
    isolation: str | None = None  # the record's process.isolation (a lockstep arm's)
    inner: list[int] = field(default_factory=list)  # the program's pid, where a relay runs it


def ref_checkout(spec: RunSpec, root: Path, work: Path, keep: list[Path]) -> Path:
    """The folder the command's ``cwd`` is relative to: the study's root, or a clean worktree of
    the arm's ref in the run's work folder (appended to ``keep``, removed after the run; one a
    killed attempt left is removed before the next)."""
    assert spec.command is not None
    ref = spec.command.get("ref")
    if not ref:
        return root
    repo = gitutil.toplevel(root)
    if repo is None:
        raise EvidenceError(
            f"ref {ref[:12]}: {root} is not a git repository, so the commit cannot be checked out"
        )
    where = work / f"{spec.run_id}.ref-{ref[:12]}"
    if where.exists():  # left by an attempt whose worker was killed: remove it first
        _remove(root, where)
    gitutil.git(repo, "worktree", "prune", check=False)
    # no hook runs (a post-checkout hook could edit the checkout after git wrote it)
    got = gitutil.git(
        repo,
        "-c",
        "core.hooksPath=/dev/null",
        "worktree",
        "add",
        "--detach",
        "--quiet",
        str(where),
        ref,
        check=False,
    )
    if got.returncode != 0:
        raise EvidenceError(f"ref {ref}: git worktree add failed: {got.stderr.strip()[-300:]}")
    keep.append(where)
    wrong = gitutil.checkout_mismatches(repo, where, ref)
    if wrong:
        raise EvidenceError(
            f"ref {ref[:12]}: the checkout in {where} is not the commit's tree ({'; '.join(wrong[:3])}"
            f"{'; ...' if len(wrong) > 3 else ''}): a hook, filter or another process changed it, so the "
            "command did not run"
        )
    return where


def _remove(root: Path, where: Path) -> None:
    repo = gitutil.toplevel(root)
    if repo is not None:
        gitutil.git(repo, "worktree", "remove", "--force", str(where), check=False)
    shutil.rmtree(where, ignore_errors=True)


def command_environment(spec: RunSpec, out: Path) -> dict[str, str]:
    """The command's environment: the allow-listed variables, the protocol's threads, the arm's
    ``env``, the reporter file, unbuffered output and no bytecode written."""
    assert spec.command is not None
    env = {k: v for k, v in os.environ.items() if k in ALLOWED or k.startswith("LC_")}
    if spec.threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(spec.threads)
    env.update(spec.command.get("env") or {})
    env[ENV_REPORT] = str(out)
    if spec.planted:  # a planted candidate: its reporter runs the plant in each step
        env[ENV_PLANT] = json.dumps(dict(spec.planted), sort_keys=True)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a command writes no bytecode the next run could read
    return env


def _argv(spec: RunSpec, out: Path) -> list[str]:
    assert spec.command is not None
    values = {
        "seed": str(spec.seed),
        "out": str(out),
        "config": spec.config,
        "device": spec.device,
        "threads": "" if spec.threads is None else str(spec.threads),
        "steps": str(spec.steps),
        "run_id": spec.run_id,
    }
    argv = [substitute(a, values) for a in spec.command["command"]]
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable  # the interpreter the freeze binds, not whichever is first on PATH
    return argv


def _prepare(job: Job, work: Path, root: Path, keep: list[Path]) -> _Proc:
    spec = job.spec
    assert spec.command is not None
    base = f"{spec.run_id}.a{job.attempt}"
    out = work / f"{base}{EVIDENCE_SUFFIX['reporter']}"
    log = work / f"{base}{EVIDENCE_SUFFIX['output']}"
    for p in (out, log):
        p.unlink(missing_ok=True)
    proc = _Proc(spec, job.attempt, [], root, {}, out, log)
    try:
        cwd = ref_checkout(spec, root, work, keep) / spec.command.get("cwd", ".")
        if not cwd.is_dir():
            raise EvidenceError(
                f"the working directory {spec.command.get('cwd')!r} is not a folder of the checkout"
            )
        proc.cwd, proc.argv, proc.env = cwd, _argv(spec, out), command_environment(spec, out)
        if (
            shutil.which(proc.argv[0], path=proc.env.get("PATH")) is None
            and not Path(cwd, proc.argv[0]).is_file()
        ):
            raise EvidenceError(f"command not found: {proc.argv[0]}")
    except (EvidenceError, ValueError, KeyError, IndexError, OSError) as e:  # each a failed run, named
        proc.failed = (
            str(e)
            if isinstance(e, EvidenceError)
            else f"the command could not be prepared: {type(e).__name__}: {e}"
        )
    return proc


def _start(proc: _Proc, reaper: Reaper) -> None:
    if proc.failed:
        proc.done.set()
        return
    preexec = _die_with_worker if sys.platform.startswith("linux") else None
    report = None
    if proc.isolate:  # a lockstep arm: in namespaces of its own where the kernel allows
        proc.isolation = isolate.unavailable() or isolate.ISOLATED
        if proc.isolation == isolate.ISOLATED:
            report = os.pipe()
            preexec = isolate.launcher(report[1])
    with open(proc.log, "wb") as log:
        try:
            proc.t0 = time.monotonic()
            proc.popen = subprocess.Popen(
                proc.argv,
                cwd=proc.cwd,
                env=proc.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the limit kills all of it
                pass_fds=proc.pass_fds + ((report[1],) if report else ()),
                preexec_fn=preexec,
            )
        except (OSError, subprocess.SubprocessError) as e:
            proc.failed = f"command could not start: {proc.argv[0]}: {getattr(e, 'strerror', None) or e}"
            proc.done.set()
            if report is not None:
                os.close(report[0])
            return
        finally:
            if report is not None:
                os.close(report[1])
    reaper.started(proc.popen.pid)
    if report is not None:
        threading.Thread(
            target=isolate.read_reports, args=(report[0], proc.stops, proc.inner), daemon=True
        ).start()
    threading.Thread(target=_reap, args=(proc,), daemon=True).start()


def _die_with_worker() -> None:
    """In the command's process before it starts (Linux): killed when this worker dies, so a runner
    killed mid-run (its worker with it, ``PR_SET_PDEATHSIG``) leaves no command running on."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1


def _reap(proc: _Proc) -> None:
    assert proc.popen is not None
    while True:  # each stop and continue the kernel reports to the parent is noted (watch.py)
        _, status, rusage = os.wait4(proc.popen.pid, os.WUNTRACED | os.WCONTINUED)
        if os.WIFSTOPPED(status) or os.WIFCONTINUED(status):
            proc.stops.append((time.monotonic(), "stopped" if os.WIFSTOPPED(status) else "continued"))
            continue
        break
    proc.wall_s = time.monotonic() - proc.t0
    proc.popen.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    proc.status, proc.rusage = proc.popen.returncode, rusage
    proc.done.set()


def _kill(proc: _Proc, why: str) -> None:
    if proc.popen is not None and not proc.done.is_set():
        proc.killed = proc.killed or why
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


#: How often the worker reaps the orphans that exited while the commands run (seconds).
REAP_EVERY_S = 0.5


def _wait(procs: list[_Proc], reaper: Reaper, pair: bool = False) -> None:
    """Wait for every process, killing all at the limit, and the others when one fails; then end
    every process the commands left (:class:`~harness.execute.reaper.Reaper`), each run naming its
    survivors. A run's limit is its arm's ``timeout_s``; a lockstep pair's processes each live
    while both arms train, so the pair's limit is the sum of its two arms'."""
    limits = [float(p.spec.command["timeout_s"]) for p in procs if p.spec.command]
    limit = sum(limits) if pair else min(limits)
    deadline = time.monotonic() + limit
    reaped = time.monotonic()
    while not all(p.done.is_set() for p in procs):
        if time.monotonic() - reaped > REAP_EVERY_S:
            reaper.reap_exited()
            reaped = time.monotonic()
        left = deadline - time.monotonic()
        if left <= 0:
            for p in procs:
                _kill(p, f"ran past its wall-clock limit of {limit:g} s (timeout_s) and was killed")
            deadline = float("inf")
            continue
        for p in procs:
            p.done.wait(min(left, 0.05))
        _stop_partners(procs)
    survivors = reaper.end()  # before any reporter file is read: nothing of the run is left to write it
    for p in procs:
        p.survivors = survivors


def _stop_partners(procs: list[_Proc]) -> None:
    """Once one process has ended badly (failed, or a non-zero status), kill the others of its
    group, naming the one that failed."""
    bad = [p for p in procs if p.done.is_set() and (p.failed or p.status)]
    if not bad:
        return
    for p in procs:
        if p not in bad:
            _kill(p, f"its partner {bad[0].spec.run_id} failed, so the pair was stopped")


def _result(proc: _Proc) -> tuple[WorkerResult, str | None]:
    """The run's result and its evidence's text (None: none to keep)."""
    spec = proc.spec
    assert spec.command is not None
    reporter = bool(spec.command.get("reporter", True))
    kind = "reporter" if reporter else "output"
    text_out = _tail(proc.log, MAX_EVIDENCE_BYTES).decode("utf-8", "replace")
    size, raw = _evidence_file(proc.out if reporter else proc.log)
    cpu = proc.rusage.ru_utime + proc.rusage.ru_stime if proc.rusage is not None else None
    process = _process_facts(proc, cpu)
    env = env_facts(spec)
    timings: dict[str, Any] = {} if proc.wall_s is None else {"total_s": proc.wall_s}
    reason = _failure(proc, kind, size, text_out, raw)
    derived = None
    if reason is None:
        assert raw is not None  # _failure names a missing file
        derived, reason = _derived(proc, kind, raw, cpu)
    fields = _derived_fields(derived, reporter, timings) if derived is not None else {}
    if derived is not None and derived.turns is not None:
        env["lockstep"] = _lockstep_env(spec, derived.turns)
    evidence = _evidence(proc, kind, raw) if raw is not None else None
    result = WorkerResult(
        status="failed" if reason else "ok",
        reason=reason,
        timings=timings,
        env=env,
        process=process,
        evidence=evidence,
        log_tail=text_out[-2000:] if reason else None,
        **fields,
    )
    return result, (raw.decode("utf-8", "surrogateescape") if raw is not None else None)


def _lockstep_env(spec: RunSpec, turns: str) -> dict[str, object]:
    """A lockstep command arm's ``env.lockstep``: its block size, whether it stepped first, and its
    turns as its reporter file gave them."""
    return {
        "block_steps": spec.block_steps,
        "steps": "first" if spec.steps_first else "second",
        "turns": turns,
    }


def _evidence_file(path: Path) -> tuple[int | None, bytes | None]:
    """The size of a run's evidence file (None: there is none) and its bytes (None: none, or over
    :data:`MAX_EVIDENCE_BYTES`)."""
    size = path.stat().st_size if path.is_file() else None
    return size, (path.read_bytes() if size is not None and size <= MAX_EVIDENCE_BYTES else None)


def _derived(proc: _Proc, kind: str, raw: bytes, cpu: float | None) -> tuple[Derived | None, str | None]:
    """The figures a run's kept ``kind`` file gives (:func:`prereg.evidence.derive`, within the run's
    window), or why the file is refused."""
    try:
        window = (proc.t0, proc.t0 + (proc.wall_s or 0.0))
        text = raw.decode("utf-8", "replace")
        return derive(kind, text, proc.spec.to_json(), proc.wall_s, window=window, cpu_s=cpu), None
    except EvidenceError as e:
        return None, f"its {kind} file is refused: {e}"


def _process_facts(proc: _Proc, cpu: float | None) -> dict[str, object]:
    """The record's ``process``: what ran, where, how it ended and what it used."""
    assert proc.spec.command is not None
    return {
        "argv": proc.argv,
        "cwd": str(proc.cwd),
        "ref": proc.spec.command.get("ref"),
        "exit": proc.status,
        "wall_s": proc.wall_s,
        "cpu_s": cpu,
        "max_rss_kib": proc.rusage.ru_maxrss if proc.rusage is not None else None,
        **({"isolation": proc.isolation} if proc.isolation else {}),
        **({"survivors": [s.describe() for s in proc.survivors]} if proc.survivors else {}),
    }


def env_facts(spec: RunSpec) -> dict[str, object]:
    """The record's ``env``: the machine and the worker's code that ran the command."""
    return {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "device": spec.device,
        "device_name": cpu_model(),  # the name a built-in run's record gives this CPU
        "threads": spec.threads,
        "harness_sha256": code_sha256()["harness"],  # the worker's: the code that ran the command
        "loadavg": [round(x, 2) for x in os.getloadavg()],  # the machine's load as the run started
        # COTANGENT_MODE and the like as the arm's env sets them (the runner passes none of its own)
        **(
            {"code_path_env": seen}
            if (seen := recorded_environment((spec.command or {}).get("env") or {}))
            else {}
        ),
    }


def _failure(proc: _Proc, kind: str, size: int | None, text_out: str, raw: bytes | None) -> str | None:
    """Why the run failed before its evidence is read (None: its evidence is there to derive)."""
    if size is not None and size > MAX_EVIDENCE_BYTES:
        return f"its {kind} file holds {size} bytes, more than the {MAX_EVIDENCE_BYTES} a run may keep"
    if proc.failed:
        return proc.failed
    if proc.killed:
        return proc.killed  # what it left is in process.survivors
    if proc.survivors:
        return (
            f"{len(proc.survivors)} process(es) the command started outlived it and were killed by the "
            f"harness: {'; '.join(s.describe() for s in proc.survivors[:3])} (a run's processes end with "
            "its command: one left running could stall the runs after it or rewrite its reporter file)"
        )
    if proc.status:
        last = [ln for ln in text_out.strip().splitlines() if ln.strip()][-1:] or [""]
        return f"the command exited with status {proc.status}" + (f": {last[0][-300:]}" if last[0] else "")
    if TRACEBACK in text_out:
        return (
            "the command printed a traceback (exit status 0): " + text_out.split(TRACEBACK)[-1].strip()[-300:]
        )
    if raw is None:
        return "the command wrote no reporter file (it never built Reporter.from_env(), or wrote elsewhere)"
    return None


def _derived_fields(derived: Derived, reporter: bool, timings: dict[str, Any]) -> dict[str, Any]:
    """The result's figures from its evidence; a reporter file's timings are added to ``timings``."""
    fields: dict[str, Any] = {"final_metric": derived.final_metric, "metrics": derived.metrics}
    if reporter:
        timings.update(
            training_s=derived.training_s,
            training_cpu_s=derived.training_cpu_s,
            training_cpu_clock="process",
            untimed_s=derived.untimed_s,
            **({"stall_s": derived.stall_s} if derived.stall_s is not None else {}),
            **(
                {"planted_s": derived.planted_s, "planted_cpu_s": derived.planted_cpu_s}
                if derived.planted_s is not None
                else {}
            ),
            **(
                {"time_to_target_s": derived.time_to_target_s} if derived.time_to_target_s is not None else {}
            ),
        )
        fields.update(curve=derived.curve, val_curve=derived.val_curve)
        if derived.step_us is not None and derived.turns is not None:  # a lockstep arm's after-own steps
            fields["step_times"] = {"wall_us": derived.step_us[0], "cpu_us": derived.step_us[1]}
    return fields


def _evidence(proc: _Proc, kind: str, raw: bytes) -> dict[str, object]:
    """The record's ``evidence``: the kept file's name, sha256 and size."""
    import hashlib

    return {
        "kind": kind,
        "file": f"{proc.spec.run_id}.a{proc.attempt}{EVIDENCE_SUFFIX[kind]}",
        "sha256": hashlib.sha256(raw).hexdigest(),
        "bytes": len(raw),
    }


def _tail(path: Path, limit: int) -> bytes:
    """The last ``limit`` bytes of a file (its whole when shorter; nothing when it is missing)."""
    if not path.is_file():
        return b""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - limit))
        return f.read()


def run_command(job: Job, work: Path, root: Path) -> tuple[WorkerResult, str | None]:
    """One command arm's run: its result and its evidence's text."""
    keep: list[Path] = []
    reaper = Reaper()
    try:
        proc = _prepare(job, work, root, keep)
        _start(proc, reaper)
        _wait([proc], reaper)
        return _result(proc)
    finally:
        reaper.close()
        for where in keep:
            _remove(root, where)


def _kernel_judged(
    procs: list[_Proc], watch: Watch, ran: list[tuple[WorkerResult, str | None]]
) -> list[tuple[WorkerResult, str | None]]:
    """Each arm's result with the kernel's view of it (``process.kernel``: stops, and its partner's
    run within its timed turns, :mod:`harness.execute.watch`); an arm the rule refuses
    (:func:`prereg.interference.kernel_reason`) fails with the reason."""
    out = []
    for i, (proc, (r, text)) in enumerate(zip(procs, ran, strict=True)):
        other = procs[1 - i]
        if proc.popen is None or other.popen is None:
            out.append((r, text))
            continue
        view = kernel_view(
            watch.samples.get(proc.popen.pid, []),
            watch.samples.get(other.popen.pid, []),
            proc.stops,
            (text, ran[1 - i][1]),
            proc.t0 + (proc.wall_s or 0.0),
        )
        why = kernel_reason(view)
        r = replace(r, process={**(r.process or {}), "kernel": view})
        if why is not None and r.status == "ok":
            r = replace(r, status="failed", reason=why)
        out.append((r, text))
    return out


def _fail_whole(
    procs: list[_Proc], ran: list[tuple[WorkerResult, str | None]]
) -> list[tuple[WorkerResult, str | None]]:
    """A lockstep pair fails whole: an ok arm whose partner failed ran part of its run alone."""
    for i, (r, text) in enumerate(ran):
        other = ran[1 - i][0]
        if r.status == "ok" and other.status != "ok":
            reason = f"its partner {procs[1 - i].spec.run_id} failed ({other.reason})"
            ran[i] = (replace(r, status="failed", reason=reason), text)
    return ran


def run_pair(jobs: tuple[Job, Job], work: Path, root: Path) -> list[tuple[WorkerResult, str | None]]:
    """A lockstep pair of command arms, both at once, handing the turn over a socket pair."""
    keep: list[Path] = []
    a, b = socket.socketpair()
    reaper = Reaper()
    try:
        procs = [_prepare(j, work, root, keep) for j in jobs]
        for proc, sock in zip(procs, (a, b), strict=True):
            spec = proc.spec
            proc.pass_fds, proc.isolate = (sock.fileno(),), True
            proc.env.update(
                {
                    ENV_LOCKSTEP_FD: str(sock.fileno()),
                    ENV_BLOCK_STEPS: str(spec.block_steps),
                    ENV_STEPS_FIRST: "1" if spec.steps_first else "0",
                }
            )
        if any(p.failed for p in procs):
            for p in procs:
                p.failed = p.failed or "its partner could not start, so the pair did not run"
        for p in procs:
            _start(p, reaper)
        a.close()
        b.close()
        watch = Watch()
        watch.start([p.popen.pid for p in procs if p.popen is not None])
        try:
            _wait(procs, reaper, pair=True)
        finally:
            watch.close()
        return _fail_whole(procs, _kernel_judged(procs, watch, [_result(p) for p in procs]))
    finally:
        reaper.close()
        a.close()
        b.close()
        for where in keep:
            _remove(root, where)

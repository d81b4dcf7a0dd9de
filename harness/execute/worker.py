"""One run, in its own process: ``python -m harness.execute.worker JOB.json fd:N`` (``N`` the pipe
its parent reads the result from; a file path instead writes the result there, for operators).

The run itself (seed, build, compile, train, validate, evaluate, checkpoint and re-score) is
:func:`harness.execute.training.execute`; this process times itself from its start, dies with its
parent, and reports timings, curves and memory peaks as JSON, which the parent turns into the
record. ``--serve`` makes it the fork server (:func:`serve`); a ``probe`` job asks it what PyTorch
and devices it has (:func:`probe`).
"""

from __future__ import annotations

import time

_T0 = time.monotonic()  # this process's start, before the heavy imports: the run's device time begins here

import os


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux ``PR_SET_PDEATHSIG``), so no
    worker outlives the runner (or fork server) that started it; exits at once if the parent has
    already gone. Elsewhere a no-op (the runner's device lock and orphan check still hold)."""
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    if os.getppid() != parent:
        os._exit(1)


if __name__ == "__main__":  # before the heavy imports: a runner killed now takes this process with it
    die_with_parent(os.getppid())

import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import NoReturn, TypedDict

import torch

from harness.execute.hermetic import slowdown
from harness.execute.job import Job
from harness.execute.training import Partial, execute, failure
from prereg.files import atomic_write
from prereg.formats.record import WorkerResult, jsonable


def serve() -> int:
    """Fork server: import everything once, then fork one fresh child process per job.

    Reads ``JOB -`` lines on stdin; for each, forks a child that runs the job and exits, writes
    ``PID START`` on stdout, and ``PID STATUS RESULT`` (``STATUS`` as ``os.waitstatus_to_exitcode``,
    ``RESULT`` the child's result as one ASCII line of JSON, read from a pipe) when it ends. The
    server dies with its runner and each child with the server (``PR_SET_PDEATHSIG``).
    The server itself never builds a model or touches a device, so each child starts from the
    same pristine state (fresh allocator, no caches) without paying interpreter start-up and
    imports. Linux only (fork after importing Apple's frameworks is unsafe).
    """
    import torch._dynamo  # noqa: F401 - optimizers import it on first use; pay it once here

    import cotangent  # noqa: F401 - preload
    import harness.data.batches  # noqa: F401 - preload
    from harness import devices, models  # noqa: F401 - preload

    sys.stdout.write("READY\n")
    sys.stdout.flush()
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 2:
            continue
        server = os.getpid()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: output to the run's log, never to the control pipe
            _child(parts[0], server, r, w)
        os.close(w)
        sys.stdout.write(f"{pid} START\n")
        sys.stdout.flush()
        _report_child(pid, r)
    return 0


def _child(job: str, server: int, r: int, w: int) -> NoReturn:
    """The forked child: run the job with its output in the run's log, its result on the pipe ``w``."""
    die_with_parent(server)
    global _T0
    _T0 = time.monotonic()
    code = 1
    os.close(r)
    log = os.open(Path(job).parent / "worker.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        code = main([job, f"fd:{w}"])
    finally:
        sys.stdout.flush()
        os._exit(code)


def _report_child(pid: int, r: int) -> None:
    """Read the child's result from the pipe ``r`` until it ends, reap it and write ``PID STATUS RESULT``."""
    from harness.execute.launchers import read_pipe

    reaped: list[int] = []

    def ended(pid: int = pid, reaped: list[int] = reaped) -> bool:
        if not reaped:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reaped.append(status)
        return bool(reaped)

    data = read_pipe(r, lambda: None, ended)
    os.close(r)
    status = reaped[0] if reaped else os.waitpid(pid, 0)[1]
    # the child's result travels on this pipe, one ASCII line, never through a file
    sys.stdout.write(f"{pid} {os.waitstatus_to_exitcode(status)} {data.decode('ascii').strip()}\n")
    sys.stdout.flush()


class Probe(TypedDict):
    """A worker process's answer to a probe (:func:`probe`)."""

    status: str
    torch: str  # PyTorch's version
    devices: dict[str, bool]  # each timing device, whether PyTorch can use it


def probe() -> Probe:
    """What a Ray node checks before it runs anything, asked of a worker process (so the node's
    own process never imports torch, and a fork server never initialises a device before forking):
    PyTorch's version and which timing devices it can use."""
    return {
        "status": "ok",
        "torch": torch.__version__,
        "devices": {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()},
    }


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args == ["--serve"]:
        return serve()
    job_path = Path(args[0])
    (job_path.parent / "worker.pid").write_text(str(os.getpid()))  # for operators (and tests)
    data = json.loads(job_path.read_text(encoding="utf-8"))
    if data.get("probe"):
        report(args[1], probe())
        return 0
    if "lockstep" in data:
        return _pair(data, args[1], job_path.parent)
    if (data.get("spec") or {}).get("command") is not None:
        return _command(Job.from_json(data), args[1], job_path.parent)
    partial = Partial()
    try:
        execute(Job.from_json(data), partial)
        code = 0
    except Exception as e:  # every failure is reported to the parent, which records it
        partial.note(**failure(e))
        code = 3
    result = _slowed([partial.result])[0]
    # the worker's own measure of its device time: from this process's start to its result
    result = replace(result, timings={**result.timings, "device_s": time.monotonic() - _T0})
    report(args[1], result.to_json())
    return code


def _slowed(results: list[WorkerResult]) -> list[WorkerResult]:
    """A test knob (never for a preregistered study): this process as on a machine that many times
    slower (it sleeps once), each result's env naming the factor."""
    factor = slowdown()
    if factor <= 1.0:
        return results
    time.sleep((factor - 1.0) * (time.monotonic() - _T0))
    return [replace(r, env={**(r.env or {}), "test_slowdown": factor}) for r in results]


def _with_evidence(result: WorkerResult, text: str | None) -> dict[str, object]:
    """A command run's result with its evidence's text, which the runner keeps beside the record."""
    from harness.execute.commands import EVIDENCE_TEXT

    return {**result.to_json(), **({EVIDENCE_TEXT: text} if text is not None else {})}


def _command(job: Job, where: str, work: Path) -> int:
    """A command arm's run (:mod:`harness.execute.commands`): the program runs in a process of its
    own, in this folder's copy of the study (the node's, under Ray)."""
    from harness.execute.commands import run_command

    result, text = run_command(job, work, Path.cwd())
    result = replace(result, timings={**result.timings, "device_s": time.monotonic() - _T0})
    report(where, _with_evidence(result, text))
    return 0 if result.status == "ok" else 3


def _pair(data: Mapping[str, object], where: str, work: Path) -> int:
    """A lockstep pair (:mod:`harness.execute.lockstep`, or :mod:`harness.execute.commands` for two
    command arms): both arms' results, and this process's device seconds, which the parent splits
    between them (:func:`harness.execute.grouping.split`)."""
    from harness.execute.lockstep import LockstepJob, PairFailed, execute_pair

    job = LockstepJob.from_json(data)
    if job.jobs[0].spec.command is not None:
        from harness.execute.commands import run_pair

        ran = run_pair(job.jobs, work, Path.cwd())
        ok = all(r.status == "ok" for r, _ in ran)
        report(
            where,
            {
                "status": "ok" if ok else "failed",
                "lockstep": [_with_evidence(r, t) for r, t in ran],
                "timings": {"device_s": time.monotonic() - _T0},
            },
        )
        return 0 if ok else 3
    partials = (Partial(), Partial())
    try:
        execute_pair(job, partials)
        code = 0
    except PairFailed:  # both partials say why
        code = 3
    results = _slowed([p.result for p in partials])
    ok = code == 0 and all(r.status == "ok" for r in results)
    report(
        where,
        {
            "status": "ok" if ok else "failed",
            "lockstep": [r.to_json() for r in results],
            "timings": {"device_s": time.monotonic() - _T0},
        },
    )
    return code


def report(where: str, result: Mapping[str, object]) -> None:
    """Hand the result to the parent: ``fd:N`` is the pipe it gave this process (one ASCII line of
    JSON, never a file another process could read first); otherwise a file path (for operators)."""
    data = json.dumps(jsonable(result), sort_keys=True, separators=(",", ":"), allow_nan=False).encode(
        "ascii"
    )
    if where.startswith("fd:"):
        fd = int(where[3:])
        view = memoryview(data + b"\n")
        while view:
            view = view[os.write(fd, view) :]
        os.close(fd)
    else:
        atomic_write(Path(where), data, overwrite=True)


if __name__ == "__main__":
    sys.exit(main())

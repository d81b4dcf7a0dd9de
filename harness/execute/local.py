"""The local executor: every unit on this machine's device, one run at a time.

Claims: a unit is claimed with a file lock under ``runs/<id>/locks``; a second runner on the same
folder skips claimed units, so no run executes twice. Timed runs also take a per-host device lock,
so two runners never time runs on one device at once. Whoever holds the device lock first ends any
live worker an earlier runner left on that device (``runs/locks/device-<host>-<device>.json`` names
it), so nothing else runs there while a run is timed; workers also die with their runner
(:mod:`harness.execute.worker` sets ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from harness.execute.base import STOPS, RunContext, RunnerPort, stop_name
from harness.execute.grouping import process_groups, process_job, split
from harness.execute.launchers import LAUNCHERS, Launcher, launch
from harness.ledger import describe
from prereg.files import atomic_write
from prereg.formats.record import RunSpec, canonical


class LocalExecutor:
    name = "local"

    def execute(self, runner: RunnerPort) -> None:
        launcher = LAUNCHERS[runner.context.proto.spec.launcher]()
        try:
            for claim in runner.claims():
                try:
                    for group in process_groups(claim.todo):
                        if not self._process(runner, launcher, group, claim.unit_attempt):
                            break  # the failure rule: the unit's further runs do not start
                    runner.context.echo(f"  {describe(runner.context.ledger.head())}")
                finally:
                    claim.release()
        finally:
            launcher.close()

    @staticmethod
    def _process(runner: RunnerPort, launcher: Launcher, group: list[RunSpec], unit_attempt: int) -> bool:
        """One worker process: its runs' attempts, started entries, the process, their records.
        False when a run failed and the failure rule (:mod:`prereg.failstop`) stops the study."""
        ctx = runner.context
        attempts = [runner.next_attempt(spec) for spec in group]
        for spec, attempt in zip(group, attempts):
            runner.announce(spec, attempt)
        spec = group[0]
        name = " + ".join(s.run_id for s in group)
        locks = ctx.root / "runs" / "locks"
        device_lock = FileLock(str(locks / f"device-{ctx.host}-{spec.device}.lock"))
        with device_lock:
            held = locks / f"device-{ctx.host}-{spec.device}.json"
            end_orphans(held, ctx.echo)
            launcher.start(ctx.root, ctx.env)  # a fork server's start-up is outside the run
            work = ctx.dir / "work" / f"{spec.run_id if len(group) == 1 else spec.unit}.a{attempts[0]}"
            atomic_write(
                held,
                canonical(
                    {"runner": os.getpid(), "work": str(work), "launcher": getattr(launcher, "pid", None)}
                ),
                overwrite=True,
            )
            t0 = time.monotonic()
            beat = _heartbeat(ctx, name, work, t0, spec.command is not None)

            try:  # from the first started entry: a stop anywhere after it is recorded now
                for s, a in zip(group, attempts):
                    runner.started(s, a, unit_attempt=unit_attempt)
                job = process_job([runner.job(s, a) for s, a in zip(group, attempts)])
                outcome = launch(launcher, job, work, ctx.root, ctx.env, beat)
            except STOPS as e:  # Ctrl-C or SIGTERM: charged what it ran, recorded now
                runner.stopped(group, attempts, time.monotonic() - t0, stop_name(e))
                raise
        failed = False
        for s, a, out in zip(group, attempts, split(outcome, group)):
            rec = runner.finished(s, a, out)
            who = f"{s.run_id}: " if len(group) > 1 else ""
            ctx.echo(f"  {who}{rec.status} ({ctx.progress.executed_s[-1]:.1f} s)")
            if rec.status != "ok":
                ctx.echo(failure_lines(rec.reason, work, ctx.root))
                failed = failed or rec.status == "failed"
        return not (failed and runner.failure_stops())


def _heartbeat(context: RunContext, name: str, work: Path, t0: float, command: bool) -> Callable[[], None]:
    """The launcher's beat (each second): the live line with the run's time, and, for a command arm
    whose reporter files stop growing, STALLED on it (:class:`harness.execute.state.StallWatch`),
    said once as a line of its own too, so a log without the live line shows it."""
    from harness.execute.state import StallWatch, first_step_limit

    watch = StallWatch(first_step_limit(list(context.progress.executed_s))) if command else None
    said: list[bool] = []

    def beat() -> None:
        elapsed = time.monotonic() - t0
        stalled = None
        if watch is not None:
            size = sum(p.stat().st_size for p in work.glob("*.report.jsonl")) if work.is_dir() else 0
            stalled = watch.see(elapsed, size)
        if stalled and not said:
            said.append(True)
            context.echo(f"  {name}: {stalled}; its timeout_s still ends it (harness status shows it)")
        if context.live:
            context.echo(f"\r  running {name} {elapsed:6.1f}s" + (f"  {stalled}" if stalled else ""))

    return beat


def failure_lines(reason: str | None, work: Path, root: Path) -> str:
    """What a user needs to see of a failed run at once: its whole reason and where its logs are
    (the worker's log, a command's output), relative to the study's root."""
    logs = sorted(work.rglob("*.log")) if work.is_dir() else []
    where = [p.relative_to(root).as_posix() if p.is_relative_to(root) else str(p) for p in logs]
    lines = [f"    reason: {reason or '(none recorded)'}"]
    lines += [f"    log: {w}" for w in where] or [f"    work folder: {work}"]
    return "\n".join(lines)


def _alive_worker(pid: int) -> bool:
    """Whether ``pid`` is a live harness worker (or fork server) process, not a reused number."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return b"harness.execute.worker" in cmd and state != "Z"


def end_orphans(held: Path, echo: Callable[[str], None]) -> None:
    """End a live worker (and fork server) of an earlier runner on this device, named by ``held``,
    and wait until it is gone, before anything is timed here. Linux (``/proc``); elsewhere a no-op."""
    try:
        info = json.loads(held.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if info.get("runner") == os.getpid():
        return
    pids = [info.get("launcher")]
    try:
        pids.append(int((Path(info["work"]) / "worker.pid").read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for pid in [p for p in pids if isinstance(p, int) and p > 0 and p != os.getpid()]:
        if not _alive_worker(pid):
            continue
        echo(
            f"ending a live worker (pid {pid}) left on this device by an earlier runner (pid {info.get('runner')}) "
            "before timing anything"
        )
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        deadline = time.monotonic() + 30.0
        while _alive_worker(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

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

from harness.execute.base import RunnerPort
from harness.execute.launchers import LAUNCHERS, launch
from harness.files import atomic_write
from harness.ledger import describe
from harness.records import RunSpec, canonical


class LocalExecutor:
    name = "local"

    def execute(self, runner: RunnerPort) -> None:
        launcher = LAUNCHERS[runner.proto.launcher]()
        try:
            for claim in runner.claims():
                try:
                    for spec in claim.todo:
                        attempt = runner.next_attempt(spec)
                        runner.announce(spec, attempt)
                        locks = runner.root / "runs" / "locks"
                        device_lock = FileLock(str(locks / f"device-{runner.host}-{spec.device}.lock"))
                        with device_lock:
                            held = locks / f"device-{runner.host}-{spec.device}.json"
                            end_orphans(held, runner.echo)
                            launcher.start(
                                runner.root, runner.env
                            )  # a fork server's start-up is outside the run
                            work = runner.dir / "work" / f"{spec.run_id}.a{attempt}"
                            atomic_write(
                                held,
                                canonical(
                                    {
                                        "runner": os.getpid(),
                                        "work": str(work),
                                        "launcher": getattr(launcher, "pid", None),
                                    }
                                ),
                                overwrite=True,
                            )
                            runner.started(spec, attempt, unit_attempt=claim.unit_attempt)
                            t0 = time.monotonic()

                            def beat(spec: RunSpec = spec, t0: float = t0) -> None:
                                if runner.live:
                                    runner.echo(f"\r  running {spec.run_id} {time.monotonic() - t0:6.1f}s")

                            outcome = launch(
                                launcher,
                                runner.job(spec, attempt).to_json(),
                                work,
                                runner.root,
                                runner.env,
                                beat,
                            )
                        status = runner.finished(spec, attempt, outcome)
                        runner.echo(f"  {status} ({runner.progress.executed_s[-1]:.1f} s)")
                    runner.echo(f"  {describe(runner.ledger.head())}")
                finally:
                    claim.release()
        finally:
            launcher.close()


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

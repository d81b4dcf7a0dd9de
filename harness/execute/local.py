"""The local executor: every unit on this machine's device, one run at a time.

Claims: a unit is claimed with a file lock under ``runs/<id>/locks``; a second runner on the same
folder skips claimed units, so no run executes twice. Timed runs also take a per-host device lock,
so two runners never time runs on one device at once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout

from harness.execute.launchers import LAUNCHERS, launch
from harness.ledger import describe
from harness.plan import units

if TYPE_CHECKING:
    from harness.execute.runner import Runner


class LocalExecutor:
    name = "local"

    def execute(self, runner: Runner) -> None:
        from harness.execute.runner import HEARTBEAT_S
        from harness.execute.state import run_states

        proto = runner.proto
        launcher = LAUNCHERS[proto.launcher]()
        try:
            for unit in units(runner.runs):
                lock = FileLock(str(runner.dir / "locks" / f"{unit[0].unit}.lock"))
                try:
                    lock.acquire(timeout=0)
                except Timeout:
                    continue  # another runner holds this unit
                try:
                    states = run_states(proto)
                    todo = runner._todo(unit, states)
                    runner.progress.done = sum(len(u) - len(runner._todo(u, states)) for u in units(runner.runs))
                    if not todo:
                        continue
                    if not runner.budget_allows(unit, todo, states):
                        break
                    for spec in todo:
                        attempt = runner.next_attempt(spec, states)
                        runner.announce(spec, attempt)
                        device_lock = FileLock(str(runner.root / "runs" / "locks" / f"device-{runner.host}-{spec.device}.lock"))
                        with device_lock:
                            runner.started(spec, attempt)
                            t0 = last = time.monotonic()

                            def beat(spec=spec, attempt=attempt, t0=t0) -> None:
                                nonlocal last
                                if time.monotonic() - last >= HEARTBEAT_S:
                                    runner.beat(spec, attempt)
                                    last = time.monotonic()
                                if runner.live:
                                    runner.echo(f"\r  running {spec.run_id} {time.monotonic() - t0:6.1f}s")

                            outcome = launch(launcher, runner.job(spec, attempt), runner.dir / "work" / f"{spec.run_id}.a{attempt}",
                                             runner.root, runner.env, beat)
                        status = runner.finished(spec, attempt, outcome)
                        runner.progress.done += 1
                        runner.echo(f"  {status} ({runner.progress.executed_s[-1]:.1f} s)")
                    runner.echo(f"  {describe(runner.ledger.head())}")
                finally:
                    lock.release()
        finally:
            launcher.close()

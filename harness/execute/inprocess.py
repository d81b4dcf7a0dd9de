"""The in-process executor, for tests and debugging: each run's worker code in the runner's own process.

It implements the one :class:`~harness.execute.base.Executor` method as the local and Ray executors
do (claims from the runner, a started entry before each run, the outcome to
:meth:`Runner.finished`), so a test can drive the runner, the ledger and the records without
starting processes. The worker's result still crosses a JSON round trip, as it does on a pipe.
Not for studies, and ``harness run`` does not offer it: a study's runs each get a fresh process
(the protocol's ``launcher``), so that no run inherits another's allocator, caches or threads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from harness.execute.base import STOPS, RunnerPort, stop_name
from harness.execute.grouping import process_groups, process_job, split
from harness.execute.job import Job, JobFile, LockstepJob
from harness.execute.launchers import Outcome
from harness.execute.training import Partial
from prereg.formats.record import jsonable


class InProcessExecutor:
    """Each run's worker code in this process. ``train(job, partial)`` is the run itself (default:
    :func:`harness.execute.training.execute`); a test passes a fake trainer to drive the runner's
    state machine (claims, resume, budget, ledger, interruptions) in milliseconds per run."""

    name = "inprocess"

    def __init__(self, train: Callable[[Job, Partial], object] | None = None) -> None:
        self.train = train

    def execute(self, runner: RunnerPort) -> None:
        for claim in runner.claims():
            try:
                for group in process_groups(claim.todo):
                    attempts = [runner.next_attempt(spec) for spec in group]
                    for spec, attempt in zip(group, attempts):
                        runner.announce(spec, attempt)
                        runner.started(spec, attempt, unit_attempt=claim.unit_attempt)
                    jobs = [runner.job(s, a) for s, a in zip(group, attempts)]
                    t0 = time.monotonic()
                    try:
                        outcome = self._run(json.loads(json.dumps(process_job(jobs))))
                    except STOPS as e:  # as the local executor: recorded now, charged what it ran
                        runner.stopped(group, attempts, time.monotonic() - t0, stop_name(e))
                        raise
                    statuses = [
                        runner.finished(s, a, out).status
                        for s, a, out in zip(group, attempts, split(outcome, group))
                    ]
                    for status in statuses:
                        runner.context.echo(f"  {status}")
                    if "failed" in statuses and runner.failure_stops():
                        break  # the failure rule: the unit's further runs do not start
            finally:
                claim.release()

    def _run(self, data: JobFile) -> Outcome:
        """One worker process's work, here: its result as the worker would put it on its pipe."""
        from harness.execute.lockstep import PairFailed, execute_pair
        from harness.execute.training import execute, failure

        t0, wall0 = time.time(), time.monotonic()
        code = 0
        if "lockstep" in data:
            job = LockstepJob.from_json(data)
            partials = (Partial(), Partial())
            try:
                execute_pair(job, partials)
            except PairFailed:
                code = 3
            results = [p.result.to_json() for p in partials]
            ok = code == 0 and all(r["status"] == "ok" for r in results)
            raw: dict[str, Any] = {"status": "ok" if ok else "failed", "lockstep": results, "timings": {}}
        else:
            partial = Partial()
            try:
                (self.train or execute)(Job.from_json(data), partial)
            except Exception as e:  # as the worker process reports it
                partial.note(**failure(e))
                code = 3
            raw = partial.result.to_json()
        wall = time.monotonic() - wall0
        # the process's device seconds: its wall time here (a fake trainer may say its own)
        raw["timings"] = {"device_s": wall, **raw["timings"]}
        result = json.loads(json.dumps(jsonable(raw), allow_nan=False))
        return Outcome(code=code, result=result, wall_s=wall, started_at=t0, finished_at=time.time())

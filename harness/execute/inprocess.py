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
from dataclasses import replace

from harness.execute.base import RunnerPort
from harness.execute.job import Job
from harness.execute.launchers import Outcome
from harness.execute.training import Partial
from harness.records import jsonable


class InProcessExecutor:
    """Each run's worker code in this process. ``train(job, partial)`` is the run itself (default:
    :func:`harness.execute.training.execute`); a test passes a fake trainer to drive the runner's
    state machine (claims, resume, budget, ledger, interruptions) in milliseconds per run."""

    name = "inprocess"

    def __init__(self, train: Callable[[Job, Partial], object] | None = None) -> None:
        self.train = train

    def execute(self, runner: RunnerPort) -> None:
        from harness.execute.training import execute, failure

        run_job = self.train or execute

        for claim in runner.claims():
            try:
                for spec in claim.todo:
                    attempt = runner.next_attempt(spec)
                    runner.announce(spec, attempt)
                    runner.started(spec, attempt, unit_attempt=claim.unit_attempt)
                    job = Job.from_json(json.loads(json.dumps(runner.job(spec, attempt).to_json())))
                    t0, wall0 = time.time(), time.monotonic()
                    partial = Partial()
                    code = 0
                    try:
                        run_job(job, partial)
                    except Exception as e:  # as the worker process reports it
                        partial.note(**failure(e))
                        code = 3
                    wall = time.monotonic() - wall0
                    # the process's device seconds: its wall time here (a fake trainer may say its own)
                    timings = {"device_s": wall, **partial.result.timings}
                    result = replace(partial.result, timings=timings)
                    data = json.loads(json.dumps(jsonable(result.to_json()), allow_nan=False))
                    outcome = Outcome(
                        code=code, result=data, wall_s=wall, started_at=t0, finished_at=time.time()
                    )
                    runner.echo(f"  {runner.finished(spec, attempt, outcome)}")
            finally:
                claim.release()

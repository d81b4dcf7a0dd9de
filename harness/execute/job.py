"""The job: what the runner hands one worker process, typed on both sides of the JSON file.

The runner builds a :class:`Job` (:meth:`harness.execute.runner.Runner.job`); it crosses the
process boundary (and a Ray node's) as JSON, :meth:`Job.to_json` then :meth:`Job.from_json`, which
refuses a job of another format or with fields it does not know, naming them.

Format log (``format``): 1: ``spec`` (a :class:`~prereg.records.RunSpec`), ``attempt``,
``config_path`` (relative to the study's root), ``data_dir``, ``corpus`` (a local corpus's pinned
files, or ``None`` for a named corpus) and ``checkpoint_path``. A lockstep pair's job
(:class:`LockstepJob`) is ``lockstep``: its two arms' jobs, in build order.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from prereg.jsonfields import exact_fields
from prereg.records import RunSpec

JOB_FORMAT = 1


class JobFormatError(ValueError):
    """A job file this worker cannot read (another format, unknown or missing fields)."""


@dataclass(frozen=True)
class Job:
    """One attempt of one run, as a worker needs it."""

    spec: RunSpec
    attempt: int
    config_path: str
    data_dir: str | None
    corpus: dict[str, Any] | None
    checkpoint_path: str

    def to_json(self) -> dict[str, Any]:
        return {
            "format": JOB_FORMAT,
            "spec": self.spec.to_json(),
            "attempt": self.attempt,
            "config_path": self.config_path,
            "data_dir": self.data_dir,
            "corpus": self.corpus,
            "checkpoint_path": self.checkpoint_path,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        if data.get("format") != JOB_FORMAT:
            raise JobFormatError(f"job format {data.get('format')!r}; this worker reads format {JOB_FORMAT}")
        exact_fields("job", set(data) - {"format"}, {f.name for f in fields(cls)}, JobFormatError)
        spec = RunSpec.from_json(data["spec"], "job spec", JobFormatError)
        return cls(
            spec=spec,
            attempt=int(data["attempt"]),
            config_path=str(data["config_path"]),
            data_dir=data["data_dir"],
            corpus=data["corpus"],
            checkpoint_path=str(data["checkpoint_path"]),
        )


@dataclass(frozen=True)
class LockstepJob:
    """Both arms of one lockstep pair, as the worker needs them: each arm's :class:`Job`, in build
    order (plan order)."""

    jobs: tuple[Job, Job]

    def to_json(self) -> dict[str, Any]:
        return {"format": JOB_FORMAT, "lockstep": [j.to_json() for j in self.jobs]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LockstepJob:
        if data.get("format") != JOB_FORMAT:
            raise JobFormatError(f"job format {data.get('format')!r}; this worker reads format {JOB_FORMAT}")
        exact_fields("lockstep job", set(data) - {"format"}, {"lockstep"}, JobFormatError)
        jobs = data["lockstep"]
        if not isinstance(jobs, list) or len(jobs) != 2:
            raise JobFormatError("a lockstep job holds exactly two jobs, one per arm")
        a, b = (Job.from_json(j) for j in jobs)
        pair_problem(a.spec, b.spec)
        return cls((a, b))


def pair_problem(a: RunSpec, b: RunSpec) -> None:
    """Refuse two specs that are not one lockstep pair (JobFormatError, naming what differs)."""
    problems = []
    if not (a.lockstep and b.lockstep):
        problems.append("both runs must be lockstep runs (block_steps set)")
    elif a.partner != b.run_id or b.partner != a.run_id:
        problems.append(f"{a.run_id} and {b.run_id} do not name each other as partners")
    elif (a.unit, a.seed, a.steps, a.block_steps, a.device, a.threads) != (
        b.unit,
        b.seed,
        b.steps,
        b.block_steps,
        b.device,
        b.threads,
    ):
        problems.append("the two runs differ in unit, seed, steps, block_steps, device or threads")
    elif [a.steps_first, b.steps_first].count(True) != 1:
        problems.append("exactly one of the two runs takes the first block (steps_first)")
    elif (a.position, b.position) != (0, 1):
        problems.append("the runs are listed in build order: position 0, then 1")
    if problems:
        raise JobFormatError(f"lockstep job: {'; '.join(problems)}")

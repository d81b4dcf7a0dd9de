"""The job: what the runner hands one worker process, typed on both sides of the JSON file.

The runner builds a :class:`Job` (:meth:`harness.execute.runner.Runner.job`); it crosses the
process boundary (and a Ray node's) as JSON, :meth:`Job.to_json` then :meth:`Job.from_json`, which
refuses a job of another format or with fields it does not know, naming them.

Format log (``format``): 1: ``spec`` (a :class:`~prereg.formats.record.RunSpec`), ``attempt``,
``config_path`` (relative to the study's root), ``data_dir``, ``corpus`` (a local corpus's pinned
files, or ``None`` for a named corpus) and ``checkpoint_path``. A lockstep pair's job
(:class:`LockstepJob`) is ``lockstep``: its two arms' jobs, in build order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypedDict, Union, cast

from prereg.formats.jsonfields import exact_fields
from prereg.formats.record import RunSpec

if TYPE_CHECKING:
    from prereg.protocol.schema import CorpusFiles

JOB_FORMAT = 1


class SingleJobFile(TypedDict):
    """One run's job file (:meth:`Job.to_json`)."""

    format: int
    spec: dict[str, Any]  # RunSpec.to_json's object
    attempt: int
    config_path: str
    data_dir: str | None
    corpus: CorpusFiles | None
    checkpoint_path: str


class LockstepJobFile(TypedDict):
    """A lockstep pair's job file (:meth:`LockstepJob.to_json`)."""

    format: int
    lockstep: list[SingleJobFile]


#: A worker process's job file: a run's, or a lockstep pair's.
JobFile = Union[SingleJobFile, LockstepJobFile]


class JobFormatError(ValueError):
    """A job file this worker cannot read (another format, unknown or missing fields)."""


@dataclass(frozen=True)
class Job:
    """One attempt of one run, as a worker needs it."""

    spec: RunSpec
    attempt: int
    config_path: str
    data_dir: str | None
    corpus: CorpusFiles | None
    checkpoint_path: str

    def to_json(self) -> SingleJobFile:
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
    def from_json(cls, data: Mapping[str, object]) -> Job:
        if data.get("format") != JOB_FORMAT:
            raise JobFormatError(f"job format {data.get('format')!r}; this worker reads format {JOB_FORMAT}")
        exact_fields("job", set(data) - {"format"}, {f.name for f in fields(cls)}, JobFormatError)
        spec = RunSpec.from_json(data["spec"], "job spec", JobFormatError)
        attempt, data_dir, corpus = data["attempt"], data["data_dir"], data["corpus"]
        if not isinstance(attempt, int) or not isinstance(data_dir, (str, type(None))):
            raise JobFormatError("job: attempt is not an integer or data_dir not a string or null")
        if not isinstance(corpus, (dict, type(None))):
            raise JobFormatError("job: corpus is not a JSON object or null")
        return cls(
            spec=spec,
            attempt=attempt,
            config_path=str(data["config_path"]),
            data_dir=data_dir,
            corpus=cast("CorpusFiles | None", corpus),  # its files are verified when it loads
            checkpoint_path=str(data["checkpoint_path"]),
        )


@dataclass(frozen=True)
class LockstepJob:
    """Both arms of one lockstep pair, as the worker needs them: each arm's :class:`Job`, in build
    order (plan order)."""

    jobs: tuple[Job, Job]

    def to_json(self) -> LockstepJobFile:
        return {"format": JOB_FORMAT, "lockstep": [j.to_json() for j in self.jobs]}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> LockstepJob:
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

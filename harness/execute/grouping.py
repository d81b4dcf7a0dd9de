"""What one worker process runs: one run, or both arms of a lockstep pair (``design: lockstep``).

Every executor launches a claim's runs in these groups (:func:`process_groups`): each run of a
paired or factorial unit in a process of its own; a lockstep pair's two runs together, in one
process (:class:`~harness.execute.job.LockstepJob`). Each run still has its own attempt, started
entry and record: the executor appends both started entries before the pair's process starts, and
:func:`split` turns the process's one outcome into each arm's, so a process that dies leaves both
arms' attempts recorded.

Device seconds: the pair's process reports its own, from its start to its result; each arm is
charged half (``device_s_source`` says so), so the budget rule sums to the process's time.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from harness.execute.job import Job, JobFile, LockstepJob
from harness.execute.launchers import Outcome
from prereg.formats.record import RunSpec

__all__ = ["process_groups", "process_job", "split"]


def process_groups(todo: list[RunSpec]) -> list[list[RunSpec]]:
    """``todo`` in the groups that each run in one process, in plan order: a lockstep unit's runs
    together (its claim always holds the whole unit), every other run alone."""
    groups: list[list[RunSpec]] = []
    for s in todo:
        if s.lockstep and groups and groups[-1][0].unit == s.unit:
            groups[-1].append(s)
        else:
            groups.append([s])
    for g in groups:
        if g[0].lockstep and len(g) != 2:
            raise ValueError(f"lockstep unit {g[0].unit}: its two runs must run together, got {len(g)}")
    return groups


def process_job(jobs: list[Job]) -> JobFile:
    """The job file of one process: the run's job, or a lockstep pair's."""
    if len(jobs) == 1:
        return jobs[0].to_json()
    a, b = jobs
    return LockstepJob((a, b)).to_json()


def split(outcome: Outcome, group: list[RunSpec]) -> list[Outcome]:
    """Each run's outcome from its process's: the run's own when it ran alone; for a lockstep pair,
    each arm's result with half the process's device seconds (and half its wall time, for a process
    that died before it could say)."""
    if len(group) == 1:
        return [outcome]
    results = outcome.result.get("lockstep")
    own = (outcome.result.get("timings") or {}).get("device_s")
    out = []
    for i, _spec in enumerate(group):
        r: dict[str, Any] = {}
        if isinstance(results, list) and len(results) == len(group) and isinstance(results[i], dict):
            r = dict(results[i])
            if own is not None:
                r["timings"] = {
                    **(r.get("timings") or {}),
                    "device_s": float(own) / len(group),
                    "pair_device_s": float(own),
                }
        out.append(replace(outcome, result=r, wall_s=outcome.wall_s / len(group), share=len(group)))
    return out

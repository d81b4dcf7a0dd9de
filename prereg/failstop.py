"""The failure rule, in one place and with the standard library alone: ``harness run`` applies it
before each unit and after each failed run (:meth:`harness.execute.runner.Runner.failure_stops`),
and the summary and the audit (:func:`.attempts.completeness`) recompute from the records whether
it stopped a study.

The rule
--------
A run *failed early* when its record is ``failed``, holds no training step (no ``curve``) and its
worker was not killed from outside (a reason starting "worker killed by signal": the OOM killer, a
user's kill): it stopped by itself before it trained, as a script that cannot import a package does. An arm *fails
throughout* when it has records and every one of them failed early (one arm of one study, by its
name; a run that failed only because its pair's partner did, and an interrupted one, count
neither way). Once some arm fails throughout:

* a unit in progress runs no further run once the failure that makes the arm fail throughout is
  recorded (a paired design's second run, whose partner already failed the pair, does not start);
* no unit that has not started yet starts in that ``harness run``.

So when every run of an arm would fail the same way at start-up, the study stops after its first
unit instead of failing every planned run, and says what is missing (each reason, the logs). The
failed unit stays failed (final, as every failed unit; ``--retry-failed`` runs it again where
``max_attempts`` allows). Running the command again, after the fix, goes on with the next unit;
without the fix it stops again after that unit, the same way. A study whose records leave runs to
do while some arm fails throughout was *stopped by the failure rule*; one ok run of the arm ends
it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: one attempt as the rule reads it: (study, arm, run id, status, failed early, reason)
FailAttempt = tuple[str, str, str, str, bool, str]

#: How the runner's reason for a worker killed from outside begins (harness.execute.launchers).
KILLED = "worker killed by signal"
#: How a run failed only because its pair's partner did begins (harness.execute.lockstep, .commands):
#: such a failure says nothing of its own arm.
PARTNER = ("its lockstep partner ", "its partner ")


def failed_early(status: str, curve: object, reason: str | None) -> bool:
    """Whether an attempt failed by itself before its first training step."""
    return status == "failed" and not curve and not (reason or "").startswith(KILLED)


def attempt_of(record: Mapping[str, Any]) -> FailAttempt:
    """A record's JSON object as the rule reads it."""
    spec = record["spec"]
    return (
        str(spec["study"]),
        str(spec["arm"]),
        str(spec["run_id"]),
        str(record["status"]),
        failed_early(str(record["status"]), record.get("curve"), record.get("reason")),
        str(record.get("reason") or ""),
    )


def failing_arms(attempts: Sequence[FailAttempt]) -> list[tuple[str, str, list[FailAttempt]]]:
    """Each arm that fails throughout, as ``(study, arm, its attempts)``, in the order the attempts
    first name them; an interrupted attempt, and one that failed because its partner did, neither
    fails nor clears an arm."""
    by_arm: dict[tuple[str, str], list[FailAttempt]] = {}
    for a in attempts:
        if a[3] == "ok" or (a[3] == "failed" and not a[5].startswith(PARTNER)):
            by_arm.setdefault((a[0], a[1]), []).append(a)
    return [(study, arm, xs) for (study, arm), xs in by_arm.items() if all(x[4] for x in xs)]


def describe(failing: Sequence[tuple[str, str, list[FailAttempt]]]) -> str:
    """The failing arms and what their records say, once per distinct reason."""
    parts = []
    for study, arm, xs in failing:
        reasons = list(dict.fromkeys(x[5] or "(no reason recorded)" for x in xs))
        parts.append(f"study {study}, arm {arm}: {len(xs)} of {len(xs)} run(s) failed: " + "; ".join(reasons))
    return " | ".join(parts)


def stop_text(planned: int, missing: int, failing: Sequence[tuple[str, str, list[FailAttempt]]]) -> str:
    """The completeness line of a study the rule stopped (the summary states it, the audit checks it)."""
    return (
        f"STOPPED BY THE FAILURE RULE: {missing} of {planned} planned runs have no ok record; every run "
        f"of an arm failed before its first training step, so no further unit started ({describe(failing)})"
    )

"""A run's attempts as the study's ledger holds them: the started entry appended before its worker
starts, the record that ends it (from the worker's outcome; for a started entry that no record
ends, an interrupted attempt charged the ledger's time), the ledger's entries of given runs, and the
unit attempt a unit's runs belong to.

:class:`harness.execute.runner.Runner` appends what these build, in the order its module docstring
states.
"""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from harness import gitutil
from harness.execute.launchers import Outcome
from harness.freeze import Frozen
from harness.ledger import Ledger, now_iso
from harness.protocol import Protocol
from prereg.formats.record import (
    SCHEMA_VERSION,
    RecordFormatError,
    RunRecord,
    RunSpec,
    StartedEntry,
    WorkerResult,
)

__all__ = [
    "attempt_record",
    "interrupted_result",
    "outcome_result",
    "started_entry",
    "unit_attempt_of",
    "utc_stamp",
]


def unit_attempt_of(ledger: Ledger, unit: list[RunSpec], todo: list[RunSpec]) -> int:
    """The unit attempt the runs ``todo`` belong to: a new one when the whole unit runs (again),
    the current one when the rest of a unit is resumed.

    Parameters
    ----------
    ledger : Ledger
        The study's ledger.
    unit : list of RunSpec
        The unit's runs.
    todo : list of RunSpec
        Those of its runs about to execute.

    Returns
    -------
    int
        The unit attempt (1 for a unit's first).
    """
    recs, starts = ledger.entries_of({s.run_id for s in unit})
    current = max([0, *(r.unit_attempt for r in recs), *(e.unit_attempt for e in starts)])
    return current + 1 if len(todo) == len(unit) or current == 0 else current


def attempt_record(
    proto: Protocol,
    frozen: Frozen,
    plan_sha: str,
    spec: RunSpec,
    attempt: int,
    result: WorkerResult,
    **runner: Any,
) -> RunRecord:
    """The record of one attempt: the worker's ``result`` and the runner's fields.

    Parameters
    ----------
    proto : Protocol
        The study's protocol (its summary, and the repository whose commit the record names).
    frozen : Frozen
        What the protocol's tag froze (:func:`harness.freeze.check`).
    plan_sha : str
        The plan's sha256 (:func:`harness.plan.plan_sha256`).
    spec : RunSpec
        The run.
    attempt : int
        The attempt's number.
    result : WorkerResult
        The worker's result (or one the runner made for it).
    **runner
        ``unit_attempt``, ``start``, ``started_at``, ``finished_at``, ``node``.

    Returns
    -------
    RunRecord
        The record, ready for the ledger.
    """
    repo = gitutil.toplevel(proto.root)
    return RunRecord(
        **result.worker_fields(),
        **runner,
        schema_version=SCHEMA_VERSION,
        protocol={**proto.summary(), **frozen.as_dict()},
        plan_sha256=plan_sha,
        spec=spec,
        attempt=attempt,
        git={
            "commit": gitutil.head(repo) if repo else None,
            "dirty": gitutil.is_dirty(repo) if repo else None,
        },
    )


def interrupted_result(e: StartedEntry) -> WorkerResult:
    """The result of a started attempt that no record ends: interrupted, charged the ledger's time
    from its started entry to now (an upper bound: the worker never reported its own).

    Parameters
    ----------
    e : StartedEntry
        The attempt's started entry, sealed in the chain.

    Returns
    -------
    WorkerResult
        Status ``interrupted``, the reason naming where and when it started, and its device seconds.
    """
    link = e.ledger
    if link is None or "at" not in link:
        raise RecordFormatError(f"started entry {e.run_id} a{e.attempt} has no time in the chain (ledger.at)")
    t0 = datetime.fromisoformat(link["at"])
    now = datetime.now(timezone.utc)
    return WorkerResult(
        status="interrupted",
        reason=(
            f"attempt started at {e.started_at} on {e.node} (runner pid "
            f"{e.runner['pid']} on {e.runner['host']}) did not finish: the runner or machine "
            "stopped before the worker's outcome was recorded"
        ),
        timings={
            "device_s": max(0.0, (now - t0).total_seconds()),
            "device_s_source": (
                f"ledger: from its started entry (seq {link['seq']}, "
                f"{link['at']}) to this record, an upper bound (the worker "
                "never reported its own)"
            ),
        },
    )


def stopped_result(e: StartedEntry, seconds: float, signal_name: str, runs: int) -> WorkerResult:
    """The result of an attempt the runner stopped on a signal it caught (``signal_name``: SIGINT
    from Ctrl-C, SIGTERM): interrupted, charged the runner's own measure of its worker process's
    time, from the process's start to the stop, shared equally among the ``runs`` it held (a
    lockstep pair's two). So a resume, however much later, charges nothing for the pause.

    Parameters
    ----------
    e : StartedEntry
        The attempt's started entry, sealed in the chain.
    seconds : float
        The worker process's time until the stop (the runner's monotonic clock).
    signal_name : str
        ``SIGINT`` or ``SIGTERM``.
    runs : int
        How many runs the process held.

    Returns
    -------
    WorkerResult
        Status ``interrupted``, the reason naming the signal, and its device seconds.
    """
    share = max(0.0, seconds) / max(1, runs)
    held = f", shared by the {runs} runs it held" if runs > 1 else ""
    return WorkerResult(
        status="interrupted",
        reason=(
            f"attempt started at {e.started_at} on {e.node} was stopped by {signal_name} after "
            f"{seconds:.1f} s (runner pid {e.runner['pid']} on {e.runner['host']}); it runs again "
            "when the study resumes"
        ),
        timings={
            "device_s": share,
            "device_s_source": f"runner: its worker process's time from start to the {signal_name} stop{held}",
        },
    )


def started_entry(
    proto: Protocol,
    frozen: Frozen,
    spec: RunSpec,
    attempt: int,
    *,
    node: str,
    unit_attempt: int,
    host: str,
) -> StartedEntry:
    """The started entry of an attempt whose process is about to start.

    Parameters
    ----------
    proto : Protocol
        The study's protocol.
    frozen : Frozen
        What the protocol's tag froze.
    spec : RunSpec
        The run.
    attempt : int
        The attempt's number.
    node : str
        The machine the run starts on.
    unit_attempt : int
        The unit attempt it belongs to.
    host : str
        The runner's host (with this process's pid, the runner it names).

    Returns
    -------
    StartedEntry
        The entry, for :meth:`harness.ledger.Ledger.append_started`.
    """
    return StartedEntry(
        schema_version=SCHEMA_VERSION,
        kind="started",
        protocol={"id": proto.spec.id, "sha256": proto.sha256, "freeze_sha256": frozen.freeze_sha256},
        run_id=spec.run_id,
        unit=spec.unit,
        attempt=attempt,
        unit_attempt=unit_attempt,
        node=node,
        runner={"host": host, "pid": os.getpid(), **machine_witness()},
        started_at=now_iso(),
    )


def machine_witness() -> dict[str, str]:
    """What tells this machine from another beside its hostname (which ``unshare --uts`` changes at
    will): the kernel's boot id (``/proc/sys/kernel/random/boot_id``, new at every boot, the same in
    every UTS namespace) and the CPU model (``/proc/cpuinfo``); each left out where unreadable."""
    out = {}
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            out["boot_id"] = f.read(64).strip()
    except (OSError, UnicodeDecodeError):
        pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f.read(1 << 16).splitlines():
                if line.startswith("model name"):
                    out["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return out


def outcome_result(outcome: Outcome) -> tuple[WorkerResult, float]:
    """A run's outcome as its record's result: the status and reason the outcome gives, the worker's
    fields (``failed``, naming the field, when its JSON is not one this runner reads) and the
    device seconds with their source.

    Parameters
    ----------
    outcome : Outcome
        What the launcher saw: exit code, the worker's JSON (:func:`harness.execute.worker.report`),
        times and log tail.

    Returns
    -------
    result : WorkerResult
        The result the record holds.
    device_s : float
        Its device seconds (the worker's own, or the launcher's wall time when it died).
    """
    status, reason = outcome.status_reason()
    try:  # the worker's JSON (harness.execute.worker.report)
        result = (
            WorkerResult.from_json(outcome.result)
            if outcome.result
            else WorkerResult(status=status, log_tail=outcome.log_tail)
        )
    except RecordFormatError as e:
        status, reason = "failed", f"the worker's result is not one this runner reads: {e}"
        result = WorkerResult(status=status, log_tail=outcome.log_tail)
    device_s, source = outcome.device_s()
    timings = {
        **result.timings,
        "device_s": device_s,
        "device_s_source": source,
        "launcher_wall_s": outcome.wall_s * outcome.share,  # the process's, for a lockstep arm too
    }
    return replace(result, status=status, reason=reason, timings=timings), device_s


def utc_stamp(t: float) -> str:
    """A POSIX time as an ISO 8601 UTC timestamp in milliseconds (a record's ``started_at``).

    Parameters
    ----------
    t : float
        Seconds since the epoch.

    Returns
    -------
    str
        For example ``2024-05-01T12:00:00.000+00:00``.
    """
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")

"""Run states read from the records: each run's attempts and outcome, progress with an ETA, and
the status table ``harness status`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.plan import make_plan
from harness.protocol import Protocol
from harness.records import RunRecord, load_records, load_started, open_attempts


@dataclass
class RunState:
    ok: bool = False
    failed: bool = False
    attempts: int = 0
    device_s: float = 0.0
    ok_device_s: float = 0.0
    last: str | None = None  # status of the latest attempt
    tries: int = 0  # attempts that ended (ok or failed); interrupted ones are resumed, not retried


@dataclass
class Progress:
    total: int
    done: int = 0
    executed_s: list[float] = field(default_factory=list)

    def eta(self) -> str:
        if not self.executed_s:
            return "?"
        left = (self.total - self.done) * (sum(self.executed_s) / len(self.executed_s))
        m, s = divmod(int(left), 60)
        return f"{m}m{s:02d}s"


def run_states(proto: Protocol) -> dict[str, RunState]:
    states: dict[str, RunState] = {}
    for rec in load_records(proto.records_path):
        st = states.setdefault(rec.spec.run_id, RunState())
        if rec.attempt >= st.attempts:
            st.last = rec.status
        st.attempts = max(st.attempts, rec.attempt)
        st.tries += rec.status in ("ok", "failed")
        st.device_s += rec.timings.get("device_s") or 0.0
        if rec.status == "ok":
            st.ok = True
            st.ok_device_s = rec.timings.get("device_s") or 0.0
        elif rec.status == "failed":
            st.failed = True
    return states


def _claimed(proto: Protocol, unit: str) -> bool:
    """Whether a runner holds ``unit``'s claim now (its attempt may still be running)."""
    from filelock import FileLock, Timeout

    path = proto.runs_path / "locks" / f"{unit}.lock"
    if not path.exists():
        return False
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    lock.release()
    return False


def unfinished(proto: Protocol) -> list[dict[str, Any]]:
    """Attempts whose started entry no record ends: ``running`` while a runner holds the unit's
    claim, otherwise interrupted (recorded as such when the study resumes)."""
    return [
        {
            "run_id": e["run_id"],
            "attempt": e["attempt"],
            "started_at": e["started_at"],
            "node": e["node"],
            "seq": e["ledger"]["seq"],
            "running": _claimed(proto, e["unit"]),
        }
        for e in open_attempts(load_records(proto.records_path), load_started(proto.records_path))
    ]


def status_table(proto: Protocol) -> tuple[list[dict[str, Any]], float]:
    """Per (study, configuration): done, failed, interrupted (recorded, and started with no ending)
    and pending runs, superseded attempts (of a unit that ran again whole); device seconds spent."""
    runs = make_plan(proto)
    recs = load_records(proto.records_path)
    unended: dict[str, int] = {}
    for e in unfinished(proto):
        unended[e["run_id"]] = unended.get(e["run_id"], 0) + (not e["running"])
    latest: dict[str, int] = {}
    for r in recs:
        unit = r.spec.unit
        latest[unit] = max(latest.get(unit, 1), r.unit_attempt)
    by_run: dict[str, list[RunRecord]] = {}
    for r in recs:
        by_run.setdefault(r.spec.run_id, []).append(r)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for spec in runs:
        row = rows.setdefault(
            (spec.study, spec.config),
            {
                "study": spec.study,
                "config": spec.config,
                "runs": 0,
                "done": 0,
                "failed": 0,
                "interrupted_attempts": 0,
                "pending": 0,
                "superseded_attempts": 0,
            },
        )
        row["runs"] += 1
        rs = by_run.get(spec.run_id, [])
        row["interrupted_attempts"] += sum(1 for r in rs if r.status == "interrupted") + unended.get(
            spec.run_id, 0
        )
        row["superseded_attempts"] += sum(1 for r in rs if r.unit_attempt < latest.get(spec.unit, 1))
        if any(r.status == "ok" for r in rs):
            row["done"] += 1
        elif any(r.status == "failed" for r in rs):
            row["failed"] += 1
        else:
            row["pending"] += 1
    spent = sum((r.timings.get("device_s") or 0.0) for r in recs)
    return list(rows.values()), spent

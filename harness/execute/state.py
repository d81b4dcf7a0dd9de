"""Run states read from the records: each run's attempts and outcome, progress with an ETA, and
the status table ``harness status`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.plan import make_plan
from harness.protocol import Protocol
from prereg.attempts import open_started
from prereg.budget import BudgetCheck
from prereg.formats.record import RunRecord, RunSpec, load_records, load_started

# the stall rule's one home (the report names stalls from the records with it)
from prereg.stalls import STALL_FLOOR_S as STALL_FLOOR_S
from prereg.stalls import STALL_RUN_TIMES as STALL_RUN_TIMES
from prereg.stalls import STALL_STEP_TIMES as STALL_STEP_TIMES
from prereg.stalls import first_step_limit as first_step_limit


@dataclass
class RunState:
    ok: bool = False
    failed: bool = False
    attempts: int = 0
    device_s: float = 0.0
    ok_device_s: float = 0.0
    last: str | None = None  # status of the latest attempt
    tries: int = 0  # attempts that ended (ok or failed); interrupted ones are resumed, not retried


@dataclass(frozen=True)
class RunEnd:
    """How :meth:`Runner.run` ended: the plan's runs, those still to do (no ok latest attempt and
    not final), those whose latest attempt failed, and whether the budget rule stopped it."""

    planned: int
    left: int
    failed: int
    stopped_for_budget: bool
    budget: BudgetCheck | None  # the rule's verdict on the unit it refused (or the last one it allowed)
    held_elsewhere: int = 0  # runs left in units whose claim another runner holds now
    stopped_at_look: dict[str, Any] | None = None  # the look where the sequential rule stopped the study
    # a replicated protocol's run (``--replicate K``): (K, count); planned and left are its runs only
    replicate: tuple[int, int] | None = None
    stopped_for_failure: str | None = None  # what the failure rule found (prereg/failstop.py), if it stopped


@dataclass
class Progress:
    """What the runner shows before each run: runs done and left, the device seconds of the budget
    spent and left, and the estimated time to the end (runs left x the mean device seconds per run,
    this runner's own runs first, else the study's ok runs)."""

    total: int
    done: int = 0
    executed_s: list[float] = field(default_factory=list)  # device seconds of this runner's runs
    spent: float | None = None  # device seconds of every attempt, as of the last claim and since
    budget_s: float | None = None
    mean_ok_s: float | None = None  # the budget rule's mean device seconds of the ok runs

    def note_budget(self, spent: float, budget: float, mean_ok_s: float | None) -> None:
        self.spent, self.budget_s, self.mean_ok_s = spent, budget, mean_ok_s

    def ran(self, device_s: float) -> None:
        self.executed_s.append(device_s)
        self.done += 1
        if self.spent is not None:
            self.spent += device_s

    def eta_s(self) -> float | None:
        per_run = sum(self.executed_s) / len(self.executed_s) if self.executed_s else self.mean_ok_s
        return None if not per_run else (self.total - self.done) * per_run

    def eta(self) -> str:
        left = self.eta_s()
        return "?" if left is None else _minutes(left)

    def line(self) -> str:
        """``26 done, 30 left; budget 120 of 720 s spent, 600 s left; ETA 2m05s``."""
        parts = [f"{self.done} done, {self.total - self.done} left"]
        if self.spent is not None and self.budget_s is not None:
            left = max(0.0, self.budget_s - self.spent)
            parts.append(f"budget {self.spent:.0f} of {self.budget_s:.0f} s spent, {left:.0f} s left")
        eta = self.eta_s()
        text = f"ETA {self.eta()}"
        if eta is not None and self.spent is not None and self.budget_s is not None:
            if eta > self.budget_s - self.spent:
                text += " (more than the budget has left: the budget rule may stop it)"
        parts.append(text)
        return "; ".join(parts)


def _minutes(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s"


def run_states(proto: Protocol, records: list[RunRecord] | None = None) -> dict[str, RunState]:
    """Each run's state from the study's records (``records``: already loaded ones)."""
    states: dict[str, RunState] = {}
    for rec in load_records(proto.records_path) if records is None else records:
        note_record(states, rec)
    return states


def note_record(states: dict[str, RunState], rec: RunRecord) -> None:
    """Update the states with one more record (records of a run come in attempt order)."""
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


def claimed(proto: Protocol, unit: str) -> bool:
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
    ended = {(r.spec.run_id, r.attempt) for r in load_records(proto.records_path)}
    started = [e.to_json() for e in load_started(proto.records_path)]
    return [
        {
            "run_id": e["run_id"],
            "attempt": e["attempt"],
            "started_at": e["started_at"],
            "node": e["node"],
            "seq": e["ledger"]["seq"],
            "running": claimed(proto, e["unit"]),
        }
        for e in open_started(ended, started)
    ]


def status_table(proto: Protocol) -> tuple[list[dict[str, Any]], float]:
    """Per (study, configuration): done, failed, interrupted (recorded, and started with no ending)
    and pending runs, superseded attempts (of a unit that ran again whole); device seconds spent.
    A lockstep run whose partner has no ok record in their latest unit attempt is pending (the
    pair runs again whole)."""
    runs = make_plan(proto)
    recs = load_records(proto.records_path)
    unended: dict[str, int] = {}
    for e in unfinished(proto):
        unended[e["run_id"]] = unended.get(e["run_id"], 0) + (not e["running"])
    latest: dict[str, int] = {}
    by_run: dict[str, list[RunRecord]] = {}
    for r in recs:
        latest[r.spec.unit] = max(latest.get(r.spec.unit, 1), r.unit_attempt)
        by_run.setdefault(r.spec.run_id, []).append(r)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for spec in runs:
        row = rows.setdefault((spec.study, spec.config), _status_row(spec))
        rs = by_run.get(spec.run_id, [])
        last = latest.get(spec.unit, 1)
        row["runs"] += 1
        row["interrupted_attempts"] += sum(1 for r in rs if r.status == "interrupted") + unended.get(
            spec.run_id, 0
        )
        row["superseded_attempts"] += sum(1 for r in rs if r.unit_attempt < last)
        row[_run_state(spec, rs, by_run, last)] += 1
    spent = sum((r.timings.get("device_s") or 0.0) for r in recs)
    return list(rows.values()), spent


def _status_row(spec: RunSpec) -> dict[str, object]:
    """A (study, configuration)'s row of :func:`status_table`, every count 0."""
    counts = ("runs", "done", "failed", "interrupted_attempts", "pending", "superseded_attempts")
    return {"study": spec.study, "config": spec.config, **dict.fromkeys(counts, 0)}


def _run_state(spec: RunSpec, rs: list[RunRecord], by_run: dict[str, list[RunRecord]], latest: int) -> str:
    """A planned run's column: ``done`` (an ok record, and a lockstep partner's ok record in their
    latest unit attempt: a pair runs again whole unless both arms are ok), ``failed`` or ``pending``."""
    partner = by_run.get(spec.partner or "", []) if spec.lockstep else None
    partner_ok = partner is None or any(r.status == "ok" and r.unit_attempt == latest for r in partner)
    if any(r.status == "ok" for r in rs) and partner_ok:
        return "done"
    if any(r.status == "failed" for r in rs):
        return "failed"
    return "pending"


@dataclass
class StallWatch:
    """Whether a running command arm (or lockstep pair) has stalled, from its reporter files'
    growth (a line a step): no growth for longer than :data:`STALL_STEP_TIMES` times its step time
    (the mean time between growths so far) and :data:`STALL_FLOOR_S`; before the first step, for
    longer than ``first_step_s``. Fed each heartbeat (:meth:`see`); says nothing of the run's
    outcome (its ``timeout_s`` still ends it).

    A step time needs two beats that saw growth: after only one (the first steps came within one
    beat, as steps shorter than the beat do) the floor alone applies. The time from the run's start
    to that first growth (the worker's and the script's start-up) is no step time: taken as one, five
    of them (a minute on a busy machine) outlasted a stop the floor should have caught."""

    first_step_s: float
    size: int = 0
    first: float | None = None  # when the files first grew (seconds since the start)
    last: float = 0.0  # when they last grew
    growths: int = 0

    def see(self, elapsed: float, size: int) -> str | None:
        """The stall's description at ``elapsed`` seconds with the files at ``size`` bytes, or None."""
        if size != self.size:
            self.size, self.last, self.growths = size, elapsed, self.growths + 1
            self.first = elapsed if self.first is None else self.first
            return None
        quiet = elapsed - self.last
        if self.first is None:
            if elapsed <= self.first_step_s:
                return None
            return f"STALLED: no step in {elapsed:.0f} s (earlier runs took about {self.first_step_s / STALL_RUN_TIMES:.0f} s whole)"
        if self.growths < 2:  # one growth seen: its steps came within one beat, their time unknown
            return (
                None
                if quiet <= STALL_FLOOR_S
                else f"STALLED: no step for {quiet:.0f} s (after its first steps)"
            )
        step = (self.last - self.first) / (self.growths - 1)
        if quiet <= max(STALL_FLOOR_S, STALL_STEP_TIMES * step):
            return None
        return f"STALLED: no step for {quiet:.0f} s (a step took about {step:.2f} s)"

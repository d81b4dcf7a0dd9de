"""Work through a protocol's plan on one device: claims, worker processes, resume, budget.

* Claims: a unit (pair or block) is claimed with a file lock under ``runs/<id>/locks``; a second
  runner skips claimed units, so no run executes twice. Timed runs also take a per-host device
  lock, so two runners never time runs on one device at once.
* Attempts: before a worker starts, a marker ``runs/<id>/attempts/<run>.aN.json`` is written and
  touched every few seconds. A marker without a record for that attempt, found by a runner that
  holds the claim, is an interrupted attempt (the machine stopped, the runner was killed): it is
  recorded as ``interrupted`` and the run is executed again.
* Failures: a worker that fails or dies is recorded as ``failed`` with its reason; failed runs
  are not retried unless asked (``--retry-failed``).
* Budget: the inclusive device seconds of every attempt are in the records; no unit starts when
  the spent time plus the unit's expected time would exceed the protocol's budget.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from harness import freeze, gitutil
from harness.ledger import Ledger, describe
from harness.plan import RunSpec, make_plan, plan_sha256, units
from harness.protocol import Protocol
from harness.records import SCHEMA_VERSION, RunRecord, atomic_write, canonical, jsonable, load_records

HEARTBEAT_S = 5.0


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


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
        st = states.setdefault(rec["spec"]["run_id"], RunState())
        if rec["attempt"] >= st.attempts:
            st.last = rec["status"]
        st.attempts = max(st.attempts, rec["attempt"])
        st.tries += rec["status"] in ("ok", "failed")
        st.device_s += rec["timings"].get("device_s") or 0.0
        if rec["status"] == "ok":
            st.ok = True
            st.ok_device_s = rec["timings"].get("device_s") or 0.0
        elif rec["status"] == "failed":
            st.failed = True
    return states


def spent_seconds(proto: Protocol) -> float:
    return sum(s.device_s for s in run_states(proto).values())


class Runner:
    """Execute a protocol. ``echo`` receives progress lines (the CLI decides how to show them)."""

    def __init__(self, proto: Protocol, *, echo: Callable[[str], None], live: bool = False,
                 retry_failed: bool = False, allow_torch_mismatch: bool = False) -> None:
        self.proto = proto
        self.echo = echo
        self.live = live
        self.retry_failed = retry_failed
        self.allow_torch_mismatch = allow_torch_mismatch
        self.runs = make_plan(proto)
        self.plan_sha = plan_sha256(self.runs)
        self.root = proto.root
        self.dir = proto.runs_path
        self.records = proto.records_path
        self.host = socket.gethostname()
        self._server: ForkServer | None = None
        self.frozen = freeze.NOT_FROZEN
        self._ledger: Ledger | None = None

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            genesis = self.frozen.freeze_sha256 or self.proto.sha256
            self._ledger = Ledger(self.records, self.dir / "locks" / "ledger.lock", genesis, root=self.root,
                                  sources=[self.proto.path], protocol=self.proto.summary())
        return self._ledger

    # -- bookkeeping ---------------------------------------------------------------------
    def _marker(self, run_id: str, attempt: int) -> Path:
        return self.dir / "attempts" / f"{run_id}.a{attempt}.json"

    def _write_marker(self, spec: RunSpec, attempt: int) -> Path:
        path = self._marker(spec.run_id, attempt)
        data = {"run_id": spec.run_id, "attempt": attempt, "host": self.host, "pid": os.getpid(), "started_at": now_iso()}
        atomic_write(path, canonical(data), overwrite=True)
        return path

    def _base_record(self, spec: RunSpec, attempt: int) -> RunRecord:
        repo = gitutil.toplevel(self.root)
        protocol = {**self.proto.summary(), **self.frozen.as_dict()}
        return {
            "schema_version": SCHEMA_VERSION,
            "protocol": protocol,
            "plan_sha256": self.plan_sha,
            "spec": spec.as_dict(),
            "attempt": attempt,
            "git": {
                "commit": gitutil.head(repo) if repo else None,
                "dirty": gitutil.is_dirty(repo) if repo else None,
            },
        }

    def _write(self, record: RunRecord) -> None:
        self.ledger.append(record)

    def _note_interrupted(self, spec: RunSpec, attempts_done: int) -> int:
        """Record every attempt marker that has no record; return the next attempt number."""
        attempt = attempts_done
        while True:
            marker = self._marker(spec.run_id, attempt + 1)
            if not marker.exists():
                return attempt + 1
            attempt += 1
            if (self.records / f"{spec.run_id}.a{attempt}.record.json").exists():
                marker.unlink(missing_ok=True)
                continue
            info = json.loads(marker.read_text(encoding="utf-8") or "{}")
            started = datetime.fromisoformat(info.get("started_at", now_iso()))
            last = datetime.fromtimestamp(marker.stat().st_mtime, timezone.utc)
            rec = self._base_record(spec, attempt)
            rec.update(
                status="interrupted",
                reason=(f"attempt started at {info.get('started_at')} on {info.get('host')} (pid {info.get('pid')}) "
                        f"did not finish: the runner or machine stopped; last heartbeat {last.isoformat()}"),
                started_at=info.get("started_at"), finished_at=None,
                timings={"device_s": max(0.0, (last - started).total_seconds())},
            )
            self._write(rec)
            marker.unlink(missing_ok=True)
            self.echo(f"noted interrupted attempt {attempt} of {spec.run_id}")

    # -- execution -----------------------------------------------------------------------
    def _execute(self, spec: RunSpec, attempt: int, progress: Progress) -> str:
        marker = self._write_marker(spec, attempt)
        work = self.dir / "work" / f"{spec.run_id}.a{attempt}"
        work.mkdir(parents=True, exist_ok=True)
        job = {
            "spec": spec.as_dict(),
            "config_path": self.proto.configs[spec.config].path,
            "data_dir": str(self.root / spec.data_dir) if spec.data_dir else None,
            "checkpoint_path": str(self.dir / "checkpoints" / f"{spec.run_id}.a{attempt}.safetensors"),
        }
        job_path, result_path = work / "job.json", work / "result.json"
        atomic_write(job_path, canonical(job), overwrite=True)
        result_path.unlink(missing_ok=True)
        device_lock = FileLock(str(self.root / "runs" / "locks" / f"device-{self.host}-{spec.device}.lock"))
        log_path = work / "worker.log"
        server = self._forkserver() if self.proto.launcher == "forkserver" else None
        with device_lock:
            started_at = now_iso()
            t0 = time.monotonic()

            def beat() -> None:
                nonlocal last_beat
                if time.monotonic() - last_beat >= HEARTBEAT_S:
                    os.utime(marker)
                    last_beat = time.monotonic()
                if self.live:
                    self.echo(f"\r  running {spec.run_id} {time.monotonic() - t0:6.1f}s")

            last_beat = t0
            if server is not None:
                code = server.run(job_path, result_path, beat)
            else:
                with open(log_path, "wb") as log:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "harness.worker", str(job_path), str(result_path)],
                        stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                    )
                    while True:
                        try:
                            code = proc.wait(timeout=1.0)
                            break
                        except subprocess.TimeoutExpired:
                            beat()
            device_s = time.monotonic() - t0
            finished_at = now_iso()
        rec = self._base_record(spec, attempt)
        result: dict[str, Any] = {}
        if result_path.exists():
            result = json.loads(result_path.read_text(encoding="utf-8"))
        if code == 0 and result.get("status") == "ok":
            status, reason = "ok", None
        else:
            status = "failed"
            if code < 0:
                reason = f"worker killed by signal {signal.Signals(-code).name}"
            else:
                reason = result.get("reason") or f"worker exited with code {code}"
            if not result:
                tail = log_path.read_bytes()[-2000:].decode("utf-8", "replace") if log_path.exists() else ""
                result = {"log_tail": tail}
        result.pop("status", None)
        result.pop("reason", None)
        timings = dict(result.pop("timings", {}) or {})
        timings["device_s"] = device_s
        rec.update(result)
        rec.update(status=status, reason=reason, started_at=started_at, finished_at=finished_at, timings=timings)
        self._write(jsonable(rec))
        marker.unlink(missing_ok=True)
        progress.executed_s.append(device_s)
        return status

    def _forkserver(self) -> ForkServer:
        if self._server is None or not self._server.alive():
            self._server = ForkServer(self.root)
        return self._server

    def run(self) -> int:
        """Work through the plan; returns the number of runs that are still not done."""
        proto = self.proto
        self.frozen = freeze.check(proto, self.plan_sha, len(self.runs))
        if proto.torch_version and not self.allow_torch_mismatch:
            import torch

            if torch.__version__.split("+")[0] != proto.torch_version:
                from harness.errors import RefusedError

                raise RefusedError(
                    f"{proto.path}: protocol {proto.id!r} names PyTorch {proto.torch_version}, this is "
                    f"{torch.__version__}; copy it into a new protocol id for this environment"
                )
        for d in ("locks", "attempts", "work", "checkpoints"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        (self.root / "runs" / "locks").mkdir(parents=True, exist_ok=True)
        self.records.mkdir(parents=True, exist_ok=True)
        progress = Progress(total=len(self.runs))
        stopped_for_budget = False
        for unit in units(self.runs):
            lock = FileLock(str(self.dir / "locks" / f"{unit[0].unit}.lock"))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue  # another runner holds this unit
            try:
                states = run_states(proto)
                todo = self._todo(unit, states)
                progress.done = sum(len(u) - len(self._todo(u, states)) for u in units(self.runs))
                if not todo:
                    continue
                spent = sum(st.device_s for st in states.values())
                # the budget rule (analysis.summary.completeness restates it): the unit's runs at the
                # mean device seconds of the ok runs so far
                per_run = [st.ok_device_s for st in states.values() if st.ok]
                expected = (sum(per_run) / len(per_run)) * len(todo) if per_run else 0.0
                if spent + expected > proto.budget_device_seconds:
                    self.echo(
                        f"budget: {spent:.1f} s of {proto.budget_device_seconds:.0f} device seconds spent; the next "
                        f"unit {unit[0].unit} would need about {expected:.1f} s more, so no further run starts"
                    )
                    stopped_for_budget = True
                    break
                for spec in todo:
                    st = states.get(spec.run_id, RunState())
                    attempt = self._note_interrupted(spec, st.attempts)
                    self.echo(f"[{progress.done + 1}/{progress.total}] {spec.run_id} ({spec.arm}, seed {spec.seed}) "
                              f"attempt {attempt} ... ETA {progress.eta()}")
                    status = self._execute(spec, attempt, progress)
                    progress.done += 1
                    self.echo(f"  {status} ({progress.executed_s[-1]:.1f} s)")
                self.echo(f"  {describe(self.ledger.head())}")
            finally:
                lock.release()
        if self._server is not None:
            self._server.close()
        states = run_states(proto)
        left = sum(len(self._todo(u, states)) for u in units(self.runs))
        if stopped_for_budget:
            self.echo(f"stopped for budget with {left} runs not done")
        return left

    def _todo(self, unit: list[RunSpec], states: dict[str, RunState]) -> list[RunSpec]:
        """The unit's runs still to execute, in plan order.

        A unit whose latest attempts include a failure is final unless ``--retry-failed`` was given
        and its runs have ended fewer than the protocol's ``max_attempts`` times; a retry executes
        the whole unit again (every arm, as a new attempt, back to back), so the pair it yields
        shares one machine state. Otherwise the runs without an ok latest attempt (never started,
        or interrupted) are executed: the resume after a stop.
        """
        sts = [states.get(s.run_id) for s in unit]
        if any(st is not None and st.last == "failed" for st in sts):
            tries = max(st.tries for st in sts if st is not None)
            return list(unit) if self.retry_failed and tries < self.proto.max_attempts else []
        return [s for s, st in zip(unit, sts) if st is None or st.last != "ok"]


class ForkServer:
    """Client of ``python -m harness.worker --serve`` (see :func:`harness.worker.serve`)."""

    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.worker", "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            cwd=root, text=True, bufsize=1,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline().strip()
        if ready != "READY":
            raise RuntimeError(f"the fork server did not start (said {ready!r}, exit {self.proc.poll()})")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, job: Path, result: Path, beat: Callable[[], None]) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(f"{job} {result}\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return -int(signal.SIGPIPE)
        import select

        while True:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if not ready:
                beat()
                continue
            line = self.proc.stdout.readline()
            if not line:  # the server died: the child is gone with it
                return -int(signal.SIGKILL) if self.proc.wait() < 0 else 1
            pid, _, status = line.strip().partition(" ")
            if status != "START":
                return int(status)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def status_table(proto: Protocol) -> tuple[list[dict[str, Any]], float]:
    """Per (study, configuration): done, failed, interrupted and pending runs; device seconds spent."""
    runs = make_plan(proto)
    recs = load_records(proto.records_path)
    by_run: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_run.setdefault(r["spec"]["run_id"], []).append(r)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for spec in runs:
        row = rows.setdefault((spec.study, spec.config), {
            "study": spec.study, "config": spec.config, "runs": 0, "done": 0, "failed": 0,
            "interrupted_attempts": 0, "pending": 0,
        })
        row["runs"] += 1
        rs = by_run.get(spec.run_id, [])
        row["interrupted_attempts"] += sum(1 for r in rs if r["status"] == "interrupted")
        if any(r["status"] == "ok" for r in rs):
            row["done"] += 1
        elif any(r["status"] == "failed" for r in rs):
            row["failed"] += 1
        else:
            row["pending"] += 1
    spent = sum((r["timings"].get("device_s") or 0.0) for r in recs)
    return list(rows.values()), spent

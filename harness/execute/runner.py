"""Work through a protocol's plan: claims, attempts, resume, budget, records (executors place units).
What an attempt's started entry and record hold is :mod:`harness.execute.attempts`.

* Claims: a unit (pair or block) is claimed with a file lock under ``runs/<id>/locks``; a second
  runner skips claimed units, so no run executes twice. Timed runs also take a per-host device
  lock, so two runners never time runs on one device at once.
* Attempts are ledger entries: before a worker starts, a *started entry* (run id, attempt, unit
  attempt, node, time) is appended to the chain, and the record that ends the attempt links to it.
  A started entry without a record, found by a runner that holds the claim, is an interrupted
  attempt (the machine stopped, the runner was killed): it is recorded as ``interrupted``, charged
  the ledger's time from its start to that record (the worker never reported its own), and the
  run is executed again. Nothing under ``runs/`` decides what happened.
* Units: a unit that runs again whole (a node died, ``--retry-failed``) starts a new *unit
  attempt*; the earlier one's records are superseded (kept, counted, never analysed). A unit whose
  runner stopped part-way resumes in the same unit attempt.
* Failures: a worker that fails or dies is recorded as ``failed`` with its reason; failed runs
  are not retried unless asked (``--retry-failed``).
* Budget: the inclusive device seconds of every attempt are in the records; no unit starts when
  the spent time plus the unit's expected time would exceed the protocol's budget.
* Hermetic workers: nothing starts while a variable that changes a code path is set
  (:data:`harness.codepath.CODE_PATH`); workers get an allow-listed environment, the
  protocol's thread count and the sha256 of the ``phase.c`` build verified here; the torch and
  numpy versions must be those of the study's earlier runs.
* Sequential looks: a unit past a look starts once the look is taken and its rule went on
  (:class:`harness.execute.looks.SequentialLooks`).
* Anchoring: with ``anchor``, the ledger head is pushed to ``refs/ledger/protocol-<id>`` of that
  git remote after every unit; every unit done under a signed tag, the head is signed
  (:class:`harness.execute.anchoring.Anchoring`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from filelock import FileLock, Timeout

from harness import freeze
from harness.data.corpora import LocalCorpus
from harness.execute.anchoring import Anchoring
from harness.execute.attempts import (
    attempt_record,
    interrupted_result,
    machine_witness,
    outcome_result,
    started_entry,
    stopped_result,
    unit_attempt_of,
    utc_stamp,
)
from harness.execute.base import Claim, Executor, RunContext
from harness.execute.commands import EVIDENCE_TEXT
from harness.execute.hermetic import SLOWDOWN, hermetic_env
from harness.execute.job import Job
from harness.execute.launchers import Outcome
from harness.execute.looks import SequentialLooks
from harness.execute.registry import DEFAULT, executor_named
from harness.execute.state import Progress, RunEnd, RunState, claimed, note_record
from harness.ledger import Ledger, check_records_folder, check_same_protocol, study_ledger
from harness.plan import make_plan, plan_sha256, units
from harness.protocol import Protocol
from prereg.budget import Attempt, BudgetCheck
from prereg.budget import check as budget_check
from prereg.errors import HarnessError, RefusedError
from prereg.failstop import FailAttempt, failing_arms
from prereg.failstop import describe as describe_failing
from prereg.formats.record import (
    RunRecord,
    RunSpec,
    StartedEntry,
    WorkerResult,
    atomic_write,
    budget_attempts,
    failure_attempts,
    sha256_bytes,
)
from prereg.replicates import machine_of, overlap_problem, spans_of
from prereg.tag import torch_matches


class Runner:
    """Execute a protocol. ``echo`` receives progress lines (the CLI decides how to show them)."""

    def __init__(
        self,
        proto: Protocol,
        *,
        echo: Callable[[str], None],
        live: bool = False,
        retry_failed: bool = False,
        allow_torch_mismatch: bool = False,
        executor: Executor | None = None,
        anchor: str | None = None,
        replicate: int | None = None,
    ) -> None:
        self.proto = proto
        self.replicate = replicate
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
        self.executor: Executor = executor if executor is not None else executor_named(DEFAULT)
        self.progress = Progress(total=len(self.runs))
        self.stopped_for_budget = False
        self.last_budget: BudgetCheck | None = None  # the budget rule's verdict on the last unit
        self.looks = SequentialLooks(proto, self.host, echo)  # the sequential rule's looks
        self.frozen = freeze.NOT_FROZEN
        self._ledger: Ledger | None = None
        self._starts: dict[tuple[str, int], StartedEntry] = {}
        self.anchoring = Anchoring(proto, anchor, echo)  # the ledger's anchors, the result's signature
        self.env: dict[str, str] | None = None  # the workers' environment, set by run()
        self._context: RunContext | None = None  # what the executor reads, set by run()
        self._units = units(self.runs)
        self._unit_ends = {u[-1].run_id for u in self._units}
        # the run states and the budget rule's attempts, kept current from the ledger's index
        self._states: dict[str, RunState] = {}
        self._attempts: list[Attempt] = []
        self._fail_attempts: list[FailAttempt] = []  # the failure rule's (prereg/failstop.py)
        self.stopped_for_failure: str | None = None  # what the failure rule found, where it stopped
        self._failed_here: set[str] = set()  # runs whose failed record this runner wrote
        self._seen = (-1, 0)  # (the index's generation, records read)
        self._written = 0  # records this runner appended
        self._written_seen = 0  # ... as of the last read of the states
        self._done_known = False  # progress.done counted from the states, kept by progress.ran since

    @property
    def context(self) -> RunContext:
        """What an executor reads of the run (:class:`harness.execute.base.RunContext`), from
        :meth:`run` on."""
        if self._context is None:
            raise RuntimeError("a runner's context is made by run(), before its executor starts")
        return self._context

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = study_ledger(self.proto, self.frozen.freeze_sha256 or self.proto.sha256)
        return self._ledger

    # -- bookkeeping ---------------------------------------------------------------------
    def _write(self, record: RunRecord) -> None:
        self.ledger.append(record)
        self._written += 1

    def _note_interrupted(self, spec: RunSpec) -> int:
        """Record every started attempt of ``spec`` that no record ends; return the next attempt number."""
        recs, starts = self.ledger.entries_of({spec.run_id})
        ended = {r.attempt for r in recs}
        for e in starts:
            if e.attempt in ended:
                continue
            rec = attempt_record(
                self.proto,
                self.frozen,
                self.plan_sha,
                spec,
                e.attempt,
                interrupted_result(e),
                unit_attempt=e.unit_attempt,
                start=e.link(),
                started_at=e.started_at,
                finished_at=None,
            )
            self._write(rec)
            ended.add(e.attempt)
            self.echo(f"noted interrupted attempt {e.attempt} of {spec.run_id} (started {e.started_at})")
        return max([0, *ended, *(e.attempt for e in starts)]) + 1

    # -- execution -----------------------------------------------------------------------
    def job(self, spec: RunSpec, attempt: int, checkpoint_dir: Path | None = None) -> Job:
        """What the worker needs, with paths relative to the study's root (a node's copy of it)."""
        ckpt = (checkpoint_dir or self.dir / "checkpoints") / f"{spec.run_id}.a{attempt}.safetensors"
        cfg = (
            Path(self.proto.configs[spec.config].path).resolve().relative_to(self.root.resolve())
            if spec.command is None
            else Path(".")  # a command arm's configuration is a label its arguments carry
        )
        local = self.proto.corpus.as_dict() if isinstance(self.proto.corpus, LocalCorpus) else None
        return Job(
            spec=spec,
            attempt=attempt,
            config_path=cfg.as_posix(),
            data_dir=spec.data_dir,
            corpus=local,
            checkpoint_path=str(ckpt),
        )

    def started(self, spec: RunSpec, attempt: int, node: str | None = None, unit_attempt: int = 1) -> None:
        """A run's process is about to start: append its started entry to the ledger (found later
        without a record, it is an interrupted attempt) naming the machine."""
        entry = started_entry(
            self.proto,
            self.frozen,
            spec,
            attempt,
            node=node or self.host,
            unit_attempt=unit_attempt,
            host=self.host,
        )
        self._starts[(spec.run_id, attempt)] = self.ledger.append_started(entry)
        # anchored before its worker starts: deleting an unfinished attempt's entry is then named
        self.anchoring.push(self.ledger, self.frozen)

    def finished(
        self, spec: RunSpec, attempt: int, outcome: Outcome, node: Mapping[str, object] | None = None
    ) -> RunRecord:
        """Turn a run's outcome into its record (the ledger appends it); returns the record."""
        start = self._starts.pop((spec.run_id, attempt), None)
        if start is None:
            _, starts = self.ledger.entries_of({spec.run_id})
            start = next(e for e in starts if e.attempt == attempt)
        text = outcome.result.pop(EVIDENCE_TEXT, None) if isinstance(outcome.result, dict) else None
        result, device_s = outcome_result(outcome)
        self._keep_evidence(result, text)
        rec = attempt_record(
            self.proto,
            self.frozen,
            self.plan_sha,
            spec,
            attempt,
            result,
            unit_attempt=start.unit_attempt,
            start=start.link(),
            started_at=utc_stamp(outcome.started_at),
            finished_at=utc_stamp(outcome.finished_at or time.time()),
            node=node,
        )
        self._write(rec)
        if rec.status == "failed":
            self._failed_here.add(spec.run_id)
        self.progress.ran(device_s)
        if spec.run_id in self._unit_ends:
            self.anchoring.push(self.ledger, self.frozen)
        return rec

    def stopped(self, group: list[RunSpec], attempts: list[int], seconds: float, signal_name: str) -> None:
        """Record each attempt of a worker process stopped by a signal the runner caught, at once:
        interrupted, charged the process's own time until the stop (:func:`stopped_result`), never
        the pause before a resume."""
        for spec, attempt in zip(group, attempts):
            start = self._starts.pop((spec.run_id, attempt), None)
            if start is None:
                _, starts = self.ledger.entries_of({spec.run_id})
                start = next((e for e in starts if e.attempt == attempt), None)
            if start is None:  # stopped before its started entry: nothing to record
                continue
            rec = attempt_record(
                self.proto,
                self.frozen,
                self.plan_sha,
                spec,
                attempt,
                stopped_result(start, seconds, signal_name, len(group)),
                unit_attempt=start.unit_attempt,
                start=start.link(),
                started_at=start.started_at,
                finished_at=utc_stamp(time.time()),
            )
            self._write(rec)
            self.progress.ran(seconds / len(group))

    def _keep_evidence(self, result: WorkerResult, text: str | None) -> None:
        """A command run's evidence (its reporter file or output), kept beside its record under the
        name the record gives it (never overwritten: a second copy of an attempt's is refused)."""
        ev = result.evidence
        if text is None or not ev:
            return
        data = text.encode("utf-8", "surrogateescape")
        name = str(ev.get("file"))
        if Path(name).name != name or sha256_bytes(data) != ev.get("sha256"):
            raise RefusedError(f"a worker's evidence for {name!r} is not the file its result names")
        atomic_write(self.ledger.dir / name, data, overwrite=False)

    def next_attempt(self, spec: RunSpec) -> int:
        """Record the run's interrupted attempts (started, never ended: a node, worker or runner died);
        the next attempt's number."""
        return self._note_interrupted(spec)

    def budget_allows(
        self,
        unit: list[RunSpec],
        todo: list[RunSpec],
        attempts: list[Attempt],
        reserved: float = 0.0,
    ) -> bool:
        """The budget rule, from its one home (:mod:`prereg.budget`, which the summary and
        the audit apply to the records too): no unit starts when the device seconds spent (plus
        those reserved by units in flight) and the unit's runs at the mean device seconds of the ok
        runs so far would exceed the protocol's budget; then ``stopped_for_budget`` is set."""
        verdict = budget_check(
            unit[0].unit, len(todo), attempts, self.proto.spec.budget_device_seconds, reserved=reserved
        )
        self.progress.note_budget(
            verdict.spent, verdict.budget, verdict.expected / verdict.todo if verdict.todo else None
        )
        self.last_budget = verdict
        if verdict.refuses:
            self.echo(
                f"budget: {verdict.spent:.1f} s of {verdict.budget:.0f} device seconds spent; the next "
                f"unit {unit[0].unit} would need about {verdict.expected:.1f} s more, so no further run starts"
            )
            self.stopped_for_budget = True
            return False
        return True

    @property
    def halted(self) -> bool:
        """Whether no further unit starts: the budget rule, the failure rule, or the sequential rule
        at a look."""
        return (
            self.stopped_for_budget
            or self.stopped_for_failure is not None
            or self.looks.stopped_at is not None
        )

    def failure_stops(self) -> bool:
        """The failure rule, from its one home (:mod:`prereg.failstop`, which the summary and the
        audit apply to the records too): once every record of some arm failed before its first
        training step, one of them in this run of the command, no unit that has not started starts,
        and no further run of a unit in progress; then ``stopped_for_failure`` says what failed. Every
        executor asks it after each failed run; the Ray driver also before each run a node announces."""
        self.current()
        failing = [
            f for f in failing_arms(self._fail_attempts) if any(a[2] in self._failed_here for a in f[2])
        ]
        if not failing:
            return False
        if self.stopped_for_failure is None:
            self.stopped_for_failure = describe_failing(failing)
            self.echo(
                "failure rule: every run of an arm so far failed before its first training step, so no "
                f"further run starts ({self.stopped_for_failure})"
            )
        return True

    def look_allows(self, unit: list[RunSpec]) -> bool:
        """The group-sequential barrier (:class:`harness.execute.looks.SequentialLooks`)."""
        return self.looks.allows(unit, self.ledger, self.frozen.freeze_sha256)

    def look_waits(self, unit: list[RunSpec]) -> bool:
        """Whether ``unit`` lies past a look its pairs in flight have not reached yet."""
        return self.looks.waits(unit, self.ledger)

    def claim(
        self,
        unit: list[RunSpec],
        reserved: float = 0.0,
        widen: Callable[[list[RunSpec], list[RunSpec], dict[str, RunState]], list[RunSpec]] | None = None,
    ) -> Claim | None:
        """Claim ``unit`` (its file lock held: release it with :meth:`Claim.release` when the unit is
        done) with its runs to execute and their unit attempt; None when another runner holds it,
        nothing is left to do, or the budget does not allow it (then ``stopped_for_budget`` is set).
        ``reserved``: the device seconds of units in flight; ``widen`` may turn the runs to do into
        the whole unit (an executor that cannot finish a unit where it started). Keeps
        ``progress.done`` current."""
        lock = FileLock(str(self.dir / "locks" / f"{unit[0].unit}.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return None  # another runner holds this unit
        states, attempts = self.current()
        todo = self.todo(unit, states)
        if not self._done_known:  # first claim, or records this runner did not write came in
            self.progress.done = sum(len(u) - len(self.todo(u, states)) for u in self._units)
            self._done_known = True
        if todo and widen is not None:
            todo = widen(unit, todo, states)
        if todo and not self.look_allows(unit):
            lock.release()
            return None
        if todo and all(states.get(s.run_id) is None for s in unit) and self.failure_stops():
            lock.release()
            return None
        if not todo or not self.budget_allows(unit, todo, attempts, reserved):
            lock.release()
            return None
        expected = self.last_budget.expected if self.last_budget is not None else 0.0
        return Claim(unit, todo, unit_attempt_of(self.ledger, unit, todo), expected, lock)

    def current(self) -> tuple[dict[str, RunState], list[Attempt]]:
        """The run states and the budget rule's attempts, from the ledger's index: only records
        not read before are read (all again when the index was read anew)."""
        recs = self.ledger.records()
        if self._seen[0] != self.ledger.generation:
            self._states, self._attempts, self._seen = {}, [], (self.ledger.generation, 0)
            self._fail_attempts = []
            self._done_known = False
        fresh = recs[self._seen[1] :]
        if len(fresh) != self._written - self._written_seen:
            self._done_known = False  # another runner's records (or this one's first read)
        self._written_seen = self._written
        for r in fresh:
            note_record(self._states, r)
        self._attempts.extend(budget_attempts(fresh))
        self._fail_attempts.extend(failure_attempts(fresh))
        self._seen = (self.ledger.generation, len(recs))
        return self._states, self._attempts

    def claims(self) -> Iterator[Claim]:
        """Every unit still to do, claimed in plan order (:meth:`claim`), until the budget stops."""
        for unit in self._units:
            claim = self.claim(unit)
            if claim is not None:
                yield claim
            elif self.halted:
                return

    def announce(self, spec: RunSpec, attempt: int, where: str = "") -> None:
        self.echo(
            f"[{self.progress.done + 1}/{self.progress.total}] {spec.run_id} ({spec.arm}, seed {spec.seed}) "
            f"attempt {attempt}{where} ... {self.progress.line()}"
        )

    def run(self) -> RunEnd:
        """Work through the plan; returns how it ended."""
        proto = self.proto
        self._check_replicate_named()
        check_records_folder(proto)
        check_same_protocol(proto)
        restored = freeze.restore_tag(proto)
        if restored:
            self.echo(restored)
        if proto.defaults_note():
            self.echo(str(proto.defaults_note()))
        self.frozen = freeze.check(proto, self.plan_sha, len(self.runs))
        if proto.spec.torch_version and not self.allow_torch_mismatch:
            self._check_torch(proto.spec.torch_version)
        self.env = hermetic_env(self.proto, self.root, self.records, self.anchoring.remote)
        if SLOWDOWN in self.env:
            self.echo(
                f"{SLOWDOWN}={self.env[SLOWDOWN]}: every run is slowed as on a machine that many times "
                "slower (a test knob; each record's env names it)"
            )
        # every byte of the corpus verifies before any run starts (DataError, exit 2, otherwise)
        self.corpus = proto.corpus_data()
        self._make_folders()
        note = self.ledger.reconcile()  # the chain is the truth: a crash may have left MANIFEST behind it
        if note:
            self.echo(note)
        self._select_replicate()
        self.progress = Progress(total=sum(len(u) for u in self._units))
        self.stopped_for_budget = False
        self.looks.stopped_at = None
        self.stopped_for_failure = None
        self._context = RunContext(
            proto=proto,
            root=self.root,
            dir=self.dir,
            records=self.records,
            host=self.host,
            live=self.live,
            env=self.env,
            corpus=self.corpus,
            runs=self.runs,
            progress=self.progress,
            echo=self.echo,
            ledger=self.ledger,
        )
        try:
            self.executor.execute(self)
        finally:  # MANIFEST lags appends by seconds; the chain is the truth if this cannot run
            if self._ledger is not None:
                try:
                    self.ledger.write_manifest()
                except (OSError, HarnessError):
                    pass
        self.anchoring.push(self.ledger, self.frozen)
        return self._ending()

    def _check_torch(self, version: str) -> None:
        """Refuse a PyTorch other than the protocol's ``torch_version``."""
        import torch

        proto = self.proto
        if not torch_matches(version, torch.__version__):
            from prereg.errors import RefusedError

            raise RefusedError(
                f"{proto.path}: protocol {proto.spec.id!r} names PyTorch {proto.spec.torch_version}, this is "
                f"{torch.__version__}; copy it into a new protocol id for this environment"
            )

    def _make_folders(self) -> None:
        """The study's work, lock, checkpoint and records folders (WriteError if one cannot be made),
        and the tag's bytes kept beside the records."""
        try:
            for d in ("locks", "work", "checkpoints"):
                (self.dir / d).mkdir(parents=True, exist_ok=True)
            (self.root / "runs" / "locks").mkdir(parents=True, exist_ok=True)
            self.records.mkdir(parents=True, exist_ok=True)
            self.anchoring.keep_tag(self.records, self.frozen)
        except OSError as e:
            from prereg.errors import WriteError

            raise WriteError(f"cannot create the study's folders: {e}") from e

    def _ending(self) -> RunEnd:
        """How the run ended, from the ledger; every unit done (here or elsewhere): the result signed."""
        states, _ = self.current()
        todos = [(u[0].unit, len(self.todo(u, states))) for u in self._units]
        left = sum(n for _, n in todos)
        failed = sum(1 for s in self.runs if (st := states.get(s.run_id)) is not None and st.last == "failed")
        held = sum(n for unit, n in todos if n and claimed(self.proto, unit))
        if not left and not held:
            self.anchoring.sign(self.ledger, self.frozen)
        return RunEnd(
            held_elsewhere=held,
            planned=sum(len(u) for u in self._units),
            left=left,
            failed=failed,
            stopped_for_budget=self.stopped_for_budget and left > 0,
            budget=self.last_budget,
            stopped_at_look=self.looks.stopped_at,
            replicate=self._replicate_run(),
            stopped_for_failure=self.stopped_for_failure if left else None,
        )

    def _replicate_run(self) -> tuple[int, int] | None:
        """``(K, count)`` of a replicated protocol run with ``--replicate K``; None otherwise."""
        if self.proto.spec.replicates is None or self.replicate is None:
            return None
        return self.replicate, self.proto.spec.replicates["count"]

    def _check_replicate_named(self) -> None:
        """``--replicate K`` goes with a replicated protocol, and names one of its replicates."""
        reps, k = self.proto.spec.replicates, self.replicate
        if reps is None:
            if k is not None:
                raise RefusedError(
                    f"{self.proto.path}: --replicate {k}, but the protocol declares no replicates; nothing was run"
                )
            return
        if k is None or not 1 <= k <= reps["count"]:
            raise RefusedError(
                f"{self.proto.path}: key replicates declares {reps['count']} replicates: name the one to run "
                f"with --replicate K (1 to {reps['count']}), got {k}; nothing was run"
            )

    def _select_replicate(self) -> None:
        """A replicated protocol runs one replicate per ``harness run --replicate K``: only its units
        are claimed, and only when no later replicate has begun and every earlier one's last entry
        on this machine is ``min_gap_s`` old (:func:`prereg.replicates.overlap_problem`)."""
        reps, k = self.proto.spec.replicates, self.replicate
        if reps is None or k is None:
            return
        of_run = {s.run_id: s.replicate for s in self.runs if s.replicate is not None}
        spans = spans_of([e.to_json() for e in self.ledger.entries()], of_run)  # the core reads JSON
        here = machine_of({"runner": {"host": self.host, **machine_witness()}})
        why = overlap_problem(k, spans, time.time(), here, reps["min_gap_s"])
        if why is not None:
            raise RefusedError(f"{self.proto.path}: key replicates: {why}; nothing was run")
        self._units = [u for u in self._units if u[0].replicate == k]
        self.echo(f"replicate {k} of {reps['count']}: {sum(len(u) for u in self._units)} runs")

    def todo(self, unit: list[RunSpec], states: dict[str, RunState]) -> list[RunSpec]:
        """The unit's runs still to execute, in plan order.

        A unit whose latest attempts include a failure is final unless ``--retry-failed`` was given
        and its runs have ended fewer than the protocol's ``max_attempts`` times; a retry executes
        the whole unit again (every arm, as a new attempt, back to back), so the pair it yields
        shares one machine state. Otherwise the runs without an ok latest attempt (never started,
        or interrupted) are executed: the resume after a stop; of a lockstep pair, both (its arms
        run in one process), as a new unit attempt.
        """
        sts = [states.get(s.run_id) for s in unit]
        if any(st is not None and st.last == "failed" for st in sts):
            tries = max(st.tries for st in sts if st is not None)
            return list(unit) if self.retry_failed and tries < self.proto.spec.max_attempts else []
        todo = [s for s, st in zip(unit, sts) if st is None or st.last != "ok"]
        if todo and unit[0].lockstep:
            return list(unit)  # a lockstep pair runs whole, in one process: a new unit attempt
        return todo

"""The executor interface: place a protocol's units on devices, report each run to the runner.

:class:`RunnerPort` is what an executor may use of the runner to claim units and report runs
(:class:`harness.execute.runner.Runner` implements it), and :class:`RunContext` what it reads of the
run, so the executors depend on this interface, never on the runner's module."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from filelock import FileLock

from harness.data.corpora import Corpus
from harness.execute.job import Job
from harness.execute.launchers import Outcome
from harness.execute.state import Progress, RunState
from harness.protocol import Protocol as StudyProtocol
from prereg.errors import Terminated
from prereg.formats.record import LedgerHead, RunRecord, RunSpec

#: The signals a runner stops on and records at once: what unwinds an executor, by name.
STOPS: tuple[type[BaseException], ...] = (KeyboardInterrupt, Terminated)


def stop_name(e: BaseException) -> str:
    """The signal behind a stop in :data:`STOPS`."""
    return "SIGINT" if isinstance(e, KeyboardInterrupt) else "SIGTERM"


@dataclass
class Claim:
    """A unit claimed for execution: its runs to do, their unit attempt, the device seconds they are
    expected to take, and the claim's file lock."""

    unit: list[RunSpec]
    todo: list[RunSpec]
    unit_attempt: int
    expected_s: float
    lock: FileLock

    def release(self) -> None:
        self.lock.release()


class LedgerView(Protocol):
    """What an executor reads of the ledger: its head and its records (only the runner writes it)."""

    def head(self) -> LedgerHead: ...

    def records(self) -> list[RunRecord]: ...


@dataclass(frozen=True)
class RunContext:
    """What an executor reads of the run, fixed before the first claim: the study, its folders and
    plan, this machine's name, whether the terminal shows a live line, the workers' environment,
    the verified corpus, the progress display (the runner keeps it current) and the ledger, read
    only. ``echo`` shows a line as the command line decides."""

    proto: StudyProtocol
    root: Path
    dir: Path
    records: Path
    host: str
    live: bool
    env: dict[str, str] | None
    corpus: Corpus
    runs: list[RunSpec]
    progress: Progress
    echo: Callable[[str], None]
    ledger: LedgerView


class RunnerPort(Protocol):
    """What an executor uses of the runner to claim units and report runs: the claims, the stop
    rules, the attempt bookkeeping, the started entries and records, the progress lines; and the
    run's read-only :class:`RunContext`."""

    @property
    def context(self) -> RunContext: ...

    @property
    def halted(self) -> bool: ...

    def look_waits(self, unit: list[RunSpec]) -> bool: ...

    def failure_stops(self) -> bool: ...

    def claims(self) -> Iterator[Claim]: ...

    def claim(
        self,
        unit: list[RunSpec],
        reserved: float = 0.0,
        widen: Callable[[list[RunSpec], list[RunSpec], dict[str, RunState]], list[RunSpec]] | None = None,
    ) -> Claim | None: ...

    def next_attempt(self, spec: RunSpec) -> int: ...

    def job(self, spec: RunSpec, attempt: int, checkpoint_dir: Path | None = None) -> Job: ...

    def started(
        self, spec: RunSpec, attempt: int, node: str | None = None, unit_attempt: int = 1
    ) -> None: ...

    def finished(
        self, spec: RunSpec, attempt: int, outcome: Outcome, node: Mapping[str, object] | None = None
    ) -> RunRecord: ...

    def stopped(
        self, group: list[RunSpec], attempts: list[int], seconds: float, signal_name: str
    ) -> None: ...

    def announce(self, spec: RunSpec, attempt: int, where: str = "") -> None: ...


class Executor(Protocol):
    """Execute the units the runner still has to do.

    The runner owns claims, progress and the budget: an executor takes claimed units from it
    (:meth:`RunnerPort.claims` in plan order, or :meth:`RunnerPort.claim` for one unit: the unit's
    runs to do, their unit attempt, the budget checked, the claim's lock held until
    :meth:`Claim.release`), asks for each run's attempt number (:meth:`RunnerPort.next_attempt`,
    which records the run's interrupted attempts first), calls :meth:`RunnerPort.started` (the
    started entry, in the ledger) before a run's process starts and :meth:`RunnerPort.finished`
    with its outcome. Only the runner writes the ledger.
    """

    name: str

    def execute(self, runner: RunnerPort) -> None: ...

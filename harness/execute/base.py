"""The executor interface: place a protocol's units on devices, report each run to the runner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from harness.execute.runner import Runner


class Executor(Protocol):
    """Execute the units the runner still has to do.

    An executor asks the runner which runs of a unit are to do (:meth:`Runner._todo`), whether the
    budget allows the unit (:meth:`Runner.budget_allows`) and for each run's attempt number
    (:meth:`Runner.next_attempt`, which records the run's interrupted attempts first) and the unit
    attempt its runs belong to (:meth:`Runner.unit_attempt`); it calls :meth:`Runner.started` (the
    started entry, in the ledger) before a run's process starts and :meth:`Runner.finished` with its
    outcome. Only the runner writes the ledger.
    """

    name: str

    def execute(self, runner: Runner) -> None: ...

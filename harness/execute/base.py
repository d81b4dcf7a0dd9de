"""The executor interface: place a protocol's units on devices, report each run to the runner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from harness.execute.runner import Runner


class Executor(Protocol):
    """Execute the units the runner still has to do.

    The runner owns claims, progress and the budget: an executor takes claimed units from it
    (:meth:`Runner.claims` in plan order, or :meth:`Runner.claim` for one unit: the unit's runs to
    do, their unit attempt, the budget checked, the claim's lock held until
    :meth:`~harness.execute.runner.Claim.release`), asks for each run's attempt number
    (:meth:`Runner.next_attempt`, which records the run's interrupted attempts first), calls
    :meth:`Runner.started` (the started entry, in the ledger) before a run's process starts and
    :meth:`Runner.finished` with its outcome. Only the runner writes the ledger.
    """

    name: str

    def execute(self, runner: Runner) -> None: ...

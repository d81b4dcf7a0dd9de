"""The budget rule, in one place and with the standard library alone: ``harness run`` applies it
before each unit (:meth:`harness.execute.runner.Runner.budget_allows`), and the summary and the
audit ask it, through :func:`prereg.attempts.completeness`, whether a study that ended with runs to
do was stopped by it.

The rule
--------
Units (a pair or a block) run in plan order: study by study, seed by seed, configuration by
configuration (:func:`plan_units`). Before a unit starts, let

* ``spent``: the device seconds of every attempt so far (``math.fsum`` over the records), plus the
  seconds reserved by units still in flight (a parallel executor);
* ``m``: the mean device seconds of the ok runs, each run counted once, by its latest ok attempt
  (0 before any run is ok);
* ``k``: the unit's runs still to do.

The unit starts only if ``spent + k * m <= budget``. Otherwise no further unit starts: the runner
does not skip ahead to a smaller unit, so the stop is the first unit the rule refuses.

A study whose records leave runs to do was *stopped by the budget* exactly when the rule refuses
the first unit in plan order that still has runs to do, recomputed from the records: a unit with a
failed latest attempt is final (nothing to do without ``--retry-failed``), and a run is to do
unless its latest attempt is ok.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: one attempt as the rule reads it: (run id, unit, attempt, status, device seconds)
Attempt = tuple[str, str, int, str, float]


@dataclass(frozen=True)
class BudgetCheck:
    """The rule applied to one unit: ``refuses`` when ``spent + expected > budget``."""

    unit: str
    todo: int  # the unit's runs still to do
    spent: float  # device seconds of every attempt (and of units in flight)
    expected: float  # todo x the mean device seconds of the ok runs
    budget: float

    @property
    def refuses(self) -> bool:
        return self.spent + self.expected > self.budget

    @property
    def left(self) -> float:
        """Device seconds of the budget not yet spent (never below 0)."""
        return max(0.0, self.budget - self.spent)


def spent_seconds(attempts: Iterable[Attempt]) -> float:
    """The device seconds of every attempt, summed exactly (``math.fsum``)."""
    return math.fsum(a[4] for a in attempts)


def ok_seconds(attempts: Iterable[Attempt]) -> list[float]:
    """Each ok run's device seconds, by its latest ok attempt, in run-id order."""
    best: dict[str, tuple[int, float]] = {}
    for run_id, _unit, attempt, status, seconds in attempts:
        if status == "ok" and (run_id not in best or attempt > best[run_id][0]):
            best[run_id] = (attempt, seconds)
    return [best[k][1] for k in sorted(best)]


def check(
    unit: str, todo: int, attempts: Sequence[Attempt], budget: float, reserved: float = 0.0
) -> BudgetCheck:
    """The rule for ``unit`` with ``todo`` runs to do, given every attempt so far."""
    ok = ok_seconds(attempts)
    mean = math.fsum(ok) / len(ok) if ok else 0.0
    return BudgetCheck(
        unit=unit,
        todo=todo,
        spent=spent_seconds(attempts) + reserved,
        expected=todo * mean,
        budget=float(budget),
    )


def plan_units(studies: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """``(unit id, runs per unit)`` in plan order, from the protocol summary's studies (each with
    ``name``, ``design``, ``configs``, ``seeds`` and, for a factorial, its ``cells``). The ids are
    the plan's (``<study>.<config>.pair<i>`` or ``.block<i>``, ``i`` the seed's index, 3 digits)."""
    from prereg.designs import study_design

    out: list[tuple[str, int]] = []
    for st in studies:
        design = study_design(st)
        size, kind = design.runs_per_unit(st), design.unit
        for si in range(len(st["seeds"])):
            for config in st["configs"]:
                out.append((f"{st['name']}.{config}.{kind}{si:03d}", size))
    return out


def runs_to_do(size: int, latest: Sequence[str]) -> int:
    """A unit's runs still to do, from the latest status of each of its runs that has a record:
    none when one failed (the unit is final), else the runs whose latest attempt is not ok."""
    if "failed" in latest:
        return 0
    return size - sum(1 for s in latest if s == "ok")


def stop_check(
    units: Sequence[tuple[str, int]], attempts: Sequence[Attempt], budget: float
) -> BudgetCheck | None:
    """The rule applied to the first unit in plan order with runs to do (None when there is none)."""
    latest: dict[str, tuple[int, str, str]] = {}
    for run_id, unit, attempt, status, _ in attempts:
        if run_id not in latest or attempt >= latest[run_id][0]:
            latest[run_id] = (attempt, status, unit)
    by_unit: dict[str, list[str]] = {}
    for _attempt, status, unit in latest.values():
        by_unit.setdefault(unit, []).append(status)
    for unit, size in units:
        todo = runs_to_do(size, by_unit.get(unit, []))
        if todo:
            return check(unit, todo, attempts, budget)
    return None


def completeness_text(planned: int, missing: int, stop: BudgetCheck | None) -> str:
    """The one-line verdict on a study's completeness that the summary states and the audit checks."""
    if missing == 0:
        return f"complete: all {planned} planned runs have an ok record"
    if stop is not None and stop.refuses:
        return (
            f"STOPPED BY THE BUDGET RULE: {missing} of {planned} planned runs have no ok record; "
            f"{stop.spent:.1f} of {stop.budget:g} device seconds spent, and the next unit in plan order "
            f"({stop.unit}: {stop.todo} runs, about {stop.expected:.1f} s) would exceed the budget; "
            "where it stopped depended on run times, the outcome of every time endpoint"
        )
    return f"INCOMPLETE: {missing} of {planned} planned runs have no ok record"

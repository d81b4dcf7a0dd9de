"""Factorial designs: declared two-level factors, one arm per combination of levels, Williams orders.

A factorial study declares its factors, each with two levels (the first is the baseline's), and one
cell per combination of levels, each run by an arm (a built-in one or a plug-in)::

    design: factorial
    factors:
      norms: [scalar, bucketed]
      adamw: [native, packed]
    cells:
      native: {norms: scalar, adamw: native}       # arm: the cell's name, unless given
      bucketed: {norms: bucketed, adamw: native}
      packed: {norms: scalar, adamw: packed}
      cotangent: {norms: bucketed, adamw: packed}

That declaration is also what a factorial study without ``factors`` means (the study's 2x2,
:data:`DEFAULT_FACTORS`). One to :data:`MAX_FACTORS` factors: 2, 4 or 8 cells. Cells are kept in
standard order, the first factor alternating fastest: cell ``i`` has factor ``j`` at its second
level exactly when bit ``j`` of ``i`` is set. Each block runs every cell once, in the order of a
row of a Williams square (the plan's, :func:`prereg.factorial.williams`), so that every cell
follows every other equally often.
Free of torch (``harness plan`` and ``tag`` start instantly).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.names import ID_RE as NAME_RE
from prereg.factorial import cell_index

MAX_FACTORS = 3

#: The study's 2x2: per-parameter norms (native scalar or bucketed) by optimizer (native or packed
#: AdamW); the cells are the four built-in arms.
DEFAULT_FACTORS: tuple[tuple[str, tuple[str, str]], ...] = (
    ("norms", ("scalar", "bucketed")),
    ("adamw", ("native", "packed")),
)
DEFAULT_CELLS = ("native", "bucketed", "packed", "cotangent")


@dataclass(frozen=True)
class Design:
    """A factorial study's factors and cells, cells in standard order.

    Attributes
    ----------
    factors
        ``(name, (first level, second level))`` per factor, in declaration order.
    cells
        Cell names (the runs' roles): ``cells[i]`` has factor ``j`` at its second level iff bit
        ``j`` of ``i`` is set; ``cells[0]`` is the baseline (every factor at its first level).
    arms
        ``arms[i]`` runs ``cells[i]``.
    declared
        The protocol declared it (``factors``); ``False``: the default 2x2 of an older protocol,
        whose records do not repeat it.
    """

    factors: tuple[tuple[str, tuple[str, str]], ...]
    cells: tuple[str, ...]
    arms: tuple[str, ...]
    declared: bool

    def arm_of(self, cell: str) -> str:
        return self.arms[self.cells.index(cell)]

    def levels(self, i: int) -> tuple[str, ...]:
        return tuple(levels[(i >> j) & 1] for j, (_, levels) in enumerate(self.factors))

    def summary(self) -> dict[str, object]:
        """What records say of a declared design: factors and cells in standard order."""
        return {"factors": [[f, list(levels)] for f, levels in self.factors], "cells": list(self.cells)}


DEFAULT_DESIGN = Design(DEFAULT_FACTORS, DEFAULT_CELLS, DEFAULT_CELLS, declared=False)


def parse(raw_factors: object, raw_cells: object) -> Design:
    """The declared design, or ``ValueError((key path, message))`` naming what is wrong."""
    factors = _factors(raw_factors)
    n = 2 ** len(factors)
    if not isinstance(raw_cells, dict) or len(raw_cells) != n:
        raise ValueError(
            (("cells",), f"{n} cells, one per combination of levels, each {{factor: level, ...}}")
        )
    by_index: dict[int, tuple[str, str]] = {}
    for cell, spec in raw_cells.items():
        i = _cell_index(cell, spec, factors)
        if i in by_index:
            raise ValueError((("cells", cell), f"cells {by_index[i][0]} and {cell} have the same levels"))
        arm = spec.get("arm", cell)
        if not isinstance(arm, str):
            raise ValueError(
                (("cells", cell, "arm"), "an arm's name (built-in, or a plug-in module:function)")
            )
        by_index[i] = (cell, arm)
    return Design(
        tuple(factors),
        tuple(by_index[i][0] for i in range(n)),
        tuple(by_index[i][1] for i in range(n)),
        declared=True,
    )


def _factors(raw_factors: object) -> list[tuple[str, tuple[str, str]]]:
    """The declared factors and their two levels, in order (ValueError as :func:`parse`'s)."""
    if not isinstance(raw_factors, dict) or not 1 <= len(raw_factors) <= MAX_FACTORS:
        raise ValueError(((), f"factors: a mapping of 1 to {MAX_FACTORS} factor names to their two levels"))
    factors: list[tuple[str, tuple[str, str]]] = []
    for name, levels in raw_factors.items():
        if not isinstance(name, str) or not NAME_RE.match(name) or name == "arm":
            raise ValueError(((name,), "a factor's name: letters, digits, - and _ only (not 'arm')"))
        if (
            not isinstance(levels, list)
            or len(levels) != 2
            or not all(isinstance(v, str) for v in levels)
            or levels[0] == levels[1]
        ):
            raise ValueError(((name,), "two different level names: [first (the baseline's), second]"))
        factors.append((name, (levels[0], levels[1])))
    return factors


def _cell_index(cell: object, spec: object, factors: list[tuple[str, tuple[str, str]]]) -> int:
    """One declared cell's name and levels checked, and its index in standard order (ValueError as
    :func:`parse`'s)."""
    names = [f for f, _ in factors]
    where = ("cells", cell)
    if not isinstance(cell, str) or not NAME_RE.match(cell):
        raise ValueError((where, "a cell's name: letters, digits, - and _ only"))
    if not isinstance(spec, dict) or set(spec) - {"arm"} != set(names):
        raise ValueError(
            (where, f"the cell's level of each factor ({', '.join(names)}), and optionally its arm")
        )
    for f, levels in factors:
        if spec[f] not in levels:
            raise ValueError((where + (f,), f"{spec[f]!r} is not a level of {f} ({levels[0]}, {levels[1]})"))
    return cell_index(spec, factors)

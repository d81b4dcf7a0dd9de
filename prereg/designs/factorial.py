"""The factorial design: a block of one run per cell (every combination of the factors' two
levels), in the rows of a Williams square; analysed by its within-block effects
(:mod:`prereg.factorial`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prereg.designs.base import Design, Planned, Rng
from prereg.factorial import arms_by_cell, design_of, from_yaml, williams

__all__ = ["FACTORIAL", "Factorial"]


class Factorial(Design):
    """A block of cells, each run once, ordered by Williams rows."""

    name = "factorial"
    analysed_as = "factorial"
    unit = "block"
    pairwise = False

    def roles(self, study: Mapping[str, object], arms: Sequence[str] | None = None) -> list[tuple[str, str]]:
        """Each cell and its arm, in standard order (the summary's form of the study)."""
        return list(arms_by_cell(study).items())

    def runs_per_unit(self, study: Mapping[str, object]) -> int:
        """One run per cell."""
        return len(design_of(study)[1])

    def arm_of(self, study: Planned, role: str, arms: Sequence[str]) -> str:
        """The arm of cell ``role``, as the protocol file declares it."""
        _, cells, cell_arms, _ = from_yaml(_declared(study))
        return str(cell_arms[cells.index(role)])

    def orders(self, study: Planned, config: str, n: int, rng: Rng) -> list[tuple[str, ...]]:
        """Rows of a Williams square of the cells, shuffled per group of as many blocks as cells by
        ``rng(study, config, g)``."""
        cells = _cells(study)
        seq: list[tuple[str, ...]] = []
        for g in range(0, n, len(cells)):
            rows = williams(len(cells))
            rng(study.name, config, g).shuffle(rows)
            seq.extend(tuple(cells[i] for i in row) for row in rows[: min(len(cells), n - g)])
        return seq

    def summary_fields(self, study: Planned) -> dict[str, object]:
        """A declared factorial's ``factors`` and ``cells`` (none for the default 2x2)."""
        factors, cells, _, declared = from_yaml(_declared(study))
        return {"factors": factors, "cells": cells} if declared else {}

    def summary_arms(self, study: Planned, arms: Sequence[object] | None) -> Sequence[object] | None:
        """A declared factorial's arms by cell; else the study's arms, or the default cells."""
        _, cells, cell_arms, declared = from_yaml(_declared(study))
        return cell_arms if declared else (arms or cells)


def _cells(study: Planned) -> list[str]:
    """The study's cells in standard order (every one declared: the protocol's reader checks it)."""
    cells = from_yaml(_declared(study))[1]
    missing = [i for i, c in enumerate(cells) if c is None]
    if missing:
        raise ValueError(f"study {study.name}: no cell declared at place {missing[0]} of the standard order")
    return [str(c) for c in cells]


def _declared(study: Planned) -> dict[str, object]:
    """A typed study's declared ``factors`` and ``cells`` (none for the default 2x2), as
    :func:`prereg.factorial.from_yaml` reads them."""
    return {} if study.factors is None else {"factors": study.factors, "cells": study.cells or {}}


#: The factorial design.
FACTORIAL = Factorial()

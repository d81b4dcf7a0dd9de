"""Factorial designs with the standard library alone: a study's declared two-level design (from its
protocol file and from the records' protocol summary), Williams rows, and the factorial effects. The
effects' one home: the summary and the audit both call :func:`factorial_effects`.

Standard order: cell ``i`` has factor ``j`` at its second level exactly when bit ``j`` of ``i`` is
set (the first factor alternates fastest). A study's summary (what every record copies) carries
``factors`` (``[[name, [first, second]], ...]``) and ``cells`` (cell names in standard order) when
the protocol declared them; otherwise it is the study's 2x2 (:data:`DEFAULT_FACTORS`,
:data:`DEFAULT_CELLS`: norms ``scalar``/``bucketed`` by AdamW ``native``/``packed``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import combinations

from prereg.descriptive import PairedInterval, Rows

DEFAULT_FACTORS: list[tuple[str, tuple[str, str]]] = [
    ("norms", ("scalar", "bucketed")),
    ("adamw", ("native", "packed")),
]
DEFAULT_CELLS = ("native", "bucketed", "packed", "cotangent")


def _list(v: object, what: str) -> list[object]:
    """``v``, a JSON list (or a tuple), as a list; a ValueError naming ``what`` otherwise."""
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"{what} is not a list: {v!r}")
    return list(v)


def _mapping(v: object, what: str) -> Mapping[str, object]:
    """``v``, a JSON object, as a mapping; a ValueError naming ``what`` otherwise."""
    if not isinstance(v, Mapping):
        raise ValueError(f"{what} is not a mapping: {v!r}")
    return v


def design_of(study: Mapping[str, object]) -> tuple[list[tuple[str, tuple[str, str]]], tuple[str, ...]]:
    """``(factors, cells)`` of a factorial study's summary."""
    if "factors" not in study:
        return DEFAULT_FACTORS, DEFAULT_CELLS
    factors = []
    for item in _list(study["factors"], "factors"):
        f, levels = _list(item, "a factor")
        lv = _list(levels, f"factor {f}'s levels")
        factors.append((str(f), (str(lv[0]), str(lv[1]))))
    return factors, tuple(str(c) for c in _list(study["cells"], "cells"))


def arms_by_cell(study: Mapping[str, object]) -> dict[str, str]:
    """Each cell's arm (the default 2x2's cells are its arms)."""
    _, cells = design_of(study)
    if "factors" not in study:
        return {c: c for c in cells}
    return dict(zip(cells, (str(a) for a in _list(study["arms"], "arms"))))


def effect_names(factors: Sequence[tuple[str, tuple[str, str]]]) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, factor indices)`` of every effect: main effects (``<second level>_<factor>``, e.g.
    ``bucketed_norms``) in factor order, then interactions by order (``interaction`` in a 2x2,
    ``interaction_<factor>_<factor>...`` with three factors)."""
    out: list[tuple[str, tuple[int, ...]]] = [
        (f"{levels[1]}_{name}", (j,)) for j, (name, levels) in enumerate(factors)
    ]
    for size in range(2, len(factors) + 1):
        for subset in combinations(range(len(factors)), size):
            label = (
                "interaction"
                if len(factors) == 2
                else "interaction_" + "_".join(factors[j][0] for j in subset)
            )
            out.append((label, subset))
    return out


def _difference(logs: Sequence[float], subset: Sequence[int], cell: int) -> float:
    """The difference of differences over ``subset``'s factors, the other factors as in ``cell``:
    for one factor ``j``, ``l(j second) - l(j first)``; for more, the last factor's second level's
    difference of the rest minus its first level's."""
    if not subset:
        return logs[cell]
    j = subset[-1]
    return _difference(logs, subset[:-1], cell | 1 << j) - _difference(logs, subset[:-1], cell & ~(1 << j))


def block_effects(logs: Sequence[float], k: int) -> list[float]:
    """One block's effects (in :func:`effect_names` order) on log training time ``logs`` (by cell).

    Effect of a set ``S`` of factors: its difference of differences (:func:`_difference`), averaged
    over the levels of the other factors (``2^(k - |S|)`` combinations, in standard order). In a 2x2
    with cells ``n, b, p, c`` (``l = ln time``): main effects ``((l_b - l_n) + (l_c - l_p)) / 2`` and
    ``((l_p - l_n) + (l_c - l_b)) / 2``, interaction ``(l_c - l_p) - (l_b - l_n)``. Negative: the
    second levels make the step faster.
    """
    out = []
    for _, subset in effect_names([("f", ("a", "b"))] * k):
        mask = sum(1 << j for j in subset)
        rest = [c for c in range(2**k) if c & mask == 0]
        out.append(sum(_difference(logs, subset, c) for c in rest) / len(rest))
    return out


def factorial_effects(
    blocks: Rows[Mapping[str, float]], factors: Sequence[tuple[str, tuple[str, str]]], cells: Sequence[str]
) -> dict[str, PairedInterval]:
    """Within-block effects on log training time (:func:`block_effects`) over blocks ``{cell: time}``,
    each averaged over blocks with a Student-t interval at the blocks' level (:meth:`.Rows.mean`);
    ``100 (1 - exp(effect))`` is the time reduction in percent."""
    per: list[list[float]] = [block_effects([math.log(b[c]) for c in cells], len(factors)) for b in blocks]
    return {
        name: blocks.mean([row[i] for row in per], "log_contrast")
        for i, (name, _) in enumerate(effect_names(factors))
    }


def factorial_contrasts(blocks: Rows[Mapping[str, float]]) -> dict[str, PairedInterval]:
    """Within-block contrasts of log training time over the study's 2x2 blocks.

    For each block with cells ``n`` (native), ``b`` (bucketed norms), ``p`` (packed AdamW) and
    ``c`` (both), on ``l = ln(time)``:

    * bucketed norms main effect: ``((l_b - l_n) + (l_c - l_p)) / 2``
    * packed AdamW main effect: ``((l_p - l_n) + (l_c - l_b)) / 2``
    * interaction: ``(l_c - l_p) - (l_b - l_n)``

    Each is averaged over blocks with a Student-t interval at the blocks' level. Negative
    values mean the change makes the step faster; ``100 (1 - exp(effect))`` is the time reduction
    in percent. Any declared design: :func:`factorial_effects`.
    """
    return factorial_effects(blocks, DEFAULT_FACTORS, DEFAULT_CELLS)


def cell_index(spec: Mapping[str, object], factors: Sequence[Sequence[object]]) -> int:
    """A cell's place in standard order (the rule's one home): bit ``j`` is set where the cell takes
    the second level of factor ``j``. ``spec`` maps each factor's name to the cell's level (its
    levels already checked); ``factors`` is ``[(name, (first, second)), ...]`` in declared order."""
    return sum(
        1 << j
        for j, (f, levels) in enumerate(factors)
        if spec[str(f)] == _list(levels, f"factor {f}'s levels")[1]
    )


def from_yaml(
    st: Mapping[str, object],
) -> tuple[list[list[object]], list[str | None], list[str | None], bool]:
    """``(factors, cells, arms, declared)`` of a study as its protocol file writes it (the summary's
    form: ``[[name, [first, second]], ...]``; a cell no declared cell takes stays ``None``)."""
    if "factors" not in st:
        factors: list[list[object]] = [[f, list(levels)] for f, levels in DEFAULT_FACTORS]
        return factors, list(DEFAULT_CELLS), list(DEFAULT_CELLS), False
    factors = [
        [f, list(_list(levels, f"factor {f}'s levels"))]
        for f, levels in _mapping(st["factors"], "factors").items()
    ]
    n = 2 ** len(factors)
    cells: list[str | None] = [None] * n
    arms: list[str | None] = [None] * n
    for name, spec in _mapping(st["cells"], "cells").items():
        cell = _mapping(spec, f"cell {name}")
        i = cell_index(cell, factors)
        cells[i], arms[i] = name, str(cell.get("arm", name))
    return factors, cells, arms, True


def williams(n: int) -> list[tuple[int, ...]]:
    """Williams square of even order ``n``: row ``r``, column ``c``: ``(r + w_c) mod n`` with
    ``w = 0, 1, n-1, 2, n-2, ...`` (``w_c = (c + 1) // 2`` for odd ``c``, ``n - c // 2`` for even ``c > 0``)."""
    w = [0 if c == 0 else ((c + 1) // 2 if c % 2 else n - c // 2) for c in range(n)]
    return [tuple((r + x) % n for x in w) for r in range(n)]

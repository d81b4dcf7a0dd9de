"""Factorial designs, re-derived from the protocol file: cells in standard order, Williams rows, effects.

Standard order: cell ``i`` has factor ``j`` at its second level exactly when bit ``j`` of ``i`` is
set (the first factor alternates fastest). A factorial study without ``factors`` is the study's 2x2
(norms ``scalar``/``bucketed`` by AdamW ``native``/``packed``; cells native, bucketed, packed,
cotangent). Effects are written here as signed sums (``harness``/``analysis`` nest differences):
the effect of a set ``S`` of factors in a block is ``sum_i s_S(i) l_i / 2^(k - |S|)``, with
``s_S(i) = prod_{j in S} (+1 if bit j of i else -1)`` and ``l_i`` the cell's log training time.
"""

from __future__ import annotations

from itertools import combinations

DEFAULT_FACTORS = [["norms", ["scalar", "bucketed"]], ["adamw", ["native", "packed"]]]
DEFAULT_CELLS = ["native", "bucketed", "packed", "cotangent"]


def from_yaml(st: dict) -> tuple[list, list, list, bool]:
    """``(factors, cells, arms, declared)`` of a study as its protocol file writes it."""
    if "factors" not in st:
        return DEFAULT_FACTORS, DEFAULT_CELLS, DEFAULT_CELLS, False
    factors = [[f, list(levels)] for f, levels in st["factors"].items()]
    n = 2 ** len(factors)
    cells: list = [None] * n
    arms: list = [None] * n
    for name, spec in st["cells"].items():
        i = sum((1 << j) if spec[f] == levels[1] else 0 for j, (f, levels) in enumerate(factors))
        cells[i], arms[i] = name, spec.get("arm", name)
    return factors, cells, arms, True


def from_summary(st: dict) -> tuple[list, list, list]:
    """``(factors, cells, arms)`` of a study as the records' protocol summary says it."""
    if "factors" not in st:
        return DEFAULT_FACTORS, DEFAULT_CELLS, DEFAULT_CELLS
    return st["factors"], st["cells"], st["arms"]


def williams(n: int) -> list[tuple[int, ...]]:
    """Williams square of even order ``n``: row ``r``, column ``c``: ``(r + w_c) mod n`` with
    ``w = 0, 1, n-1, 2, n-2, ...`` (``w_c = (c + 1) // 2`` for odd ``c``, ``n - c // 2`` for even ``c > 0``)."""
    w = [0 if c == 0 else ((c + 1) // 2 if c % 2 else n - c // 2) for c in range(n)]
    return [tuple((r + x) % n for x in w) for r in range(n)]


def effects(factors: list) -> list[tuple[str, tuple[int, ...]]]:
    """Effect names and their factors: ``<second level>_<factor>``; ``interaction`` (2 factors) or
    ``interaction_<f>_<g>...``."""
    out: list[tuple[str, tuple[int, ...]]] = [
        (f"{levels[1]}_{name}", (j,)) for j, (name, levels) in enumerate(factors)
    ]
    for size in range(2, len(factors) + 1):
        for s in combinations(range(len(factors)), size):
            out.append(
                (
                    "interaction"
                    if len(factors) == 2
                    else "interaction_" + "_".join(factors[j][0] for j in s),
                    s,
                )
            )
    return out


def block_effect(logs: list[float], subset: tuple[int, ...], k: int) -> float:
    total = 0.0
    for i, x in enumerate(logs):
        sign = 1
        for j in subset:
            sign *= 1 if (i >> j) & 1 else -1
        total += sign * x
    return total / 2 ** (k - len(subset))

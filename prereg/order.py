"""Order diagnostics in every report: period and carry-over in AB/BA pairs, drift over execution
order, and the position effect in Williams-balanced factorial blocks.

Standard library alone: the one home of these diagnostics, which the summary and the audit both call
(``tests/test_decisions.py`` checks them against scipy and statsmodels). All values are on the log scale of training time (``ln(c / b)`` per pair), so effects read as
ratios; ``exp(x)`` is the factor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prereg.descriptive import Rows, TResult
from prereg.hypotheses import Pair, PairRow, typed_pairs
from prereg.tdist import f_sf, student_t_sf

#: A configuration's pairs at its study's interval level.
Pairs = Rows[Pair | PairRow]
#: A factorial block's row: its unit, seed, order of cells and each cell's ``<cell>_training_s``.
Block = Mapping[str, object]


def block_time(block: Block, cell: str) -> float:
    """A block's training time of ``cell`` (a finite number: a block is complete when used)."""
    v = block[f"{cell}_training_s"]
    if not isinstance(v, (int, float)):
        raise ValueError(f"block {block.get('unit')}: {cell}_training_s is not a number")
    return float(v)


def block_order(block: Block) -> list[str]:
    """A block's cells in the order they ran."""
    order = block["order"]
    if not isinstance(order, list):
        raise ValueError(f"block {block.get('unit')}: order is not a list")
    return [str(c) for c in order]


def mean_ss(x: Sequence[float]) -> tuple[float, float]:
    """The mean of ``x`` and the sum of squared deviations from it."""
    m = math.fsum(x) / len(x)
    return m, math.fsum((v - m) ** 2 for v in x)


@dataclass(frozen=True)
class TwoGroups(TResult):
    """A pooled two-sample t result (:func:`two_groups`): its estimate, standard error, degrees of
    freedom and level, the two-sided p-value and the two groups' sizes."""

    p_value: float
    n: tuple[int, int]

    def as_dict(self) -> dict[str, object]:
        """As the summary holds it."""
        low, high = self.interval()
        return {
            "estimate": self.estimate,
            "standard_error": self.standard_error,
            "low": low,
            "high": high,
            "df": self.df,
            "level": self.level,
            "p_value": self.p_value,
            "n": list(self.n),
        }


def two_groups(a: Sequence[float], b: Sequence[float], half: bool, at: Rows[object]) -> TwoGroups:
    """Pooled two-sample t: estimate ``(mean_a - mean_b)`` (halved when ``half``), its interval at
    ``at``'s level, two-sided p."""
    n1, n2 = len(a), len(b)
    m1, ss1 = mean_ss(a)
    m2, ss2 = mean_ss(b)
    df = n1 + n2 - 2
    sp2 = (ss1 + ss2) / df
    k = 0.5 if half else 1.0
    est = k * (m1 - m2)
    se = k * math.sqrt(sp2 * (1 / n1 + 1 / n2))
    p = 2 * student_t_sf(abs(est / se), df) if se > 0 else (1.0 if est == 0 else 0.0)
    return TwoGroups(est, se, df, at.level, p, (n1, n2))


def crossover(pairs: Pairs) -> dict[str, object] | None:
    """Period effect and treatment-by-period check of the AB/BA pairs (log training time).

    Notes
    -----
    With ``d = ln c - ln b`` per pair, AB the pairs that ran the baseline first and BA the others:
    period effect (second run minus first) ``(mean d_AB - mean d_BA) / 2``; treatment-by-period
    (carry-over) check: the pooled two-sample t test of the per-pair sums ``ln b + ln c`` between
    the two sequences (Grizzle 1965; Jones & Kenward, 3rd ed., 2.3-2.5). ``None`` unless each
    sequence has at least two pairs.
    """
    typed = typed_pairs(pairs.rows)
    ab = [p for p in typed if p.first == "baseline"]
    ba = [p for p in typed if p.first != "baseline"]
    if len(ab) < 2 or len(ba) < 2:
        return None

    def d(p: Pair) -> float:
        return p.log_ratio()

    def s(p: Pair) -> float:
        return math.log(p.value("candidate", "training_s")) + math.log(p.value("baseline", "training_s"))

    return {
        "period": two_groups([d(p) for p in ab], [d(p) for p in ba], True, pairs).as_dict(),
        "carryover": two_groups([s(p) for p in ab], [s(p) for p in ba], False, pairs).as_dict(),
    }


def drift(pairs: Pairs) -> dict[str, object] | None:
    """Least-squares slope of ``ln(c / b)`` against the pair's position in execution order.

    Notes
    -----
    ``x`` is the pair's plan order (its first run's ``order``), ``y = ln(c/b)``; slope
    ``b1 = Sxy / Sxx``, residual variance ``s^2 = sum(e^2) / (n - 2)``, ``se = s / sqrt(Sxx)``,
    Student t with ``n - 2`` df. A non-zero slope means the arms' difference changes as the study
    runs (a machine warming up affects the arms unequally). ``None`` below three pairs.
    """
    if len(pairs) < 3:
        return None
    typed = typed_pairs(pairs.rows)
    x = [float(p.order or 0) for p in typed]
    y = [p.log_ratio() for p in typed]
    mx, sxx = mean_ss(x)
    my = math.fsum(y) / len(y)
    if sxx == 0:
        return None
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(x, y))
    b1 = sxy / sxx
    b0 = my - b1 * mx
    df = len(x) - 2
    s2 = math.fsum((b - b0 - b1 * a) ** 2 for a, b in zip(x, y)) / df
    se = math.sqrt(s2 / sxx)
    low, high = pairs.t(b1, se, df).interval()
    p = 2 * student_t_sf(abs(b1 / se), df) if se > 0 else (1.0 if b1 == 0 else 0.0)
    return {
        "slope": b1,
        "intercept": b0,
        "standard_error": se,
        "low": low,
        "high": high,
        "df": df,
        "level": pairs.level,
        "p_value": p,
        "points": [[a, b] for a, b in zip(x, y)],
    }


def positions(blocks: Rows[Block], cells: Sequence[str]) -> list[dict[str, object]] | None:
    """Effect of the position in the Williams square on log training time.

    Notes
    -----
    Within each block, a cell's residual is ``ln t - mean over the block's cells of ln t``; for each
    position (1 to 4) the residuals of the cells that ran there are averaged over blocks with a
    Student-t interval. Balanced orders make these cancel in the factorial contrasts; a large
    position effect still says the device changed state within a block. ``None`` below two blocks.
    """
    if len(blocks) < 2:
        return None
    out: list[dict[str, object]] = []
    for pos in range(len(cells)):
        res = []
        for b in blocks:
            logs = {c: math.log(block_time(b, c)) for c in cells}
            centre = math.fsum(logs.values()) / len(cells)
            res.append(logs[block_order(b)[pos]] - centre)
        m, ss = mean_ss(res)
        se = math.sqrt(ss / (len(res) - 1) / len(res))
        low, high = blocks.t(m, se, len(res) - 1).interval()
        out.append(
            {
                "position": pos + 1,
                "estimate": m,
                "standard_error": se,
                "low": low,
                "high": high,
                "df": len(res) - 1,
                "level": blocks.level,
            }
        )
    return out


def by_device(pairs: Pairs) -> dict[str, object] | None:
    """Per device (host / device name), the mean of ``ln(c / b)`` with its interval, and a
    heterogeneity check when more than one device contributed pairs.

    Notes
    -----
    Every pair runs within one device, so the pooled estimate averages within-device differences.
    Heterogeneity: one-way analysis of variance of the per-pair ``ln(c/b)`` across devices,
    ``F = (SS_between / (k - 1)) / (SS_within / (N - k))``, p from the F distribution with
    ``(k - 1, N - k)`` degrees of freedom. ``None`` when only one device contributed.
    """
    groups: dict[str, list[float]] = {}
    for p in typed_pairs(pairs.rows):
        groups.setdefault(str(p.device), []).append(p.log_ratio())
    if len(groups) < 2:
        return None
    rows = []
    for dev in sorted(groups):
        v = groups[dev]
        m, ss = mean_ss(v)
        row: dict[str, object] = {"device": dev, "pairs": len(v), "estimate": m, "low": None, "high": None}
        if len(v) >= 2:
            se = math.sqrt(ss / (len(v) - 1) / len(v))
            low, high = pairs.t(m, se, len(v) - 1).interval()
            row.update(low=low, high=high)
        rows.append(row)
    allv = [x for v in groups.values() for x in v]
    grand = math.fsum(allv) / len(allv)
    k, n = len(groups), len(allv)
    ssb = math.fsum(len(v) * (math.fsum(v) / len(v) - grand) ** 2 for v in groups.values())
    ssw = math.fsum(mean_ss(v)[1] for v in groups.values())
    het = None
    if n > k and ssw > 0:
        f = (ssb / (k - 1)) / (ssw / (n - k))
        het = {"F": f, "df": [k - 1, n - k], "p_value": f_sf(f, k - 1, n - k)}
    return {"devices": rows, "heterogeneity": het}

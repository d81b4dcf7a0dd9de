"""Group-sequential designs, with the standard library alone: alpha spending, the efficacy
boundaries it gives, their crossing probabilities, and the family's decisions look by look. Their
one home: ``harness run`` (the stop at a look), the summary and the audit all call these.

A protocol declares ``sequential: {looks: [n_1, ..., n_K], spending: obrien_fleming | pocock,
futility_z: z}`` in its ``hypotheses`` block. Look ``k`` is taken when the first ``n_k`` pairs (seed
indices ``0 .. n_k - 1``, every configuration) of every study a hypothesis names are final,
never "the first ``n_k`` to finish"; ``n_K`` is the planned number of pairs.

The statistics
--------------
Information fraction ``t_k = n_k / n_K``. The Lan-DeMets spending function ``a(t)`` (Lan & DeMets
1983, *Biometrika* 70:659) spends, at level ``alpha`` (one-sided):

* ``obrien_fleming``: ``a(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))``;
* ``pocock``: ``a(t) = alpha ln(1 + (e - 1) t)``.

The efficacy boundary ``c_k`` on the Z scale solves ``P0(Z_1 < c_1, ..., Z_{k-1} < c_{k-1},
Z_k >= c_k) = a(t_k) - a(t_{k-1})`` for the canonical joint distribution of the cumulative
statistics (``Z_k sqrt(t_k)`` a Brownian motion at times ``t_k``), by the recursive numerical
integration of Armitage, McPherson & Rowe (1969) as Jennison & Turnbull (2000, *Group Sequential
Methods*, ch. 19) give it (:func:`boundaries`). The boundaries ignore futility: a futility stop
is non-binding, so stopping for futility, or not, never raises the error rate.

Each look decides on the tests the protocol declares (t, sign or signed-rank, on the pairs so
far) by their p-values against the nominal level ``1 - Phi(c_k)`` (the significance-level approach
for statistics that are not normal: Jennison & Turnbull 2000, 3.8 and 11.4; its error rate by
simulation in ``benchmarks/coverage.py --sequential``). The family's error is controlled by the
graphical approach for group-sequential designs (Maurer & Bretz 2013, *Stat. Biopharm. Res.*
5:311), which reduces to the protocol's procedure: ``holm`` starts each of ``m`` hypotheses at
``alpha / m`` and gives an established hypothesis' level to the others equally; ``fixed_sequence``
starts the first at ``alpha`` and passes it on in order. A hypothesis whose level rises is
tested again, at every look so far, against the boundaries of its new level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

_N = NormalDist()
#: Spending functions a protocol may name.
SPENDING = ("obrien_fleming", "pocock")
#: Grid points of the recursive integration per look (odd: Simpson's rule).
GRID = 401
#: The integration's lower end, in standard deviations below the mean.
WIDTH = 9.0
#: A boundary that spends nothing (a look with no alpha to spend): no statistic crosses it.
NEVER = 40.0


def upper_tail(z: float) -> float:
    """``1 - Phi(z)``, accurate in the far tail (``erfc``)."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def spent(spending: str, alpha: float, t: float) -> float:
    """The alpha spent by information fraction ``t`` (0 < t <= 1): :data:`SPENDING`'s functions."""
    if t <= 0:
        return 0.0
    t = min(t, 1.0)
    if spending == "obrien_fleming":
        return 2.0 * upper_tail(_N.inv_cdf(1.0 - alpha / 2.0) / math.sqrt(t))
    if spending == "pocock":
        return alpha * math.log1p((math.e - 1.0) * t)
    raise ValueError(f"spending: {spending!r} is not one of {', '.join(SPENDING)}")


def _simpson(lo: float, hi: float) -> tuple[list[float], list[float]]:
    """Simpson's rule on ``[lo, hi]``: its :data:`GRID` points and weights."""
    h = (hi - lo) / (GRID - 1)
    xs = [lo + i * h for i in range(GRID)]
    ws = [h / 3.0 * (1 if i in (0, GRID - 1) else 4 if i % 2 else 2) for i in range(GRID)]
    return xs, ws


@dataclass(frozen=True)
class Crossing:
    """The boundaries' crossing probabilities at drift ``theta``: ``P(first crossing at look k)``."""

    at: tuple[float, ...]

    @property
    def total(self) -> float:
        return math.fsum(self.at)


#: The previous look's grid: its points, the density there and the integration weights.
_Grid = tuple[list[float], list[float], list[float]]


def _cross(c: float, k: int, t: float, dt: float, theta: float, grid: _Grid) -> float:
    """``P(S_{k-1}`` continues and ``S_k >= c sqrt(t))``, over the previous look's density on its grid."""
    edge = c * math.sqrt(t)
    if k == 0:
        return upper_tail((edge - theta * t) / math.sqrt(t))
    xs, dens, ws = grid
    sd = math.sqrt(dt)
    return math.fsum(w * f * upper_tail((edge - x - theta * dt) / sd) for x, f, w in zip(xs, dens, ws))


def _recursion(
    times: Sequence[float], bounds: Sequence[float] | None, targets: Sequence[float] | None, theta: float
) -> tuple[list[float], list[float]]:
    """The recursion over looks, on the score ``S_k = Z_k sqrt(t_k)`` (independent increments
    ``N(theta dt, dt)``). Given ``bounds``, the crossing probabilities; given ``targets`` (alpha to
    spend per look, at ``theta``), the bounds that spend them. Returns (bounds, crossings)."""
    out_b: list[float] = []
    out_p: list[float] = []
    xs: list[float] = []
    dens: list[float] = []
    ws: list[float] = []
    prev = 0.0
    for k, t in enumerate(times):
        dt = t - prev
        sd = math.sqrt(dt)

        grid = (xs, dens, ws)

        def cross(c: float, k: int = k, t: float = t, dt: float = dt, grid: _Grid = grid) -> float:
            return _cross(c, k, t, dt, theta, grid)

        if targets is not None:
            want = targets[k]
            if want <= 0:
                c = NEVER
            else:
                lo, hi = -10.0, NEVER
                for _ in range(200):  # bisection to adjacent doubles: the same bits in every caller
                    mid = 0.5 * (lo + hi)
                    if mid in (lo, hi):
                        break
                    if cross(mid) > want:
                        lo = mid
                    else:
                        hi = mid
                c = hi
        else:
            assert bounds is not None
            c = bounds[k]
        out_b.append(c)
        out_p.append(cross(c))
        # the density of S_k on the continuation region S_k < c sqrt(t)
        mean, top = theta * t, c * math.sqrt(t)
        lo_s = min(mean - WIDTH * math.sqrt(t), top - 1e-9)
        nx, nw = _simpson(lo_s, top)
        if k == 0:
            nd = [math.exp(-0.5 * ((x - mean) / sd) ** 2) / (sd * math.sqrt(2 * math.pi)) for x in nx]
        else:
            norm = 1.0 / (sd * math.sqrt(2 * math.pi))
            nd = [
                norm
                * math.fsum(
                    w * f * math.exp(-0.5 * ((y - x - theta * dt) / sd) ** 2) for x, f, w in zip(xs, dens, ws)
                )
                for y in nx
            ]
        xs, dens, ws, prev = nx, nd, nw, t
    return out_b, out_p


def boundaries(times: Sequence[float], alpha: float, spending: str) -> list[float]:
    """The efficacy boundaries ``c_1 .. c_K`` (Z scale) that spend ``spending``'s alpha at ``times``.

    Parameters
    ----------
    times : sequence of float
        Information fractions ``0 < t_1 < ... < t_K = 1``.
    alpha : float
        The one-sided level to spend (a hypothesis' share of the family's alpha).
    spending : str
        ``obrien_fleming`` or ``pocock`` (:func:`spent`).

    Notes
    -----
    ``c_1 = Phi^{-1}(1 - a(t_1))`` exactly; each later ``c_k`` by bisection on the crossing
    probability given the earlier boundaries (:func:`crossing`), which Simpson's rule on
    :data:`GRID` points per look integrates (accurate to about ``1e-9`` in probability; tests check
    Jennison & Turnbull's published constants and a simulation).
    """
    check_times(times)
    inc, prev = [], 0.0
    for t in times:
        a = spent(spending, alpha, t)
        inc.append(a - prev)
        prev = a
    return _recursion(times, None, inc, 0.0)[0]


def crossing(times: Sequence[float], bounds: Sequence[float], theta: float = 0.0) -> Crossing:
    """``P(the first crossing is at look k)`` for the boundaries at drift ``theta`` (``Z_k`` has mean
    ``theta sqrt(t_k)``: ``theta`` is the standardised effect at full information, ``delta sqrt(n_K) / sd``)."""
    check_times(times)
    return Crossing(tuple(_recursion(times, bounds, None, theta)[1]))


def check_times(times: Sequence[float]) -> None:
    if not times or any(not 0 < t <= 1 for t in times) or any(b <= a for a, b in zip(times, times[1:])):
        raise ValueError(f"information fractions increase within (0, 1]: {list(times)}")
    if abs(times[-1] - 1.0) > 1e-12:
        raise ValueError(f"the last look is at full information (1), not {times[-1]}")


def nominal_levels(looks: Sequence[int], alpha: float, spending: str) -> list[float]:
    """Each look's nominal one-sided level ``1 - Phi(c_k)`` for pair counts ``looks`` at ``alpha``
    (kept per design: a pure function of its arguments)."""
    return list(_nominal(tuple(looks), alpha, spending))


@lru_cache(maxsize=256)
def _nominal(looks: tuple[int, ...], alpha: float, spending: str) -> tuple[float, ...]:
    n = looks[-1]
    return tuple(upper_tail(c) for c in boundaries([k / n for k in looks], alpha, spending))


def looks_problems(
    spec: object, planned: Sequence[int], min_pairs: int = 3, studies: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """What is wrong with a ``sequential`` block as ``(key, message)`` pairs, given each
    hypothesis study's planned pairs, the family's ``min_pairs`` and the studies its hypotheses
    name: hypotheses over more than one study (their looks would wait on each other's pairs),
    looks that are not increasing whole numbers of at least ``min_pairs`` (a look where no
    hypothesis can be reached spends alpha for nothing) ending at the planned pairs, a spending function not in :data:`SPENDING`, a futility bound that
    is not a finite number, keys it does not know."""
    if not isinstance(spec, dict):
        return [("sequential", "a mapping: {looks: [n_1, ..., n_K], spending: obrien_fleming | pocock}")]
    out: list[tuple[str, str]] = []
    unknown = sorted(set(spec) - {"looks", "spending", "futility_z"})
    if unknown:
        out.append((unknown[0], f"unknown key {unknown[0]!r} (looks, spending, futility_z)"))
    looks = spec.get("looks")
    if (
        not isinstance(looks, list)
        or len(looks) < 2
        or any(isinstance(x, bool) or not isinstance(x, int) for x in looks)
        or looks[0] < 3
        or any(b <= a for a, b in zip(looks, looks[1:]))
    ):
        out.append(("looks", "at least two increasing pair counts, the first at least 3"))
    elif looks[0] < min_pairs:
        out.append(
            ("looks", f"the first look, at {looks[0]} pairs, is below the family's min_pairs {min_pairs}")
        )
    elif any(p != looks[-1] for p in planned):
        out.append(
            (
                "looks",
                f"the last look is the planned number of pairs: {looks[-1]} is not the seeds of "
                f"every hypothesis' study ({', '.join(map(str, sorted(set(planned))))})",
            )
        )
    if len(set(studies)) > 1:
        out.append(
            (
                "sequential",
                f"a sequential design's hypotheses name one study, not {len(set(studies))} "
                f"({', '.join(sorted(set(studies)))}): its looks are that study's pairs",
            )
        )
    if spec.get("spending") not in SPENDING:
        out.append(("spending", f"{spec.get('spending')!r} is not one of {', '.join(SPENDING)}"))
    fut = spec.get("futility_z")
    if fut is not None and (
        isinstance(fut, bool) or not isinstance(fut, (int, float)) or not math.isfinite(fut)
    ):
        out.append(("futility_z", "a finite z value (stop for futility below it), or leave it out"))
    return out

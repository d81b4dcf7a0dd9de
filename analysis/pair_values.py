"""Per-pair values on a hypothesis' test scale, from the used pairs' rows: the endpoint's two values
checked (finite, positive for ratios; a null or non-finite one makes the hypothesis "not reached",
naming the pair), restricted mean times and worst-rank scores for time to target, and the unreached
counts. :mod:`analysis.decisions` tests these values; its docstring states the sign convention.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from analysis.preregistration import Hypothesis
from analysis.ranks import median, worst_rank_differences
from analysis.stats import rounding_scale
from analysis.ttests import scale

__all__ = ["ENDPOINT_KEYS", "NotReached", "values_and_scales", "values_of", "worst_rank_estimate"]

ENDPOINT_KEYS = {
    "training_time": "training_s",
    "time_to_target": "time_to_target_s",
    "total_time": "total_s",
    "test_bpb": "test_bpb",
    "peak_memory": "peak_memory_bytes",
}


class NotReached(ValueError):
    """The data cannot decide a hypothesis; the message is the reason."""


def _number(p: dict[str, Any], role: str, key: str, positive: bool) -> float:
    v = p[f"{role}_{key}"]
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or (positive and v <= 0)
    ):
        what = "null" if v is None else f"{v!r}, not a finite{' positive' if positive else ''} number"
        raise NotReached(f"pair {p.get('unit', '?')}: the {role}'s {key} is {what} in an ok record")
    return float(v)


def _restricted(h: Hypothesis, pairs: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """Restricted times ``min(T, tau)`` of both arms, one restriction ``tau`` per pair for both arms.

    ``tau`` is the hypothesis' ``restriction_s`` or, by default, the shorter of the pair's two
    training times (both fixed-step runs were observed that long, so ``min(T, tau)`` is known
    for both arms with no imputation: an unreached arm has ``T > tau``). The decision then
    compares restricted mean times (Royston & Parmar 2013, *BMC Med. Res. Methodol.* 13:152).
    """
    b: list[float] = []
    c: list[float] = []
    for p in pairs:
        train = {r: _number(p, r, "training_s", True) for r in ("baseline", "candidate")}
        tau = h.restriction_s or min(train.values())
        for role, out in (("baseline", b), ("candidate", c)):
            t = p[f"{role}_time_to_target_s"]
            if t is None:
                if train[role] < tau:
                    raise NotReached(
                        f"pair {p.get('unit', '?')}: the {role} missed the target after training "
                        f"{train[role]:.6g} s, less than the restriction {tau:g} s: its restricted "
                        "time is unknown"
                    )
                out.append(tau)
            else:
                out.append(min(_number(p, role, "time_to_target_s", True), tau))
    return b, c


def values_of(
    h: Hypothesis | Mapping[str, Any], pairs: list[dict[str, Any]]
) -> tuple[list[float], dict[str, int] | None]:
    """Per-pair values on the hypothesis' test scale, and the unreached counts for time to target.

    Raises :class:`NotReached` naming the pair, arm and key of a null or non-finite endpoint.
    """
    values, _scales, unreached = values_and_scales(Hypothesis.of(h), pairs)
    return values, unreached


def values_and_scales(
    h: Hypothesis, pairs: list[dict[str, Any]]
) -> tuple[list[float], list[float] | None, dict[str, int] | None]:
    """:func:`values_of` and, but for worst-rank scores, each value's :func:`rounding_scale`.

    Parameters
    ----------
    h : Hypothesis
        The hypothesis: its endpoint, estimand and censoring rule say which values.
    pairs : list of dict
        The used pairs' rows (:func:`analysis.summary.derive`).

    Returns
    -------
    values : list of float
        One value per pair on the test scale (``c - b`` or ``ln c - ln b``; worst-rank scores).
    scales : list of float or None
        Each value's rounding scale (:func:`analysis.stats.rounding_scale`); ``None`` for worst-rank
        scores, which the signed-rank test takes.
    unreached : dict or None
        For time to target, how many baseline, candidate and both arms missed the target.

    Raises
    ------
    NotReached
        Naming the pair, arm and key of a null or non-finite endpoint, or a restricted time that
        is unknown.
    """
    key = ENDPOINT_KEYS[h.endpoint]
    ratio = scale(h.estimand) == "log_ratio"
    unreached = None
    if h.endpoint == "time_to_target":
        raw = {r: [p[f"{r}_{key}"] for p in pairs] for r in ("baseline", "candidate")}
        unreached = {
            "baseline": raw["baseline"].count(None),
            "candidate": raw["candidate"].count(None),
            "both": sum(x is None and y is None for x, y in zip(raw["baseline"], raw["candidate"])),
        }
        for p in pairs:
            for role in ("baseline", "candidate"):
                if p[f"{role}_{key}"] is not None:
                    _number(p, role, key, True)
        if h.censoring == "worst_rank":
            return worst_rank_differences(raw["baseline"], raw["candidate"]), None, unreached
        b, c = _restricted(h, pairs)
    else:
        b = [_number(p, "baseline", key, ratio) for p in pairs]
        c = [_number(p, "candidate", key, ratio) for p in pairs]
    scales = rounding_scale(b, c, scale(h.estimand))
    if ratio:
        return [math.log(y) - math.log(x) for x, y in zip(b, c)], scales, unreached
    return [y - x for x, y in zip(b, c)], scales, unreached


def worst_rank_estimate(pairs: list[dict[str, Any]]) -> tuple[float | None, str]:
    """The estimate a worst-rank decision shows: the median log ratio where both arms reached the target.

    Parameters
    ----------
    pairs : list of dict
        The used pairs' rows.

    Returns
    -------
    estimate : float or None
        The median ``ln(c / b)`` of the pairs where both arms reached the target; ``None`` without one.
    what : str
        What the estimate is, for the decision's ``estimate_of``.
    """
    both = [
        math.log(p["candidate_time_to_target_s"]) - math.log(p["baseline_time_to_target_s"])
        for p in pairs
        if p["baseline_time_to_target_s"] is not None and p["candidate_time_to_target_s"] is not None
    ]
    return median(both), f"median ln(c/b) of the {len(both)} pairs where both arms reached the target"

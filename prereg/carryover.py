"""A lockstep study's order cells and carry-over, from the records' own step times (standard
library; the summary and the audit both call it).

**The order cells.** A lockstep pair has two orders: which arm was built first (its run's
``position`` 0) and which took the first block (``steps_first``). The plan crosses them, all four
cells in every group of four pairs. :func:`order_cells` fits the per-pair log ratio on them,
``d = mu + b_build x_build + b_step x_step + b_both x_build x_step + e`` with each ``x`` coded
``+1`` when the candidate is first and ``-1`` when the baseline is (R: ``lm(d ~ build * step)``
with ``contr.sum``); ``mu``, the mean of the four cell means, is the effect with the order
effects taken out, and its standard error is ``sqrt(s^2 sum_k 1/n_k) / 4`` with ``s^2`` the
pooled within-cell variance on ``n - 4`` degrees of freedom (:func:`cells_mean`). A hypothesis
declares this adjustment with ``period_adjusted: true`` on a lockstep study (a preregistered
covariate; for a process per arm the same key adjusts for the AB/BA period).

**Carry-over.** In ABBA order an arm's step follows either its partner's block or its own step.
:func:`carry_over` takes, per arm of each pair, the mean log step time of the steps that follow
the partner less that of the steps that follow its own (warm-up steps and the pair's very first
step left out), on both clocks; its mean over pairs, per role, with its t interval, is the cost of
stepping after the partner, and the candidate's less the baseline's is what it does to the
pair's ratio.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

from prereg.descriptive import PairedInterval, Rows

ROLES = ("baseline", "candidate")


def cells_mean(values: Sequence[float], cells: Sequence[tuple[int, int]]) -> tuple[float, float, int]:
    """The mean of the four cell means ``(estimate, se, df)`` (the module's text). Raises
    ValueError when a cell is empty or no degree of freedom is left."""
    groups: dict[tuple[int, int], list[float]] = {}
    for v, c in zip(values, cells):
        groups.setdefault(c, []).append(v)
    if len(groups) != 4:
        raise ValueError(f"the order cells need all four combinations; {len(groups)} have pairs")
    n = len(values)
    if n - 4 < 1:
        raise ValueError("the order cells need at least five pairs (n - 4 degrees of freedom)")
    means = {c: math.fsum(g) / len(g) for c, g in groups.items()}
    ss = math.fsum((v - means[c]) ** 2 for v, c in zip(values, cells))
    s2 = ss / (n - 4)
    se = math.sqrt(s2 * math.fsum(1 / len(g) for g in groups.values())) / 4
    return math.fsum(means.values()) / 4, se, n - 4


def _contrast(
    values: Sequence[float], cells: Sequence[tuple[int, int]], w: Callable[[tuple[int, int]], int]
) -> float:
    """A contrast of the cell means with coefficients ``w(cell)`` / 4 (the coefficient of the
    sum-coded model)."""
    groups: dict[tuple[int, int], list[float]] = {}
    for v, c in zip(values, cells):
        groups.setdefault(c, []).append(v)
    return math.fsum(w(c) * math.fsum(g) / len(g) for c, g in groups.items()) / 4


def _positive(row: Mapping[str, object], key: str) -> float | None:
    """``row[key]`` when it is a positive number, else ``None``."""
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def order_cells(pairs: Rows[Mapping[str, object]], key: str) -> dict[str, object] | None:
    """The order-cell model of one clock (``key``: ``training_s`` or ``training_cpu_s``) over a
    lockstep study's pairs (each with ``first``, ``steps_first`` and both arms' times): each
    coefficient with its two-sided interval at the pairs' level, in log-ratio units. None when the
    pairs do not fill the four cells with a degree of freedom left."""
    d: list[float] = []
    cells: list[tuple[int, int]] = []
    for p in pairs:
        b, c = _positive(p, f"baseline_{key}"), _positive(p, f"candidate_{key}")
        if p.get("steps_first") in ROLES and b is not None and c is not None:
            d.append(math.log(c / b))
            cells.append(
                (1 if p["first"] == "candidate" else -1, 1 if p["steps_first"] == "candidate" else -1)
            )
    try:
        mu, se, df = cells_mean(d, cells)
    except ValueError:
        return None
    out: dict[str, object] = {"pairs": len(d), "df": df, "level": pairs.level, "se": se}
    terms = {
        "effect": mu,
        "built_first": _contrast(d, cells, lambda c: c[0]),
        "steps_first": _contrast(d, cells, lambda c: c[1]),
        "interaction": _contrast(d, cells, lambda c: c[0] * c[1]),
    }
    # every coefficient of the sum-coded model shares the intercept's standard error (balanced or not,
    # each is a +-1/4 combination of the four cell means)
    for name, v in terms.items():
        lo, hi = pairs.t(v, se, df).interval()
        out[name] = {"estimate": v, "lo": lo, "hi": hi}
    return out


def blocks(steps: int, block_steps: int) -> Iterator[tuple[int, int]]:
    """A lockstep pair's blocks in order: ``(arm, steps)``, arm 0 the one that steps first, in ABBA
    order (0, 1, 1, 0, 0, 1, ...) until each arm has taken ``steps`` steps (the last block of each
    arm may be shorter). The one home of the order: the lockstep worker runs it, the carry-over reads
    it."""
    done = [0, 0]
    k = 0
    while done[0] < steps or done[1] < steps:
        arm = (0, 1, 1, 0)[k % 4]
        k += 1
        n = min(block_steps, steps - done[arm])
        if n > 0:
            done[arm] += n
            yield arm, n


def turns(steps: int, block_steps: int) -> Iterator[tuple[int, int]]:
    """:func:`blocks` with an arm's consecutive blocks joined into one turn: ``(arm, steps)``. At
    blocks of 1 the ABBA order is the steps ``A, B, B, A, A, B, ...``: each arm's second step of a
    turn follows its own step with nothing of its partner's run between (the lockstep worker checks
    the waiting arm once a turn, not once a block), which is what :func:`own_step_means` reads."""
    last, n = None, 0
    for arm, k in blocks(steps, block_steps):
        if arm == last:
            n += k
            continue
        if last is not None:
            yield last, n
        last, n = arm, k
    if last is not None:
        yield last, n


def own_step_means(times: Sequence[int], after: Sequence[bool | None], warmup: int) -> float | None:
    """An arm's mean step time over its timed steps that follow its own step (the steps a run of
    its own would take; :func:`follows`), or None when it has none.

    Notes
    -----
    The *after-own* estimand: with ``m_c`` and ``m_b`` the candidate's and the baseline's means, the
    pair's log ratio is ``ln(m_c / m_b)``, the ratio of the training times each arm would take
    running alone if a step's cost depends on the step before it and no earlier one (first-order
    carry-over, as crossover designs assume). The ABBA order at blocks of 1 makes half of each
    arm's steps follow its own, so the partner's carry-over, which the ratio of whole training
    times mixes in, is left out rather than balanced."""
    own = timed_steps(times, after, warmup, after_partner=False)
    return math.fsum(own) / len(own) if own else None


def timed_steps(
    times: Sequence[int], after: Sequence[bool | None], warmup: int, *, after_partner: bool
) -> list[int]:
    """An arm's step times past its ``warmup`` steps (a time recorded, above 0) of the steps that
    follow the partner's block (``after_partner``) or the arm's own step (:func:`follows`); the
    pair's first step follows neither. The one filter of :func:`own_step_means` and
    :func:`carry_over_of`."""
    return [t for i, (t, f) in enumerate(zip(times, after)) if i >= warmup and f is after_partner and t > 0]


def _mapping(v: object) -> Mapping[str, object]:
    """``v`` when it is a JSON object, else an empty one (a key a record may leave out)."""
    return v if isinstance(v, Mapping) else {}


def _int(v: object, what: str) -> int:
    """``v``, a record's whole number."""
    if not isinstance(v, int):
        raise ValueError(f"{what} is not a whole number: {v!r}")
    return v


def step_us(record: Mapping[str, object], field: str) -> list[int]:
    """A record's kept step times on one clock (``step_times.<field>``: ``wall_us``, ``cpu_us``),
    empty where it keeps none."""
    v = _mapping(record.get("step_times")).get(field)
    if not isinstance(v, list):
        return []
    return [_int(x, f"step_times.{field}") for x in v]


def own_step_columns(b: Mapping[str, object], c: Mapping[str, object]) -> dict[str, object]:
    """A lockstep pair's after-own columns (:func:`own_step_means`: ``baseline_own_step_us``,
    ``candidate_own_step_cpu_us``, ...), where its worker kept each step's time and ran an arm's
    consecutive blocks as one turn (``env.lockstep.turns``); none otherwise (records before the
    rule, other designs, command arms)."""
    out: dict[str, object] = {}
    for role, r in (("baseline", b), ("candidate", c)):
        lock = _mapping(_mapping(r.get("env")).get("lockstep"))
        spec = _mapping(r["spec"])
        if lock.get("turns") != "joined" or not step_us(r, "cpu_us") or not spec.get("block_steps"):
            return {}
        after = arm_follows(spec, _int(spec["block_steps"], "block_steps"))
        for clock, field in (("", "wall_us"), ("_cpu", "cpu_us")):
            out[f"{role}_own_step{clock}_us"] = own_step_means(
                step_us(r, field), after, _int(spec.get("warmup_steps") or 0, "warmup_steps")
            )
    return out


def follows(steps: int, block_steps: int) -> tuple[list[bool | None], list[bool | None]]:
    """For each step of the arm that steps first (0) and of the other (1), in :func:`blocks` order:
    True when it follows the partner's block, False when it follows its own step, None for the
    pair's first step (new lists, from :func:`_follows`)."""
    first, other = _follows(steps, block_steps)
    return list(first), list(other)


@functools.lru_cache(maxsize=64)
def _follows(steps: int, block_steps: int) -> tuple[tuple[bool | None, ...], tuple[bool | None, ...]]:
    """:func:`follows`, kept per ``(steps, block_steps)`` for the process: every record of a lockstep
    study asks for the same one (3360 times for records/cpu3, most of its carry-over's time)."""
    out: tuple[list[bool | None], list[bool | None]] = ([], [])
    last = None
    for arm, n in blocks(steps, block_steps):
        for _ in range(n):
            out[arm].append(None if last is None else last != arm)
            last = arm
    return tuple(out[0]), tuple(out[1])


def arm_follows(spec: Mapping[str, object], block_steps: int) -> list[bool | None]:
    """:func:`follows` for the arm whose run ``spec`` is: the first list when it stepped first
    (``steps_first``), the second otherwise."""
    return follows(_int(spec["steps"], "steps"), block_steps)[0 if spec.get("steps_first") else 1]


def carry_over_of(times: Sequence[int], after: Sequence[bool | None], warmup: int) -> float | None:
    """One arm's ``mean log t | after partner - mean log t | after own`` over its timed steps."""
    after_partner = [math.log(t) for t in timed_steps(times, after, warmup, after_partner=True)]
    after_own = [math.log(t) for t in timed_steps(times, after, warmup, after_partner=False)]
    if not after_partner or not after_own:
        return None
    return math.fsum(after_partner) / len(after_partner) - math.fsum(after_own) / len(after_own)


def carry_over(arms: Rows[Mapping[str, Mapping[str, object]]], block_steps: int) -> dict[str, object] | None:
    """The carry-over of a lockstep study (the module's text): ``arms`` one mapping per pair, role
    to record. Per clock (``wall``, ``CPU``) and role, the mean over pairs of each arm's carry-over
    with its interval, and the candidate's less the baseline's; None when no pair has step times."""
    out: dict[str, object] = {"block_steps": block_steps, "level": arms.level}
    for clock, field in (("wall", "wall_us"), ("CPU", "cpu_us")):
        per: dict[str, list[float]] = {r: [] for r in ROLES}
        diff: list[float] = []
        for pair in arms:
            got = {}
            for role in ROLES:
                r = pair[role]
                times = step_us(r, field)
                spec = _mapping(r["spec"])
                if not times:
                    break
                after = arm_follows(spec, block_steps)
                v = carry_over_of(times, after, _int(spec.get("warmup_steps") or 0, "warmup_steps"))
                if v is None:
                    break
                got[role] = v
            if len(got) == 2:
                for role in ROLES:
                    per[role].append(got[role])
                diff.append(got["candidate"] - got["baseline"])
        if len(diff) < 2:
            return None
        out[clock] = {role: _iv(arms.mean(per[role])) for role in ROLES} | {
            "candidate_less_baseline": _iv(arms.mean(diff)),
            "pairs": len(diff),
        }
    return out


def _iv(iv: PairedInterval) -> dict[str, float]:
    """An interval as the carry-over's entries hold it."""
    return {"estimate": iv.estimate, "lo": iv.low, "hi": iv.high}

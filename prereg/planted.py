"""Planted reference effects: a known cost added to a study's candidate arm, and what a design
recovers of it (the one home of the rule and the arithmetic; the harness's plan and parser, the
summary and the audit all call it).

A *planted* study is an A/A study (both arms the same) whose candidate also runs a plant inside
every timed training step, after the gradient phase:

* ``spin`` (``us``): a busy loop of ``us`` microseconds of the training thread's CPU time per
  step, clock-checked (it reads the thread's CPU clock until that much has passed). It touches
  no memory, so its cost does not depend on what the caches hold: its true effect is known by
  arithmetic (:func:`spin_truth`).
* ``matmul`` (``n``): one ``n`` x ``n`` float32 matrix product per step over buffers of the
  plant's own, the result discarded (built-in arms: torch). Its cost depends on the caches its
  buffers find, so its true effect is what it costs where nothing interleaves with it, measured
  (:func:`reference_study`).
* ``gather`` (``bytes``): a strided read of one byte per 64-byte cache line over a buffer of
  ``bytes`` bytes (standard library): over a buffer larger than the caches it evicts what they
  held, the partner's working set included.
* ``copy`` (``bytes``): a copy of a buffer of ``bytes`` bytes into another (standard library,
  one ``memmove``): memory bandwidth.
* ``alloc`` (``bytes``): a fresh zeroed buffer of ``bytes`` bytes each step, dropped at once
  (standard library): the allocator's churn (above the allocator's mapping threshold, a mapping
  and its page faults each step).
* ``sleep`` (``us``): ``us`` microseconds of wall time asleep (standard library): a wall-only cost,
  as I/O or a wait for data would be, which no CPU clock sees.

Each kind belongs to one *effect class* (:data:`CLASSES`), the class of training-speed change it
stands for: ``context-free`` (spin), ``cache-heavy`` (matmul, gather), ``bandwidth`` (copy),
``allocation`` (alloc) and ``wall-only`` (sleep). A design's bias is known per class.

``toggle_steps: K`` (built-in arms only) runs the plant in alternating blocks of ``K`` steps in
ABBA order (steps ``0..K-1`` without it, then ``2K`` with it, ``2K`` without, ...; :func:`toggled`):
a *truth study*. In a process per arm, the candidate's own steps with and without the plant give
the plant's cost in that arm alone, with no partner anywhere (:func:`toggle_truth`).

A study of command arms may plant ``spin`` or ``gather``: the harness hands the candidate's
process the plant (``HARNESS_PLANT``), and its reporter (``harness/reporter.py``, standard
library) runs it at the end of each step, before the step's stamp, and writes a ``plant`` line
that the evidence check (``prereg/evidence.py``) sums into ``planted_s`` and ``planted_cpu_s``
(every step of a planted candidate must hold one). A ``matmul`` needs torch, and an arm without
the reporter runs no plant: both are refused at plan time.

The plant never draws from a random state and never touches the model, so the planted arm's
losses, weights and BPB are bitwise its partner's. Each run's ``timings`` hold ``planted_s`` and
``planted_cpu_s``: the plant's own time on the wall and CPU clocks, summed over the timed steps.

**The truth of a spin.** A spin adds ``S`` seconds of CPU work (``planted_cpu_s``, what the run
measured of its own plant) to an arm whose other work is its partner's. On the CPU clock the
planted arm's time is then ``C_b + S`` in expectation, so the pair's true log ratio is
``log(1 + S / C_b)``, with ``C_b`` the baseline's training CPU time in that pair. On the wall
clock the same holds when the spin runs at the speed of the rest of the step (a machine that
slows everything by one factor slows both alike): ``log(1 + S W_b / (C_b W_b)) = log(1 + S /
C_b)``. The bias of a design is the mean of ``d_i - t_i``, its estimate less that truth, pair by
pair, with its paired t interval; coverage is whether the study's nominal interval of the mean
log ratio holds the mean truth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from prereg.descriptive import PairedInterval, mean_interval, reduction
from prereg.designs import LOCKSTEP, PAIRED, design_label, find_design, study_design

#: Each plant kind and its one size key (a positive integer), and what the size means.
KINDS: dict[str, tuple[str, str]] = {
    "spin": ("us", "microseconds of the training thread's CPU time per step"),
    "matmul": ("n", "the side of the n x n float32 matrices multiplied once per step"),
    "gather": ("bytes", "the size of the buffer read once per step, one byte per 64-byte line"),
    "copy": ("bytes", "the size of the buffer copied into another once per step"),
    "alloc": ("bytes", "the size of the zeroed buffer allocated and dropped once per step"),
    "sleep": ("us", "microseconds of wall time asleep per step"),
}
#: The effect class each kind stands for (the module's text).
CLASSES: dict[str, str] = {
    "spin": "context-free",
    "matmul": "cache-heavy",
    "gather": "cache-heavy",
    "copy": "bandwidth",
    "alloc": "allocation",
    "sleep": "wall-only",
}
#: Plants a command arm's reporter can run (standard library: ``harness/reporter.py``).
COMMAND_KINDS = ("spin", "gather", "copy", "alloc", "sleep")
#: Plants whose true effect is known by arithmetic; the others' is measured (:func:`reference_study`).
CONTEXT_FREE = ("spin",)
#: The largest size of each kind a protocol may plant (a spin or sleep of a second per step, a
#: 4096-wide matrix, a buffer of 1 GiB): far above any calibration, below a plant that would stall a run.
MAX_SIZE = {
    "spin": 1_000_000,
    "matmul": 4096,
    "gather": 1 << 30,
    "copy": 1 << 30,
    "alloc": 1 << 30,
    "sleep": 1_000_000,
}
#: The optional keys of a plant besides its kind and size.
OPTIONAL = ("replicate_pairs", "toggle_steps")


class Bias(TypedDict, total=False):
    """A design's bias on one clock (:func:`bias_of`); only ``pairs`` and ``bias`` (None) with fewer
    than two pairs."""

    pairs: int
    truth: float
    truth_pct: float
    estimate: float
    estimate_lo: float
    estimate_hi: float
    estimate_pct: float
    bias: float | None
    bias_lo: float
    bias_hi: float
    covered: bool


class Coverage(TypedDict):
    """The coverage of the nominal interval over replicate studies (:func:`coverage`)."""

    studies: int
    pairs_each: int
    covered: int
    rate: float
    lo: float
    hi: float
    level: float


class _RowKeys(TypedDict):
    """The keys every ``planted`` row has."""

    study: str
    config: str
    design: str
    block_steps: int | None
    plant: str
    kind: str
    clock: str
    pairs: int
    level: float


class PlantedRow(_RowKeys, total=False):
    """A row of the summary's ``planted`` table (:func:`planted_rows`): a planted study's design on
    one configuration and clock, its estimate, truth and bias in points of the log ratio; these keys
    where the row has them (``why`` where it has no bias)."""

    bias: float | None
    why: str
    estimator: str
    estimate: float
    estimate_lo: float
    estimate_hi: float
    truth: float
    truth_lo: float
    truth_hi: float
    truth_origin: str
    bias_lo: float
    bias_hi: float
    covered: bool
    reference: bool
    coverage: Coverage


def toggled(step: int, toggle_steps: int | None) -> bool:
    """Whether the plant runs in ``step`` (0-based): always without ``toggle_steps``; with it, in
    ABBA blocks of ``toggle_steps`` steps, the first block without the plant."""
    if not toggle_steps:
        return True
    return (0, 1, 1, 0)[(step // toggle_steps) % 4] == 1


def plant_problems(value: object, command: bool) -> list[tuple[tuple[str, ...], str]]:
    """What is wrong with a study's ``planted`` mapping (key path below ``planted``, message); none
    for a valid one. ``command``: the study's arms are command arms."""
    if not isinstance(value, Mapping):
        return [((), f"expected a mapping {{kind: spin, us: N}}, got {type(value).__name__}")]
    kind = value.get("kind")
    if kind not in KINDS:
        return [(("kind",), f"planted kind must be one of {', '.join(KINDS)}, got {kind!r}")]
    size = KINDS[kind][0]
    extra = sorted(str(k) for k in value if k not in ("kind", size, *OPTIONAL))
    if extra:
        return [
            (
                (extra[0],),
                f"unknown key {extra[0]!r} for a {kind} plant (keys: kind, {size}, {', '.join(OPTIONAL)})",
            )
        ]
    toggle = value.get("toggle_steps")
    if toggle is not None and (
        not isinstance(toggle, int) or isinstance(toggle, bool) or not 2 <= toggle <= 1000
    ):
        return [
            (
                ("toggle_steps",),
                "toggle_steps (the plant on and off in ABBA blocks of this many steps: a truth study) is an "
                f"integer from 2 to 1000, got {toggle!r}",
            )
        ]
    if toggle is not None and command:
        return [
            (
                ("toggle_steps",),
                "toggle_steps is for built-in arms (the harness's trainer toggles the plant); a command "
                "arm's reporter runs its plant in every step",
            )
        ]
    group = value.get("replicate_pairs")
    if group is not None and (not isinstance(group, int) or isinstance(group, bool) or group < 2):
        return [
            (
                ("replicate_pairs",),
                "replicate_pairs (the pairs of each replicate study the coverage is counted over) is an "
                f"integer of at least 2, got {group!r}",
            )
        ]
    n = value.get(size)
    if n is None:
        return [((), f"a {kind} plant names its size: {size} ({KINDS[kind][1]})")]
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= MAX_SIZE[kind]:
        return [((size,), f"{size} must be an integer from 1 to {MAX_SIZE[kind]}, got {n!r}")]
    if command and kind not in COMMAND_KINDS:
        return [
            (
                ("kind",),
                f"a study of command arms plants {' or '.join(COMMAND_KINDS)}: its script's reporter "
                f"(standard library) runs the plant, and a {kind} plant needs torch",
            )
        ]
    return []


def describe(plant: Mapping[str, Any]) -> str:
    """A plant in words: ``spin 150 us/step``, ``matmul 288x288/step``, ``gather 4 MiB/step``."""
    kind = plant["kind"]
    if kind == "spin":
        return f"spin {plant['us']} us/step"
    if kind == "sleep":
        return f"sleep {plant['us']} us/step"
    if kind == "matmul":
        return f"matmul {plant['n']}x{plant['n']}/step"
    b = int(plant["bytes"])
    return f"{kind} {b / (1 << 20):g} MiB/step" if b >= 1 << 20 else f"{kind} {b / 1024:g} KiB/step"


def plant_key(plant: Mapping[str, Any]) -> tuple[str, int]:
    """What makes two studies' plants the same plant: its kind and size."""
    kind = plant["kind"]
    return kind, int(plant[KINDS[kind][0]])


def spin_truth(baseline_cpu_s: float, planted_cpu_s: float) -> float:
    """A pair's true log ratio of a spin: ``log(1 + S / C_b)`` (the module's text)."""
    return math.log1p(planted_cpu_s / baseline_cpu_s)


def _mean(x: Sequence[float]) -> float:
    return math.fsum(x) / len(x)


def bias_of(estimates: Sequence[float], truths: Sequence[float], level: float) -> Bias:
    """A design's bias on one clock: the mean of ``d_i - t_i`` (log-ratio points, candidate over
    baseline, positive: the design reads the plant as costing more than it does) with its paired t
    interval at ``level``, the mean estimate with its nominal interval, the mean truth, and whether
    that interval covers it.

    Notes
    -----
    ``d_i = log(T_candidate / T_baseline)`` of pair ``i``, ``t_i`` its true log ratio. The bias
    ``mean(d - t)`` has the paired Student-t interval ``mean +- t(1 - a/2, n - 1) s / sqrt(n)``;
    ``covered`` is ``lo <= mean(t) <= hi`` for the nominal interval ``(lo, hi)`` of ``mean(d)``.
    With fewer than two pairs there is no interval (None).
    """
    n = len(estimates)
    if n < 2 or len(truths) != n:
        return {"pairs": n, "bias": None}
    diffs = [d - t for d, t in zip(estimates, truths)]
    b = mean_interval(diffs, level, "contrast")
    e = mean_interval(list(estimates), level, "contrast")
    truth = _mean(truths)
    return {
        "pairs": n,
        "truth": truth,
        "truth_pct": -reduction(truth),
        "estimate": e.estimate,
        "estimate_lo": e.low,
        "estimate_hi": e.high,
        "estimate_pct": -reduction(e.estimate),
        "bias": b.estimate,
        "bias_lo": b.low,
        "bias_hi": b.high,
        "covered": e.low <= truth <= e.high,
    }


def coverage(
    estimates: Sequence[float], truths: Sequence[float], group: int, level: float
) -> Coverage | None:
    """Coverage of the nominal interval over replicate studies: the pairs, in plan order, cut into
    consecutive groups of ``group`` pairs, each group a study of its own; the share of groups
    whose nominal interval of the mean log ratio holds the group's mean truth, with its exact
    (Clopper-Pearson) 95% interval. None with fewer than two whole groups.

    Notes
    -----
    Each group's interval is the paired t interval at ``level`` over its ``group`` pairs. The
    Clopper-Pearson bounds are the ``0.025`` and ``0.975`` quantiles of Beta(k, m - k + 1) and
    Beta(k + 1, m - k), found by bisection of the binomial tail.
    """
    m = len(estimates) // group
    if group < 2 or m < 2:
        return None
    hits = 0
    for g in range(m):
        d = list(estimates[g * group : (g + 1) * group])
        t = truths[g * group : (g + 1) * group]
        e = mean_interval(d, level, "contrast")
        hits += e.low <= _mean(t) <= e.high
    lo, hi = clopper_pearson(hits, m)
    return {
        "studies": m,
        "pairs_each": group,
        "covered": hits,
        "rate": hits / m,
        "lo": lo,
        "hi": hi,
        "level": level,
    }


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p): the exact sum of the terms."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return math.fsum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """The exact two-sided ``conf`` interval of a binomial proportion ``k / n``."""
    a = (1 - conf) / 2

    def solve(f: Callable[[float], bool]) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(80):
            mid = (lo + hi) / 2
            if f(mid):
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(lambda p: 1 - binom_cdf(k - 1, n, p) < a)
    upper = 1.0 if k == n else solve(lambda p: binom_cdf(k, n, p) > a)
    return lower, upper


def calibrated_designs(calibration: Mapping[str, object]) -> dict[int | None, set[str]]:
    """The designs a calibration study (a protocol document, as YAML read it) measured the bias of,
    each with the effect classes (:data:`CLASSES`) of the plants it measured: each planted study's
    lockstep ``block_steps``, or ``None`` for a process per arm. A truth study (``toggle_steps``)
    measures the truth, not a design, and counts for none."""
    out: dict[int | None, set[str]] = {}
    studies = calibration.get("studies")
    for st in studies if isinstance(studies, list) else []:
        design = find_design(st.get("design")) if isinstance(st, Mapping) else None
        if design is None or not design.pairwise:
            continue
        plant = st.get("planted")
        if not isinstance(plant, Mapping) or plant.get("kind") not in CLASSES or plant.get("toggle_steps"):
            continue
        block = design.block_steps(st)
        key = block if isinstance(block, int) and not isinstance(block, bool) else None
        out.setdefault(key, set()).add(CLASSES[plant["kind"]])
    return out


#: The effect class a protocol's change is taken to be when it declares none: an optimizer or
#: kernel change moves memory traffic (docs/decisions.md, "Effect classes").
DEFAULT_CLASS = "cache-heavy"


def _block_label(block_steps: int | None) -> str:
    """A calibrated design by its block size (None: a process per arm), in words."""
    return PAIRED.label() if block_steps is None else LOCKSTEP.label(block_steps, brief=True)


def uncalibrated(
    block_steps: int | None,
    covered: Mapping[int | None, set[str]],
    where: str,
    effect_class: str = DEFAULT_CLASS,
) -> str | None:
    """Why a study's design (lockstep ``block_steps``, ``None``: a process per arm) is not one the
    calibration at ``where`` measured for ``effect_class``, or ``None`` when it is: its bias for
    that class would be unknown."""
    if effect_class in covered.get(block_steps, set()):
        return None
    have = "; ".join(
        f"{_block_label(b)} ({', '.join(sorted(covered[b]))})" for b in sorted(covered, key=lambda b: b or 0)
    )
    return (
        f"{_block_label(block_steps)} is not a design the calibration "
        f"{where} measured for the effect class {effect_class} (its planted studies cover: {have or 'nothing'}), "
        f"so its bias for such a change is unknown: use a covered design, or plant a {effect_class} cost "
        f"({', '.join(k for k, c in CLASSES.items() if c == effect_class)}) through this design in the "
        "calibration and run that first"
    )


def reference_study(candidates: Sequence[Mapping[str, object]]) -> Mapping[str, Any] | None:
    """Of the studies that plant one measured (cache-heavy) plant, the one whose estimate is taken
    as its true effect: the lockstep study with the longest blocks (its blocks interleave least, so
    the plant runs nearest to how it runs alone, and its noise is a lockstep pair's); a process per
    arm only when no lockstep study plants it. Each candidate is a study's protocol entry (with
    ``lockstep.block_steps`` for lockstep)."""
    lock = [(block, s) for s in candidates if (block := study_design(s).block_steps(s)) is not None]
    if lock:
        return max(lock, key=lambda bs: bs[0])[1]
    return candidates[0] if candidates else None


#: The two clocks a planted study's bias is read on: the pair columns' key and the clock's name.
CLOCKS = (("training_s", "wall"), ("training_cpu_s", "CPU"))


def toggle_means(times: Sequence[int], warmup: int, toggle_steps: int) -> tuple[float, float] | None:
    """A truth study's candidate: its mean step time with the plant and without (:func:`toggled`),
    over its timed steps, the first step after each change left out (it follows the other kind of
    step: every step kept follows a step of its own kind, as in a run that always or never plants),
    or None when either kind has none."""
    on: list[int] = []
    off: list[int] = []
    for i, t in enumerate(times):
        now = toggled(i, toggle_steps)
        if i < warmup or i == 0 or now != toggled(i - 1, toggle_steps) or t <= 0:
            continue
        (on if now else off).append(t)
    if not on or not off:
        return None
    return math.fsum(on) / len(on), math.fsum(off) / len(off)


def toggle_truth(on_off: tuple[float, float]) -> float:
    """A truth study run's log ratio, ``ln(m_on / m_off)``: the plant's cost to that arm alone.

    Notes
    -----
    ``m_on`` and ``m_off`` are the run's mean step times with and without the plant
    (:func:`toggle_means`). The run has no partner: the plant's cost, cache effects on the steps
    after it included, is measured where nothing of another run interleaves, the estimand a
    user's own training run has. Each run is one value; the truth is their mean with its t
    interval, and a design's bias the Welch difference of its pairs' values from these."""
    return math.log(on_off[0] / on_off[1])


def pair_columns(b: Mapping[str, Any], c: Mapping[str, Any]) -> dict[str, object]:
    """A planted study's pair columns: what the candidate's plant took on each clock, and a truth
    study's candidate's means with and without its plant."""
    ct = c.get("timings") or {}
    plant = c["spec"].get("planted")
    if not plant:
        return {}
    out = {"candidate_planted_s": ct.get("planted_s"), "candidate_planted_cpu_s": ct.get("planted_cpu_s")}
    times = c.get("step_times") or {}
    if plant.get("toggle_steps") and times.get("cpu_us"):
        for clock, field in (("", "wall_us"), ("_cpu", "cpu_us")):
            m = toggle_means(times[field], c["spec"].get("warmup_steps") or 0, int(plant["toggle_steps"]))
            out[f"candidate_on{clock}_us"], out[f"candidate_off{clock}_us"] = m if m else (None, None)
    return out


def _logs(pairs: Sequence[Mapping[str, Any]], key: str) -> tuple[list[Mapping[str, Any]], list[float]]:
    b, c = f"baseline_{key}", f"candidate_{key}"
    ok = [
        p
        for p in sorted(pairs, key=lambda p: p["order"])
        if isinstance(p.get(b), (int, float)) and isinstance(p.get(c), (int, float)) and p[b] > 0 and p[c] > 0
    ]
    return ok, [math.log(p[c] / p[b]) for p in ok]


def planted_rows(
    studies: Sequence[Mapping[str, object]], pairs_of: Mapping[tuple[str, str], Any]
) -> list[PlantedRow]:
    """Every planted study's bias, per configuration and clock, as the summary's ``planted`` rows.

    A plant with a truth study (``toggle_steps``: :func:`toggle_truth`) takes its truth from it, on
    every design and clock, and each design's bias is the Welch difference of its pairs' log
    ratios from the truth study's runs' (``designs.welch_difference``: two independent groups), so
    the truth's own uncertainty is in the interval; a lockstep study whose worker kept each step's
    time and ran an arm's consecutive blocks as one turn has a second row, its after-own estimate
    (:func:`prereg.carryover.own_step_means`). Without a truth study, a spin's truth is its
    arithmetic (:func:`spin_truth`, pair by pair) and a measured plant's the mean log ratio of its
    reference study (:func:`reference_study`) on the same configuration and clock, as before. Bias,
    truth and estimate are in points of the log ratio (100 x ``ln(T_candidate / T_baseline)``,
    positive: the plant read as costing more); at these sizes a point of the log ratio is a
    percentage point of the time within 0.05."""
    planted = [s for s in studies if s.get("planted")]
    rows: list[PlantedRow] = []
    for st in planted:
        rows += _study_rows(st, planted, pairs_of)
    return rows


def _study_rows(
    st: Mapping[str, Any], planted: Sequence[Mapping[str, Any]], pairs_of: Mapping[tuple[str, str], Any]
) -> list[PlantedRow]:
    """:func:`planted_rows` of one planted study (``planted``: every planted study of the protocol,
    among which its truth or reference study)."""
    rows: list[PlantedRow] = []
    plant = st["planted"]
    truth, ref = _truth_and_reference(plant, planted)
    block = study_design(st).block_steps(st)
    for config in st["configs"]:
        pairs = pairs_of.get((st["name"], config)) or []
        tv = _truth_values(pairs_of.get((truth["name"], config)) or []) if truth else None
        for key, clock in CLOCKS:
            timed, d = _logs(pairs, key)
            row: PlantedRow = {
                "study": st["name"],
                "config": config,
                "design": design_label(st, brief=True),
                "block_steps": block,
                "plant": describe(plant),
                "kind": plant["kind"],
                "clock": clock,
                "pairs": len(d),
                "level": st["interval_level"],
            }
            if st is truth and tv is not None:
                rows.append(_truth_row(row, tv[clock], truth))
                continue
            if len(d) < 2:
                rows.append({**row, "bias": None, "why": "fewer than two timed pairs"})
                continue
            rows += _design_rows(row, timed, d, plant, st, tv[clock] if tv else None, (pairs_of, ref, key))
    return rows


def _truth_and_reference(
    plant: Mapping[str, Any], planted: Sequence[Mapping[str, Any]]
) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """A plant's truth study (the planted study of the same plant with ``toggle_steps``) and, without
    one, a measured plant's reference study (:func:`reference_study`); None each where it has none."""
    same = [s for s in planted if plant_key(s["planted"]) == plant_key(plant)]
    truth = next((s for s in same if s["planted"].get("toggle_steps")), None)
    ref = None if plant["kind"] in CONTEXT_FREE or truth else reference_study(same)
    return truth, ref


def _truth_values(pairs: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """A truth study's runs' log ratios (:func:`toggle_truth`), per clock, in plan order."""
    out: dict[str, list[float]] = {}
    for clock, suffix in (("wall", ""), ("CPU", "_cpu")):
        on, off = f"candidate_on{suffix}_us", f"candidate_off{suffix}_us"
        ok = [p for p in sorted(pairs, key=lambda p: p["order"]) if p.get(on) and p.get(off)]
        out[clock] = [toggle_truth((float(p[on]), float(p[off]))) for p in ok]
    return out


def _truth_row(row: PlantedRow, t: list[float], truth: Mapping[str, Any]) -> PlantedRow:
    """A truth study's row: the mean of its runs' log ratios with its interval (the reference)."""
    row["design"] = f"its own process, plant on and off in blocks of {truth['planted']['toggle_steps']}"
    row["pairs"] = len(t)
    if len(t) < 2:
        return {**row, "bias": None, "why": "fewer than two runs with and without the plant"}
    r = mean_interval(t, row["level"], "contrast")
    return {
        **row,
        "estimate": 100 * r.estimate,
        "estimate_lo": 100 * r.low,
        "estimate_hi": 100 * r.high,
        "truth": 100 * r.estimate,
        "truth_lo": 100 * r.low,
        "truth_hi": 100 * r.high,
        "truth_origin": f"measured: {truth['name']}, each run's steps with the plant against its steps without",
        "bias": 0.0,
        "reference": True,
    }


def _design_rows(
    row: PlantedRow,
    timed: list[Mapping[str, Any]],
    d: list[float],
    plant: Mapping[str, Any],
    st: Mapping[str, Any],
    truth: list[float] | None,
    measured: tuple[Mapping[tuple[str, str], Any], Mapping[str, Any] | None, str],
) -> list[PlantedRow]:
    """A design's row on one clock (against the truth study's runs, the spin's arithmetic or the
    reference study), and its after-own row where its pairs have one."""
    level = st["interval_level"]
    e = mean_interval(d, level, "contrast")
    first: PlantedRow = {
        **row,
        "estimate": 100 * e.estimate,
        "estimate_lo": 100 * e.low,
        "estimate_hi": 100 * e.high,
    }
    if truth is not None:
        out = [_against_truth(first, d, truth, st)]
        own = _own_logs(timed, row["clock"])
        if len(own) >= 2:
            eo = mean_interval(own, level, "contrast")
            out.append(
                _against_truth(
                    {
                        **row,
                        "design": row["design"] + ", steps after its own",
                        "estimator": "after-own",
                        "pairs": len(own),
                        "estimate": 100 * eo.estimate,
                        "estimate_lo": 100 * eo.low,
                        "estimate_hi": 100 * eo.high,
                    },
                    own,
                    truth,
                    st,
                )
            )
        return out
    pairs_of, ref, key = measured
    if ref is None:
        return [_spin_row(first, list(timed), d, plant)]
    return [_measured_row(first, d, e, pairs_of, ref, st, row["config"], key)]


def _own_logs(timed: Sequence[Mapping[str, Any]], clock: str) -> list[float]:
    """Each pair's after-own log ratio on ``clock``, where both arms have one."""
    suffix = "_cpu" if clock == "CPU" else ""
    b, c = f"baseline_own_step{suffix}_us", f"candidate_own_step{suffix}_us"
    return [math.log(p[c] / p[b]) for p in timed if p.get(b) and p.get(c)]


def _against_truth(row: PlantedRow, d: list[float], truth: list[float], st: Mapping[str, Any]) -> PlantedRow:
    """A row's bias against a truth study's runs: the Welch difference of the two groups, whether
    the row's nominal interval covers the truth's mean, and its coverage over replicate studies."""
    from prereg.designs import welch_difference

    level = st["interval_level"]
    if len(truth) < 2:
        return {**row, "bias": None, "why": "its truth study has fewer than two runs"}
    r = mean_interval(truth, level, "contrast")
    w = welch_difference(d, truth, level)
    row.update(
        {
            "truth": 100 * r.estimate,
            "truth_lo": 100 * r.low,
            "truth_hi": 100 * r.high,
            "truth_origin": "measured: the plant on and off in its own process (its truth study)",
            "bias": 100 * w.difference,
            "bias_lo": 100 * w.lo,
            "bias_hi": 100 * w.hi,
            "covered": row["estimate_lo"] <= 100 * r.estimate <= row["estimate_hi"],
        }
    )
    group = st["planted"].get("replicate_pairs")
    cov = coverage(d, [r.estimate] * len(d), int(group), level) if group else None
    if cov is not None:
        row["coverage"] = cov
    return row


def _spin_row(
    row: PlantedRow,
    timed: list[Mapping[str, Any]],
    d: list[float],
    plant: Mapping[str, Any],
) -> PlantedRow:
    """A spin's row: its bias against its arithmetic truth, pair by pair, and its coverage, at the
    level the row carries (its study's)."""
    level = row["level"]
    times = [(p.get("baseline_training_cpu_s"), p.get("candidate_planted_cpu_s")) for p in timed]
    both = [(bc, pc) for bc, pc in times if isinstance(bc, (int, float)) and isinstance(pc, (int, float))]
    if len(both) < len(times):
        return {**row, "bias": None, "why": "a pair without the plant's CPU time"}
    t = [spin_truth(float(bc), float(pc)) for bc, pc in both]
    b = bias_of(d, t, level)
    if b["bias"] is None:  # fewer than two pairs: no interval
        return {**row, "bias": None, "why": "fewer than two timed pairs"}
    row.update(
        {
            "truth": 100 * b["truth"],
            "truth_origin": "arithmetic: ln(1 + S / C_b) per pair (S the plant's CPU time)",
            "bias": 100 * b["bias"],
            "bias_lo": 100 * b["bias_lo"],
            "bias_hi": 100 * b["bias_hi"],
            "covered": b["covered"],
        }
    )
    group = plant.get("replicate_pairs")
    cov = coverage(d, t, int(group), level) if group else None
    if cov is not None:
        row["coverage"] = cov
    return row


def _measured_row(
    row: PlantedRow,
    d: list[float],
    e: PairedInterval,
    pairs_of: Mapping[tuple[str, str], Any],
    ref: Mapping[str, Any],
    st: Mapping[str, Any],
    config: str,
    key: str,
) -> PlantedRow:
    """A measured plant's row: its bias against the mean of its reference study (``e``: its own
    mean's interval), the Welch difference of the two groups of pairs."""
    from prereg.designs import welch_difference

    _, dr = _logs(pairs_of.get((ref["name"], config)) or [], key)
    if len(dr) < 2:
        return {**row, "bias": None, "why": f"its reference {ref['name']} has fewer than two pairs"}
    r = mean_interval(dr, st["interval_level"], "contrast")
    row.update(
        {
            "truth": 100 * r.estimate,
            "truth_lo": 100 * r.low,
            "truth_hi": 100 * r.high,
            "truth_origin": f"measured: the mean of {ref['name']} ({design_label(ref, brief=True)}, {len(dr)} pairs)",
        }
    )
    if ref["name"] == st["name"]:
        row.update({"bias": 0.0, "reference": True})
    else:
        w = welch_difference(d, dr, st["interval_level"])
        row.update({"bias": 100 * w.difference, "bias_lo": 100 * w.lo, "bias_hi": 100 * w.hi})
        row["covered"] = e.low <= r.estimate <= e.high
    return row


#: The clock each effect class is read on: a wall-only cost is what no CPU clock sees.
CLASS_CLOCK = {c: ("wall" if c == "wall-only" else "CPU") for c in sorted(set(CLASSES.values()))}


@dataclass(frozen=True)
class Verdict:
    """One effect class's best design in a calibration: the design (and estimator) whose bias
    interval, over the class's plants, lies nearest zero at its far end."""

    effect_class: str
    clock: str
    design: str
    worst: float  # the largest |bound| of the bias intervals over the class's plants, points
    rows: tuple[Mapping[str, Any], ...]  # each plant's row of that design on that clock


def _class_verdicts(rows: Sequence[Mapping[str, Any]], cls: str, clock: str) -> list[Verdict]:
    """The designs of ``rows`` with a bias interval, on ``clock``, for every plant of class ``cls``."""
    mine = [
        r for r in rows if CLASSES.get(r["kind"]) == cls and r["clock"] == clock and not r.get("reference")
    ]
    plants = {r["plant"] for r in mine}
    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in mine:
        by.setdefault(r["design"], []).append(r)
    out = []
    for design, rs in by.items():
        if {r["plant"] for r in rs} != plants or any(r.get("bias_lo") is None for r in rs):
            continue
        worst = max(max(abs(r["bias_lo"]), abs(r["bias_hi"])) for r in rs)
        out.append(Verdict(cls, clock, design, worst, tuple(sorted(rs, key=lambda r: r["plant"]))))
    return out


def verdicts(rows: Sequence[Mapping[str, object]]) -> list[Verdict]:
    """Per effect class the calibration planted, its designs ranked by the worst bound of their bias
    intervals over the class's plants (:data:`CLASS_CLOCK`'s clock), best first.

    A design counts for a class only where it has a bias interval for every plant of that class;
    a truth or reference row is not a design."""
    out = [v for cls, clock in CLASS_CLOCK.items() for v in _class_verdicts(rows, cls, clock)]
    return sorted(out, key=lambda v: (v.effect_class, v.worst))


def design_verdict(
    rows: Sequence[Mapping[str, object]], effect_class: str, design: str, clock: str
) -> Verdict | None:
    """The bias of one ``design`` (a row's ``design`` label) on ``clock`` for ``effect_class``, over
    the class's plants, as :func:`verdicts` measures it (the one home of that choice of rows);
    ``None`` when the calibration has no bias interval of that design for every such plant."""
    return next((v for v in _class_verdicts(rows, effect_class, clock) if v.design == design), None)

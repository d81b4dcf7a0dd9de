"""Never slower than native: clients' whole iterations, packed and PackedAdamW's default against native.

Each client loop is built in four arms in one process from the same weights and fed the same
batches:

* ``native``: the client's ``clip_grad_norm_``, ``AdamW(fused=True).step()``, ``zero_grad``;
* ``packed``: ``PackedAdamW(mode="packed")`` taking the one-pass phase (``clip_step_zero_grad``);
* ``auto``: ``PackedAdamW``'s default (``mode="auto"``), which measures packed against native over
  its first iterations and steps natively where packing is slower (``cotangent/modes.py``);
* ``twin``: native's loop built again: the placement A/A (its truth is 1).

Where a loop's tensors lie in memory moves its iteration by up to a few percent (a second native
build read 0.975 against the first for nanoGPT in one build), so one build per arm cannot tell the
method from placement. The arms are therefore built afresh ``--builds`` times (default 20), each
build after spacers of random size that shift where its tensors land (:func:`placed`), in the
order of a balanced Latin square cycling by build. In each build ``auto`` first runs ``--warmup``
iterations alone (it decides after ``cotangent.modes.DECIDES_AFTER``, 52, on the loop by itself,
as in a user's run; the default is 56) and so does each other arm (the same steps, so that the
bits can be compared), in the order they were built, then the arms take turns for ``--rounds / --builds`` rounds (48). A turn
is ``--lead-in`` untimed iterations (1) and one timed, so that the timed step follows the arm's
own, as in a user's loop, not another arm's (:func:`turn`); the order of the turns cycles through
eight rounds in which each arm takes each place, and comes right after each arm (itself
included), equally often (:data:`ROUND_ORDERS`). An iteration is timed whole, from the batch to
the end of the phase. Reported per loop: native's median iteration; each arm's ratio to native, the
geometric mean over builds of each build's geometric mean of per-round ratios (packed's and auto's
to the geometric mean of native's two builds in the round, native and twin: the reference's share
of the placement halved; twin's to native's), with its 95% Student-t interval over the builds
(:func:`over_builds`): the interval covers placement as well as the rounds' noise; which mode
``auto`` chose in how many builds; whether it meets the promise (:func:`at_most_native`: ratio at
most 1.00 at two decimals, upper bound at most 1.01), with a count of the rows that do at the end.
After the timed rounds of each build the four models must be equal bit for bit.

The builds per row come in two stages (Stein 1945): the first ``--builds`` (20) are the pilot;
their spread of auto's build values sets how many a row needs for an interval of half-width
``--half-width`` (0.41%, :data:`HALF_WIDTH`: a row equal to native then meets the promise with
chance 0.99), rounded up to a multiple of four, at most ``--max-builds``; the interval is
Stein's (``prereg.descriptive.two_stage_interval``: the pilot's spread, ``pilot - 1`` df). For
normal build values it is exact whatever the pilot's spread chose, since then the pilot's mean
and spread are independent and the number depends on the spread alone; the row also gives the
second stage's own spread, so that a machine that grew noisier after the pilot shows.

First, the design's own check (one row per thread count), with the same estimator: nanoGPT's loop
built three times, native in all three arms, with a busy spin of ``--plant`` (default 2%) of
native's median warm-up iteration added to one arm's (B's) every iteration, the other two (A and
C) its reference, over fresh builds sized by the same two stages, in turns as the loops' (B's
lead-in iterations spin too: the plant is B's loop's), the order within a round cycling through
the six orders of the three (:data:`PLANT_ORDERS`). Its truth is known by arithmetic: the
geometric mean over rounds of (the reference's iteration + the spin of B's timed iteration) / the
reference's iteration, from the spins as measured. The design reads the plant correctly when the truth lies inside the interval.

Loops (all from ``benchmarks/clients.py``, their one home): nanoGPT's ``train.py`` loop and timm's
``resnet10t``, a small convolutional net with batch norm (images, 3 conv+BN+ReLU, pooling, a linear
head), and the study's four tiny configurations (``configs/tiny_*.yaml``: their model, batch, lr,
weight decay and clip).

    python benchmarks/never_slower.py --threads 1 2            # the full table (pilots of 20 builds, ~70 min, then second stages)
    python benchmarks/never_slower.py --quick --threads 1      # CI size
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import os
import platform
import random
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from clients import (  # benchmarks/, the script's own folder: the loops
    NanoGPT,
    SmallCNN,
    Study,
    Timm,
    add_loop_sizes,
    ratio_of,
)

from cotangent.modes import DECIDES_AFTER
from cotangent.verify import bitwise_equal
from harness.machine import cpu_model
from prereg.descriptive import mean_interval, stein_size, two_stage_interval, two_stage_size
from prereg.planted import binom_cdf
from prereg.tdist import f_sf, student_t_sf_signed, t_critical

#: ``twin``: native's loop built a second time, last (after ``auto`` moved its tensors): the
#: placement A/A. Its truth is 1; where it reads otherwise, the builds' memory placement alone moves
#: a loop by that much, and a row of ``auto`` within it is not told apart from native's.
ARMS = ("native", "packed", "auto", "twin")
#: A balanced Latin square (Williams) over the four arms, the order they are built in, one a build
#: (:func:`placed`): each arm built in each place once, and after each other arm once, in four builds.
ORDERS = ((0, 1, 3, 2), (1, 2, 0, 3), (2, 3, 1, 0), (3, 0, 2, 1))
#: The order of the arms' turns, one a round, cycling: in every eight rounds each arm takes each
#: place twice, and in the stream of turns (the rounds back to back, the eighth's last turn before
#: the first's first) each arm comes right after each arm, itself included, exactly twice. The
#: Latin square balances which arm comes before within a round only: cycled, a round's last turn
#: comes before the next's first, and it put packed before native and native before twin twice in
#: every four rounds. Found by an exhaustive search; ``tests/test_benchmark.py`` checks both.
ROUND_ORDERS = (
    (0, 1, 3, 2),
    (2, 0, 1, 3),
    (3, 0, 2, 1),
    (1, 2, 0, 3),
    (3, 1, 0, 2),
    (2, 3, 1, 0),
    (0, 3, 2, 1),
    (1, 2, 3, 0),
)
TINY = ("tiny_transformer", "tiny_medium", "tiny_gqa", "tiny_conv")
LOOPS = ("nanogpt", "timm", "small_cnn", *TINY)
#: The promise, per loop (issue 61): the default's iteration at most native's (the geometric mean
#: of per-round ratios at most RATIO_MAX) with the upper 95% bound at most UPPER_MAX.
RATIO_MAX, UPPER_MAX = 1.00, 1.01

#: The spread over builds of a row's per-build mean log ratio (auto / native), measured with 100
#: step-by-step rounds a build (``--lead-in 0``), before the lead-in: the sizing's calibration, to
#: be measured again on tables of the lead-in (Stein's second stage sizes each row on its own pilot):
#: ``sd = half width * sqrt(20) / t(0.975, 19)`` from the 95% intervals of the ``auto`` column in
#: ``docs/benchmark.md``'s fresh-build runs (:data:`ROWS_SIZED_ON` rows); the median row's and the
#: widest.
BUILD_SD, BUILD_SD_WIDEST = 0.0118, 0.0225
#: The rows those two come from: the Intel Xeon 1-thread runs at both instruction sets and the AMD
#: EPYC runs of 2026-12-07 (docs/benchmark.md).
ROWS_SIZED_ON = 42
#: The chance that a row equal to native (true ratio 1.00) reads an upper bound at most
#: :data:`UPPER_MAX`, which the default builds are sized for at the median row's spread.
POWER = 0.90
#: Untimed iterations each arm runs right before each of its timed ones, in its turn (:func:`turn`):
#: the timed iteration then follows the arm's own, as every step of a user's loop does, not another
#: arm's. Taking turns step by step, the twin (native built again) read 0.3-0.5% off native in 5 of
#: 21 rows, where 95% intervals miss about 1 (docs/benchmark.md, "Carryover").
LEAD_IN = 1
#: Timed rounds in each build: each build's mean over them is one observation of the interval. 48:
#: six cycles of :data:`ROUND_ORDERS` (and eight of the design check's six orders), the steps a
#: build takes with :data:`LEAD_IN` about those of the 100 rounds a build of step-by-step turns took.
#: Kept after the first table of the lead-in (1 thread, AVX-512, a5337521): the rounds' share of
#: the variance of its rows' auto and twin build values is 0.43-1.98 (median 0.87), and
#: priced at 24, 72 and 96 rounds a build the same intervals would have taken 1.33, 0.97 and 0.99
#: of its steps (``--reread``, :func:`rounds_cost`): no gain worth tables that differ.
ROUNDS_PER_BUILD = 48
#: Seconds a round of one step of each arm takes in the full table, per thread count and loop
#: (native's iteration, four arms; nanoGPT's A/A rows two arms): the fresh-build runs took 23 to 32
#: minutes a command (:func:`expected_minutes` counts a turn's lead-in steps as rounds).
ROUND_SECONDS = 4 / 3


def upper_power(builds: int, sd: float = BUILD_SD, upper: float = UPPER_MAX) -> float:
    """The chance that a row whose true ratio is 1.00 reads an upper 95% bound at most ``upper``
    over ``builds`` builds whose mean log ratios spread with standard deviation ``sd``.

    Notes
    -----
    The upper bound is ``m + t * sd / sqrt(n)`` with ``t = t(0.975, n - 1)`` and ``m`` the mean of
    the ``n`` builds' log ratios, ``m ~ N(0, sd / sqrt(n))`` at a true ratio of 1.00, so
    ``P(upper <= log(upper)) = Phi(log(upper) * sqrt(n) / sd - t)``: the normal approximation of
    the one-sided t-test's power (statsmodels' ``TTestPower``, noncentral t, agrees within one
    build in the builds needed and within 0.02 in the power, ``tests/test_modes.py``). The other half of the promise, ratio at most 1.00, is read at
    two decimals (:func:`at_most_native`): unrounded, it would hold at a true ratio of exactly 1.00
    half the time whatever the builds.
    """
    t = t_critical(0.025, builds - 1)
    return statistics.NormalDist().cdf(math.log(upper) * math.sqrt(builds) / sd - t)


def builds_needed(sd: float = BUILD_SD, power: float = POWER, upper: float = UPPER_MAX) -> int:
    """The fewest builds at which :func:`upper_power` reaches ``power``: 17 at the median row's
    spread (0.0118), 56 at the widest's (0.0225, timm at 1 thread on AMD EPYC with AVX-512, whose
    upper bound read 1.013 at 20 builds), both at power 0.90."""
    n = 2
    while upper_power(n, sd, upper) < power:
        n += 1
    return n


#: Fresh builds per row in the first stage, the pilot (:func:`placed`): :func:`builds_needed` at the
#: median row's spread rounded up to ten (20); the interval is over the builds, so it covers where
#: each build's tensors lie.
BUILDS = math.ceil(builds_needed() / 10) * 10
#: The pilot's timed rounds per row: 48 in each of the 20 builds (960).
ROUNDS = BUILDS * ROUNDS_PER_BUILD
#: The chance a row whose true ratio is 1.00 should have of meeting the promise (both halves).
PROMISE_CHANCE = 0.99


def promise_chance(half_width: float, pilot: int = BUILDS) -> float:
    """The chance that a row whose true ratio is 1.00, sized by Stein's two stages to a half-width
    ``half_width`` (a share of the ratio: 0.0041 is 0.41%), meets the promise (:func:`at_most_native`).

    Notes
    -----
    With ``h = log(1 + half_width)``, ``t = t(0.975, pilot - 1)`` and ``n = (t s0 / h)^2`` builds
    (``s0`` the pilot's spread), the mean log ratio ``m`` over the ``n`` builds is normal with
    variance ``sigma^2 / n`` and independent of ``s0``, so ``m t / h = m sqrt(n) / s0`` is Student
    t with ``pilot - 1`` df, exactly (the argument of Stein's interval). The row meets the promise
    when ``m + h <= log(1.01)`` and ``m < log(1.005)`` (1.00 at two decimals), so the chance is
    ``F_t(min(log(1.01) - h, log(1.005)) t / h; pilot - 1)``. At 0.41% it is 0.990. It assumes
    normal build values and a second stage that runs (``n`` above the pilot, under the cap): rows
    whose pilot already reads narrower do better, and so do rows where auto is faster.
    """
    h = math.log1p(half_width)
    t = t_critical(0.025, pilot - 1)
    x = min(math.log(UPPER_MAX) - h, math.log(RATIO_MAX + 0.005)) * t / h
    return 1.0 - student_t_sf_signed(x, pilot - 1)


#: The second stage's target: each row's builds are as many as Stein's two-stage rule needs for an
#: interval of half this width (``prereg.descriptive.two_stage_size`` on the pilot's auto column),
#: rounded up to a multiple of four (each arm built first as often): the widest half-width, to
#: 0.01%, at which :func:`promise_chance` is at least :data:`PROMISE_CHANCE` (0.41%). A table of
#: 28 rows all at truth 1.00, every one wide enough to need a second stage, then meets the promise
#: in every row with chance 0.99^28, about 3 in 4.
HALF_WIDTH = max(x / 1e4 for x in range(1, 100) if promise_chance(x / 1e4) >= PROMISE_CHANCE)


def expected_builds(sd: float, half_width: float = HALF_WIDTH, pilot: int = BUILDS) -> int:
    """Stein's size for a row whose build values spread with ``sd``, taking the pilot's spread for
    it: ``max(pilot, ceil((t sd / log(1 + half_width))^2))``, ``t = t(0.975, pilot - 1)``."""
    return stein_size(sd, pilot, math.log1p(half_width))


#: A cost stop on a row's builds: 1.5 times the widest row's expected size, to a multiple of four
#: (152: 100 builds at :data:`BUILD_SD_WIDEST` times sqrt(3/4), the spread of a row's values
#: against two native builds where the arms' placements spread alike and independently). Where it
#: binds the interval stays exact, only wider, and the row says so.
MAX_BUILDS = 4 * math.ceil(1.5 * expected_builds(BUILD_SD_WIDEST * math.sqrt(3 / 4)) / 4)


def expected_minutes(args: argparse.Namespace) -> float:
    """The full table's expected duration on this project's 2-core machine (:data:`ROUND_SECONDS`
    per round of all seven loops at one and two threads, scaled to the rows asked for)."""
    loops = 0.75 if args.check_only else len(args.loops)  # the check: one loop's three arms of four
    # the pilot; a row's second stage adds builds where its pilot spreads wider than the median row
    share = loops / len(LOOPS) * len(args.threads) / 2
    warm = args.builds * args.warmup  # in rounds (every arm warms up in every build)
    return (args.rounds * (1 + args.lead_in) + warm) * ROUND_SECONDS * share / 60


def at_most_native(r: dict[str, float]) -> bool:
    """Whether a row meets the promise: ratio at most :data:`RATIO_MAX` at the promise's two decimals
    (below 1.005) and upper bound at most :data:`UPPER_MAX` (unrounded).

    A default that steps natively runs native's code: its true ratio is 1.00, and an unrounded
    ``ratio <= 1.00`` would then hold half the time whatever the rounds (all 14 rows of a table
    about once in 16,000 tables). At two decimals it holds with probability 0.99 or more in a row
    sized to the default half-width (standard error 0.41% / t(0.975, 19) = 0.2%), and the upper
    bound, which the builds are sized for, is the half that tells a default slower than native."""
    return r["ratio"] < RATIO_MAX + 0.005 and r["high"] <= UPPER_MAX


def builders(args: argparse.Namespace, loops: list[str]) -> dict[str, Callable[[str], Any]]:
    """Each loop's builder: arm -> an object with ``model``, ``opt`` and ``iteration(k)``."""
    out: dict[str, Callable[[str], Any]] = {}
    n = args
    if "nanogpt" in loops:
        out["nanogpt"] = lambda arm: NanoGPT(
            arm, n.nanogpt_layers, n.nanogpt_width, n.nanogpt_batch, n.nanogpt_context, n.nanogpt_accum
        )
    if "timm" in loops:
        import timm

        torch.manual_seed(0)
        resnet = timm.create_model("resnet10t", num_classes=10)
        out["timm"] = lambda arm: Timm(arm, n.timm_batch, n.timm_size, resnet)
    if "small_cnn" in loops:
        torch.manual_seed(0)
        cnn = SmallCNN.net(n.cnn_width)
        out["small_cnn"] = lambda arm: SmallCNN(arm, cnn, n.cnn_batch, n.cnn_size)
    for name in TINY:
        if name in loops:
            out[name] = functools.partial(Study, name=name)
    return out


def timed(loop: Any, k: int) -> float:
    t0 = time.perf_counter()
    loop.iteration(k)
    return time.perf_counter() - t0


#: Each build's solo warm-ups run in the order its arms were built (:func:`placed`), not in
#: :data:`ARMS`' order. An arm's gradients and AdamW moments are made at its first step, in the
#: warm-up: in a fixed order native's were made first, before the other arms' and before auto moved
#: its tensors, and twin's last, in every build, so native and twin differed in where those tensors
#: lie. In the last table of fixed-order warm-ups twin read below native in 14 of 21 rows (one-sided
#: binomial p = 0.09: a hint, not a finding); the symmetry costs nothing. ``benchmarks/twin_check.py``
#: compares the two orders.
WARM_IN_BUILD_ORDER = True


def turn(step: Callable[[int], object], k: int, lead_in: int) -> float:
    """An arm's turn in a round: ``lead_in`` untimed iterations (:data:`LEAD_IN`), then one timed,
    steps ``k`` on: the timed one follows the arm's own iteration, as in a user's loop."""
    for j in range(lead_in):
        step(k + j)
    t0 = time.perf_counter()
    step(k + lead_in)
    return time.perf_counter() - t0


def spin(seconds: float) -> float:
    """Busy-wait ``seconds``; returns the time it took (the plant as run)."""
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        pass
    return time.perf_counter() - t0


#: Warm-up iterations of each arm of the design check's A/A in each build (the allocator's caches
#: and the first-step state; no arm there decides anything).
SOLO_WARMUP = 8


def placed(build: Callable[[str], Any], arms: dict[str, str], b: int) -> tuple[dict[str, Any], list[Any]]:
    """Build ``arms`` (name: the arm's kind) afresh for build ``b``, four in the Latin square's
    order of round ``b`` (each arm built first, and after each other arm, equally often in four
    builds: native and twin exchangeable), other counts in an order rotated by ``b``, each after a spacer of a random size (seeded by ``b``) that shifts where its
    tensors land in the heap: where a loop's tensors lie moves its iteration by up to a few percent
    (the twin column), so each build is a fresh draw of placement, as Stabilizer randomises layout
    (Curtsinger and Berger, ASPLOS 2013). The spacers are returned to keep them alive."""
    rng = random.Random(b)
    names = list(arms)
    if len(names) == len(ORDERS):  # the four arms: the Latin square, so each also follows each other
        order = [names[i] for i in ORDERS[b % len(ORDERS)]]
    else:
        order = names[b % len(names) :] + names[: b % len(names)]
    loops: dict[str, Any] = {}
    spacers = []
    for arm in order:
        spacers.append(torch.empty(rng.randrange(64, 1 << 18), dtype=torch.uint8))
        loops[arm] = build(arms[arm])
    return loops, spacers


def round_logs(cand: list[list[float]], *refs: list[list[float]]) -> list[list[float]]:
    """Each build's per-round log ratios of ``cand`` to the reference: the geometric mean of
    ``refs``' iterations in the same round (native's, or native's and its twin's: two builds of
    native's loop, whose mean halves the reference's share of the placement)."""
    return [
        [math.log(c) - statistics.fmean(math.log(x) for x in rs) for c, *rs in zip(cb, *rb)]
        for cb, *rb in zip(cand, *refs)
    ]


def build_logs(cand: list[list[float]], *refs: list[list[float]]) -> list[float]:
    """Each build's geometric mean (as a log) of its per-round ratios (:func:`round_logs`)."""
    return [statistics.fmean(b) for b in round_logs(cand, *refs)]


def over_builds(
    native: list[list[float]], cand: list[list[float]], *more: list[list[float]], pilot: int | None = None
) -> dict[str, float]:
    """``cand`` over the reference (``native``, and the ``more`` native builds of each build) over
    builds: each build's geometric mean of its per-round ratios (:func:`build_logs`), then their
    geometric mean with the 95% Student-t interval over the builds (``builds - 1`` df,
    ``prereg.descriptive.mean_interval``), or Stein's two-stage interval where the first ``pilot``
    builds set their number (``pilot - 1`` df, ``two_stage_interval``): the interval covers where
    each build's tensors lie as well as the rounds' noise. Medians over every round of native's and
    ``cand``'s iterations; ``logs``, the builds' values, for the JSON; ``round_sd``, the pooled sd
    of the per-round log ratios within builds (None under two rounds a build): with ``r`` rounds a
    build, the rounds' share of a build value's variance is ``round_sd^2 / r``, the rest is the
    builds' own (placement), which more rounds a build cannot shrink."""
    per_round = round_logs(cand, native, *more)
    logs = [statistics.fmean(b) for b in per_round]
    flat_n = [x for nb in native for x in nb]
    flat_c = [x for cb in cand for x in cb]
    within = [statistics.variance(b) for b in per_round if len(b) >= 2]
    return {
        **ratio_of(logs, flat_n, flat_c, pilot),
        "rounds": len(flat_n),
        "logs": logs,
        "round_sd": math.sqrt(statistics.fmean(within)) if within else None,
    }


def one_build(
    build: Callable[[str], Any], b: int, rounds: int, warmup: int, lead_in: int = LEAD_IN
) -> dict[str, Any]:
    """One build of the four arms: solo warm-ups, ``rounds`` rounds in :data:`ROUND_ORDERS`,
    each arm's turn ``lead_in`` untimed iterations and one timed (:func:`turn`), each arm's times
    and whether the four models ended bit for bit equal."""
    loops, spacers = placed(build, {arm: "native" if arm == "twin" else arm for arm in ARMS}, b)
    # alone, so that auto measures the loop by itself; in the order the arms were built (the build's
    # row of ORDERS), so that each arm's gradients and moments, made at its first step, are made
    # first, and after each other arm's, equally often, as its parameters are (WARM_IN_BUILD_ORDER)
    for arm in loops if WARM_IN_BUILD_ORDER else ARMS:
        for k in range(warmup):  # every arm as many: the same steps, so the bits can be compared
            loops[arm].iteration(k)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for r in range(rounds):
        for a in ROUND_ORDERS[r % len(ROUND_ORDERS)]:
            times[ARMS[a]].append(turn(loops[ARMS[a]].iteration, warmup + r * (lead_in + 1), lead_in))
    states = [loops[a].model.state_dict() for a in ARMS]
    auto = loops["auto"].opt
    out = {
        "times": times,
        "bitwise": all(bitwise_equal(states[0][key], s[key]) for s in states[1:] for key in states[0]),
        "mode": auto.mode if auto.mode_report is not None else f"undecided ({auto.mode} now)",
        "report": auto.mode_report,
        "kernel": loops["packed"].opt.phase_kernel(),
        "parameters": sum(p.numel() for p in loops["native"].model.parameters()),
    }
    del loops, spacers
    return out


def second_stage(
    pilot_logs: list[float], builds: int, half_width: float, cap: int, multiple: int
) -> tuple[int, int]:
    """A row's builds in all and Stein's size before the cost stop: :func:`two_stage_size` on the
    pilot's values, rounded up to a ``multiple`` (the build orders' cycle), at most ``cap``; the
    pilot alone where ``half_width`` is 0. Both depend on the pilot's spread alone."""
    if half_width <= 0:
        return builds, builds
    need = -(-two_stage_size(pilot_logs, math.log1p(half_width)) // multiple) * multiple
    return max(builds, min(need, cap)), need


#: The level at which a row's second stage is said to spread wider than its pilot (:func:`spreads`).
WIDER_AT = 0.05


def spreads(logs: list[float], pilot: int) -> dict[str, float | None]:
    """The sd of the pilot's build values and of the second stage's (None under two builds), and
    ``wider_p``: the one-sided F test's p-value that the second stage spreads wider than the pilot,
    ``P(F(n2 - 1, n0 - 1) >= s2^2 / s0^2)`` (``prereg.tdist.f_sf``; None without a second sd).
    Stein's interval takes the pilot's spread for the whole row, exact only while the spread stays
    the same: below :data:`WIDER_AT` the row says so, and ``--reread`` gives the plain interval."""
    rest = logs[pilot:]
    s0 = statistics.stdev(logs[:pilot])
    s2 = statistics.stdev(rest) if len(rest) >= 2 else None
    p = f_sf(s2**2 / s0**2, len(rest) - 1, pilot - 1) if s2 is not None and s0 > 0 else None
    return {"pilot_sd": s0, "second_sd": s2, "wider_p": p}


def wider(r: dict[str, Any]) -> bool:
    """Whether a row's second stage spread wider than its pilot: ``wider_p`` (:func:`spreads`)
    below :data:`WIDER_AT`; the Builds cell and :func:`verdict` both ask here."""
    p = r.get("wider_p")
    return p is not None and p < WIDER_AT


def run_loop(
    build: Callable[[str], Any],
    rounds: int,
    warmup: int,
    builds: int,
    half_width: float = 0.0,
    cap: int = MAX_BUILDS,
    lead_in: int = LEAD_IN,
) -> dict[str, Any]:
    """The four arms over fresh builds of ``rounds // builds`` rounds each: ``builds`` of them (the
    pilot), then, where ``half_width`` is above 0, as many more as Stein's rule asks for on the
    pilot's auto column (:func:`second_stage`). Packed's and auto's ratios are to the reference of
    native's two builds (native and twin), twin's to native's alone (:func:`over_builds`); auto's
    choices and the bits."""
    per = rounds // builds
    runs = [one_build(build, b, per, warmup, lead_in) for b in range(builds)]
    t = [[r["times"][arm] for r in runs] for arm in ARMS]
    size, need = second_stage(build_logs(t[2], t[0], t[3]), builds, half_width, cap, len(ORDERS))
    runs += [one_build(build, b, per, warmup, lead_in) for b in range(builds, size)]
    native, packed, auto, twin = ([r["times"][arm] for r in runs] for arm in ARMS)
    modes = collections.Counter(r["mode"] for r in runs)
    pilot = builds if half_width > 0 else None
    out = {
        "native_ms": statistics.median(x for t in native for x in t) * 1e3,
        "packed": over_builds(native, packed, twin, pilot=pilot),
        "auto": over_builds(native, auto, twin, pilot=pilot),
        "twin": over_builds(native, twin, pilot=pilot),
        "builds": size,
        "pilot": builds,
        "needed": need,
        "auto_mode": ", ".join(f"{m} {n}/{size}" for m, n in sorted(modes.items())),
        "auto_modes": dict(modes),
        "auto_report": runs[-1]["report"],
        "packed_kernel": runs[-1]["kernel"],
        "bitwise": all(r["bitwise"] for r in runs),
        "parameters": runs[-1]["parameters"],
    }
    return {**out, **spreads(out["auto"]["logs"], builds)}


#: Where the spin of B's timed iteration runs, by round: right after it (the default), right before
#: it, or alternately (before in even rounds, after in odd). B's lead-in iterations spin right
#: before themselves. A spin leaves the intra-op pool idle, so at two threads it is a gap before
#: whichever iteration follows it, which the truth (the spins alone) does not count: with
#: ``after`` that iteration is always untimed (B's own lead-in, or the next arm's), so the truth is
#: the whole of the plant; ``before`` puts the gap inside B's timed iteration.
SPIN_AT = ("after", "before", "alternate")


#: The design check's orders within a round: all six orders of its three arms (A and C native, B
#: native with the spin), one a round, cycling: each arm in each place twice, and in the stream of
#: turns each arm right after each arm, itself included, twice (as :data:`ROUND_ORDERS`).
PLANT_ORDERS = ("abc", "cab", "bac", "cba", "acb", "bca")


def plant_build(
    build: Callable[[str], Any],
    n: int,
    rounds: int,
    warmup: int,
    cost: float,
    share: float,
    at: str,
    lead_in: int = LEAD_IN,
) -> tuple[dict[str, list[float]], list[float], float]:
    """One fresh build of the design check: the three arms' timed iterations over ``rounds`` rounds,
    each turn ``lead_in`` untimed iterations and one timed (:func:`turn`; B spins in every
    iteration, where ``at`` says: the plant is part of B's loop), the spins of B's timed iterations
    as they ran, and the spin's length (``share`` of A's median warm-up iteration in the first
    build, ``cost`` after)."""
    loops, spacers = placed(build, {"a": "native", "b": "native", "c": "native"}, n)
    warm: dict[str, list[float]] = {}
    for arm in loops:  # in the order built, as the loops' (WARM_IN_BUILD_ORDER)
        warm[arm] = [timed(loops[arm], k) for k in range(min(warmup, SOLO_WARMUP))]
    cost = cost or share * statistics.median(warm["a"])
    times: dict[str, list[float]] = {arm: [] for arm in "abc"}
    spun: list[float] = []
    ran: list[float] = []

    def spun_b(k: int, timed_from: int, at_timed: bool) -> None:
        before = k < timed_from or at_timed  # a lead-in iteration spins before itself (SPIN_AT)
        if before:
            ran.append(spin(cost))
        loops["b"].iteration(k)
        if not before:
            ran.append(spin(cost))

    for r in range(rounds):
        k = warmup + r * (lead_in + 1)
        before = at == "before" or (at == "alternate" and r % 2 == 0)
        for arm in PLANT_ORDERS[r % len(PLANT_ORDERS)]:
            if arm != "b":
                times[arm].append(turn(loops[arm].iteration, k, lead_in))
                continue
            step = functools.partial(spun_b, timed_from=k + lead_in, at_timed=before)
            times["b"].append(turn(step, k, lead_in))
            spun.append(ran[-1])  # the timed iteration's
    return times, spun, cost  # the loops and the spacers go with the frame


def planted(
    build: Callable[[str], Any],
    rounds: int,
    warmup: int,
    share: float,
    builds: int,
    at: str = "after",
    half_width: float = 0.0,
    cap: int = MAX_BUILDS,
    lead_in: int = LEAD_IN,
) -> dict[str, Any]:
    """The design check with the loops' estimator: native three times, a spin of ``share`` of
    native's median warm-up iteration (the first build's) in B, A and C its reference, over
    ``builds`` fresh builds as the loops' (:func:`placed`) and as many more as Stein's rule asks
    for (:func:`second_stage`), the six orders of three cycling by round, the spin where ``at``
    says (:data:`SPIN_AT`). Truth: the geometric mean over every round of (the reference's
    iteration, the geometric mean of A's and C's, + the spin as it ran) / the reference's."""
    runs = []
    cost = 0.0
    for n in range(builds):
        runs.append(plant_build(build, n, rounds // builds, warmup, cost, share, at, lead_in))
        cost = runs[-1][2]
    t = {arm: [r[0][arm] for r in runs] for arm in "abc"}
    size, need = second_stage(
        build_logs(t["b"], t["a"], t["c"]), builds, half_width, cap, 3
    )  # placed rotates 3
    runs += [
        plant_build(build, n, rounds // builds, warmup, cost, share, at, lead_in) for n in range(builds, size)
    ]
    ta, tb, tc = ([r[0][arm] for r in runs] for arm in "abc")
    spun = [s for r in runs for s in r[1]]
    ref = [math.sqrt(x * y) for a, c in zip(ta, tc) for x, y in zip(a, c)]
    truth = math.exp(statistics.fmean(math.log((x + s) / x) for x, s in zip(ref, spun)))
    read = over_builds(ta, tb, tc, pilot=builds if half_width > 0 else None)
    return {
        "cost_ms": cost * 1e3,
        "truth": truth,
        "read": read,
        "covered": read["low"] <= truth <= read["high"],
        "builds": size,
        "pilot": builds,
        "needed": need,
        **spreads(read["logs"], builds),
    }


def ratio_cell(r: dict[str, float]) -> str:
    return f"{r['ratio']:.3f} ({r['low']:.3f}-{r['high']:.3f})"


def builds_cell(r: dict[str, Any]) -> str:
    """A row's builds: the pilot's and the second stage's, where the cost stop bound how many
    Stein's rule asked for, and the spread of the build values in each stage."""
    more = r["builds"] - r["pilot"]
    cap = f", capped: {r['needed']} asked for" if r["needed"] > r["builds"] else ""
    sd = f"; sd {r['pilot_sd']:.4f}" + (f", then {r['second_sd']:.4f}" if r["second_sd"] is not None else "")
    wide = (
        f"; wider than the pilot, F test p = {r['wider_p']:.2g}: Stein's interval too narrow"
        if wider(r)
        else ""
    )
    return f"{r['builds']} ({r['pilot']} + {more}{cap}{sd}{wide})"


def header(args: argparse.Namespace) -> list[str]:
    env = " ".join(
        f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS") if k in os.environ
    )
    command = " ".join(shlex.quote(x) for x in ["python", *sys.argv])
    return [
        f"command: {(env + ' ') if env else ''}{command}",
        f"CPU: {cpu_model()} ({platform.machine()}, {os.cpu_count()} logical CPUs); torch {torch.__version__} "
        f"dispatches {torch.backends.cpu.get_cpu_capability()} (ATEN_CPU_CAPABILITY="
        f"{os.environ.get('ATEN_CPU_CAPABILITY', 'unset')})",
        f"{args.rounds // args.builds} timed rounds in each fresh build of every arm{turns(args)}, "
        f"{args.builds} builds per row "
        f"{stages(args)}, each arm after {args.warmup} solo warm-up iterations in every "
        f"build (auto decides after {DECIDES_AFTER}); ratios: "
        "geometric mean of the builds' geometric means of per-round ratios (packed and auto to the mean of "
        "native's two builds, twin to native's), 95% Student-t interval over the builds",
        f"expected duration: about {expected_minutes(args):.0f} minutes (full-size models){later(args)}",
    ]


def turns(args: argparse.Namespace) -> str:
    """The header's words on a turn (:func:`turn`) and on whether the rounds make whole cycles of
    :data:`ROUND_ORDERS` and :data:`PLANT_ORDERS`, which balance place and carryover only whole."""
    per = args.rounds // args.builds
    cycle = math.lcm(len(ROUND_ORDERS), len(PLANT_ORDERS))
    whole = (
        "" if per % cycle == 0 else f" (not a multiple of {cycle}: place and carryover only nearly balanced)"
    )
    if args.lead_in == 0:
        return f"{whole}, the arms taking turns one step each (--lead-in 0)"
    return f"{whole}, each timed step after {args.lead_in} untimed of the arm's own (--lead-in)"


def stages(args: argparse.Namespace) -> str:
    if args.half_width <= 0:
        return "(one stage)"
    return (
        f"in the pilot, then as many more as Stein's two-stage rule asks for on the pilot's auto column for a "
        f"half-width of {args.half_width:g}% (at most {args.max_builds} in all; the interval's df: the pilot's)"
    )


def later(args: argparse.Namespace) -> str:
    return ", for the pilots; the second stages add to it" if args.half_width > 0 else ""


PLANT_HEAD = [
    "| Design check | Threads | torch dispatches | A's iteration (ms) | Planted spin (ms) | Truth "
    "| Read (95% CI) | Truth inside | Builds (pilot + Stein's second stage) |",
    "|---|---|---|---|---|---|---|---|---|",
]
LOOP_HEAD = [
    "| Loop | Threads | torch dispatches | Native iteration (ms) | packed / native, both builds (95% CI) "
    "| default (auto) / native, both builds (95% CI) | auto chose | auto at most native (ratio <= 1.00, upper <= 1.01) "
    "| Bitwise, one pass on | twin (native built again) / native (95% CI) | Builds (pilot + Stein's second stage) |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]


def save(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """``--json``: the results so far, after every row (a run stopped early keeps its finished rows;
    the whole table's lines come at the end), replaced whole, never half-written."""
    if not args.json:
        return
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def plant_rows(args: argparse.Namespace, results: dict[str, Any]) -> list[str]:
    """The design check at each thread count (nanoGPT's loop, native in three arms, a spin in one)."""
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        build = builders(args, ["nanogpt"])["nanogpt"]
        p = planted(
            build,
            args.rounds,
            args.warmup,
            args.plant,
            args.builds,
            args.spin_at,
            args.half_width / 100,
            args.max_builds,
            args.lead_in,
        )
        results[f"planted/{threads}"] = p
        save(args, results)
        where = "" if args.spin_at == "after" else f", spin {args.spin_at}"
        rows.append(
            f"| A/A, {args.plant:.0%} of an iteration planted in B (nanogpt{where}) | {threads} "
            f"| {torch.backends.cpu.get_cpu_capability()} | {p['read']['native_ms']:.2f} | {p['cost_ms']:.3f} "
            f"| {p['truth']:.4f} | {ratio_cell(p['read'])} | {'yes' if p['covered'] else 'NO'} | {builds_cell(p)} |"
        )
        print(rows[-1], flush=True)
    return rows


def table_rows(args: argparse.Namespace, threads: int, results: dict[str, Any]) -> list[str]:
    """The loops' rows at ``threads``."""
    rows = []
    cap = torch.backends.cpu.get_cpu_capability()
    for name, build in builders(args, args.loops).items():
        r = run_loop(
            build, args.rounds, args.warmup, args.builds, args.half_width / 100, args.max_builds, args.lead_in
        )
        results[f"{name}/{threads}"] = r
        r["at_most_native"] = at_most_native(r["auto"])
        save(args, results)
        at_most = "yes" if r["at_most_native"] else "NO"
        kern = "phase.c" if r["packed_kernel"].startswith("phase.c") else "torch kernels"
        rows.append(
            f"| {name} ({r['parameters'] / 1e6:.2f}M) | {threads} | {cap} | {r['native_ms']:.2f} "
            f"| {ratio_cell(r['packed'])} | {ratio_cell(r['auto'])} | {r['auto_mode']} | {at_most} "
            f"| {r['bitwise']}, {kern} | {ratio_cell(r['twin'])} | {builds_cell(r)} |"
        )
        print(rows[-1], flush=True)
    return rows


def loop_table(args: argparse.Namespace, results: dict[str, Any]) -> list[str]:
    """Every loop's rows at every thread count, then :func:`verdict`, printed as they come."""
    print("\n" + "\n".join(LOOP_HEAD), flush=True)
    table = ["", *LOOP_HEAD]
    for threads in args.threads:
        torch.set_num_threads(threads)
        table += table_rows(args, threads, results)
    lines = verdict(results)
    print("\n".join(lines), flush=True)
    return [*table, "", *lines]


def verdict(results: dict[str, Any]) -> list[str]:
    """The lines under the table: the rows whose second stage spread wider than their pilot (F test,
    :func:`spreads`), where Stein's interval is too narrow, and the count of rows that meet the
    promise."""
    rows = [v for k, v in results.items() if not k.startswith("planted/") and isinstance(v, dict)]
    met = sum(r["at_most_native"] for r in rows)
    wide = [k for k, v in results.items() if isinstance(v, dict) and wider(v)]
    lines = []
    if wide:
        lines.append(
            f"second stage wider than the pilot (F test, p < {WIDER_AT}) in {len(wide)} row(s), {', '.join(wide)}: "
            "Stein's interval too narrow there; --reread gives the plain t over all builds"
        )
    lines.append(
        f"auto at most native (ratio <= {RATIO_MAX:.2f}, upper <= {UPPER_MAX:.2f}): {met} of {len(rows)} rows"
    )
    return lines


REREAD_HEAD = [
    "| Run | Row | Arm | Builds (pilot) | sd: pilot, second stage | Rounds' share of a build's variance "
    "| Stein's interval (the table's) | Plain t over all builds | Check | Under Stein's | Under the plain t |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
#: The A/A checks whose 95% intervals miss their truth by chance in 5% of rows: twin's (1) and the
#: design check's (the planted truth); :func:`reread` counts the misses over all the runs given.
MISS_CHANCE = 0.05
AA_CHECKS = {"twin": "twin's interval excluded 1", "read": "the design check's interval excluded its truth"}
#: Timed rounds a build that :func:`reread` prices a run's rows at: multiples of 24, the cycle of
#: both :data:`ROUND_ORDERS` (8) and :data:`PLANT_ORDERS` (6).
ROUNDS_PRICED = (24, 48, 72, 96)


def rounds_share(r: dict[str, Any]) -> float | None:
    """The rounds' share of the variance of an arm's build values: ``round_sd^2 / (rounds / n)``
    over the builds' variance (:func:`over_builds`). Near 1, the builds differ by their rounds'
    noise alone; below 1, placement adds its own, which more rounds a build cannot shrink. The
    builds' variance is itself an estimate (with 19 df, 0.46-1.7 times the true one 95% of the
    time), and the balanced orders cancel in a build's mean what varies with the place in the round,
    so the share can read above 1. None where the JSON has no ``round_sd`` or the builds do not
    vary."""
    if r.get("round_sd") is None or len(r["logs"]) < 2 or statistics.variance(r["logs"]) == 0:
        return None
    if not (r["rounds"] > 0 and math.isfinite(r["round_sd"]) and r["round_sd"] >= 0):
        raise ValueError(f"rounds {r['rounds']!r}, round_sd {r['round_sd']!r}: not a run's")
    return r["round_sd"] ** 2 / (r["rounds"] / len(r["logs"])) / statistics.variance(r["logs"])


def rows_of(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A run's rows (design checks and loops), in the order they ran; ValueError where there are none."""
    rows = [(key, r) for key, r in data.items() if isinstance(r, dict) and "/" in key]
    if not rows:
        raise ValueError("no rows (keys LOOP/THREADS or planted/THREADS)")
    return rows


def rounds_cost(
    data: dict[str, Any], rounds: int, warmup: int = DECIDES_AFTER + 4, lead_in: int = LEAD_IN
) -> float | None:
    """The steps a run's rows would take at ``rounds`` timed rounds a build, over the steps they
    take at the run's own, for the same intervals; None where a row lacks its rounds' share.

    Notes
    -----
    Each row's builds are Stein's size, ``(t s0 / h)^2``, proportional to the pilot's variance
    ``s0^2``. With a share ``f`` of it from the rounds (:func:`rounds_share`, at most 1) and ``r0``
    rounds a build, ``r`` rounds scale it by ``1 - f + f r0 / r``, so a row takes
    ``max(pilot, needed (1 - f + f r0 / r))`` builds (``needed``: the run's Stein size, before the
    cost stop, which is left out), each of ``arms (warmup + (1 + lead_in) r)`` steps (``arms``: 4,
    or 3 in a design check). It prices the column each row is sized on: auto's, or the check's.
    It assumes the defaults' warm-up and lead-in unless told.
    """
    steps = {rounds: 0.0, "own": 0.0}
    for key, row in rows_of(data):
        arm, arms = ("read", 3) if key.startswith("planted/") else ("auto", 4)
        x = row[arm]
        share = rounds_share(x)
        if share is None:
            return None
        f, own = min(share, 1.0), x["rounds"] / len(x["logs"])
        for k, r in ((rounds, rounds), ("own", own)):
            builds = max(row["pilot"], row["needed"] * (1 - f + f * own / r))
            steps[k] += builds * arms * (warmup + (1 + lead_in) * r)
    return steps[rounds] / steps["own"]


def reread_rows(name: str, data: dict[str, Any], misses: dict[str, list[int]]) -> list[str]:
    """One run's rows for :func:`reread`; adds each A/A check's misses under Stein's and the plain
    t to ``misses`` (check -> [rows, Stein's misses, the plain t's misses])."""
    rows = []
    for key, r in rows_of(data):
        checks = (
            [("read", "truth inside", lambda c, t=r["truth"]: c["low"] <= t <= c["high"])]
            if key.startswith("planted/")
            else [
                ("auto", "at most native", at_most_native),
                ("twin", "1 inside", lambda c: c["low"] <= 1 <= c["high"]),
            ]
        )
        for arm, what, check in checks:
            logs, pilot = r[arm]["logs"], r["pilot"]
            cells = [
                {"ratio": math.exp(ci.estimate), "low": math.exp(ci.low), "high": math.exp(ci.high)}
                for ci in (two_stage_interval(logs, pilot, 0.95), mean_interval(logs, 0.95))
            ]
            held = [check(c) for c in cells]
            if arm in AA_CHECKS:
                count = misses.setdefault(AA_CHECKS[arm], [0, 0, 0])
                count[0] += 1
                count[1] += not held[0]
                count[2] += not held[1]
            sd = spreads(logs, pilot)  # this arm's own
            second = f"{sd['second_sd']:.4f}" if sd["second_sd"] is not None else "-"
            share = rounds_share(r[arm])
            rows.append(
                f"| {name} | {key} | {arm} | {len(logs)} ({pilot}) | {sd['pilot_sd']:.4f}, {second} "
                f"| {'-' if share is None else f'{share:.2f}'} | {ratio_cell(cells[0])} | {ratio_cell(cells[1])} "
                f"| {what} | {'yes' if held[0] else 'NO'} | {'yes' if held[1] else 'NO'} |"
            )
    return rows


def run_names(paths: list[str]) -> list[str]:
    """Each run's name in :func:`reread`: the file's stem, or its folder and stem where stems
    repeat, or the path as given where those repeat too (distinct, since the same file twice is
    refused)."""
    if len({Path(p).resolve() for p in paths}) < len(paths):
        raise SystemExit("never_slower.py: --reread: a file given twice would count its rows twice")
    for name in (lambda p: Path(p).stem, lambda p: f"{Path(p).parent.name}/{Path(p).stem}"):
        names = [name(p) for p in paths]
        if len(set(names)) == len(names):
            return names
    return list(paths)


def reread(paths: list[str]) -> list[str]:
    """Runs' JSONs read again: for each row's auto and twin and each design check, the builds'
    values (``logs``) under Stein's interval (the table's: the pilot's spread, ``pilot - 1`` df) and
    under the plain Student-t interval over all the builds (their own spread, ``n - 1`` df), the
    rounds' share of their variance (:func:`rounds_share`), and the row's check under each: auto
    meets the promise (:func:`at_most_native`), twin's interval holds 1, the design check's holds
    its truth. Stein's is exact where the spread stays the same; where the second stage spreads
    wider than the pilot (the machine grew noisier), it is too narrow and the plain interval, which
    sees the whole spread, is the one to read. Then, for each run, what its rows would have cost
    at :data:`ROUNDS_PRICED` rounds a build (:func:`rounds_cost`).

    Notes
    -----
    Last, over all the runs, each A/A check's misses ``k`` of ``n`` rows under each interval, with
    the chance of ``k`` or more by chance alone, ``P(X >= k)`` for ``X ~ Binomial(n, 0.05)``
    (``1 - prereg.planted.binom_cdf(k - 1, n, 0.05)``): a small chance says the intervals miss
    more often than 95% intervals do. It takes rows as independent, which rows of one run on one
    machine need not be.
    """
    rows = list(REREAD_HEAD)
    misses: dict[str, list[int]] = {}
    costs = []
    for path, name in zip(paths, run_names(paths)):
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            rows += reread_rows(name, data, misses)
            priced = [rounds_cost(data, r) for r in ROUNDS_PRICED]
        except OSError as e:
            raise SystemExit(f"never_slower.py: --reread {path}: cannot read it ({e.strerror})") from None
        except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError, RecursionError) as e:
            raise SystemExit(
                f"never_slower.py: --reread {path}: not a never_slower JSON ({type(e).__name__}: {e})"
            ) from None
        if None not in priced:
            costs.append(
                f"{name}: at {', '.join(map(str, ROUNDS_PRICED))} timed rounds a build its rows would take "
                f"{', '.join(f'{c:.2f}' for c in priced)} of its steps (rounds_cost: Stein's sizes scaled by "
                "the rounds' share, no cost stop, the default warm-up and lead-in)"
            )
    rows += ["", *costs]
    for what, (n, stein, plain) in misses.items():
        chance = [1.0 - binom_cdf(k - 1, n, MISS_CHANCE) for k in (stein, plain)]
        rows.append(
            f"{what} in {stein} of {n} rows under Stein's (P(as many or more by chance) = {chance[0]:.3f}), "
            f"{plain} under the plain t ({chance[1]:.3f}); a 95% interval misses in {MISS_CHANCE:.0%} of rows, "
            "rows taken as independent"
        )
    return rows


def add_design_args(ap: argparse.ArgumentParser) -> None:
    """The design's options: the turns, the builds and their two stages, the design check."""
    ap.add_argument(
        "--lead-in",
        type=int,
        default=LEAD_IN,
        help=f"untimed iterations of each arm before each timed one (default {LEAD_IN}: LEAD_IN; 0: arms alternate step by step)",
    )
    ap.add_argument(
        "--builds",
        type=int,
        help=f"fresh builds of every arm per row, the rounds split between them (default {BUILDS}: builds_needed(); --quick 2)",
    )
    ap.add_argument(
        "--half-width",
        type=float,
        help=f"the second stage's target half-width of auto's interval, percent (default {HALF_WIDTH * 100:g}: "
        "HALF_WIDTH; --quick 0; 0: one stage, --builds in all)",
    )
    ap.add_argument(
        "--max-builds",
        type=int,
        default=MAX_BUILDS,
        help=f"a row's builds at most, the pilot's included (default {MAX_BUILDS}: MAX_BUILDS; unused at --half-width 0)",
    )
    ap.add_argument(
        "--plant", type=float, default=0.02, help="the A/A's planted cost, a share of an iteration"
    )
    ap.add_argument(
        "--spin-at",
        choices=SPIN_AT,
        default="after",
        help="where B's spin runs in the design check (SPIN_AT)",
    )
    ap.add_argument("--check-only", action="store_true", help="the design check alone, no loops' rows")


def settled(ap: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The defaults that depend on ``--quick``, then the checks (``ap.error``: exit 2, no traceback)."""
    if args.rounds is None:
        args.rounds = 12 if args.quick else ROUNDS
    if args.builds is None:
        args.builds = 2 if args.quick else BUILDS
    if args.half_width is None:
        args.half_width = 0.0 if args.quick else HALF_WIDTH * 100
    if args.quick:
        args.nanogpt_layers, args.nanogpt_width, args.timm_size = 2, 64, 16
        args.cnn_width, args.cnn_batch, args.cnn_size = 8, 4, 16
    if args.check_only and args.plant <= 0:
        ap.error("--check-only runs the design check alone: it needs --plant above 0")
    if args.builds < 2 or args.rounds < args.builds or args.warmup < 1 or args.lead_in < 0:
        ap.error(
            "--builds must be at least 2 (an interval needs two), --rounds at least --builds, --warmup at least 1, "
            "--lead-in 0 or more"
        )
    if not (math.isfinite(args.half_width) and args.half_width >= 0) or args.max_builds < args.builds:
        ap.error("--half-width must be a number, 0 or more; --max-builds at least --builds")
    return args


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI size: 12 rounds, smaller models and batches")
    ap.add_argument(
        "--rounds",
        type=int,
        help=f"timed rounds per row (default {ROUNDS}: {ROUNDS_PER_BUILD} a build; --quick 12)",
    )
    ap.add_argument("--warmup", type=int, default=DECIDES_AFTER + 4, help="solo warm-up iterations per arm")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--loops", nargs="+", default=list(LOOPS), choices=LOOPS)
    add_design_args(ap)
    add_loop_sizes(ap)  # the loops' sizes (--quick shrinks them)
    ap.add_argument(
        "--json",
        help='write the results as JSON to this path, after every row (no "table" key until the run ends)',
    )
    ap.add_argument(
        "--reread",
        metavar="JSON",
        nargs="+",
        help="read runs' --json again: each row under Stein's interval and the plain t over all builds, then "
        "the A/A checks' misses over all of them against chance (reread)",
    )
    return settled(ap, ap.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.reread:
        print("\n".join(reread(args.reread)))
        return 0
    # auto's own report (a UserWarning where it steps natively) is the table's "auto chose" and the JSON's
    warnings.filterwarnings("ignore", message=r"PackedAdamW\(mode='auto'\) measured")
    lines = header(args)
    print("\n".join(lines), flush=True)
    results: dict[str, Any] = {"header": lines}
    table: list[str] = []
    if args.plant > 0:  # the design's own check first: a known cost must read as itself
        print("\n" + "\n".join(PLANT_HEAD), flush=True)
        table += ["", *PLANT_HEAD, *plant_rows(args, results)]
    if not args.check_only:
        table += loop_table(args, results)
    results["table"] = table  # a JSON without it is a run that stopped early
    save(args, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Packed or native: which way :class:`~cotangent.PackedAdamW` steps, and the measurement that chooses.

Packing pays in backward (each gradient delivered into its slot of the flat buffer) for what it saves
in the gradient phase. Where delivery costs more than the phase saves (a convolutional model whose
gradient buffer outgrows the caches, ``docs/benchmark.md``), the optimizer steps natively: backward
stores its own gradients, the clip is ``torch.nn.utils.clip_grad_norm_`` and the step native's fused
AdamW call over per-parameter tensors. The state (``exp_avg``, ``exp_avg_sq``, ``step``) stays where it
is, so a switch in either direction carries it over exactly and both modes give native's bits: the
measurement decides the speed, never the bits.

``"auto"`` measures over the first iterations of the loop itself: an iteration is the time between
two ends of a gradient phase (``zero_grad()`` or ``clip_step_zero_grad()`` after a step). After
:data:`WARMUP` iterations packed, :data:`BLOCKS` blocks of four iterations run packed, native,
native, packed (ABBA: a linear drift over a block cancels). Each block gives one ratio,
``(P1 + P2) / (N1 + N2)``; packed is kept only where the one-sided upper bound on their median
(the :data:`RANK`-th smallest of the :data:`BLOCKS`, the sign test's, :func:`bound`) lies below
``1 - MARGIN``, i.e. only where packed is *clearly* faster: anywhere else (a tie, a noisy loop,
packed slower) it steps natively from then on. Where packed is in truth no faster than native,
it is kept with probability at most ``1 - COVERAGE`` (1.9%) whatever the distribution of the
block ratios, provided they are independent (``docs/method.md``, "Packed or native", has the rule, a simulation of its error
rate and the cost of deciding).
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

MODES = ("auto", "packed", "native")

#: The environment variable that sets the mode where the constructor's ``mode`` is left unset.
ENV = "COTANGENT_MODE"

#: Iterations run packed before the measurement (first-step allocations, caches, the kernel's checks).
WARMUP = 4
#: Blocks of four measured iterations (packed, native, native, packed).
BLOCKS = 12
PATTERN = ("packed", "native", "native", "packed")
#: The least one-sided confidence of the bound that keeps packed.
LEVEL = 0.95


def order_rank(blocks: int, level: float) -> int:
    """The rank ``j`` of the order statistic ``d_(j)`` that is a one-sided upper ``level`` bound on
    the median of ``blocks`` independent values (distribution-free: the sign test's).

    Notes
    -----
    ``d_(j)`` lies below the median only when at most ``j - 1`` values do, so
    ``P(median <= d_(j)) = P(Binomial(blocks, 1/2) <= j - 1)``; ``j`` is the smallest rank at which
    that reaches ``level``."""
    total = 0
    for j in range(blocks + 1):
        total += math.comb(blocks, j)
        if total / 2**blocks >= level:
            return j + 1
    raise ValueError(f"{blocks} blocks cannot bound a median at {level}")


#: The rank of the bound among the sorted block log ratios (10 of 12).
RANK = order_rank(BLOCKS, LEVEL)
#: The bound's exact confidence, ``P(Binomial(BLOCKS, 1/2) <= RANK - 1)`` (0.9807 for 10 of 12): where
#: packed is in truth no faster (median block ratio at least 1), it is kept with at most ``1 - COVERAGE``.
COVERAGE = math.fsum(math.comb(BLOCKS, j) for j in range(RANK)) / 2**BLOCKS
#: Packed is kept only where its upper bound on packed / native is below ``1 - MARGIN``.
MARGIN = 0.0
#: Iterations ``mode="auto"`` runs before the one that takes the decided mode (warm-up + measured).
DECIDES_AFTER = WARMUP + 4 * BLOCKS


_INSIDE = (str(Path(__file__).resolve().parent), str(Path(torch.__file__).resolve().parent))


def user_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel`` (called from the function that warns) that names the first
    frame outside this package and torch: the user's line that ended the iteration."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame = frame.f_back
        level += 1
    return level


def resolve(mode: str | None) -> str:
    """The mode asked for: ``mode`` where given, else :data:`ENV`, else ``"auto"``; a value that is
    none of :data:`MODES` is refused, naming where it came from."""
    if mode is None:
        raw = os.environ.get(ENV)
        if raw is None or raw == "":
            return "auto"
        if raw not in MODES:
            raise ValueError(f"environment variable {ENV}={raw!r}: must be one of {', '.join(MODES)}")
        return raw
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)} (or None: {ENV}, else auto), not {mode!r}")
    return mode


class Chooser:
    """The ``"auto"`` schedule: which mode each iteration runs in, and the decision.

    :meth:`tick` is called at the end of each iteration's gradient phase with the mode that
    iteration ran in; it returns the mode for the next one. ``clock`` is the timer (replaceable,
    so the decision can be tested without timing anything); ``sync``, where given, runs just
    before each clock reading while measuring (``torch.cuda.synchronize`` for an optimizer over
    CUDA tensors, whose kernels run asynchronously; ``None`` on the CPU: no synchronisation). Once
    decided, :meth:`tick` reads no clock."""

    def __init__(
        self, clock: Callable[[], float] = time.perf_counter, sync: Callable[[], None] | None = None
    ) -> None:
        self.clock = clock
        self.sync = sync
        self.ticks = 0
        self.last: float | None = None
        self.times: dict[str, list[float]] = {"packed": [], "native": []}
        self.measured: list[tuple[str, float]] = []  # (mode, seconds) of each measured iteration
        self.decided: str | None = None
        self.report: str | None = None
        self.ratio: float | None = None  # packed / native: the median block ratio
        self.upper: float | None = None  # its one-sided upper COVERAGE bound

    def tick(self, current: str) -> str:
        """One more iteration ended (it ran in ``current``); the mode of the next one."""
        if self.decided is not None:
            return self.decided
        if self.sync is not None:
            self.sync()
        now = self.clock()
        measured = self.ticks - WARMUP  # index of the iteration that just ended, among the measured
        if 0 <= measured < 4 * BLOCKS and self.last is not None:
            self.times[current].append(now - self.last)
            self.measured.append((current, now - self.last))
        self.ticks += 1
        self.last = now
        upcoming = self.ticks - WARMUP
        if upcoming < 0:
            return "packed"
        if upcoming < 4 * BLOCKS:
            return PATTERN[upcoming % 4]
        return self.decide()

    def decide(self) -> str:
        """Packed where the upper bound on packed / native is below ``1 - MARGIN``, else native."""
        self.ratio, self.upper = bound(block_log_ratios(self.measured))
        self.decided = "packed" if self.upper < 1.0 - MARGIN else "native"
        packed = statistics.median(self.times["packed"])
        native = statistics.median(self.times["native"])
        self.report = (
            f"PackedAdamW(mode='auto') measured {len(self.measured)} iterations after {WARMUP} warm-up "
            f"in {BLOCKS} blocks packed/native/native/packed: median iteration {packed * 1e3:.3f} ms packed, "
            f"{native * 1e3:.3f} ms native; median block packed / native {self.ratio:.3f}, upper "
            f"{COVERAGE:.1%} bound {self.upper:.3f}; "
            + (
                "packed is not clearly faster here, so from now on it steps natively (native clip "
                "and fused AdamW, the same bits)"
                if self.decided == "native"
                else "it keeps the packed phase"
            )
        )
        return self.decided


def block_log_ratios(measured: list[tuple[str, float]]) -> list[float]:
    """One ``log(packed / native)`` per block of four iterations: the sum of its packed iterations
    over the sum of its native ones (a block that lacks either mode, or a non-positive time, is
    skipped)."""
    out = []
    for b in range(0, len(measured) - 3, 4):
        block = measured[b : b + 4]
        p = math.fsum(t for m, t in block if m == "packed")
        n = math.fsum(t for m, t in block if m == "native")
        if p > 0 and n > 0:
            out.append(math.log(p / n))
    return out


def bound(logs: list[float]) -> tuple[float, float]:
    """The median block ratio packed / native and its one-sided upper :data:`COVERAGE` bound.

    Notes
    -----
    With ``B`` block log ratios sorted, ``d_(1) <= ... <= d_(B)``, the estimate is ``exp`` of their
    median and the bound ``exp(d_(RANK))`` (:func:`order_rank`): distribution-free, so an
    outlying iteration (a pause, another process) moves neither by more than one rank, where a
    Student-t bound on the mean would be carried by it. ``d_(RANK) < 0`` is the sign test's
    rejection: at least ``RANK`` of the ``B`` blocks ran faster packed. Fewer than ``BLOCKS`` usable
    blocks (a clock that did not move) give an infinite bound: not clearly faster.
    """
    if len(logs) < BLOCKS:
        return math.exp(statistics.median(logs)) if logs else 1.0, math.inf
    ordered = sorted(logs)
    return math.exp(statistics.median(ordered)), math.exp(ordered[RANK - 1])

"""Packed or native: which way :class:`~cotangent.PackedAdamW` steps, and the measurement that chooses.

Packing pays in backward (each gradient delivered into its slot of the flat buffer) for what it saves
in the gradient phase. Where delivery costs more than the phase saves (a convolutional model whose
gradient buffer outgrows the caches, ``docs/benchmark.md``), the optimizer steps natively: backward
stores its own gradients, the clip is ``torch.nn.utils.clip_grad_norm_`` and the step native's fused
AdamW call over per-parameter tensors. The state (``exp_avg``, ``exp_avg_sq``, ``step``) stays where it
is, so a switch in either direction carries it over exactly and both modes give native's bits: the
measurement decides the speed, never the bits.

``"auto"`` measures over the first iterations of the loop itself: an iteration is the time between
two ends of a gradient phase (``zero_grad()`` or ``clip_step_zero_grad()`` after a step);
after :data:`WARMUP` iterations packed, :data:`ROUNDS` blocks of four iterations run packed,
native, native, packed (ABBA, so a drift over the block cancels), and the mode whose median
iteration is shorter is kept (native only where packed's median is longer).
"""

from __future__ import annotations

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
WARMUP = 3
#: Blocks of four measured iterations (packed, native, native, packed).
ROUNDS = 4
PATTERN = ("packed", "native", "native", "packed")


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
    so the decision can be tested without timing anything)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.ticks = 0
        self.last: float | None = None
        self.times: dict[str, list[float]] = {"packed": [], "native": []}
        self.decided: str | None = None
        self.report: str | None = None

    def tick(self, current: str) -> str:
        """One more iteration ended (it ran in ``current``); the mode of the next one."""
        now = self.clock()
        if self.decided is not None:
            return self.decided
        measured = self.ticks - WARMUP  # index of the iteration that just ended, among the measured
        if 0 <= measured < 4 * ROUNDS and self.last is not None:
            self.times[current].append(now - self.last)
        self.ticks += 1
        self.last = now
        upcoming = self.ticks - WARMUP
        if upcoming < 0:
            return "packed"
        if upcoming < 4 * ROUNDS:
            return PATTERN[upcoming % 4]
        return self.decide()

    def decide(self) -> str:
        packed = statistics.median(self.times["packed"])
        native = statistics.median(self.times["native"])
        self.decided = "native" if packed > native else "packed"
        n = len(self.times["packed"])
        self.report = (
            f"PackedAdamW(mode='auto') measured {2 * n} iterations after {WARMUP} warm-up ({n} each, "
            f"alternating packed/native ABBA): median iteration {packed * 1e3:.3f} ms packed, "
            f"{native * 1e3:.3f} ms native ({packed / native:.3f}x); "
            + (
                "delivering gradients into the packed buffer costs more than the phase saves here, so "
                "from now on it steps natively (native clip and fused AdamW, the same bits)"
                if self.decided == "native"
                else "it keeps the packed phase"
            )
        )
        return self.decided

"""A planted reference cost, run inside each timed training step of a planted study's candidate
(the kinds and the arithmetic of their truth: ``prereg/planted.py``).

The plant draws from no random state and touches nothing of the run (its buffers are its own and
filled by a formula), so the planted arm's losses, weights and BPB are bitwise its partner's; it
times itself on the wall clock and the training thread's CPU clock, and the trainer adds what it
took in the timed steps to ``timings.planted_s`` and ``planted_cpu_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from harness.reporter import plant_of
from prereg.planted import toggled

__all__ = ["Plant"]


class Plant:
    """One run's plant (``spec.planted``): call it once per step; :attr:`wall_s` and :attr:`cpu_s`
    hold what its last call took."""

    def __init__(self, planted: Mapping[str, Any], device: torch.device) -> None:
        kind = planted["kind"]
        self.kind = kind
        self.wall_s = self.cpu_s = 0.0
        self._run: Callable[[], object]
        self.toggle_steps: int | None = planted.get("toggle_steps")
        if kind != "matmul":  # the standard-library kinds, as a command arm's reporter runs them
            run = plant_of(planted)
            assert run is not None  # a plant that names its kind is never empty
            self._run = run
        else:
            n = int(planted["n"])
            # buffers of its own, by formula (no random state): values in [-1, 1]
            a = torch.arange(n * n, dtype=torch.float32, device=device).reshape(n, n).mul_(1e-3).sin_()
            b = a.t().contiguous().cos_()
            out = torch.empty(n, n, dtype=torch.float32, device=device)
            self._run = lambda: torch.mm(a, b, out=out)

    def runs_in(self, step: int) -> bool:
        """Whether the plant runs in ``step`` (0-based): every step, or its toggled blocks."""
        return toggled(step, self.toggle_steps)

    def __call__(self) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        with torch.no_grad():
            self._run()
        self.wall_s, self.cpu_s = time.perf_counter() - t0, time.thread_time() - c0

"""Calibration: preregistered numbers from a pilot's records, by a rule fixed in advance.

Rule (applied per configuration to the pilot's ``ok`` baseline-role runs):

* validation target: the median, over runs, of the validation-subset BPB at the last validation
  at or before 75% of the pilot's steps, rounded up to two decimals, so a typical baseline
  reaches it at about three quarters of the budget;
* device seconds per run: the median inclusive device time per run; a target protocol's budget
  is that times its number of runs times 1.5 (times ``--slower``, for a machine that many times
  slower than the pilot's), rounded up to the next 60 s.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from prereg.formats.record import RunRecord


class Calibrated(TypedDict):
    """One configuration's figures from the pilot's baseline runs."""

    runs: int  # the ok baseline runs
    val_target_bpb: float  # their median validation BPB at 75% of their steps, rounded up
    device_s_per_run: float  # their median device seconds


def calibrate(records: list[RunRecord]) -> dict[str, Calibrated]:
    out: dict[str, Calibrated] = {}
    by_config: dict[str, list[RunRecord]] = {}
    for r in records:
        if r.status == "ok" and r.spec.role in ("baseline", "native"):
            by_config.setdefault(r.spec.config, []).append(r)
    for config, recs in sorted(by_config.items()):
        vals, secs = [], []
        for r in recs:
            cut = 0.75 * r.spec.steps
            curve = r.val_curve or []  # an ok record has its validation curve
            points = [v for v in curve if v[0] <= cut] or curve[:1]
            vals.append(points[-1][1])
            secs.append(r.timings["device_s"])
        target = math.ceil(statistics.median(vals) * 100) / 100
        out[config] = {
            "runs": len(recs),
            "val_target_bpb": target,
            "device_s_per_run": statistics.median(secs),
        }
    return out


def budget(device_s_per_run: float, runs: int, slower: float = 1.0) -> float:
    """``device_s_per_run x runs x 1.5 x slower``, rounded up to the next 60 s: ``slower`` sizes it
    for a machine that many times slower than the pilot's (the demo's is 3)."""
    return float(math.ceil(device_s_per_run * runs * 1.5 * slower / 60) * 60)

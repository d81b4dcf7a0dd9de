"""The stall rule's one home: a run stalled when no step came for a few times its step time (and
at least :data:`STALL_FLOOR_S`), or its first step came later than a few times an earlier run's
whole time. The progress line applies it live to a running command arm's reporter files
(``harness.execute.state.StallWatch``); the report names, from the records, every run whose steps
show one (:func:`folder_stalls`), built-in and command arms alike.

From the records, a run's step times are the differences of its training clock at each step (the
record's ``curve``: step, loss, clock), and the time before its first step is its set-up and
compile time (``timings.setup_s``, ``timings.compile_s``) and its clock at the first step.
"""

from __future__ import annotations

import glob
import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from prereg.bounded import InputLimitError, parse_json, read_regular

#: A run shows as stalled when no step has come for this many times its step time ...
STALL_STEP_TIMES = 5
#: ... and for at least this many seconds (a step time read at the beat's one-second grain).
STALL_FLOOR_S = 30.0
#: Before its first step: this many times an earlier run's whole time (start-up included).
STALL_RUN_TIMES = 3


def first_step_limit(executed_s: list[float]) -> float:
    """How long a run may go without its first step before it shows as stalled: a few times the
    median earlier run's whole time, at least :data:`STALL_FLOOR_S` (4 x that with none yet)."""
    if not executed_s:
        return 4 * STALL_FLOOR_S
    mid = sorted(executed_s)[len(executed_s) // 2]
    return max(STALL_FLOOR_S, STALL_RUN_TIMES * mid)


def step_stall(clocks: Sequence[float]) -> tuple[int, float, float] | None:
    """The longest gap between steps (its step index, counted from 1, the gap and the run's median
    step time) when it exceeds :data:`STALL_STEP_TIMES` median steps and :data:`STALL_FLOOR_S`."""
    gaps = [b - a for a, b in zip([0.0, *clocks], clocks)]
    if len(gaps) < 2:
        return None
    step = statistics.median(gaps)
    at = max(range(len(gaps)), key=gaps.__getitem__)
    return (at + 1, gaps[at], step) if gaps[at] > max(STALL_FLOOR_S, STALL_STEP_TIMES * step) else None


def _run(rec: Mapping[str, Any]) -> tuple[str, list[float], float, float] | None:
    """A record's run id, step clocks, time before its first step and whole time (None: no steps)."""
    spec, timings, curve = rec.get("spec"), rec.get("timings"), rec.get("curve")
    if not isinstance(spec, dict) or not isinstance(timings, dict) or not isinstance(curve, list):
        return None
    try:
        clocks = [float(p[2]) for p in curve]
        before = float(timings.get("setup_s") or 0) + float(timings.get("compile_s") or 0)
        whole = float(timings.get("total_s") or 0)
    except (TypeError, ValueError, IndexError):
        return None
    if not clocks:
        return None
    return f"{spec.get('run_id')} (attempt {rec.get('attempt', 1)})", clocks, before + clocks[0], whole


def folder_stalls(folder: str) -> list[str]:
    """One sentence per run in ``folder``'s records whose first step or a later step came later
    than the stall rule allows, in run order; empty when none did (unreadable records are the
    audit's to name)."""
    runs = []
    for path in sorted(glob.glob(os.path.join(glob.escape(folder), "*.record.json"))):
        try:
            rec = parse_json(read_regular(path))
        except (InputLimitError, ValueError):
            continue
        run = _run(rec) if isinstance(rec, dict) else None
        if run is not None:
            runs.append(run)
    limit = first_step_limit([r[3] for r in runs if r[3] > 0])
    out = []
    for name, clocks, before, _ in runs:
        if before > limit:
            out.append(
                f"{name}: its first step came {before:.0f} s after its start (the limit: {limit:.0f} s)"
            )
        found = step_stall(clocks)
        if found:
            k, gap, step = found
            out.append(f"{name}: no step for {gap:.0f} s before step {k} (a step took about {step:.3g} s)")
    return out

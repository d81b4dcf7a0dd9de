"""The stall rule's one home: a run stalled when no step came for a few times its step time (and
at least :data:`STALL_FLOOR_S`), or its first step came later than a few times an earlier run's
whole time. The progress line applies it live to a running command arm's reporter files
(``harness.execute.state.StallWatch``); the report names, from the records, every run whose steps
show one (:func:`folder_stalls`), built-in and command arms alike.

From the records, a run's step times are its ``step_times`` (every step's wall time, warm-up steps
included: built-in arms and lockstep command arms), else the differences of its training clock at
each step (the record's ``curve``: step, loss, clock). The time before its first step is measured
from its start and judged by the first-step rule alone (as on the progress line): a built-in run's
set-up, compile and first step (``timings.setup_s``, ``timings.compile_s``; a warm-up step too,
which the training clock leaves out); a command run's process time (``timings.total_s``) less what
its kept reporter file shows after its first step, so its start-up before the reporter's first
line counts. The gaps between later steps are the step-time rule's.
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
    """The longest gap between two steps (the later step's number, counted from 1, the gap and the
    run's median gap) when it exceeds :data:`STALL_STEP_TIMES` median gaps and :data:`STALL_FLOOR_S`.

    ``clocks`` is each step's end on a clock from the run's first step on; the time before the first
    step is the first-step rule's (:func:`first_step_s`), as on the progress line, and no gap here."""
    gaps = [b - a for a, b in zip(clocks, clocks[1:])]
    if len(gaps) < 2:
        return None
    step = statistics.median(gaps)
    at = max(range(len(gaps)), key=gaps.__getitem__)
    return (at + 2, gaps[at], step) if gaps[at] > max(STALL_FLOOR_S, STALL_STEP_TIMES * step) else None


def _number(v: object) -> float:
    """A record's figure as a float (0 for a missing one; ValueError for one not a number)."""
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{v!r} is not a number")
    return float(v)


def _step_clocks(rec: Mapping[str, Any], curve: list[Any]) -> list[float]:
    """Each step's end on the run's own clock of its steps: its ``step_times`` summed (every step,
    warm-up included) where the record holds them, else its curve's training clock."""
    walls = (rec.get("step_times") or {}).get("wall_us") if isinstance(rec.get("step_times"), dict) else None
    if isinstance(walls, list) and len(walls) == len(curve):
        out: list[float] = []
        t = 0.0
        for w in walls:
            t += _number(w) / 1e6
            out.append(t)
        return out
    return [_number(p[2]) for p in curve]


def _reporter_span(folder: str, rec: Mapping[str, object]) -> float | None:
    """A command run's time from its first step line to its last line in its kept reporter file
    (None: no such file, or one that does not read as lines with clocks)."""
    evidence = rec.get("evidence")
    name = evidence.get("file") if isinstance(evidence, dict) and evidence.get("kind") == "reporter" else None
    if not isinstance(name, str) or os.sep in name or name.startswith("."):
        return None
    try:
        lines = [parse_json(x) for x in read_regular(os.path.join(folder, name)).splitlines() if x.strip()]
        first = next(e["t"] for e in lines if isinstance(e, dict) and e.get("kind") == "step")
        return _number(lines[-1]["t"]) - _number(first)
    except (InputLimitError, ValueError, StopIteration, KeyError, TypeError):
        return None


def first_step_s(folder: str, rec: Mapping[str, Any], clocks: Sequence[float]) -> float:
    """How long after its start a run's first step ended, from its record: a built-in run's set-up,
    compile and first step (``clocks[0]``, warm-up steps included); a command run's process time
    less what its reporter file shows after its first step (its start-up and first step, and its
    exit after its last line), or, without that file, its first step from its reporter's start."""
    timings = rec["timings"]
    if isinstance(rec["spec"].get("command"), dict):
        span = _reporter_span(folder, rec)
        whole = _number(timings.get("total_s"))
        return whole - span if span is not None and whole > span else clocks[0]
    return _number(timings.get("setup_s")) + _number(timings.get("compile_s")) + clocks[0]


def _run(folder: str, rec: Mapping[str, object]) -> tuple[str, list[float], float, float] | None:
    """A record's run id, step clocks, time before its first step ended (from its start) and whole
    time (None: no steps)."""
    spec, timings, curve = rec.get("spec"), rec.get("timings"), rec.get("curve")
    if (
        not isinstance(spec, dict)
        or not isinstance(timings, dict)
        or not isinstance(curve, list)
        or not curve
    ):
        return None
    try:
        clocks = _step_clocks(rec, curve)
        before = first_step_s(folder, rec, clocks)
        whole = _number(timings.get("total_s"))
    except (TypeError, ValueError, IndexError):
        return None
    return f"{spec.get('run_id')} (attempt {rec.get('attempt', 1)})", clocks, before, whole


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
        run = _run(folder, rec) if isinstance(rec, dict) else None
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

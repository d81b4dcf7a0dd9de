"""Interference between a lockstep pair's arms, as each arm's wall time against its own CPU time.

In a lockstep pair one arm trains while the other waits, so an arm that stops its partner
(``SIGSTOP``), starves it (a thread that holds the partner's lock or core) or otherwise keeps it
off the processor while the partner is timed adds wall time to the partner's clock that the
partner's CPU clock does not see. Each arm's *stall* is that gap, block by block: over each of its
blocks of ``block_steps`` timed steps, the block's wall time less its CPU time (the arm's own
clock: the training thread's, or the process's when it runs more than one thread; a command's
process, as its reporter reads it), counted where positive, summed. Its *stall fraction* is that
sum over its training time, and its *CPU share* one less that fraction: the share of its timed
wall time its own CPU clock saw. The record of a lockstep arm written since this rule holds its
stall (``timings.stall_s``; ``prereg/formats/record.py``'s format log) beside the per-step times it is
derived from (a built-in arm's ``step_times``, a command's kept reporter file), from which the
audit derives it again.

A pair is **flagged** when its two arms' CPU shares differ by more than :data:`STALL_LIMIT` on the
log scale: ``|ln share(candidate) - ln share(baseline)|``, the wall-time log ratio of the pair less
its CPU-time log ratio. The two arms of an honest pair share the machine block by block, so what
the machine's other work takes from one it takes from the other: the difference, not the level, is
the rule, and on the log scale it does not saturate on a loaded machine, where an honest arm's own
share can be a fifth. Where the limit comes from, on the committed lockstep pairs (their records'
whole-run ``training_cpu_s`` over ``training_s``, the training thread's CPU time, one thread,
2-core CPU machines; :func:`spread`, the command in ``docs/provenance.md``): the largest difference
between an honest pair's arms was 0.118 in ``records/cpu2`` (252 lockstep pairs; there one arm's
own stall fraction reached 0.80), 0.142 in ``records/cpu2-pilot`` (67 A/A pairs) and 0.005 in
``records/calibration-cpu`` (276 pairs); the limit, 0.30, is twice the largest, rounded up. A
flagged pair is kept and analysed as preregistered; the report names it, so a reader weighs it.
What the limit leaves: a stall that moves one arm's share by less than that (about 26% of its
wall time) is not told apart from the machine's own load by this rule; the study's CPU-time
endpoint (``training_cpu_time``), beside the wall-time one, is where a reader sees the rest.

The kernel's view of a lockstep command pair (``harness/execute/watch.py``), beside the arms' own
clocks, does not depend on the machine's load: the kernel reports each stop of an arm to its
parent, the worker, and samples of each arm's scheduler times give its partner's CPU time within
its timed turns. An arm stopped while the pair ran, or whose partner ran more than
:data:`PARTNER_RUN_LIMIT` of the arm's own CPU time within its timed turns, fails the pair
(:func:`kernel_reason`; the record's ``process.kernel`` keeps the figures, and the audit names an
ok record they fail). A built-in
lockstep pair's arms share one process, so neither can stop the other alone: the stall rule is
theirs.

Records without ``stall_s`` (every record written before the rule, and other designs') are not
judged by it: their summaries and reports stay as they were.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

__all__ = [
    "PARTNER_RUN_LIMIT",
    "STALL_LIMIT",
    "flagged_pairs",
    "kernel_named",
    "kernel_problems",
    "kernel_reason",
    "share_gap",
    "spread",
    "stall_s",
]

#: The most two arms of a lockstep pair's CPU shares may differ, on the log scale, before the pair
#: is flagged (twice the largest difference among the committed honest pairs: the module's text).
STALL_LIMIT = 0.30


def block_times(
    wall_us: Sequence[int], cpu_us: Sequence[int], block_steps: int, warmup: int = 0
) -> list[tuple[int, int]]:
    """An arm's timed blocks, ``(wall_us, cpu_us)`` each: its steps from ``warmup`` on, in runs of
    ``block_steps`` (the arm's own blocks, as :func:`prereg.carryover.blocks` hands them out; the
    last may be shorter; warm-up steps are off the training clock and left out)."""
    if block_steps < 1:
        raise ValueError(f"block_steps = {block_steps}: a lockstep block is at least one step")
    out = []
    for i in range(0, len(wall_us), block_steps):
        k = range(max(i, warmup), min(i + block_steps, len(wall_us)))
        if len(k):
            out.append((sum(wall_us[j] for j in k), sum(cpu_us[j] for j in k)))
    return out


def stall_s(wall_us: Sequence[int], cpu_us: Sequence[int], block_steps: int, warmup: int = 0) -> float:
    """The arm's stall: over its timed blocks, wall less CPU time where positive, summed (seconds)."""
    return sum(max(0, w - c) for w, c in block_times(wall_us, cpu_us, block_steps, warmup)) / 1e6


def _fraction(stall: object, training: object) -> float | None:
    s, t = _number(stall), _number(training)
    return s / t if s is not None and t is not None and t > 0 else None


def _log_share(fraction: float | None) -> float | None:
    """ln of the CPU share (one less the stall fraction); None when none is left to take a log of."""
    return math.log(1.0 - fraction) if fraction is not None and fraction < 1.0 else None


def share_gap(fb: float | None, fc: float | None) -> float | None:
    """``ln share(candidate) - ln share(baseline)`` of the two arms' stall fractions (None when
    either is not a share's: an arm with no training time, or one stalled throughout)."""
    lb, lc = _log_share(fb), _log_share(fc)
    return None if lb is None or lc is None else lc - lb


class FlaggedPair(TypedDict):
    """A pair the stall rule flags: both arms' stall fractions and the gap of their log shares."""

    unit: str
    baseline_stall_fraction: float | None
    candidate_stall_fraction: float | None
    log_share_difference: float | None


class StallRule(TypedDict):
    """The stall rule over a study's pairs (:func:`flagged_pairs`; the summary's ``interference``)."""

    limit: float
    pairs_judged: int
    flagged: list[FlaggedPair]


def flagged_pairs(
    pairs: Iterable[tuple[str, Mapping[str, object], Mapping[str, object]]],
) -> StallRule | None:
    """The rule over a study's pairs, each ``(unit, baseline timings, candidate timings)``: how many
    were judged (both arms hold ``stall_s``) and each flagged pair with both fractions; None when
    no pair was judged (records from before the rule)."""
    judged = 0
    flagged: list[FlaggedPair] = []
    for unit, bt, ct in pairs:
        if "stall_s" not in bt or "stall_s" not in ct:
            continue
        judged += 1
        fb, fc = (
            _fraction(bt["stall_s"], bt.get("training_s")),
            _fraction(ct["stall_s"], ct.get("training_s")),
        )
        gap = share_gap(fb, fc)
        if gap is None or abs(gap) > STALL_LIMIT:
            flagged.append(
                {
                    "unit": unit,
                    "baseline_stall_fraction": fb,
                    "candidate_stall_fraction": fc,
                    "log_share_difference": gap,
                }
            )
    if not judged:
        return None
    return {"limit": STALL_LIMIT, "pairs_judged": judged, "flagged": flagged}


def spread(records: Iterable[Mapping[str, Any]]) -> tuple[int, float]:
    """Where :data:`STALL_LIMIT` comes from: over a folder's ok lockstep pairs (records whose spec
    names ``block_steps``), how many pairs there are and the largest :func:`share_gap` between
    their arms, each share the whole run's ``training_cpu_s / training_s`` (records from before
    ``stall_s`` hold no blocks' figures: their whole run's, unclipped)."""
    arms: dict[tuple[str, int], dict[str, Mapping[str, Any]]] = {}
    for r in records:
        spec = r.get("spec") or {}
        if r.get("status") == "ok" and spec.get("block_steps") is not None:
            arms.setdefault((spec["unit"], int(r.get("unit_attempt") or 1)), {})[spec["role"]] = r["timings"]
    worst = 0.0
    n = 0
    for both in arms.values():
        if set(both) != {"baseline", "candidate"}:
            continue
        f = [
            _fraction(t["training_s"] - t["training_cpu_s"], t["training_s"])
            for t in (both["baseline"], both["candidate"])
        ]
        gap = share_gap(f[0], f[1])
        if gap is not None:
            n += 1
            worst = max(worst, abs(gap))
    return n, worst


#: The most CPU time a lockstep arm's partner may run within the arm's timed turns, as a share of
#: the arm's own CPU time there, in the kernel's view (``harness/execute/watch.py``): the share the
#: stall rule leaves (``1 - exp(-STALL_LIMIT)``, about 26%). A waiting arm sleeps in its hand-over
#: read, so an honest partner runs only its hand-over there; the machine's other work takes from
#: both run times alike, so the ratio does not fall with load as a share of wall time would.
PARTNER_RUN_LIMIT = 1.0 - math.exp(-STALL_LIMIT)


def kernel_reason(kernel: Mapping[str, object]) -> str | None:
    """Why a lockstep command arm's run fails in the kernel's view of it (its record's
    ``process.kernel``; None: nothing to say): the kernel saw it stopped (``SIGSTOP``, a tracer) while
    the pair ran, or its partner ran more than :data:`PARTNER_RUN_LIMIT` of its own CPU time
    within its timed turns (where its turns were observed: ``observed`` not false)."""
    stops = kernel.get("stops")
    if isinstance(stops, int) and not isinstance(stops, bool) and stops > 0:
        return (
            f"the kernel saw it stopped {stops} time(s) ({_seconds(kernel.get('stopped_s'))} in all) "
            "while the pair ran (SIGSTOP or a tracer; nothing of the harness stops an arm): a stopped "
            "arm's clock counts its partner's doing, so the pair fails"
        )
    own, partner = _number(kernel.get("run_s")), _number(kernel.get("partner_run_s"))
    if kernel.get("observed") is False:  # samples too few within its turns: named NOT OBSERVED, not judged
        return None
    if own is not None and partner is not None and partner > PARTNER_RUN_LIMIT * max(own, 0.0):
        return (
            f"its partner ran {partner:.3f} s of CPU time within its timed turns, where it ran {own:.3f} s "
            f"(more than {PARTNER_RUN_LIMIT:.0%} of its own, in the kernel's view): a waiting arm sleeps in "
            "its hand-over, so this one was starved by its partner and the pair fails"
        )
    return None


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _seconds(v: object) -> str:
    n = _number(v)
    return "an unknown time" if n is None else f"{n:.3f} s"


def kernel_problems(records: Iterable[Mapping[str, Any]]) -> tuple[list[str], int]:
    """Each ok record whose kernel's view (``process.kernel``, lockstep command arms since the
    rule) says it fails (:func:`kernel_reason`): the problems, and how many records hold a view."""
    out: list[str] = []
    held = 0
    for r in records:
        process = r.get("process")
        kernel = process.get("kernel") if isinstance(process, Mapping) else None
        if not isinstance(kernel, Mapping):
            continue
        held += 1
        why = kernel_reason(kernel)
        if why is not None and r.get("status") == "ok":
            spec = r.get("spec") or {}
            out.append(f"{spec.get('run_id')}.a{r.get('attempt')}: status ok, yet {why}")
    return out, held


def kernel_named(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """What the kernel's view of the lockstep command arms leaves open, named (not failed): arms
    run in the worker's PID namespace (``process.isolation`` "arms not isolated ...": either arm
    could signal, trace or read the other; a stop is still seen, not prevented), and arms whose
    samples covered less than half their timed turns (``kernel.observed`` false: steps shorter
    than the sampling, so "neither stopped nor starved" was not observed)."""
    shared: list[str] = []
    unseen: list[str] = []
    for r in records:
        process = r.get("process")
        if not isinstance(process, Mapping) or not isinstance(process.get("kernel"), Mapping):
            continue
        name = f"{(r.get('spec') or {}).get('run_id')}.a{r.get('attempt')}"
        isolation = process.get("isolation")
        if isinstance(isolation, str) and isolation != "pid namespace":
            shared.append(f"{name}: {isolation}")
        if process["kernel"].get("observed") is False:
            unseen.append(name)
    out = []
    if shared:
        out.append(f"ARMS NOT ISOLATED: {len(shared)} arm(s), e.g. {shared[0]}")
    if unseen:
        out.append(
            f"NOT OBSERVED: {len(unseen)} arm(s) whose steps were shorter than the kernel's sampling "
            f"(e.g. {unseen[0]}): neither stopped nor starved is not shown for them"
        )
    return out

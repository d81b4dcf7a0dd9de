"""The kernel's view of a lockstep pair of command arms (Linux): whether an arm was stopped, and
how much CPU time its partner ran within its timed turns.

An arm's own clocks are its reporter's, so they say what the arm saw, not who kept it off the
processor. The worker, each arm's parent, asks the kernel instead:

* **stops**: the kernel tells a parent of each stop and continue of its child (``wait4`` with
  ``WUNTRACED | WCONTINUED``, :func:`harness.execute.commands._reap`): a stop followed by a
  continue before the parent asked still leaves the continue to report, so no stop goes unseen.
  Nothing of the harness stops an arm, so a stop is another process's doing (the partner's
  ``SIGSTOP``, a tracer); :class:`Watch` also notes each sample that finds the arm in state ``T``
  or ``t`` (``/proc/PID/stat``).
* **run and wait**: :class:`Watch` samples each arm's ``/proc/PID/task/*/schedstat`` (the time its
  threads ran and waited on a run queue, nanoseconds) every :data:`EVERY_S`; over the arm's timed
  turns (each step's time on its training clock, from its reporter file: from the start, the step
  before or the hand-over that gave it the turn, to the step's stamp, less ``untimed`` blocks)
  the sample intervals that lie wholly inside one give the arm's own run and run-queue time and
  its partner's run time there, the partner's counted from its start to its last step (its
  imports before and its evaluation and exit after are not part of the turns).

Each arm's record keeps the figures (``process.kernel``), and the rule
(:func:`prereg.interference.kernel_reason`) fails the pair with the reason. What this does not
reach: a stop of a process the command started (not the arm's own), a partner's run shorter than
a sample interval inside a turn, and what a partner runs after its own last step (its exit, or a
thread it leaves spinning then).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["EVERY_S", "Watch", "kernel_view", "timed_windows"]

#: How often the watch samples each arm's state and scheduler times (seconds).
EVERY_S = 0.005

#: A sample: (monotonic time, run ns, run-queue wait ns, stopped: the arm's state was T or t).
Sample = tuple[float, int, int, bool]


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:  # a /proc file of the worker's own child
            return f.read(4096).decode("ascii", "replace")
    except OSError:
        return None


def sample(pid: int) -> Sample | None:
    """The arm's state and its threads' scheduler times now (None: it has gone)."""
    t = time.monotonic()
    stat = _read(f"/proc/{pid}/stat")
    if stat is None or ")" not in stat:
        return None
    state = stat.rsplit(")", 1)[1].split()[:1]
    run = wait = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        text = _read(f"/proc/{pid}/task/{tid}/schedstat")
        fields = text.split() if text else []
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
            run, wait = run + int(fields[0]), wait + int(fields[1])
    return t, run, wait, state in (["T"], ["t"])


class Watch:
    """A thread sampling each arm's process (:func:`sample`) while the pair runs."""

    def __init__(self, every_s: float = EVERY_S) -> None:
        self.every_s = every_s
        self.pids: list[int] = []
        self.samples: dict[int, list[Sample]] = {}
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.samples = {p: [] for p in self.pids}
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.is_set():
            for pid in self.pids:
                got = sample(pid)
                if got is not None:
                    self.samples[pid].append(got)
            self._halt.wait(self.every_s)

    def close(self) -> None:
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join()


def _lines(reporter: str | None) -> list[dict[str, Any]]:
    """The reporter file's lines (none when one is not a JSON object with a kind)."""
    out = []
    for line in (reporter or "").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            return []
        if not isinstance(e, dict) or not isinstance(e.get("kind"), str):
            return []
        out.append(e)
    return out


def timed_windows(reporter: str | None) -> list[tuple[float, float]]:
    """The arm's timed turns from its reporter file's stamps: each step's time on the training
    clock (from the start, the step before, or the hand-over that gave it the turn, to the step's
    stamp), less the ``untimed`` blocks (none when the file does not say)."""
    out: list[tuple[float, float]] = []
    base = None
    try:
        for e in _lines(reporter):
            kind = e["kind"]
            if kind == "start":
                base = float(e["t"])
            elif kind == "wait":
                base = float(e["t1"])
            elif kind == "untimed" and base is not None:
                out.append((base, float(e["t0"])))
                base = float(e["t1"])
            elif kind == "step" and base is not None:
                out.append((base, float(e["t"])))
                base = float(e["t"])
    except (KeyError, TypeError, ValueError):
        return []
    return [(a, b) for a, b in out if b > a]


def active_span(reporter: str | None) -> tuple[float, float] | None:
    """From the arm's reporter start to its last step: while it takes part in the turns (its
    imports before and its evaluation and exit after are its own, not its partner's interference)."""
    try:
        lines = _lines(reporter)
        starts = [float(e["t"]) for e in lines if e["kind"] == "start"]
        steps = [float(e["t"]) for e in lines if e["kind"] == "step"]
    except (KeyError, TypeError, ValueError):
        return None
    return (starts[0], steps[-1]) if starts and steps else None


def _within(samples: list[Sample], windows: list[tuple[float, float]]) -> tuple[int, int, float]:
    """Run and wait ns over the sample intervals that lie wholly inside a window, and their time."""
    run = wait = 0
    span = 0.0
    for a, b in zip(samples, samples[1:]):
        if any(w0 <= a[0] and b[0] <= w1 for w0, w1 in windows):
            run, wait, span = run + b[1] - a[1], wait + b[2] - a[2], span + b[0] - a[0]
    return run, wait, span


def _stopped(events: list[tuple[float, str]], samples: list[Sample], end: float) -> tuple[int, float]:
    """How many stops the kernel reported (a continue with no stop reported before it counts as one;
    a sample in state T or t with none reported counts as one) and their time."""
    stops, total, since = 0, 0.0, None
    for t, what in events:
        if what == "stopped":
            stops, since = stops + 1, t if since is None else since
        elif what == "continued":
            stops += since is None
            total += t - since if since is not None else 0.0
            since = None
    total += end - since if since is not None else 0.0
    if not stops and any(s[3] for s in samples):
        stops = 1
    return stops, total


def kernel_view(
    own: list[Sample],
    partner: list[Sample],
    events: list[tuple[float, str]],
    reporters: tuple[str | None, str | None],
    end: float,
) -> dict[str, Any]:
    """One arm's ``process.kernel``: its stops and, over its timed turns, its own run and run-queue
    time and its partner's run time while the partner takes part in the turns (seconds), from the
    samples of both (:class:`Watch`), the stops and continues the kernel reported (``events``) and
    both reporter files (its own, its partner's)."""
    windows = timed_windows(reporters[0])
    run, wait, span = _within(own, windows)
    active = active_span(reporters[1])
    partner_run, _, _ = _within(
        partner,
        [(max(w0, active[0]), min(w1, active[1])) for w0, w1 in windows if active is not None],
    )
    stops, stopped = _stopped(events, own, end)
    return {
        "stops": stops,
        "stopped_s": round(stopped, 6),
        "timed_s": round(span, 6),
        "run_s": run / 1e9,
        "runqueue_s": wait / 1e9,
        "partner_run_s": partner_run / 1e9,
        "samples": len(own),
    }

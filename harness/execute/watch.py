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

__all__ = ["EVERY_S", "OBSERVED_SHARE", "Watch", "descendants", "kernel_view", "timed_windows"]

#: How often the watch samples each arm's state and scheduler times (seconds).
EVERY_S = 0.005

#: The share of an arm's timed turns that whole sample intervals must cover for the kernel's view
#: to count as observed: shorter steps than the sampling leave it "not observed" (named, not ok).
OBSERVED_SHARE = 0.5

#: A sample: (monotonic time, run ns, run-queue wait ns, stopped: the arm's state was T or t).
Sample = tuple[float, int, int, bool]


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:  # a /proc file of the worker's own child
            return f.read(4096).decode("ascii", "replace")
    except OSError:
        return None


def _task_times(pid: int) -> dict[int, tuple[int, int]] | None:
    """Each thread's scheduler times of one process (None: it has gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out = {}
    for tid in tasks:
        text = _read(f"/proc/{pid}/task/{tid}/schedstat")
        fields = text.split() if text else []
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit() and tid.isdigit():
            out[int(tid)] = (int(fields[0]), int(fields[1]))
    return out


def _state(pid: int) -> tuple[str, int] | None:
    """A process's state letter and its parent's pid (None: it has gone)."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (fields[0], int(fields[1])) if len(fields) > 1 and fields[1].isdigit() else None


def descendants(root: int) -> list[int]:
    """``root`` and every process below it now (from each process's parent in ``/proc``)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            got = _state(int(name))
            if got is not None:
                children.setdefault(got[1], []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


class _Tree:
    """One arm's process tree: its members, and the last scheduler times seen of each thread (a
    thread that has ended keeps its last times, so the tree's totals never fall)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.members = [root]
        self.times: dict[tuple[int, int], tuple[int, int]] = {}

    def sample(self) -> Sample | None:
        """The tree's state and its threads' scheduler times now (None: the whole tree has gone)."""
        t = time.monotonic()
        stopped, alive = False, False
        for pid in self.members:
            state = _state(pid)
            tasks = _task_times(pid) if state is not None else None
            if state is None or tasks is None:
                continue
            alive = True
            stopped = stopped or state[0] in ("T", "t")
            for tid, times in tasks.items():
                self.times[(pid, tid)] = times
        if not alive:
            return None
        run = sum(v[0] for v in self.times.values())
        wait = sum(v[1] for v in self.times.values())
        return t, run, wait, stopped


def sample(pid: int) -> Sample | None:
    """One process's state and its threads' scheduler times now (None: it has gone)."""
    return _Tree(pid).sample()


#: How often the watch looks again for the processes below each arm (seconds): a wrapper's child
#: (``sh -c``, a launcher) is watched from then on.
TREE_EVERY_S = 0.1


class Watch:
    """A thread sampling each arm's process tree (the arm and every process below it, so the
    program a wrapper or a namespace relay runs is watched, not only the wrapper) while the pair
    runs."""

    def __init__(self, every_s: float = EVERY_S) -> None:
        self.every_s = every_s
        self.pids: list[int] = []
        self.samples: dict[int, list[Sample]] = {}
        self._trees: list[_Tree] = []
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.samples = {p: [] for p in self.pids}
        self._trees = [_Tree(p) for p in self.pids]
        self._thread.start()

    def _run(self) -> None:
        looked = 0.0
        while not self._halt.is_set():
            if time.monotonic() - looked >= TREE_EVERY_S:
                looked = time.monotonic()
                for tree in self._trees:
                    tree.members = descendants(tree.root)  # a member that ended keeps its times
            for tree in self._trees:
                got = tree.sample()
                if got is not None:
                    self.samples[tree.root].append(got)
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
    stamp), less the ``untimed`` blocks (none when the file does not say); steps that follow one
    another are one window, so a sample interval across a step's stamp counts (with 10 ms steps and
    5 ms samples, per-step windows held about half of the samples: "not observed" by chance)."""
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
    turns: list[tuple[float, float]] = []
    for a, b in out:  # steps that follow one another form one window: the turn they make up
        if b <= a:
            continue
        if turns and turns[-1][1] == a:
            turns[-1] = (turns[-1][0], b)
        else:
            turns.append((a, b))
    return turns


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
    turns = sum(w1 - w0 for w0, w1 in windows)
    return {
        "stops": stops,
        "stopped_s": round(stopped, 6),
        "timed_s": round(span, 6),
        # the samples covered at least half of the arm's timed turns (else: "not observed", named)
        "observed": bool(turns > 0 and span >= OBSERVED_SHARE * turns),
        "run_s": run / 1e9,
        "runqueue_s": wait / 1e9,
        "partner_run_s": partner_run / 1e9,
        "samples": len(own),
    }

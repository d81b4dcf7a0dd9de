"""A command arm's evidence: the reporter file (``harness/reporter.py``) or, for a script that
cannot be changed, its captured output read with preregistered regular expressions; the endpoints
a record holds, derived from it. One home: the worker derives a run's figures by
:func:`derive`, and the audit derives them again from the file kept beside the record
(:func:`evidence_problems`), so a record's figures are the file's, and the file is the one its
record's sha256 names.

Endpoints from a reporter file: ``training_s`` and ``training_cpu_s`` (the sums of the steps'
``dt`` and ``cpu_dt``: the training clock, evaluation and hand-overs off it), ``time_to_target_s``
(the training clock at the first evaluation whose metric reaches the study's target, None when
none does), ``final_metric`` (the study's metric at the last evaluation), ``metrics`` (every
metric's last value), the curves. From captured output: ``final_metric`` and ``metrics`` only
(the last match of each expression); the whole process's time is the harness's own clock
(``total_s``), which no file can tell.

A built-in arm's record is its own evidence: its ``training_s`` and CPU and warm-up clocks are
checked against the per-step times it keeps (:func:`clock_problems`).

A file is refused (the run failed, its reason this module's words) when a line is not a JSON
object of a known kind, the clock runs backwards, a step's number is not the one after the last
(a gap), a loss or metric is not finite, the study's metric is never reported, the count of steps
is not the planned one, ``done`` is missing or not last, or the file's elapsed time exceeds the
harness's wall clock of the process.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prereg.bounded import InputLimitError, read_regular
from prereg.interference import stall_s

FORMAT = 1
#: A kept evidence file's name beside its record: ``<run_id>.a<attempt>`` and this.
EVIDENCE_SUFFIX = {"reporter": ".report.jsonl", "output": ".output.log"}
#: The most bytes of evidence a run may keep (a line a step: far above any study's).
MAX_EVIDENCE_BYTES = 16 * 1024 * 1024
#: How far the file's elapsed time may exceed the harness's clock of the process (seconds): the
#: two clocks are read a few system calls apart.
CLOCK_SLACK_S = 0.05


class EvidenceError(ValueError):
    """A reporter file or output that is not evidence of a finished run (the reason is the text)."""


@dataclass(frozen=True)
class Derived:
    """What a run's evidence says: the record's figures."""

    training_s: float | None = None
    training_cpu_s: float | None = None
    time_to_target_s: float | None = None
    final_metric: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    steps: int | None = None
    elapsed_s: float | None = None
    untimed_s: float | None = None  # the untimed blocks' wall seconds (what the script took off the clock)
    # a planted candidate's plant (``plant`` lines): its wall and CPU seconds on the training clock
    planted_s: float | None = None
    planted_cpu_s: float | None = None
    curve: list[list[float]] = field(default_factory=list)  # [step, loss, training clock]
    val_curve: list[list[float]] = field(default_factory=list)  # [step, metric, training clock]
    # a lockstep arm's stall (prereg/interference.py): its blocks' wall less CPU time; None elsewhere
    stall_s: float | None = None
    # a lockstep arm's steps' wall and CPU microseconds, and how its reporter handed over ("joined":
    # at the end of each turn, prereg/carryover.turns); None elsewhere
    step_us: tuple[list[int], list[int]] | None = None
    turns: str | None = None

    def figures(self) -> dict[str, object]:
        """The figures a record holds and the audit compares (curves apart)."""
        return {
            "training_s": self.training_s,
            "training_cpu_s": self.training_cpu_s,
            "untimed_s": self.untimed_s,
            "planted_s": self.planted_s,
            "planted_cpu_s": self.planted_cpu_s,
            "time_to_target_s": self.time_to_target_s,
            "final_metric": self.final_metric,
            "metrics": self.metrics,
        }


def reached(value: float, target: float, better: str) -> bool:
    """Whether a metric's value reaches its target (``better`` ``lower``: at or below it)."""
    return value <= target if better == "lower" else value >= target


def _number(v: object, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise EvidenceError(f"{what} = {json.dumps(v)[:40]} is not a number")
    try:
        x = float(v)
    except OverflowError:
        raise EvidenceError(f"{what} is too large to be a number of seconds or a metric") from None
    if not math.isfinite(x):
        raise EvidenceError(f"{what} is not finite")
    return x


#: How far a step's ``dt`` (or ``cpu_dt``) may differ from the difference of the file's own stamps
#: (seconds): the two are computed from the same readings, so only rounding parts them.
STAMP_SLACK_S = 1e-6


@dataclass
class _Scan:
    """The running state of one reporter file's reading (:func:`derive_reporter`)."""

    name: str
    target: float
    better: str
    planted: bool
    window: tuple[float, float] | None
    clock: float = 0.0
    cpu: float = 0.0
    last_t: float | None = None
    last_cpu: float | None = None
    start_t: float | None = None
    start_cpu: float | None = None
    done_t: float | None = None
    done_cpu: float | None = None
    base_t: float = 0.0  # the current step's boundary
    base_cpu: float = 0.0
    off_t: float = 0.0  # untimed since the boundary
    off_cpu: float = 0.0
    untimed: float = 0.0
    plant_s: float = 0.0
    plant_cpu: float = 0.0
    plant_in_step: bool = False
    last_step: int = 0
    count: int = 0
    curve: list[list[float]] = field(default_factory=list)
    val_curve: list[list[float]] = field(default_factory=list)
    # each step's wall and CPU microseconds
    step_us: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))
    turns: str | None = None  # the start line's hand-over rule (a lockstep reporter's)
    finals: dict[str, float] = field(default_factory=dict)
    ttt: float | None = None

    def stamps(self, e: dict[str, object], i: int, kind: str, where: str) -> tuple[float, float | None]:
        """Check a line's place and clocks (``t``, ``cpu``); return them."""
        if self.done_t is not None:
            raise EvidenceError(f"{where}: a {kind} line after done")
        if i == 1:
            if kind != "start" or e.get("format") != FORMAT:
                raise EvidenceError(f"{where}: the first line is a start line of format {FORMAT}")
        elif kind == "start":
            raise EvidenceError(f"{where}: a second start line (two runs wrote one file)")
        t = _number(e.get("t"), f"{where}: t")
        if self.last_t is not None and t < self.last_t:
            raise EvidenceError(f"{where}: the clock runs backwards ({t} after {self.last_t})")
        w = self.window
        if w is not None and not w[0] - CLOCK_SLACK_S <= t <= w[1] + CLOCK_SLACK_S:
            raise EvidenceError(f"{where}: t = {t} is outside the process's life on this machine's clock")
        self.last_t = t
        c = _number(e["cpu"], f"{where}: cpu") if "cpu" in e else None
        if c is not None:
            if self.last_cpu is not None and c < self.last_cpu:
                raise EvidenceError(f"{where}: the CPU clock runs backwards")
            self.last_cpu = c
        return t, c

    def step(self, e: dict[str, object], where: str, t: float, c: float | None) -> None:
        """A step line: its number, loss and clocks, checked against the file's own stamps."""
        s = e.get("step")
        if isinstance(s, bool) or not isinstance(s, int) or s != self.last_step + 1:
            raise EvidenceError(
                f"{where}: step {s!r} after step {self.last_step} (steps are 1, 2, ...: a gap or a repeat)"
            )
        loss = e.get("loss")
        if isinstance(loss, str):
            raise EvidenceError(f"{where}: step {s}: the loss is {loss} (not finite)")
        loss = _number(loss, f"{where}: loss")
        if c is None:
            raise EvidenceError(f"{where}: the step line has no cpu")
        dt, cdt = t - self.base_t - self.off_t, c - self.base_cpu - self.off_cpu
        said = (_number(e.get("dt"), f"{where}: dt"), _number(e.get("cpu_dt"), f"{where}: cpu_dt"))
        if abs(said[0] - dt) > STAMP_SLACK_S or abs(said[1] - cdt) > STAMP_SLACK_S or dt < -STAMP_SLACK_S:
            raise EvidenceError(
                f"{where}: step {s}: dt {said[0]!r} and cpu_dt {said[1]!r} are not the file's own "
                f"stamps' ({dt!r}, {cdt!r}): the clock was edited"
            )
        if self.planted and not self.plant_in_step:
            raise EvidenceError(f"{where}: step {s} of a planted candidate ran no plant (no plant line)")
        self.plant_in_step = False
        self.clock += max(dt, 0.0)
        self.cpu += max(cdt, 0.0)
        self.step_us[0].append(round(max(dt, 0.0) * 1e6))
        self.step_us[1].append(round(max(cdt, 0.0) * 1e6))
        self.count += 1
        self.last_step = s
        self.base_t, self.base_cpu, self.off_t, self.off_cpu = t, c, 0.0, 0.0
        self.curve.append([float(s), loss, self.clock])

    def block(self, e: dict[str, object], kind: str, where: str, t: float, c: float | None) -> None:
        """An ``untimed``, ``plant`` or ``wait`` line: a block inside a step, or a hand-over."""
        if kind == "plant" and not self.planted:
            raise EvidenceError(f"{where}: a plant line in a run that is not a planted candidate")
        t0, t1 = _number(e.get("t0"), f"{where}: t0"), _number(e.get("t1"), f"{where}: t1")
        if kind == "wait":
            if c is None or t1 != t or not self.base_t <= t0 <= t1 or self.off_t:
                raise EvidenceError(f"{where}: a hand-over that is not at a step's end")
            self.base_t, self.base_cpu = t, c
            return
        c0, c1 = _number(e.get("cpu0"), f"{where}: cpu0"), _number(e.get("cpu1"), f"{where}: cpu1")
        if kind == "untimed":
            if not self.base_t <= t0 <= t1 <= t or not self.base_cpu <= c0 <= c1:
                raise EvidenceError(f"{where}: an untimed block outside its step (or reversed)")
            self.off_t += t1 - t0
            self.off_cpu += c1 - c0
            self.untimed += t1 - t0
            return
        if self.plant_in_step or t1 != t or not self.base_t <= t0 <= t1 or not self.base_cpu <= c0 <= c1:
            raise EvidenceError(f"{where}: a plant outside its step (or a second one, or reversed)")
        self.plant_in_step = True
        self.plant_s += t1 - t0
        self.plant_cpu += c1 - c0

    def evaluation(self, e: dict[str, object], where: str) -> None:
        """An eval line: every metric's value, and the study's metric on the curve."""
        m = e.get("metrics")
        if not isinstance(m, dict):
            raise EvidenceError(f"{where}: metrics is not an object")
        if self.count == 0 or e.get("step") != self.last_step:
            raise EvidenceError(
                f"{where}: an evaluation says step {e.get('step')!r}; it follows step {self.last_step} "
                "(evaluate after a step, naming it)"
            )
        for k, v in m.items():
            self.finals[str(k)] = _number(v, f"{where}: metric {k}")
        if self.name in m:
            v = self.finals[self.name]
            self.val_curve.append([float(self.last_step), v, self.clock])
            if self.ttt is None and reached(v, self.target, self.better):
                self.ttt = self.clock

    def line(self, i: int, line: str) -> None:
        """Read line ``i`` of the file."""
        where = f"line {i}"
        try:
            e = json.loads(line)
        except (ValueError, RecursionError):
            raise EvidenceError(f"{where}: not JSON (a torn or edited file)") from None
        if not isinstance(e, dict) or not isinstance(e.get("kind"), str):
            raise EvidenceError(f"{where}: not a JSON object with a kind")
        kind = e["kind"]
        t, c = self.stamps(e, i, kind, where)
        if kind == "start":
            if c is None:
                raise EvidenceError(f"{where}: the start line has no cpu")
            self.start_t, self.start_cpu = t, c
            self.base_t, self.base_cpu = t, c
            self.turns = e["turns"] if e.get("turns") == "joined" else None
        elif kind == "step":
            self.step(e, where, t, c)
        elif kind in ("untimed", "plant", "wait"):
            self.block(e, kind, where, t, c)
        elif kind == "eval":
            self.evaluation(e, where)
        elif kind == "done":
            self.done_t, self.done_cpu = t, c
            got = e.get("steps")
            if isinstance(got, bool) or got != self.count:
                raise EvidenceError(f"{where}: done says {got!r} steps, the file reports {self.count}")
        else:
            raise EvidenceError(f"{where}: unknown kind {kind!r}")


def _finished(r: _Scan, steps: int, wall_s: float | None, cpu_s: float | None) -> float:
    """Check the whole file's reading (done, steps, metric, clocks); return its elapsed seconds."""
    if r.done_t is None:
        raise EvidenceError("no done line: the script did not call Reporter.done() (it stopped early)")
    if r.count != steps:
        raise EvidenceError(f"the file reports {r.count} steps; the protocol plans {steps}")
    if r.name not in r.finals:
        raise EvidenceError(f"the study's metric {r.name!r} was never reported (Reporter.eval)")
    assert r.start_t is not None and r.start_cpu is not None
    elapsed = r.done_t - r.start_t
    if wall_s is not None and elapsed > wall_s + CLOCK_SLACK_S:
        raise EvidenceError(
            f"the file's elapsed time ({elapsed:.3f} s) exceeds the harness's wall clock of the process "
            f"({wall_s:.3f} s): the file is not this process's"
        )
    used = r.done_cpu if r.done_cpu is not None else r.last_cpu or 0.0
    if cpu_s is not None and used > cpu_s + CLOCK_SLACK_S:
        raise EvidenceError(
            f"the file's CPU time exceeds the kernel's CPU time of the process ({cpu_s:.3f} s): "
            "the file is not this process's"
        )
    return elapsed


def derive_reporter(
    text: str,
    metric: dict[str, Any],
    steps: int,
    wall_s: float | None,
    *,
    window: tuple[float, float] | None = None,
    cpu_s: float | None = None,
    planted: bool = False,
    block_steps: int | None = None,
) -> Derived:
    """The figures of a reporter file's ``text`` (format 1), for the study's ``metric`` (``name``,
    ``target``, ``better``) and ``steps`` planned. The training clock is recomputed from the file's
    stamps: a step's time is its ``t`` less the previous boundary (the start, the previous step, a
    hand-over's return) less the untimed blocks between, and its ``dt`` must say the same (likewise
    the CPU clock). The worker also gives ``wall_s`` (its wall clock of the process), ``window``
    (the process's start and end on the same monotonic clock: every stamp must fall inside it)
    and ``cpu_s`` (the kernel's CPU time of the process, which the file's may not exceed).
    ``planted``: the run is a planted candidate, whose every step holds one ``plant`` line (inside
    the step, on its clock: summed into ``planted_s`` and ``planted_cpu_s``); any other run's file
    may hold none. A lockstep arm's ``block_steps`` gives its stall
    (:func:`prereg.interference.stall_s`, from the steps' own ``dt`` and ``cpu_dt``). Raises
    :class:`EvidenceError` naming the line."""
    lines = text.splitlines()
    if not lines:
        raise EvidenceError("the reporter file is empty (the script never built a Reporter)")
    name, target, better = metric["name"], float(metric["target"]), metric.get("better", "lower")
    r = _Scan(name, target, better, planted, window)
    for i, line in enumerate(lines, 1):
        r.line(i, line)
    elapsed = _finished(r, steps, wall_s, cpu_s)
    return Derived(
        training_s=r.clock,
        training_cpu_s=r.cpu,
        time_to_target_s=r.ttt,
        final_metric=r.finals[r.name],
        metrics=r.finals,
        steps=r.count,
        elapsed_s=elapsed,
        untimed_s=r.untimed,
        planted_s=r.plant_s if planted else None,
        planted_cpu_s=r.plant_cpu if planted else None,
        curve=r.curve,
        val_curve=r.val_curve,
        stall_s=None if not block_steps else stall_s(r.step_us[0], r.step_us[1], block_steps),
        step_us=r.step_us if block_steps else None,
        turns=r.turns if block_steps else None,
    )


def derive_output(text: str, metric: Mapping[str, object], patterns: dict[str, str]) -> Derived:
    """The figures of a script's captured output read with its arm's preregistered expressions
    (``patterns``: metric name to a regular expression whose first group is the number; the last
    match counts)."""
    finals: dict[str, float] = {}
    for name, pattern in sorted(patterns.items()):
        found = re.findall(pattern, text, flags=re.MULTILINE)
        if not found:
            continue
        last = found[-1]
        raw = last[0] if isinstance(last, tuple) else last
        try:
            finals[name] = _number(float(raw), f"metric {name}")
        except ValueError:
            raise EvidenceError(
                f"metric {name}: {raw!r} (the expression's last match) is not a number"
            ) from None
    if metric["name"] not in finals:
        raise EvidenceError(
            f"the study's metric {metric['name']!r}: its expression matched nothing in the output"
        )
    return Derived(final_metric=finals[metric["name"]], metrics=finals)


def derive(
    kind: str,
    text: str,
    spec: dict[str, Any],
    wall_s: float | None,
    *,
    window: tuple[float, float] | None = None,
    cpu_s: float | None = None,
) -> Derived:
    """A run's figures from its evidence (``kind`` ``reporter`` or ``output``), for its ``spec``
    (a record's ``spec``: its ``metric``, ``steps`` and ``command``); the worker's bounds as for
    :func:`derive_reporter`."""
    if kind == "reporter":
        block = spec.get("block_steps")
        return derive_reporter(
            text,
            spec["metric"],
            int(spec["steps"]),
            wall_s,
            window=window,
            cpu_s=cpu_s,
            planted=bool(spec.get("planted")),
            block_steps=int(block) if block else None,
        )
    return derive_output(text, spec["metric"], dict(spec["command"].get("metrics_regex") or {}))


def _close(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_close(a[k], b[k]) for k in a)
    if a is None or b is None:
        return a is None and b is None
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and float(a) == float(b)


def evidence_problems(directory: str, records: list[dict[str, Any]]) -> tuple[list[str], int]:
    """Every command run's kept evidence against its record: the file named in ``evidence`` is
    there, its sha256 and size are the record's, and the figures derived from it again are the
    record's (``timings`` and ``final_metric``, ``metrics``, and a lockstep arm's ``stall_s`` where
    its record holds one); a command run's ok record with no evidence is named too. Returns the
    problems and how many files were checked."""
    out: list[str] = []
    checked = 0
    for r in records:
        spec = r.get("spec") or {}
        if "command" not in spec:
            continue
        name = f"{spec.get('run_id')}.a{r.get('attempt')}"
        ev = r.get("evidence")
        if not isinstance(ev, dict):
            if r.get("status") == "ok":
                out.append(f"{name}: an ok command run with no evidence file named in its record")
            continue
        path = os.path.join(directory, str(ev.get("file")))
        if os.path.basename(str(ev.get("file"))) != ev.get("file") or not os.path.lexists(path):
            out.append(f"{path}: the evidence file its record names is missing")
            continue
        try:  # a link, a FIFO, a device: named, never opened
            data = read_regular(path, MAX_EVIDENCE_BYTES)
        except InputLimitError as e:
            out.append(str(e))
            continue
        sha, size = hashlib.sha256(data).hexdigest(), len(data)
        checked += 1
        if sha != ev.get("sha256") or size != ev.get("bytes"):
            out.append(
                f"{path}: sha256 {sha[:16]}... ({size} bytes) is not the one its record names (edited after the run)"
            )
            continue
        if r.get("status") != "ok":
            continue
        try:
            got = derive(str(ev.get("kind")), data.decode("utf-8", "replace"), spec, None)
        except (EvidenceError, KeyError, TypeError, ValueError, OverflowError) as e:
            out.append(f"{path}: the evidence of an ok record is refused: {e}")
            continue
        t = r.get("timings") or {}
        have = {
            "training_s": t.get("training_s"),
            "training_cpu_s": t.get("training_cpu_s"),
            "untimed_s": t.get("untimed_s"),
            "planted_s": t.get("planted_s"),
            "planted_cpu_s": t.get("planted_cpu_s"),
            "time_to_target_s": t.get("time_to_target_s"),
            "final_metric": r.get("final_metric"),
            "metrics": r.get("metrics") or {},
        }
        want = got.figures()
        out += _turn_problems(name, r, got)
        if "stall_s" in t:  # a lockstep arm's, since the stall rule (absent from earlier records)
            have["stall_s"], want["stall_s"] = t["stall_s"], got.stall_s
        for k in want:
            if not _close(have[k], want[k]):
                out.append(f"{name}: {k} = {have[k]!r} in the record; its evidence file says {want[k]!r}")
    return out, checked


def _turn_problems(name: str, r: dict[str, Any], got: Derived) -> list[str]:
    """A lockstep command arm's kept step times and hand-over rule against its evidence's (records
    before the after-own rule hold neither)."""
    out = []
    lock = (r.get("env") or {}).get("lockstep") or {}
    if "step_times" in r and got.step_us is not None:
        want = {"wall_us": got.step_us[0], "cpu_us": got.step_us[1]}
        if r["step_times"] != want:
            out.append(f"{name}: step_times in the record are not the steps its evidence file times")
    elif "step_times" in r:
        out.append(f"{name}: step_times in the record of a command arm that is not a lockstep arm")
    if lock.get("turns") != got.turns and ("turns" in lock or got.turns is not None and "step_times" in r):
        out.append(
            f"{name}: env.lockstep.turns = {lock.get('turns')!r}; its evidence file says {got.turns!r}"
        )
    return out


def stall_problems(records: list[dict[str, Any]]) -> tuple[list[str], int]:
    """Each built-in lockstep arm's ``stall_s`` against the one its own ``step_times`` give
    (:func:`prereg.interference.stall_s`; a command arm's is its evidence's, checked by
    :func:`evidence_problems`). Returns the problems and how many records hold one."""
    out: list[str] = []
    checked = 0
    for r in records:
        spec, t = r.get("spec") or {}, r.get("timings") or {}
        if "command" in spec or not isinstance(t, dict) or "stall_s" not in t:
            continue
        checked += 1
        name = f"{spec.get('run_id')}.a{r.get('attempt')}"
        st = r.get("step_times") or {}
        try:
            warm = int(spec.get("warmup_steps") or 0)
            want = stall_s(st["wall_us"], st["cpu_us"], int(spec["block_steps"]), warm)
        except (KeyError, TypeError, ValueError):
            out.append(f"{name}: stall_s without the step times and block_steps it is derived from")
            continue
        if not _close(t["stall_s"], want):
            out.append(f"{name}: stall_s = {t['stall_s']!r} in the record; its step times say {want!r}")
    return out, checked


#: Each step's time is kept in whole microseconds (``round(seconds * 1e6)``), so the kept steps of
#: ``n`` timed steps sum to the clock within half a microsecond each (and the float sum's rounding).
STEP_ROUNDING_S = 0.5e-6


def _sum_differs(us: list[int], clock: float) -> bool:
    return abs(sum(us) / 1e6 - clock) > STEP_ROUNDING_S * len(us) + 1e-9 * (1.0 + abs(clock))


def clock_problems(records: list[dict[str, Any]]) -> tuple[list[str], int]:
    """A built-in arm's ok record against its own per-step figures, as the trainer
    (``harness/execute/training.py``) computes both from the same readings: ``training_s`` is the
    sum of the timed steps' wall times (the steps after ``spec.warmup_steps``) and
    ``training_cpu_s`` of their CPU times, ``warmup_s`` and ``warmup_cpu_s`` those of the warm-up
    steps, each to within :data:`STEP_ROUNDING_S` a step (``step_times`` keeps whole
    microseconds); and the training curve's last point holds the training clock itself, exactly. A
    command arm's figures are its evidence file's (:func:`evidence_problems`). Returns the
    problems and how many records had per-step times to check."""
    out: list[str] = []
    checked = 0
    for r in records:
        spec, t = r.get("spec") or {}, r.get("timings") or {}
        if r.get("status") != "ok" or "command" in spec or not isinstance(t.get("training_s"), (int, float)):
            continue
        name = f"{spec.get('run_id')}.a{r.get('attempt')}"
        curve = r.get("curve")
        if isinstance(curve, list) and curve and curve[-1][2] != t["training_s"]:
            out.append(
                f"{name}: timings.training_s = {t['training_s']!r}, but its training curve ends at "
                f"{curve[-1][2]!r} seconds (the same clock)"
            )
        steps = r.get("step_times")
        if not isinstance(steps, dict):
            continue
        wall, cpu = steps.get("wall_us"), steps.get("cpu_us")
        wall, cpu = (wall if isinstance(wall, list) else []), (cpu if isinstance(cpu, list) else [])
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in wall + cpu)
        if not ints or len(wall) != len(cpu) or len(wall) != spec.get("steps"):
            out.append(
                f"{name}: step_times is not one wall and one CPU time in whole microseconds for each "
                f"of its {spec.get('steps')} steps"
            )
            continue
        checked += 1
        w = spec.get("warmup_steps") or 0
        for key, us in (
            ("training_s", wall[w:]),
            ("training_cpu_s", cpu[w:]),
            ("warmup_s", wall[:w]),
            ("warmup_cpu_s", cpu[:w]),
        ):
            clock = t.get(key)
            if isinstance(clock, (int, float)) and not isinstance(clock, bool) and _sum_differs(us, clock):
                out.append(
                    f"{name}: timings.{key} = {clock!r}, but the {len(us)} steps it times sum to "
                    f"{sum(us) / 1e6!r} seconds in its own step_times (within {STEP_ROUNDING_S * 1e6} "
                    "microseconds a step)"
                )
    return out, checked

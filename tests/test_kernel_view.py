"""The kernel's view of a lockstep pair's arms (``harness/execute/watch.py``) and its rule
(``prereg/interference.py``), from hand-made samples and records; the real processes are
``tests/test_interference.py``'s."""

from __future__ import annotations

import json

from harness.execute.watch import active_span, kernel_view, timed_windows
from prereg.interference import PARTNER_RUN_LIMIT, kernel_problems, kernel_reason


def _reporter(*lines):
    return "\n".join(json.dumps(e) for e in lines)


REPORTER = _reporter(
    {"kind": "start", "t": 10.0},
    {"kind": "step", "t": 11.0},
    {"kind": "wait", "t0": 11.0, "t1": 12.0, "t": 12.0},
    {"kind": "untimed", "t0": 12.5, "t1": 12.6, "t": 12.6},
    {"kind": "step", "t": 14.0},
    {"kind": "untimed", "t0": 14.0, "t1": 14.4, "t": 14.4},
    {"kind": "done", "t": 14.5},
)


def test_the_timed_turns_are_the_reporters_steps_on_the_clock_less_its_waits_and_untimed_blocks():
    assert timed_windows(REPORTER) == [(10.0, 11.0), (12.0, 12.5), (12.6, 14.0)]
    assert timed_windows("not json") == [] and timed_windows(None) == []
    assert active_span(REPORTER) == (10.0, 14.0)  # the partner's part in the turns: start to last step


def test_steps_that_follow_one_another_are_one_turn_so_samples_across_a_stamp_count():
    """Twelve 7 ms steps in turns of three (a hand-over between turns), sampled every 5 ms: per-step
    windows held a whole sample interval only now and then (under half of the timed time: "not
    observed", so the partner went unjudged); one window a turn holds most of them."""
    lines, t = [{"kind": "start", "t": 0.0}], 0.0
    for _turn in range(4):
        for _ in range(3):
            t += 0.007
            lines.append({"kind": "step", "t": round(t, 6)})
        lines.append({"kind": "wait", "t0": round(t, 6), "t1": round(t + 0.021, 6), "t": round(t + 0.021, 6)})
        t += 0.021
    reporter = _reporter(*lines)
    assert timed_windows(reporter) == [(round(0.042 * k, 6), round(0.042 * k + 0.021, 6)) for k in range(4)]
    samples = [(0.001 + 0.005 * i, int(0.005 * i * 1e9), 0, False) for i in range(34)]
    view = kernel_view(samples, samples, [], (reporter, reporter), t)
    assert view["observed"] and view["timed_s"] >= 0.6 * 4 * 0.021, view


def test_a_continue_the_kernel_reported_without_its_stop_counts_as_a_stop():
    samples = [(10.0 + i / 10, 0, 0, False) for i in range(40)]
    view = kernel_view(samples, samples, [(10.2, "continued")], (REPORTER, REPORTER), 14.0)
    assert view["stops"] == 1 and "stopped 1 time" in (kernel_reason(view) or "")
    view = kernel_view(samples, samples, [(10.2, "stopped"), (10.5, "continued")], (REPORTER, REPORTER), 14.0)
    assert view["stops"] == 1 and abs(view["stopped_s"] - 0.3) < 1e-9
    seen_stopped = [(s[0], 0, 0, s[0] == 10.5) for s in samples]
    assert kernel_view(seen_stopped, samples, [], (REPORTER, REPORTER), 14.0)["stops"] == 1


def test_a_partner_that_runs_in_the_arms_turns_fails_it_and_one_that_sleeps_does_not():
    own = [(10.0 + i / 10, i * 50_000_000, 0, False) for i in range(45)]
    sleeping = [(t, 1_000_000, 0, False) for t, *_ in own]
    busy = [(t, i * 50_000_000, 0, False) for i, (t, *_) in enumerate(own)]
    quiet = kernel_view(own, sleeping, [], (REPORTER, REPORTER), 14.0)
    assert quiet["stops"] == 0 and quiet["partner_run_s"] == 0 and kernel_reason(quiet) is None
    starved = kernel_view(own, busy, [], (REPORTER, REPORTER), 14.0)
    assert starved["partner_run_s"] > PARTNER_RUN_LIMIT * starved["run_s"]
    assert "starved by its partner" in (kernel_reason(starved) or "")
    # after its last step the partner's evaluation and exit are its own: not counted
    done = [(t, 0 if t <= 14.0 else int((t - 14.0) * 1e9), 0, False) for t, *_ in own]
    assert kernel_view(own, done, [], (REPORTER, REPORTER), 14.5)["partner_run_s"] == 0


def test_the_audit_names_an_ok_record_whose_kernel_view_fails_it():
    ok = {"stops": 0, "stopped_s": 0.0, "timed_s": 1.0, "run_s": 0.5, "partner_run_s": 0.01}
    stopped = {**ok, "stops": 3, "stopped_s": 0.4}
    records = [
        {"spec": {"run_id": "a"}, "attempt": 1, "status": "ok", "process": {"kernel": ok}},
        {"spec": {"run_id": "b"}, "attempt": 1, "status": "ok", "process": {"kernel": stopped}},
        {"spec": {"run_id": "c"}, "attempt": 1, "status": "failed", "process": {"kernel": stopped}},
        {"spec": {"run_id": "d"}, "attempt": 1, "status": "ok", "process": {"exit": 0}},
    ]
    problems, held = kernel_problems(records)
    assert held == 3 and len(problems) == 1 and problems[0].startswith("b.a1: status ok, yet the kernel saw")


def test_steps_shorter_than_the_sampling_are_named_not_observed_not_passed():
    """Review finding: a turn shorter than the sampling interval held no whole sample interval, so
    the view had nothing to judge and passed. Now it says ``observed`` false: the rule does not
    judge the starvation figures, the audit names the arm NOT OBSERVED, and a stop still fails."""
    from prereg.interference import kernel_named

    turns = []  # turns of one 2 ms step each, the partner's 2 ms turn between (a hand-over)
    for i in range(5):
        t = 10.0 + 0.004 * i
        turns += [
            {"kind": "step", "t": t + 0.002},
            {"kind": "wait", "t0": t + 0.002, "t1": t + 0.004, "t": t + 0.004},
        ]
    short = _reporter({"kind": "start", "t": 10.0}, *turns, {"kind": "done", "t": 10.02})
    samples = [(9.999 + 0.005 * i, i * 1_000_000, 0, False) for i in range(6)]
    view = kernel_view(samples, samples, [], (short, short), 10.02)
    assert view["observed"] is False and view["timed_s"] == 0 and kernel_reason(view) is None
    seen = kernel_view([(10.0 + i / 10, i, 0, False) for i in range(45)], [], [], (REPORTER, REPORTER), 14.0)
    assert seen["observed"] is True
    record = {"spec": {"run_id": "s.c.pair000.baseline"}, "attempt": 1, "status": "ok"}
    named = kernel_named([{**record, "process": {"kernel": view, "isolation": "pid namespace"}}])
    assert len(named) == 1 and named[0].startswith("NOT OBSERVED: 1 arm(s)") and "pair000" in named[0]
    assert "stopped 1 time" in (kernel_reason({**view, "stops": 1}) or "")

"""Command arms (a user's own script as an arm): the reporter against an independent account of its
clock, the evidence rules (``prereg/evidence.py``) on files a hostile script or an edit
would produce, the plan-time refusals through ``harness plan`` (file, key, line, no traceback), and
real processes run by :mod:`harness.execute.commands`: every way a command goes wrong is a failed
run with its reason, and a lockstep pair's two processes never train at the same time.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
from conftest import harness, harness_in_process
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import reporter as reporter_mod
from harness.execute.commands import run_command, run_pair
from harness.execute.job import Job
from harness.reporter import Reporter
from prereg.evidence import EvidenceError, derive_reporter, evidence_problems
from prereg.formats.record import RunSpec

METRIC = {"name": "val_loss", "target": 2.0, "better": "lower"}


class FakeClock:
    """A wall and a CPU clock the test moves by hand (the reporter reads both)."""

    def __init__(self) -> None:
        self.t, self.cpu = 1000.0, 5.0

    def advance(self, wall: float, cpu: float) -> None:
        self.t += wall
        self.cpu += cpu


# one step: (timed wall, timed cpu, untimed wall inside it, an evaluation after it with this value)
STEP = st.tuples(
    st.floats(0.0, 2.0),
    st.floats(0.0, 2.0),
    st.floats(0.0, 1.0),
    st.one_of(st.none(), st.floats(0.5, 5.0)),
)


@settings(max_examples=60, deadline=None)
@given(setup=st.floats(0.0, 3.0), steps=st.lists(STEP, min_size=1, max_size=30))
def test_the_training_clock_is_the_timed_work_alone(tmp_path_factory, setup, steps):
    """The derived training time and CPU time are the sums of what each step spent outside its
    untimed blocks (the first step's from the reporter's start), and the time to target is that
    clock at the first evaluation reaching it, on step sequences the test does not choose (an
    independent sum, not the reporter's own)."""
    c = FakeClock()
    path = tmp_path_factory.mktemp("rep") / "r.jsonl"
    with (
        mock.patch.object(reporter_mod.time, "monotonic", lambda: c.t),
        mock.patch.object(reporter_mod.time, "process_time", lambda: c.cpu),
    ):
        r = Reporter(str(path))
        c.advance(setup, setup)  # set-up after from_env counts towards the first step
        want_wall = want_cpu = 0.0
        ttt = finals = None
        for i, (wall, cpu, untimed, ev) in enumerate(steps, 1):
            c.advance(wall / 2, cpu / 2)
            with r.untimed():
                c.advance(untimed, untimed / 2)
            c.advance(wall / 2, cpu / 2)
            want_wall += wall + (setup if i == 1 else 0.0)
            want_cpu += cpu + (setup if i == 1 else 0.0)
            r.step(i, 3.0)
            if ev is not None:
                with r.untimed():
                    c.advance(0.25, 0.1)
                    r.eval(i, {"val_loss": ev})
                finals = ev
                if ttt is None and ev <= METRIC["target"]:
                    ttt = want_wall
        if finals is None:
            with r.untimed():
                r.eval(len(steps), {"val_loss": 9.0})
            finals = 9.0
        r.done()
    got = derive_reporter(path.read_text(), METRIC, len(steps), None)
    assert math.isclose(got.training_s, want_wall, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(got.training_cpu_s, want_cpu, rel_tol=1e-9, abs_tol=1e-9)
    assert got.final_metric == finals
    if ttt is None:
        assert got.time_to_target_s is None
    else:
        assert math.isclose(got.time_to_target_s, ttt, rel_tol=1e-9, abs_tol=1e-9)


def _file(lines: list[dict]) -> str:
    return "".join(json.dumps(x) + "\n" for x in lines)


def _good(n: int = 3) -> list[dict]:
    out = [{"kind": "start", "format": 1, "pid": 1, "t": 0.0, "cpu": 0.0}]
    for i in range(1, n + 1):
        out.append(
            {
                "kind": "step",
                "step": i,
                "loss": 3.0,
                "tokens": 8,
                "t": float(i),
                "cpu": 0.5 * i,
                "dt": 1.0,
                "cpu_dt": 0.5,
            }
        )
    out.append({"kind": "eval", "step": n, "metrics": {"val_loss": 1.5}, "t": n + 0.5})
    out.append(
        {
            "kind": "untimed",
            "t0": n + 0.1,
            "t1": n + 0.55,
            "cpu0": 0.5 * n,
            "cpu1": 0.5 * n + 0.1,
            "t": n + 0.55,
        }
    )
    out.append({"kind": "done", "steps": n, "t": n + 0.6, "cpu": 0.5 * n + 0.2})
    return out


def test_a_good_file_gives_its_figures():
    got = derive_reporter(_file(_good()), METRIC, 3, 3.7, window=(0.0, 3.7), cpu_s=1.8)
    assert (got.training_s, got.training_cpu_s, got.final_metric, got.time_to_target_s) == (
        3.0,
        1.5,
        1.5,
        3.0,
    )
    assert got.untimed_s == pytest.approx(0.45)


def _edit(fn):
    lines = _good()
    fn(lines)
    return _file(lines)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda L: L.pop(2), "a gap"),
        (lambda L: L.__setitem__(2, {**L[2], "step": 1}), "a gap or a repeat"),
        (lambda L: L.__setitem__(1, {**L[1], "step": 0}), "steps are 1, 2"),
        (lambda L: L.__setitem__(2, {**L[2], "step": 10**400}), "a gap"),
        (lambda L: L.__setitem__(2, {**L[2], "t": 0.5}), "backwards"),
        (lambda L: L.__setitem__(2, {**L[2], "cpu": 0.1}), "CPU clock runs backwards"),
        (lambda L: L.pop(), "no done line"),
        (
            lambda L: L.append({"kind": "step", "step": 4, "loss": 1.0, "t": 9.0, "dt": 0.1, "cpu_dt": 0.1}),
            "after done",
        ),
        (lambda L: L.__setitem__(1, {**L[1], "loss": "nan"}), "not finite"),
        (lambda L: L.__setitem__(4, {**L[4], "metrics": {"other": 1.0}}), "never reported"),
        (lambda L: L.__setitem__(2, {**L[2], "dt": 0.0}), "the clock was edited"),  # a faster step, forged
        (lambda L: L.__setitem__(2, {**L[2], "cpu_dt": 1e9}), "the clock was edited"),
        (lambda L: L.__setitem__(4, {**L[4], "step": 999}), "an evaluation says step 999"),
        (
            lambda L: L.insert(1, {"kind": "eval", "step": 0, "metrics": {"val_loss": 0.1}, "t": 0.0}),
            "evaluate after a step",
        ),
        (
            lambda L: L.insert(
                2, {"kind": "untimed", "t0": 0.5, "t1": 1.5, "cpu0": 0.5, "cpu1": 0.6, "t": 1.5}
            ),
            "outside its step",
        ),
        (
            lambda L: L.insert(2, {"kind": "wait", "t0": 1.0, "t1": 1.5, "t": 1.2, "cpu": 0.5}),
            "not at a step's end",
        ),
        (lambda L: L.__setitem__(0, {**L[0], "format": 9}), "format 1"),
        (lambda L: L.__setitem__(6, {**L[6], "steps": 7}), "done says 7"),
        (lambda L: L.__setitem__(6, {**L[6], "steps": True}), "done says True"),
    ],
)
def test_a_file_that_is_not_evidence_of_a_finished_run_is_refused(edit, words):
    with pytest.raises(EvidenceError, match=re.escape(words)):
        derive_reporter(_edit(edit), METRIC, 3, None)


def test_the_planned_step_count_and_the_harness_clocks_bind_the_file():
    with pytest.raises(EvidenceError, match="the protocol plans 4"):
        derive_reporter(_file(_good()), METRIC, 4, None)
    with pytest.raises(EvidenceError, match="exceeds the harness's wall clock"):
        derive_reporter(_file(_good()), METRIC, 3, 1.0)
    with pytest.raises(EvidenceError, match="outside the process's life"):
        derive_reporter(_file(_good()), METRIC, 3, None, window=(0.5, 10.0))
    with pytest.raises(EvidenceError, match="exceeds the kernel's CPU time"):
        derive_reporter(_file(_good()), METRIC, 3, None, cpu_s=1.0)
    with pytest.raises(EvidenceError, match="not JSON"):
        derive_reporter(_file(_good())[:-7], METRIC, 3, None)


def test_a_nested_untimed_block_counts_once_and_a_step_inside_one_is_refused(tmp_path):
    c = FakeClock()
    path = tmp_path / "r.jsonl"
    with (
        mock.patch.object(reporter_mod.time, "monotonic", lambda: c.t),
        mock.patch.object(reporter_mod.time, "process_time", lambda: c.cpu),
    ):
        r = Reporter(str(path))
        for i in (1, 2):
            c.advance(0.2, 0.2)
            r.step(i, 1.0)
            with r.untimed(), r.untimed():
                c.advance(0.1, 0.1)
                r.eval(i, {"val_loss": 1.0})
        with pytest.raises(RuntimeError, match="inside Reporter.untimed"), r.untimed():
            r.step(3, 1.0)
        r.done()
    got = derive_reporter(path.read_text(), METRIC, 2, None)
    assert got.training_s == pytest.approx(0.4) and got.untimed_s == pytest.approx(0.2)


def test_a_reporter_outside_the_harness_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv("HARNESS_REPORT", raising=False)
    monkeypatch.chdir(tmp_path)
    r = Reporter.from_env()
    r.step(1, 2.0)
    with r.untimed():
        r.eval(1, {"val_loss": 1.0})
    r.done()
    assert list(tmp_path.iterdir()) == []


# -- plan-time refusals -----------------------------------------------------------------------------

HEADER = """\
id: cmd
version: 1
description: command arms
preregistered: false
corpus: pydoc-topics
device: cpu
compile: false
threads: 1
budget_device_seconds: 100
interval_level: 0.95
"""  # the top-level keys every plan-time protocol of this file shares
PROTOCOL = (
    HEADER
    + """\
hypotheses:
  procedure: holm
  family_alpha: 0.05
  min_pairs: 3
  tests:
    - {{id: H1, study: s, endpoint: {endpoint}, estimand: difference, type: superiority, better: lower}}
order_seed: 1
studies:
  - name: s
    design: paired
    arms:
      baseline: {baseline}
      candidate: {{command: [python, train.py, --seed, "{{seed}}"], timeout_s: 60}}
    metric: {{name: val_loss, target: 2.0}}
    configs: [tiny]
    seeds: [1, 2, 3]
    steps: 5
"""
)
GOOD_ARM = '{command: [python, train.py, --seed, "{seed}", --out, "{out}"], timeout_s: 60}'


def _plan(
    tmp_path: Path, baseline: str = GOOD_ARM, endpoint: str = "training_time", call=harness_in_process
) -> subprocess.CompletedProcess[str]:
    """``harness plan`` of the command protocol, through the command line's main in this process
    (the same parser, checks, messages and exit status); ``call=harness``: the installed entry
    point in a fresh process."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "sub").mkdir(exist_ok=True)
    p = tmp_path / "p.yaml"
    p.write_text(PROTOCOL.format(baseline=baseline, endpoint=endpoint))
    return call(tmp_path, "plan", str(p))


def test_a_good_command_protocol_plans(tmp_path):
    r = _plan(tmp_path, call=harness)
    assert r.returncode == 0, r.stderr
    assert "6 runs" in r.stdout


def test_an_arm_env_of_allowed_names_plans(tmp_path):
    """The allow-list's names and the script's own (``ARM_``) plan, and the audit's plan (the core's
    normaliser) refuses a name the harness refuses, so a protocol tagged by another harness is named."""
    from prereg.commands import ENV_ALLOWED, arm_of

    env = "{ARM_DATA_DIR: /data, ARM_LR: '3e-4', HF_HUB_OFFLINE: '1', TOKENIZERS_PARALLELISM: 'false', WANDB_MODE: offline}"
    r = _plan(tmp_path, GOOD_ARM[:-1] + f", env: {env}}}")
    assert r.returncode == 0, r.stderr
    assert {"HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "WANDB_MODE"} <= set(ENV_ALLOWED)
    arm = {"command": ["python", "train.py"], "timeout_s": 9, "env": {"PYTHONPYCACHEPREFIX": "/tmp/x"}}
    with pytest.raises(ValueError, match="PYTHONPYCACHEPREFIX is an interpreter control"):
        arm_of(arm)


@pytest.mark.parametrize(
    ("baseline", "endpoint", "key", "words"),
    [
        ('"python train.py --seed {seed}"', "training_time", "studies[0].arms.baseline", "shell string"),
        (
            '{command: [python, train.py, "{sed}"], timeout_s: 9}',
            "training_time",
            "arms.baseline.command[2]",
            "unknown placeholder {sed}",
        ),
        (
            "{command: [python, train.py], timeout_s: 9, ref: main}",
            "training_time",
            "arms.baseline.ref",
            "not a full commit id",
        ),
        (
            "{command: [python, train.py], timeout_s: 9, ref: " + "a" * 40 + "}",
            "training_time",
            "arms.baseline.ref",
            "not a commit",
        ),
        (
            "{command: [python, train.py], timeout_s: 9, cwd: ../elsewhere}",
            "training_time",
            "arms.baseline.cwd",
            "inside the repository",
        ),
        (
            "{command: [python, train.py], timeout_s: 9, cwd: /tmp}",
            "training_time",
            "arms.baseline.cwd",
            "relative path",
        ),
        (
            "{command: [python, train.py], timeout_s: 9, env: {OMP_NUM_THREADS: '4'}}",
            "training_time",
            "arms.baseline.env.OMP_NUM_THREADS",
            "the harness's to set",
        ),
        (
            "{command: [python, train.py], timeout_s: 9, env: {HARNESS_REPORT: x}}",
            "training_time",
            "arms.baseline.env.HARNESS_REPORT",
            "the harness's to set",
        ),
        ("{command: [], timeout_s: 9}", "training_time", "arms.baseline.command", "empty"),
        ("{command: [python, train.py]}", "training_time", "arms.baseline", "timeout_s"),
        (
            "{command: [python, train.py], timeout_s: 9, reporter: false}",
            "training_time",
            "arms.baseline.metrics_regex",
            "metrics_regex",
        ),
        (
            "{command: [python, train.py], timeout_s: 9, reporter: false, metrics_regex: {val_loss: 'loss (\\d+) (\\d+)'}}",
            "training_time",
            "metrics_regex.val_loss",
            "exactly one group",
        ),
        (
            "{command: [python, train.py], timeout_s: 9, reporter: false, metrics_regex: {val_loss: 'loss ([0-9.]+)'}}",
            "training_time",
            "tests[0].endpoint",
            "has no reporter",
        ),
        (GOOD_ARM, "test_bpb", "tests[0].endpoint", "cannot measure test_bpb"),
        (
            '{command: [python, train.py, "{seed:d}"], timeout_s: 9}',
            "training_time",
            "command[2]",
            "a bare name",
        ),
        (
            '{command: [python, train.py, "{seed!r}"], timeout_s: 9}',
            "training_time",
            "command[2]",
            "a bare name",
        ),
        ("{command: [python, train.py], timeout_s: .inf}", "training_time", "timeout_s", "finite"),
        (
            "{command: [python, train.py], timeout_s: 9, env: {PYTHONPATH: /x}}",
            "training_time",
            "env.PYTHONPATH",
            "the harness's",
        ),
        (
            "{command: [python, train.py], timeout_s: 9, env: {CUDA_VISIBLE_DEVICES: ''}}",
            "training_time",
            "env.CUDA_VISIBLE_DEVICES",
            "the harness's",
        ),
        # an arm's env is an allow-list (prereg.commands.env_problem): these were accepted
        *(
            (
                "{command: [python, train.py], timeout_s: 9, env: {" + name + ": '1'}}",
                "training_time",
                f"arms.baseline.env.{name}",
                words,
            )
            for name, words in (
                ("PYTHONMALLOC", "is an interpreter control"),
                ("PYTHONTRACEMALLOC", "is an interpreter control"),
                ("PYTHONUSERBASE", "is an interpreter control"),
                ("PYTHONPYCACHEPREFIX", "is an interpreter control"),
                ("GLIBC_TUNABLES", "is a C library control"),
                ("MALLOC_ARENA_MAX", "is a C library allocator control"),
                ("LD_DEBUG", "is a dynamic loader control"),
                ("PATH", "is not on the allow-list"),
                ("HOME", "is not on the allow-list"),
                ("HF_HOME", "is not on the allow-list"),
                ("arm_lower", "is not on the allow-list"),
            )
        ),
        ("{command: [no-such-program-x], timeout_s: 9}", "training_time", "command[0]", "command not found"),
        ("{command: [python, nosuch.py], timeout_s: 9}", "training_time", "command[1]", "no such script"),
        (
            "{command: [python, train.py], timeout_s: 9, metrics_regex: {val_loss: 'l ([0-9.]+)'}}",
            "training_time",
            "arms.baseline.metrics_regex",
            "reporter: false",
        ),
    ],
)
def test_what_cannot_run_as_planned_is_refused_at_plan_time(tmp_path, baseline, endpoint, key, words):
    r = _plan(tmp_path, baseline, endpoint)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr + r.stdout
    assert "p.yaml" in r.stderr and key in r.stderr and words in r.stderr, r.stderr
    assert re.search(r"p\.yaml:\d+, key ", r.stderr), r.stderr  # the file, its line, the key


def test_a_lockstep_pair_without_the_reporter_and_non_finite_numbers_are_refused(tmp_path):
    arm = "{command: [python, train.py], timeout_s: 9, reporter: false, metrics_regex: {val_loss: 'loss ([0-9.]+)'}}"
    (tmp_path / "train.py").write_text("")
    text = PROTOCOL.format(baseline=arm, endpoint="final_metric").replace(
        "design: paired", "design: lockstep\n    block_steps: 1"
    )
    for body, key, words in (
        (text, "arms.baseline.reporter", "would train beside its partner"),
        (
            PROTOCOL.format(baseline=GOOD_ARM, endpoint="training_time").replace(
                "target: 2.0", "target: .nan"
            ),
            "metric.target",
            "finite",
        ),
        (
            PROTOCOL.format(baseline=GOOD_ARM, endpoint="training_time").replace(
                "name: val_loss", "name: ' '"
            ),
            "metric.name",
            "not empty",
        ),
    ):
        (tmp_path / "p.yaml").write_text(body)
        r = harness_in_process(tmp_path, "plan", "p.yaml")
        assert r.returncode != 0 and "Traceback" not in r.stderr and key in r.stderr and words in r.stderr, (
            r.stderr
        )


def test_an_arm_without_the_reporter_may_decide_on_total_time_and_its_metric(tmp_path):
    arm = "{command: [python, train.py], timeout_s: 9, reporter: false, metrics_regex: {val_loss: 'loss ([0-9.]+)'}}"
    assert _plan(tmp_path, arm, "total_time").returncode == 0
    assert _plan(tmp_path, arm, "final_metric").returncode == 0


# -- real processes ----------------------------------------------------------------------------------

SCRIPT = textwrap.dedent(
    """\
    import sys, time
    from harness.reporter import Reporter
    mode = sys.argv[1]
    steps = int(sys.argv[2])
    if mode == "missing-reporter":
        print("trained, reported nothing"); sys.exit(0)
    r = Reporter.from_env()
    for i in range(1, steps + 1):
        t = time.monotonic()
        while time.monotonic() - t < 0.01:
            pass
        if mode == "nan" and i == 2:
            r.step(i, float("nan")); continue
        r.step(i, 3.0 / i)
        if mode == "crash" and i == 2:
            raise RuntimeError("boom at step 2")
        if mode == "hang":
            time.sleep(60)
    with r.untimed():
        r.eval(steps, {"val_loss": 1.0})
    print("loss 1.25")
    if mode == "traceback":
        import traceback
        try:
            raise ValueError("caught and printed")
        except ValueError:
            traceback.print_exc()
    if mode != "no-done":
        r.done()
    """
)


def _job(
    tmp_path: Path, argv: list[str], *, steps: int = 4, reporter: bool = True, timeout: float = 30, **extra
) -> Job:
    (tmp_path / "s.py").write_text(SCRIPT)
    spec = RunSpec(
        run_id=extra.pop("run_id", "s.tiny.pair000.baseline"),
        protocol_id="cmd",
        protocol_sha256="0" * 64,
        study="s",
        design="paired",
        config="tiny",
        config_sha256="0" * 64,
        arm="baseline",
        role="baseline",
        seed=1,
        unit="s.tiny.pair000",
        position=extra.pop("position", 0),
        order=0,
        steps=steps,
        val_every=steps,
        val_target_bpb=2.0,
        corpus="pydoc-topics",
        data_dir=None,
        device="cpu",
        compile=False,
        threads=1,
        command={
            "command": argv,
            "cwd": ".",
            "env": {},
            "timeout_s": timeout,
            "ref": None,
            "reporter": reporter,
            **({} if reporter else {"metrics_regex": {"val_loss": r"loss ([0-9.]+)"}}),
        },
        metric=METRIC,
        **extra,
    )
    return Job(spec, 1, ".", None, None, str(tmp_path / "ckpt"))


def _run(tmp_path: Path, *args: str, **kw):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return run_command(_job(tmp_path, ["python", "s.py", *args], **kw), work, tmp_path)


def test_a_command_that_reports_well_is_ok_with_its_evidence(tmp_path):
    result, text = _run(tmp_path, "ok", "4")
    assert result.status == "ok", result.reason
    assert result.final_metric == 1.0 and result.timings["training_s"] > 0.03
    assert result.timings["total_s"] >= result.timings["training_s"]
    assert text is not None and result.evidence and result.evidence["kind"] == "reporter"
    assert result.process and result.process["exit"] == 0 and result.process["cpu_s"] > 0


@pytest.mark.parametrize(
    ("args", "kw", "words"),
    [
        (("crash", "4"), {}, "exited with status 1: RuntimeError: boom at step 2"),
        (("hang", "4"), {"timeout": 1.5}, "wall-clock limit of 1.5 s"),
        (("missing-reporter", "4"), {}, "wrote no reporter file"),
        (("no-done", "4"), {}, "no done line"),
        (("nan", "4"), {}, "not finite"),
        (("traceback", "4"), {}, "printed a traceback"),
        (("ok", "3"), {}, "the protocol plans 4"),
    ],
)
def test_every_way_a_command_goes_wrong_is_a_failed_run_with_its_reason(tmp_path, args, kw, words):
    result, _ = _run(tmp_path, *args, **kw)
    assert result.status == "failed"
    assert words in (result.reason or ""), result.reason


def test_a_command_that_is_not_found_fails_before_it_starts(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    result, text = run_command(_job(tmp_path, ["no-such-program-here", "x"]), work, tmp_path)
    assert result.status == "failed" and "command not found: no-such-program-here" in (result.reason or "")
    assert text is None


def test_a_script_that_cannot_be_changed_is_read_from_its_output(tmp_path):
    result, text = _run(tmp_path, "missing-reporter", "4", reporter=False)
    assert result.status == "failed" and "matched nothing" in (result.reason or "")
    result, text = _run(tmp_path, "no-done", "4", reporter=False)
    assert result.status == "ok", result.reason
    assert result.final_metric == 1.25 and "training_s" not in result.timings
    assert result.evidence and result.evidence["kind"] == "output" and "loss 1.25" in (text or "")


def test_a_lockstep_pair_of_commands_never_trains_at_once(tmp_path):
    """Each arm's timed step intervals, on the machine's one monotonic clock, fall between the
    other's: the hand-over gives one process the turn at a time, whichever steps first."""
    work = tmp_path / "work"
    work.mkdir()
    jobs = []
    for pos, (role, first) in enumerate((("candidate", False), ("baseline", True))):
        j = _job(
            tmp_path,
            ["python", "s.py", "ok", "12"],
            steps=12,
            run_id=f"s.tiny.pair000.{role}",
            position=pos,
            block_steps=3,
            partner=f"s.tiny.pair000.{'baseline' if role == 'candidate' else 'candidate'}",
            steps_first=first,
        )
        jobs.append(j)
    ran = run_pair((jobs[0], jobs[1]), work, tmp_path)
    assert all(r.status == "ok" for r, _ in ran), [r.reason for r, _ in ran]
    spans = []
    for (_, text), who in zip(ran, ("candidate", "baseline"), strict=True):
        lines = [json.loads(x) for x in (text or "").splitlines()]
        assert sum(x["kind"] == "wait" for x in lines) >= 3
        spans += [(x["t"] - x["dt"], x["t"], who, x["step"]) for x in lines if x["kind"] == "step"]
    spans.sort()
    assert spans[0][2] == "baseline"  # the arm that steps first did
    starts = {
        who: json.loads((t or "").splitlines()[0])["t"] for (_, t), who in zip(ran, ("candidate", "baseline"))
    }
    assert spans[0][0] >= starts["candidate"]  # the start barrier: its partner's start-up came first
    for (a0, a1, wa, _), (b0, b1, wb, _) in zip(spans, spans[1:]):
        if wa != wb:
            assert a1 <= b0 + 1e-6, (a0, a1, wa, b0, b1, wb)
    runs: list[list] = [[spans[0][2], 0]]
    for s in spans:
        if s[2] != runs[-1][0]:
            runs.append([s[2], 0])
        runs[-1][1] += 1
    # the ABBA blocks of three with an arm's consecutive blocks one turn (prereg.carryover.turns)
    from prereg.carryover import turns

    who = ("baseline", "candidate")
    assert [(w, n) for w, n in runs] == [(who[a], n) for a, n in turns(12, 3)]
    for r, _ in ran:  # each arm keeps its steps' times and says how it handed over
        assert r.env["lockstep"]["turns"] == "joined" and len(r.step_times["cpu_us"]) == 12


def test_a_lockstep_pair_fails_whole_when_one_arm_fails(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    jobs = [
        _job(
            tmp_path,
            ["python", "s.py", mode, "6"],
            steps=6,
            run_id=f"s.tiny.pair000.{role}",
            position=pos,
            block_steps=2,
            partner=f"s.tiny.pair000.{other}",
            steps_first=pos == 0,
        )
        for pos, (role, other, mode) in enumerate(
            (("baseline", "candidate", "ok"), ("candidate", "baseline", "no-done"))
        )
    ]
    (a, _), (b, _) = run_pair((jobs[0], jobs[1]), work, tmp_path)
    assert b.status == "failed" and "no done line" in (b.reason or "")
    assert a.status == "failed" and "its partner s.tiny.pair000.candidate failed" in (a.reason or "")


def test_the_audit_names_a_kept_file_that_is_not_its_record_s(tmp_path):
    result, text = _run(tmp_path, "ok", "4")
    assert text is not None and result.evidence
    (tmp_path / result.evidence["file"]).write_text(text)
    spec = _job(tmp_path, []).spec.to_json()
    spec["command"] = {**spec["command"]}
    rec = {"spec": spec, "attempt": 1, "status": "ok", **result.to_json()}
    assert evidence_problems(str(tmp_path), [rec]) == ([], 1)
    bad = {**rec, "final_metric": 0.5}
    found, _ = evidence_problems(str(tmp_path), [bad])
    assert any("final_metric = 0.5 in the record" in f for f in found)
    (tmp_path / result.evidence["file"]).write_text(text.replace('"loss": 3.0', '"loss": 2.0'))
    found, _ = evidence_problems(str(tmp_path), [rec])
    assert any("edited after the run" in f for f in found)


def test_the_audit_names_a_lockstep_arms_step_times_its_file_does_not_hold(tmp_path):
    """A lockstep command arm's ``step_times`` and ``env.lockstep.turns`` are its reporter file's:
    the audit derives them again and names a record whose steps or hand-over rule differ."""
    work = tmp_path / "work"
    work.mkdir()
    jobs = [
        _job(
            tmp_path,
            ["python", "s.py", "ok", "6"],
            steps=6,
            run_id=f"s.tiny.pair000.{role}",
            position=pos,
            block_steps=1,
            partner=f"s.tiny.pair000.{other}",
            steps_first=first,
        )
        for pos, (role, other, first) in enumerate(
            (("baseline", "candidate", True), ("candidate", "baseline", False))
        )
    ]
    ran = run_pair((jobs[0], jobs[1]), work, tmp_path)
    result, text = ran[0]
    assert result.status == "ok" and text is not None and result.evidence
    (tmp_path / result.evidence["file"]).write_text(text)
    rec = {"spec": jobs[0].spec.to_json(), "attempt": 1, "status": "ok", **result.to_json()}
    assert evidence_problems(str(tmp_path), [rec]) == ([], 1)
    cpu = list(rec["step_times"]["cpu_us"])
    cpu[3] //= 2
    found, _ = evidence_problems(str(tmp_path), [{**rec, "step_times": {**rec["step_times"], "cpu_us": cpu}}])
    assert any("step_times in the record are not the steps its evidence file times" in f for f in found)
    env = {**rec["env"], "lockstep": {**rec["env"]["lockstep"], "turns": "split"}}
    found, _ = evidence_problems(str(tmp_path), [{**rec, "env": env}])
    assert any("env.lockstep.turns = 'split'; its evidence file says 'joined'" in f for f in found)


def test_a_command_dies_with_its_worker(tmp_path):
    """A runner killed mid-run takes its worker with it; the worker's command goes too (nothing
    trains on unseen, and the attempt is an interrupted one the runner records on resume)."""
    import os
    import signal
    import time

    job = _job(
        tmp_path,
        ["python", "-c", "import os, time; open('pid', 'w').write(str(os.getpid())); time.sleep(60)"],
    )
    (tmp_path / "job.json").write_text(json.dumps(job.to_json()))
    driver = (
        "import json, sys; from pathlib import Path; from harness.execute.job import Job; "
        "from harness.execute.commands import run_command; "
        "run_command(Job.from_json(json.loads(Path('job.json').read_text())), Path('.'), Path('.'))"
    )
    worker = subprocess.Popen([sys.executable, "-c", driver], cwd=tmp_path)
    pid_file = tmp_path / "pid"
    deadline = time.monotonic() + 30
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the command outlived its worker")


def test_the_freeze_names_a_rebound_ref_and_a_changed_installation(tmp_path):
    """What the tag binds for command arms, compared by the runner (``command_drift``) and by the
    audit (``ref_problems``, against the repository's own objects)."""
    from audit.freeze import ref_problems
    from harness.freeze import command_drift

    then = {
        "refs": {"a" * 40: "t1"},
        "python": "CPython 3.11.7",
        "packages": {"torch": "2.14.1", "numpy": "2.0"},
    }
    now = {
        "refs": {"a" * 40: "t2"},
        "python": "CPython 3.12.1",
        "packages": {"torch": "2.14.2", "rich": "13"},
    }
    found = command_drift(then, now)
    assert any("ref aaaaaaaaaaaa: its tree differs" in f for f in found)
    assert "interpreter: CPython 3.12.1, the tag's CPython 3.11.7" in found
    assert "installed package torch: 2.14.2, the tag's 2.14.1" in found
    assert "installed package numpy: removed after the tag" in found
    assert "installed package rich: 13, added after the tag" in found
    assert command_drift(then, then) == []

    repo = tmp_path / "r"
    repo.mkdir()
    for args in (["init", "-q"], ["config", "user.email", "t@e.invalid"], ["config", "user.name", "T"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "f").write_text("x")
    subprocess.run(["git", "add", "f"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "c"], cwd=repo, check=True)
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    tree = subprocess.run(
        ["git", "rev-parse", "HEAD^{tree}"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    arm = {"command": ["python", "t.py"], "timeout_s": 1, "ref": sha}
    from types import SimpleNamespace

    study = SimpleNamespace(commands=True, arms={"baseline": arm, "candidate": {**arm, "ref": "b" * 40}})
    truth = {"spec": SimpleNamespace(studies=[study]), "manifest": {"commands": {"refs": {sha: tree}}}}
    found = ref_problems(str(repo), truth)
    assert found == [f"ref {'b' * 12}: named by the tagged protocol, not bound by the tag's manifest"]
    truth["manifest"]["commands"]["refs"] = {sha: "0" * 40, "b" * 40: "1" * 40}
    found = ref_problems(str(repo), truth)
    assert any(f"ref {sha[:12]}: its tree" in f for f in found)
    assert any("not a commit of this repository" in f for f in found)


def test_a_planted_command_candidate_runs_its_plant_in_every_timed_step(tmp_path):
    """A planted study's candidate (``HARNESS_PLANT``): the reporter spins in each step, before its
    stamp, and says so in a plant line; the figures sum the plant's own time, on the training
    clock; the same file read as a run that is not planted, or with a step's plant line removed, is
    refused."""
    spin_us = 20_000
    result, text = _run(
        tmp_path, "ok", "4", run_id="s.tiny.pair000.candidate", planted={"kind": "spin", "us": spin_us}
    )
    assert result.status == "ok", result.reason
    t = result.timings
    assert t["planted_cpu_s"] >= 4 * spin_us / 1e6 and t["planted_s"] >= t["planted_cpu_s"] * 0.5
    assert t["training_cpu_s"] >= t["planted_cpu_s"] and t["training_s"] >= t["planted_s"]
    assert text is not None
    again = derive_reporter(text, METRIC, 4, None, planted=True)
    assert (again.planted_s, again.planted_cpu_s) == (t["planted_s"], t["planted_cpu_s"])
    with pytest.raises(EvidenceError, match="a plant line in a run that is not a planted candidate"):
        derive_reporter(text, METRIC, 4, None)
    lines = text.splitlines()
    first_plant = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "plant")
    with pytest.raises(EvidenceError, match="step 1 of a planted candidate ran no plant"):
        derive_reporter(
            "\n".join(lines[:first_plant] + lines[first_plant + 1 :]), METRIC, 4, None, planted=True
        )
    twice = lines[: first_plant + 1] + lines[first_plant:]
    with pytest.raises(EvidenceError, match="a plant outside its step"):
        derive_reporter("\n".join(twice), METRIC, 4, None, planted=True)


def test_a_gather_plant_runs_in_the_reporter_and_a_matmul_is_refused_there():
    from harness.reporter import plant_of

    assert plant_of({"kind": "gather", "bytes": 4096}) is not None and plant_of(None) is None
    with pytest.raises(ValueError, match="sleep plants, not 'matmul'"):
        plant_of({"kind": "matmul", "n": 8})


def test_an_unplanted_run_writes_no_plant_line(tmp_path):
    """A baseline (no ``HARNESS_PLANT``) writes no plant line, and its figures have no plant."""
    result, text = _run(tmp_path, "ok", "3", steps=3)
    assert result.status == "ok" and "planted_s" not in result.timings
    assert text is not None and '"plant"' not in text


PLANTED_PROTOCOL = (
    HEADER
    + """\
hypotheses: {{descriptive: "a planted study"}}
order_seed: 1
studies:
  - name: s
    design: paired
    arms:
      baseline: {arm}
      candidate: {arm}
    metric: {{name: val_loss, target: 2.0}}
    configs: [tiny]
    seeds: [1, 2, 3]
    steps: 5
    planted: {planted}
"""
)


@pytest.mark.parametrize(
    ("arm", "planted", "key", "words"),
    [
        (GOOD_ARM, "{kind: spin, us: 50}", None, None),
        (GOOD_ARM, "{kind: gather, bytes: 65536}", None, None),
        (GOOD_ARM, "{kind: matmul, n: 64}", "studies[0].planted.kind", "needs torch"),
        (
            "{command: [python, train.py], timeout_s: 9, reporter: false, metrics_regex: {val_loss: 'l ([0-9.]+)'}}",
            "{kind: spin, us: 50}",
            "studies[0].planted",
            "the candidate has none (reporter: false)",
        ),
    ],
)
def test_a_planted_command_study_plans_or_is_refused_with_file_key_and_line(
    tmp_path, arm, planted, key, words
):
    (tmp_path / "train.py").write_text("print('hi')\n")
    p = tmp_path / "p.yaml"
    p.write_text(PLANTED_PROTOCOL.format(arm=arm, planted=planted))
    r = harness_in_process(tmp_path, "plan", str(p))  # the command line's main, in this process
    if key is None:
        assert r.returncode == 0 and "6 runs" in r.stdout, r.stdout + r.stderr
        return
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert re.search(r"p\.yaml:\d+, key ", r.stderr) and key in r.stderr and words in r.stderr, r.stderr


def test_the_tags_package_check_covers_what_the_studys_imports_import(tmp_path):
    """Review finding: the static scan reads the study's own files, and a package's metadata does
    not list what it imports without requiring it (torch imports numpy): a study that imports torch
    alone left numpy out, so numpy changed after the tag went unnoticed. The packages that importing
    the study's imports loads (``loaded_modules``, a process of its own) are bound too, and the
    tag's package list holds every one of them."""
    from types import SimpleNamespace

    from harness.freeze import command_bindings, command_drift, imported_distributions

    repo = tmp_path / "r"
    (repo / "job").mkdir(parents=True)
    (repo / "job" / "train.py").write_text("import torch\n")
    for args in (["init", "-q"], ["config", "user.email", "t@e.invalid"], ["config", "user.name", "T"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "c"], cwd=repo, check=True)
    arm = {"command": ["python", "train.py", "{seed}"], "cwd": "job", "timeout_s": 60}
    study = SimpleNamespace(commands=True, arms={"baseline": arm, "candidate": arm})
    proto = SimpleNamespace(spec=SimpleNamespace(studies=[study]), studies=[], path=repo)
    only = imported_distributions(proto, repo)  # type: ignore[arg-type]
    assert only is not None and {"torch", "numpy"} <= only, sorted(only or [])
    none = SimpleNamespace(spec=SimpleNamespace(studies=[]), studies=[], path=repo)
    tagged = command_bindings(none, repo)  # type: ignore[arg-type]
    assert set(tagged["packages"]) >= only  # the tag's list covers what the study imports
    bumped = {**tagged, "packages": {**tagged["packages"], "numpy": "0.0.1"}}
    assert command_drift(tagged, bumped, only) == [
        f"installed package numpy: 0.0.1, the tag's {tagged['packages']['numpy']}"
    ]


def test_the_tags_package_check_is_limited_to_what_the_study_imports(tmp_path):
    """Issue 59, case 12: installing a package the study does not import after the tag must not make
    ``harness run`` refuse it; one the study imports (or one of its requirements) still does. A
    command whose program is not this interpreter keeps every package bound."""
    from types import SimpleNamespace

    from harness.freeze import command_bindings, command_drift, imported_distributions

    repo = tmp_path / "r"
    (repo / "job").mkdir(parents=True)
    (repo / "job" / "train.py").write_text(
        "import json\nimport yaml\nfrom harness.reporter import Reporter\n"
    )
    (repo / "job" / "util.py").write_text("from numpy import linalg\nfrom . import train\n")
    for args in (["init", "-q"], ["config", "user.email", "t@e.invalid"], ["config", "user.name", "T"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "c"], cwd=repo, check=True)

    def arms(program: str) -> SimpleNamespace:
        arm = {"command": [program, "train.py", "{seed}"], "cwd": "job", "timeout_s": 60}
        study = SimpleNamespace(commands=True, arms={"baseline": arm, "candidate": arm})
        return SimpleNamespace(spec=SimpleNamespace(studies=[study]), studies=[], path=repo)

    only = imported_distributions(arms("python"), repo)
    assert only is not None and {"pyyaml", "numpy"} <= only and "hypothesis" not in only
    then = {"refs": {}, "python": "CPython 3.11.7", "packages": {"pyyaml": "6.0", "numpy": "2.0"}}
    added = {**then, "packages": {**then["packages"], "hypothesis": "6.0"}}
    assert command_drift(then, added, only) == []  # an unrelated package installed after the tag
    assert command_drift(then, added) == ["installed package hypothesis: 6.0, added after the tag"]
    bumped = {**then, "packages": {"pyyaml": "6.1", "numpy": "2.0"}}
    assert command_drift(then, bumped, only) == ["installed package pyyaml: 6.1, the tag's 6.0"]
    assert imported_distributions(arms("bash"), repo) is None  # cannot be read: every package counts
    assert set(command_bindings(SimpleNamespace(spec=SimpleNamespace(studies=[])), repo)["packages"]) >= only

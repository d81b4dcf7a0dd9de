"""``harness init``: a complete, commented protocol for a user's own training script (a study of
command arms), written from flags alone, checked as ``harness plan`` checks it, never over a file.

Every key is written out, the ones with a safe default (``prereg.plan.PROTOCOL_DEFAULTS``) with that
default, so the file says everything the study will do; each number's origin is stated under
``origins``. The budget is every run at its ``timeout_s``: a safety stop that no study whose runs
finish can reach (lower it once a pilot has timed the runs: ``harness calibrate``).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from prereg.designs import design_named
from prereg.errors import InputError
from prereg.files import atomic_write
from prereg.plan import PROTOCOL_DEFAULTS

#: The command both arms run unless told otherwise: the placeholders the harness fills in.
DEFAULT_COMMAND = "python train.py --seed {seed} --steps {steps}"


@dataclass(frozen=True)
class Scaffold:
    """What ``harness init``'s flags say (cliargs: ``init``)."""

    id: str
    baseline: str
    candidate: str
    baseline_ref: str | None
    candidate_ref: str | None
    metric: str
    target: float
    better: str
    margin: float | None
    design: str
    block_steps: int
    configs: tuple[str, ...]
    pairs: int
    steps: int
    timeout_s: float
    device: str


def _argv(text: str, flag: str) -> str:
    """A command line as the YAML flow list of its arguments (split as a POSIX shell would, no
    shell run); InputError naming the flag when it cannot be split or is empty."""
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise InputError(f"{flag} {text!r}: {e}") from None
    if not argv:
        raise InputError(f"{flag}: an empty command")
    return "[" + ", ".join(json.dumps(a) for a in argv) + "]"


def _arm(command: str, ref: str | None, timeout_s: float, flag: str) -> str:
    ref_part = f", ref: {ref}" if ref else ""
    return f"{{command: {_argv(command, flag)}, timeout_s: {timeout_s:g}{ref_part}}}"


def render(s: Scaffold) -> str:
    """The protocol's text: every key, each with a comment saying what it does."""
    runs = 2 * s.pairs * len(s.configs)
    budget = runs * s.timeout_s
    lockstep = design_named(s.design).shares_process
    lines = _head(s, budget, _tests(s)) + _origins(s, runs, lockstep) + _study(s, lockstep)
    return "\n".join(lines) + "\n"


def warmup_steps(steps: int) -> int:
    """A lockstep study's warm-up: a tenth of the steps, at least 1, at most 10 (0 for one step)."""
    return 0 if steps < 2 else max(1, min(10, steps // 10))


def _tests(s: Scaffold) -> list[str]:
    """The hypotheses' tests: speed for each configuration (lockstep: on the CPU clock, the one the
    calibration found accurate; a process per arm: the wall clock), quality when a margin is given."""
    endpoint = "training_cpu_time" if design_named(s.design).shares_process else "training_time"
    tests = []
    for c in s.configs:
        at = f", config: {c}" if len(s.configs) > 1 else ""
        suffix = f"-{c}" if len(s.configs) > 1 else ""
        tests.append(
            f"    - {{id: H1-speed{suffix}, study: mine{at}, endpoint: {endpoint}, estimand: log_ratio, "
            "type: superiority, better: lower}"
        )
        if s.margin is not None:
            tests.append(
                f"    - {{id: H2-quality{suffix}, study: mine{at}, endpoint: final_metric, estimand: "
                f"difference, type: non_inferiority, margin: {s.margin:g}, better: {s.better}}}"
            )
    if s.margin is None:
        tests += [
            "    # add a quality test once you know the margin you accept (or pass --margin), e.g.:",
            "    # - {id: H2-quality, study: mine, endpoint: final_metric, estimand: difference,",
            f"    #    type: non_inferiority, margin: 0.01, better: {s.better}}}",
        ]
    return tests


def _head(s: Scaffold, budget: float, tests: list[str]) -> list[str]:
    """The opening comments and the study-wide keys, through the hypotheses."""
    d = PROTOCOL_DEFAULTS
    return [
        "# A study of your own training script: baseline against candidate, same seeds, balanced order.",
        "# Written by `harness init`; edit freely, then `harness plan` checks it and lists every run.",
        '# Your script reports its steps through harness/reporter.py (docs/your-change.md, "Your own script").',
        "# To preregister: set preregistered: true, commit, `harness tag` this file, then `harness run` it.",
        f"id: {s.id}",
        _line(
            f"version: {d['version']}", "raise it when you change the study (a new id keeps records apart)"
        ),
        f'description: "{s.id}: baseline against candidate"',
        _line(f"preregistered: {_yaml_bool(d['preregistered'])}", "true: harness tag freezes it first"),
        _line(f"corpus: {d['corpus']}", "read by built-in arms only; your script reads its own data"),
        _line(f"device: {s.device}", "what {device} says to your script"),
        _line(
            f"compile: {_yaml_bool(d['compile'])}",
            "torch.compile of built-in arms; your script decides its own",
        ),
        _line("threads: 1", "torch threads of each run (what {threads} says)"),
        _line(f"budget_device_seconds: {budget:g}", "the study stops here (see origins)"),
        _line(f"interval_level: {d['interval_level']}", "two-sided level of every interval"),
        _line(f"order_seed: {d['order_seed']}", "seeds the balanced order of the arms in each pair"),
        _line("hypotheses:", "decided one-sided, in this order (fixed sequence)"),
        "  procedure: fixed_sequence",
        "  family_alpha: 0.025",
        "  min_pairs: 3",
        "  tests:",
        *tests,
    ]


def _origins(s: Scaffold, runs: int, lockstep: bool) -> list[str]:
    """Where each number comes from."""
    lines = [
        _line("origins:", "where each number comes from"),
        f'  seeds: "{s.pairs} pairs: harness init\'s default; harness power on a pilot says how many a study needs"',
        f'  steps: "{s.steps} steps a run: the script must report exactly this many"',
        f'  timeout_s: "{s.timeout_s:g} s: the longest one run may take before it is stopped and recorded as failed"',
        f'  budget_device_seconds: "{runs} runs x {s.timeout_s:g} s timeout: a safety stop no finishing study reaches"',
        f'  metric: "target {s.target:g}: what {s.metric} should reach (time to target reads it)"',
        '  hypotheses: "speed first at 2.5% one-sided; a decision needs at least 3 pairs"',
    ]
    if lockstep:
        lines.append(
            f'  block_steps: "{s.block_steps}: each arm trains this many steps before the other '
            '(docs/decisions.md, Lockstep pairs)"'
        )
        if warmup_steps(s.steps):
            lines.append(
                f'  warmup_steps: "{warmup_steps(s.steps)}: the first steps, timed apart (a tenth of the steps, '
                'at most 10), as in records/calibration-cpu"'
            )
        lines.append(
            '  clock: "speed on the CPU clock (training_cpu_time): the one records/calibration-cpu found '
            'accurate in lockstep; a wall-only change (sleep, I/O, waiting) needs training_time"'
        )
    return lines


def _study(s: Scaffold, lockstep: bool) -> list[str]:
    """The one study: its design, arms, metric, configurations, seeds and steps."""
    return [
        "studies:",
        "  - name: mine",
        _line(f"    design: {s.design}", "paired: a process per run; lockstep: the two take turns"),
        *([f"    block_steps: {s.block_steps}"] if lockstep else []),
        *([f"    warmup_steps: {warmup_steps(s.steps)}"] if lockstep and warmup_steps(s.steps) else []),
        _line("    arms:", "argument lists, never a shell; ref: run that commit in a worktree"),
        f"      baseline:  {_arm(s.baseline, s.baseline_ref, s.timeout_s, '--command')}",
        f"      candidate: {_arm(s.candidate, s.candidate_ref, s.timeout_s, '--candidate-command')}",
        f"    metric: {{name: {s.metric}, target: {s.target:g}, better: {s.better}}}",
        _line(f"    configs: [{', '.join(s.configs)}]", "labels passed to your script as {config}"),
        f"    seeds: {{count: {s.pairs}, base: 1}}",
        f"    steps: {s.steps}",
    ]


def _line(text: str, comment: str) -> str:
    return f"{text.ljust(36)}# {comment}"


def _yaml_bool(v: object) -> str:
    return "true" if v else "false"


def write(path: Path, s: Scaffold) -> str:
    """Write the protocol to ``path`` (refused if the file exists) and check it as ``harness plan``
    does; a protocol the checks refuse is removed again and the error raised, so nothing stays
    half-right. Returns the text written."""
    from harness.protocol import load_protocol

    if path.exists():
        raise InputError(f"{path}: already exists; init never overwrites a file (choose another path)")
    text = render(s)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text.encode(), overwrite=False)
    try:
        load_protocol(path)
    except InputError as e:
        path.unlink()
        raise InputError(
            f"{e}; so {path} was not written (init writes only a protocol harness plan accepts: fix the "
            "flag, or write the script first)"
        ) from None
    return text

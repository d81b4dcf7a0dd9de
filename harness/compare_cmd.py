"""``harness compare``: one command from "is my change faster?" to a defensible answer.

Two commands (``--base-cmd``, ``--head-cmd``) or one command at two git refs (``--base main --head
HEAD -- python train.py --steps 300``), in the user's own repository. It writes a study of command
arms for them (:func:`protocol_text`: the calibrated design for the declared effect class, its
clock, warm-up steps, seeds and a group-sequential stopping rule, so a clear answer ends early),
runs it through the normal runner (its protocol's sha256 sealed into every record and the ledger:
not preregistered, so no tag is needed and ``harness audit`` says "not verified" and exits 3),
writes the normal report, and prints the answer first (:func:`headline`).

One sign convention: the change is in points of ``100 x ln(T_head / T_base)``, the calibration's
(docs/decisions.md, "Planted effects"): positive means the head is slower. The verdict says it in
words, with the change as a percentage of the base's time (``100 x (T_head / T_base - 1)``).

The design, by effect class (``prereg/planted.py``'s ``CLASSES``; default ``cache-heavy``, an
optimizer or kernel change): lockstep at blocks of 1 step with warm-up steps, decided on the CPU
clock, or for a ``wall-only`` change (sleep, I/O, waiting: nothing the CPU clock sees) on the
wall clock, by whichever of the design's two estimators (the whole training times, or each arm's
steps after its own) the calibration beside the harness (:data:`CALIBRATION`) found nearest to
the truth for that class (:func:`calibrated_choice`), whose bias the headline shows.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from prereg.designs import LOCKSTEP
from prereg.errors import HarnessError, InputError
from prereg.planted import CLASSES

if TYPE_CHECKING:
    from harness.protocol import Protocol
    from prereg.descriptive import PairedInterval
    from prereg.results import PairedResult, Summary

#: The effect classes a user may declare (``prereg/planted.py``'s ``CLASSES``), default cache-heavy.
EFFECT_CLASSES = tuple(sorted(set(CLASSES.values())))
#: The calibrated design: lockstep, this many steps a turn.
BLOCK_STEPS = 1
#: The calibration study whose planted rows give a design's bias, beside the harness.
CALIBRATION = "records/calibration-classes"
#: Every calibration the choice is made over: the quiet one and the same plants under load.
CALIBRATIONS = (CALIBRATION, "records/calibration-classes-loaded")
#: The design's two estimators a calibration reads (``prereg/planted.py`` rows' designs): the ratio
#: of whole training times, and each arm's steps after its own (the after-own endpoints).
WHOLE, AFTER_OWN = (
    f"lockstep, blocks of {BLOCK_STEPS}",
    f"lockstep, blocks of {BLOCK_STEPS}, steps after its own",
)
#: ``harness compare``'s exit status when ``--fail-above`` fires (a slowdown beyond it established).
SLOWER_THAN_ALLOWED = 6
#: Where a compare study's protocol and records go, under the repository.
RUNS = "runs/compare"
SIGN = "points of 100 x ln(T_head / T_base); positive: head slower"


@dataclass(frozen=True)
class Compare:
    """What ``harness compare``'s flags say, resolved (refs to full commit ids)."""

    id: str
    base: list[str]
    head: list[str]
    base_ref: str | None
    head_ref: str | None
    label: tuple[str, str]  # how the user named each side
    steps: int
    warmup_steps: int
    pairs: int
    looks: tuple[int, ...]
    effect_class: str
    endpoint: str  # the hypotheses' endpoint: the estimator the calibration chose for the class
    bias: str  # the headline's bias line
    fail_above: float | None  # percent
    timeout_s: float
    metric: str


def parse_percent(text: str | None, flag: str = "--fail-above") -> float | None:
    """``"1%"`` or ``"1"`` as 1.0 (percent); InputError naming the flag unless a finite positive
    number below 100."""
    if text is None:
        return None
    try:
        v = float(text.strip().removesuffix("%"))
    except ValueError:
        raise InputError(f"{flag} {text!r}: a percentage such as 1%") from None
    if not (0 < v < 100):
        raise InputError(f"{flag} {text!r}: a percentage above 0 and below 100")
    return v


def looks_for(pairs: int) -> tuple[int, ...]:
    """The sequential looks: at a third, two thirds and all of the pairs (those of at least 4
    pairs, so each look has more than ``min_pairs``); none when that leaves one look (a fixed design)."""
    looks = tuple(sorted({n for n in (pairs // 3, 2 * pairs // 3) if n >= 4} | {pairs}))
    return looks if len(looks) > 1 else ()


def steps_of(argv: Sequence[str], given: int | None) -> int:
    """The steps the command reports: ``--steps`` given to compare, else the command's own
    ``--steps N`` (or ``--steps=N``); InputError when neither says."""
    if given is not None:
        if given < 2:
            raise InputError(f"--steps {given}: at least 2 (a warm-up step and a timed one)")
        return given
    for i, a in enumerate(argv):
        m = re.fullmatch(r"--steps(?:=(\d+))?", a)
        if m and (m.group(1) or (i + 1 < len(argv) and argv[i + 1].isdigit())):
            return steps_of(argv, int(m.group(1) or argv[i + 1]))
    raise InputError(
        "how many steps does the command report? give --steps N to harness compare (the command may use "
        "{steps}), or pass --steps N in the command itself"
    )


def split_command(text: str, flag: str) -> list[str]:
    """A command line split as a POSIX shell would (no shell run); InputError naming the flag."""
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise InputError(f"{flag} {text!r}: {e}") from None
    if not argv:
        raise InputError(f"{flag}: an empty command")
    return argv


def resolve_ref(repo: Path, ref: str, flag: str) -> str:
    """``ref`` as a full commit id of ``repo``; InputError naming the flag when it is no commit."""
    from harness.gitutil import git

    out = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    if out.returncode != 0 or not out.stdout.strip():
        raise InputError(
            f"{flag} {ref}: no such commit in {repo} (git rev-parse found none); nothing was written"
        )
    return out.stdout.strip()


def refuse_dirty_head(repo: Path, head_ref: str, head_id: str) -> None:
    """InputError when the head is the checked-out commit and tracked files differ from it: the
    runs would measure the commit, not the change on disk."""
    from harness.gitutil import git, head

    if head_ref != "HEAD" and head_id != head(repo):
        return
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no", check=False).stdout.strip()
    if dirty:
        first = dirty.splitlines()[0].split(maxsplit=1)[-1]
        raise InputError(
            f"--head {head_ref}: the working tree has uncommitted changes ({first}"
            f"{' and more' if len(dirty.splitlines()) > 1 else ''}); the runs would time the commit, not "
            "them: commit them (or stash them) first; nothing was written"
        )


def _yaml_list(argv: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(a) for a in argv) + "]"


def _arm(argv: Sequence[str], ref: str | None, timeout_s: float) -> str:
    return f"{{command: {_yaml_list(argv)}, timeout_s: {timeout_s:g}" + (f", ref: {ref}}}" if ref else "}")


def protocol_text(c: Compare) -> str:
    """The study ``harness compare`` runs, every number's origin stated: lockstep at blocks of
    :data:`BLOCK_STEPS` on the effect class's clock, warm-up steps, Holm over "head faster" and
    "head slower" (beyond ``--fail-above`` when given), with Pocock looks and a futility bound."""
    margin = math.log1p(c.fail_above / 100) if c.fail_above else 0.0
    runs = 2 * c.pairs
    lines = [
        "# Written by harness compare (harness/compare_cmd.py): the baseline against the candidate.",
        f"id: {c.id}",
        "version: 1",
        "description: "
        + json.dumps(f"harness compare: {c.label[0]} against {c.label[1]}, effect class {c.effect_class}"),
        "preregistered: false",
        "corpus: pydoc-topics",
        "device: cpu",
        "compile: false",
        "threads: 1",
        f"budget_device_seconds: {runs * c.timeout_s:g}",
        "interval_level: 0.95",
        "order_seed: 0",
        f"records_dir: {RUNS}/{c.id}/records",
        "hypotheses:",
        "  procedure: holm",
        "  family_alpha: 0.05",
        "  min_pairs: 3",
        *_sequential(c.looks),
        "  tests:",
        f"    - {{id: H1-faster, study: compare, endpoint: {c.endpoint}, estimand: log_ratio, "
        "type: superiority, better: lower}",
        f"    - {{id: H2-slower, study: compare, endpoint: {c.endpoint}, estimand: log_ratio, "
        f"type: superiority, margin: {margin!r}, better: higher}}",
        "origins:",
        f'  design: "lockstep at blocks of {BLOCK_STEPS} on {c.endpoint}: the design {CALIBRATION} '
        f'measured with the least bias, for effect class {c.effect_class} (harness compare)"',
        f'  seeds: "{c.pairs} pairs, looks at {list(c.looks)}: harness compare\'s default (--pairs)"',
        f'  warmup_steps: "{c.warmup_steps}: the first steps, timed apart (a tenth of the steps, at most 10)"',
        f'  budget_device_seconds: "{runs} runs x {c.timeout_s:g} s timeout: a safety stop"',
        f'  hypotheses: "head faster or slower{_beyond(c)}, Holm at 5% (2.5% each way), Pocock looks"',
        "studies:",
        "  - name: compare",
        f"    design: {LOCKSTEP.name}",
        f"    block_steps: {BLOCK_STEPS}",
        f"    warmup_steps: {c.warmup_steps}",
        "    arms:",
        f"      baseline:  {_arm(c.base, c.base_ref, c.timeout_s)}",
        f"      candidate: {_arm(c.head, c.head_ref, c.timeout_s)}",
        f"    metric: {{name: {c.metric}, target: 0, better: lower}}",
        "    configs: [compare]",
        "    seeds: {count: " + str(c.pairs) + ", base: 1}",
        f"    steps: {c.steps}",
    ]
    return "\n".join(lines) + "\n"


def _sequential(looks: tuple[int, ...]) -> list[str]:
    if not looks:
        return []
    return [f"  sequential: {{looks: [{', '.join(map(str, looks))}], spending: pocock, futility_z: 0.0}}"]


def _beyond(c: Compare) -> str:
    return f" (slower by more than {c.fail_above:g}%)" if c.fail_above else ""


@functools.lru_cache(maxsize=1)
def calibration_rows() -> tuple[tuple[dict[str, Any], ...], str | None]:
    """The planted rows of every calibration (:data:`CALIBRATIONS`, their sealed ``summary.json``
    beside this harness), each with its condition (quiet, loaded), read once per process; or no
    rows and the first calibration that could not be read."""
    from harness.packages import package_dirs

    rows: list[dict[str, Any]] = []
    for name, condition in zip(CALIBRATIONS, ("quiet", "loaded")):
        path = next(iter(package_dirs())).parent / name / "summary.json"
        try:
            rows += [{**r, "condition": condition} for r in json.loads(path.read_text()).get("planted") or []]
        except (OSError, ValueError):
            return (), name
    return tuple(rows), None


def calibrated_choice(effect_class: str) -> tuple[str, str]:
    """The endpoint and the bias line for a change of ``effect_class``: of lockstep at blocks of
    :data:`BLOCK_STEPS`'s two estimators (the whole times, :data:`WHOLE`, or the steps after each
    arm's own, :data:`AFTER_OWN`), the one whose bias interval the calibration beside this harness
    (:data:`CALIBRATION`, its sealed ``summary.json``) found nearest zero for the class
    (:func:`prereg.planted.verdicts`, the one home of that choice), on the class's
    clock; with no calibration of the class, the whole times and "bias: not calibrated". A
    calibration made on another CPU model than this machine's is used for the choice, and its bias
    line says so, naming the record file (:func:`prereg.calibrated.refuse_other_machine`).

    The one place ``harness compare`` asks for a design's bias."""
    from harness.machine import cpu_model
    from harness.packages import package_dirs
    from prereg.calibrated import refuse_other_machine
    from prereg.planted import CLASS_CLOCK, verdicts

    wall = CLASS_CLOCK[effect_class] == "wall"
    whole, own = ("training_time", "own_step_time") if wall else ("training_cpu_time", "own_step_cpu_time")
    root = next(iter(package_dirs())).parent
    try:  # the built-in calibration is the maintainers' machine's: said, never silently carried over
        refuse_other_machine([str(root / name) for name in CALIBRATIONS], cpu_model())
        elsewhere = ""
    except InputError as e:
        elsewhere = (
            f"; measured on another CPU model than this one ({e.file}, env.device_name): it may not hold "
            "here, harness calibration-study measures it on this machine"
        )
    rows, missing = calibration_rows()
    if missing is not None:
        return whole, f"bias: not calibrated for this class ({missing} is not beside this harness)"
    ranked = [v for v in verdicts(rows) if v.effect_class == effect_class and v.design in (WHOLE, AFTER_OWN)]
    if not ranked:
        return whole, f"bias: not calibrated for this class ({CALIBRATION} planted no {effect_class} cost)"
    best = ranked[0]
    each = "; ".join(
        f"{r['plant']} {r['condition']} {r['bias']:+.2f} ({r['bias_lo']:+.2f} to {r['bias_hi']:+.2f})"
        for r in best.rows
    )
    return (own if best.design == AFTER_OWN else whole), (
        f"bias: {each} from {CALIBRATION} and its loaded twin ({best.design}, the worse of quiet and loaded)"
        + elsewhere
    )


@dataclass(frozen=True)
class Answer:
    """The headline's figures: the change on the decided clock and the verdict."""

    points: float | None
    low: float | None
    high: float | None
    pairs: int
    clock: str
    verdict: str
    slower_established: bool  # beyond --fail-above when given
    bias: str
    other_clock: str | None  # a disagreement between the clocks, with its likely reason


def _pct(points: float) -> float:
    return 100 * math.expm1(points / 100)


def verdict(points: float, low: float, high: float, faster: bool, slower: bool) -> str:
    """The one-line verdict from the interval (points) and the decisions."""
    rng = f"({abs(_pct(low if points > 0 else high)):.1f} to {abs(_pct(high if points > 0 else low)):.1f})"
    if faster:
        return f"faster by {-_pct(points):.1f}% {rng}, established"
    if slower:
        return f"slower by {_pct(points):.1f}% {rng}, established"
    if low <= 0 <= high:
        return f"no difference resolved: at most {max(abs(_pct(low)), abs(_pct(high))):.1f}% either way"
    way = "faster" if points < 0 else "slower"
    return f"{way} by {abs(_pct(points)):.1f}% {rng}, not established (the decision's interval is wider)"


def answer_of(summary: Summary, c: Compare) -> Answer:
    """The answer from a compare study's summary (``prereg.results.Summary``)."""
    paired = summary.studies[0].paired_configs() if summary.studies else []  # a compare study is paired
    config = paired[0] if paired else None
    decided = {x.decision.id: x.decision for x in getattr(summary.hypotheses, "decisions", [])}
    slower = decided.get("H2-slower")
    faster = decided.get("H1-faster")
    clock = "CPU" if "cpu" in c.endpoint else "wall"
    bias = c.bias
    iv = _interval(summary, c, config)
    if iv is None:
        return Answer(None, None, None, 0, clock, "no answer: no complete pair", False, bias, None)
    p, lo, hi = 100 * iv.estimate, 100 * iv.low, 100 * iv.high
    est_f = faster is not None and faster.status == "established"
    est_s = slower is not None and slower.status == "established"
    text = verdict(p, lo, hi, est_f, est_s and not c.fail_above)
    if c.fail_above and est_s:
        text = f"slower by {_pct(p):.1f}% ({_pct(lo):.1f} to {_pct(hi):.1f}), beyond {c.fail_above:g}%: established"
    elif c.fail_above and p > 0:
        text = f"{text.split(',')[0]}; a slowdown beyond {c.fail_above:g}% is not established"
    return Answer(p, lo, hi, iv.n, clock, text, est_s, bias, clocks_disagree(config, c.endpoint))


def _interval(summary: Summary, c: Compare, config: PairedResult | None) -> PairedInterval | None:
    """The change's log-ratio interval on the decided endpoint: the configuration's endpoint, or for
    an after-own endpoint the mean of the pairs' values (:func:`prereg.hypotheses.values_of`) with
    its paired t interval at the study's level; None without two complete pairs."""
    from prereg.descriptive import mean_interval
    from prereg.hypotheses import NotReached, values_of

    if config is None:
        return None
    ep = getattr(config, c.endpoint, None)
    if ep is not None:
        return ep.log_ratio
    tests = summary.protocol["hypotheses"]["tests"]
    try:
        values, _ = values_of(next(t for t in tests if t["id"] == "H1-faster"), config.pairs)
    except (NotReached, StopIteration):
        return None
    return mean_interval(values, 0.95, "contrast") if len(values) >= 2 else None


def clocks_disagree(config: PairedResult | None, endpoint: str) -> str | None:
    """The report's warning when the CPU and the wall clock disagree
    (:func:`prereg.render.answer.clock_disagreement`), with what to do about a wall-only cost."""
    from prereg.render.answer import clock_disagreement

    said = clock_disagreement(config)
    if said is None:
        return None
    if endpoint.startswith("own_step"):  # the headline's estimator is another: say so beside its figures
        said += " (both from whole training times; the change above is the steps after each arm's own)"
    if not endpoint.endswith("cpu_time"):
        return said
    return said + "; if the change is wall-only, run again with --effect-class wall-only"


def headline(a: Answer, c: Compare) -> list[str]:
    """The answer's lines, first on the terminal: the change with its interval and the bias, the
    verdict, and any disagreement of the clocks."""
    change = "n/a" if a.points is None else f"{a.points:+.2f} (95% interval {a.low:+.2f} to {a.high:+.2f})"
    lines = [
        f"{c.label[1]} against {c.label[0]}: {a.verdict}",
        f"change: {change} {SIGN}; {a.pairs} pairs, {a.clock} clock, lockstep at blocks of {BLOCK_STEPS}"
        + (", the steps after each arm's own" if c.endpoint.startswith("own_step") else ""),
        a.bias,
    ]
    if a.other_clock:
        lines.append(f"warning: {a.other_clock}")
    return lines


def markdown(a: Answer, c: Compare, ledger_head: str, report: str) -> str:
    """A pull-request comment: the verdict, the table, the records' ledger head."""
    cell = "n/a" if a.points is None else f"{a.points:+.2f}"
    iv = "n/a" if a.low is None or a.high is None else f"{a.low:+.2f} to {a.high:+.2f}"
    out = [
        "## harness compare",
        "",
        f"**{a.verdict}**",
        "",
        "| base | head | clock | design | pairs | change (points) | 95% interval | bias |",
        "|---|---|---|---|---|---|---|---|",
        f"| `{c.label[0]}` | `{c.label[1]}` | {a.clock} | lockstep, blocks of {BLOCK_STEPS} | {a.pairs} | "
        f"{cell} | {iv} | {a.bias.removeprefix('bias: ')} |",
        "",
        f"Change in {SIGN}.",
    ]
    if c.fail_above:
        out.append(f"Gate: fails when a slowdown beyond {c.fail_above:g}% is established.")
    if a.other_clock:
        out.append(f"\n**Warning**: {a.other_clock}.")
    out += [
        "",
        f"Records: `{ledger_head}`; report `{report}`; verify: `harness audit {Path(report).parent}`.",
    ]
    return "\n".join(out) + "\n"


def default_id() -> str:
    return "compare-" + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def write_protocol(repo: Path, c: Compare) -> tuple[Path, list[Path]]:
    """Write the compare study's protocol under :data:`RUNS` and check it as ``harness plan`` does;
    a protocol the checks refuse is removed with every folder made for it (nothing half-written).
    Returns its path and the folders made for it, outermost first."""
    from harness.protocol import load_protocol
    from prereg.files import atomic_write

    folder = repo / RUNS / c.id
    if folder.exists():
        raise InputError(f"{folder}: already exists; give another --id (nothing was written)")
    made = [d for d in (repo / "runs", repo / RUNS, folder) if not d.exists()]
    folder.mkdir(parents=True)
    path = folder / "protocol.yaml"
    try:
        atomic_write(path, protocol_text(c).encode(), overwrite=False)
        load_protocol(path)
    except InputError as e:
        remove_made(made)
        raise InputError(f"{e}; nothing was written") from None
    return path, made


def remove_made(made: list[Path], *also: Path) -> None:
    """Remove ``also`` and the folders in ``made`` (outermost first), which harness compare made."""
    import shutil

    for f in (*also, *reversed(made)):
        shutil.rmtree(f, ignore_errors=True)


def echo_to(stream: TextIO) -> Callable[[str], None]:
    """The runner's echo on ``stream`` (standard error: standard output opens with the answer)."""

    def echo(msg: str) -> None:
        if msg.startswith("\r"):
            if stream.isatty():
                stream.write(msg)
                stream.flush()
            return
        if stream.isatty():
            stream.write("\r\033[K")
        print(msg, file=stream, flush=True)

    return echo


def run_compare(repo: Path, c: Compare, markdown_path: Path | None) -> int:
    """Write, run and report the study; print the answer first; the exit status."""
    from harness.clirun import refuse_shadowing, report, run_ending
    from harness.execute.runner import Runner
    from harness.protocol import load_protocol

    refuse_shadowing()
    path, made = write_protocol(repo, c)
    proto = load_protocol(path)
    runner = Runner(proto, echo=echo_to(sys.stderr), live=sys.stderr.isatty())
    end = runner.run()
    code, message = run_ending(proto, end)
    if end.stopped_for_failure is not None and end.planned - end.left == end.failed:
        remove_made(made or [path.parent], runner.dir)
        raise HarnessError(
            f"a command failed before its first step ({end.stopped_for_failure}); nothing was kept "
            "(run it by hand to see why)"
        )
    if not any(proto.records_path.glob("*.record.json")):
        print(message, file=sys.stderr)
        return code or 1
    report(proto, fmt=None, quiet=True)
    a, head = _answer(proto, c)
    rel = proto.records_path.relative_to(repo)
    print("\n".join(headline(a, c)))
    print(f"{message}\n{head}\nreport {rel / 'report.md'}; verify: harness audit {rel}", flush=True)
    if markdown_path is not None:
        atomic_write_text(markdown_path, markdown(a, c, head, str(rel / "report.md")))
        print(f"wrote {markdown_path}")
    if code:
        return code
    return SLOWER_THAN_ALLOWED if c.fail_above and a.slower_established else 0


def _answer(proto: Protocol, c: Compare) -> tuple[Answer, str]:
    """The answer from the study's sealed summary, and its ledger head's line."""
    from harness.ledger import describe, head_of, load_entries
    from prereg.results import Summary

    summary = Summary.read(json.loads((proto.records_path / "summary.json").read_text()))
    return answer_of(summary, c), describe(head_of(load_entries(proto.records_path), ""))


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` whole (a temporary file renamed over it)."""
    from prereg.files import atomic_write

    atomic_write(path, text.encode(), overwrite=True)


def _arms_of(
    repo: Path, args: argparse.Namespace, argv: list[str]
) -> tuple[list[str], list[str], str | None, str | None, tuple[str, str]]:
    """The base's and head's commands, their commits (None for two commands) and their labels,
    from ``--base-cmd``/``--head-cmd`` or ``--base``/``--head`` and the command after ``--``
    (``argv``)."""
    refs = args.base is not None or args.head is not None
    cmds = args.base_cmd is not None or args.head_cmd is not None
    if refs == cmds:
        raise InputError(
            "give either --base-cmd and --head-cmd, or --base REF --head REF -- COMMAND (one command at two "
            "commits); nothing was written"
        )
    if cmds:
        if args.base_cmd is None or args.head_cmd is None or argv:
            raise InputError("--base-cmd and --head-cmd go together, with no command after --")
        base, head = split_command(args.base_cmd, "--base-cmd"), split_command(args.head_cmd, "--head-cmd")
        return base, head, None, None, (args.base_cmd, args.head_cmd)
    if not argv:
        raise InputError("--base/--head: give the command after --, e.g. -- python train.py --steps 300")
    base_ref = resolve_ref(repo, args.base or "main", "--base")
    head_ref = resolve_ref(repo, args.head or "HEAD", "--head")
    refuse_dirty_head(repo, args.head or "HEAD", head_ref)
    return argv, argv, base_ref, head_ref, (args.base or "main", args.head or "HEAD")


def _check_numbers(args: argparse.Namespace) -> None:
    """``--pairs``, ``--timeout`` and ``--id`` checked (InputError naming the flag)."""
    if args.pairs < 4:
        raise InputError(f"--pairs {args.pairs}: at least 4 (a look needs more than 3 pairs)")
    if not args.timeout > 0:
        raise InputError(f"--timeout {args.timeout}: must be positive")
    if args.id is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}", args.id):
        raise InputError(f"--id {args.id!r}: letters, digits, '.', '_' and '-' (a folder under {RUNS})")


def from_args(repo: Path, args: argparse.Namespace) -> Compare:
    """The flags resolved and checked, before anything is written (InputError naming the flag)."""
    from harness.scaffold import warmup_steps

    argv = list(args.command_argv or [])
    if argv[:1] == ["--"]:
        argv = argv[1:]
    base, head, base_ref, head_ref, label = _arms_of(repo, args, argv)
    steps = steps_of(head if args.steps or "--steps" in " ".join(head) else base, args.steps)
    _check_numbers(args)
    endpoint, bias = calibrated_choice(args.effect_class)
    return Compare(
        id=args.id or default_id(),
        base=base,
        head=head,
        base_ref=base_ref,
        head_ref=head_ref,
        label=label,
        steps=steps,
        warmup_steps=warmup_steps(steps),
        pairs=args.pairs,
        looks=looks_for(args.pairs),
        effect_class=args.effect_class,
        endpoint=endpoint,
        bias=bias,
        fail_above=parse_percent(args.fail_above),
        timeout_s=args.timeout,
        metric=args.metric,
    )


def cmd_compare(args: argparse.Namespace) -> int:
    """``harness compare``: resolve the flags, then write, run and report the study."""
    from harness.gitutil import toplevel

    repo = toplevel(Path.cwd())
    if repo is None:
        raise InputError(
            f"{Path.cwd()}: not in a git repository (harness compare runs in your own repository)"
        )
    c = from_args(repo, args)
    md = Path(args.markdown) if args.markdown else None
    if md is not None and md.exists() and not md.is_file():
        raise InputError(f"--markdown {args.markdown}: not a file")
    return run_compare(repo, c, md)

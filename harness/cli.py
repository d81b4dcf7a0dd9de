"""The ``harness`` command line: argparse subcommands dispatched from a dict of ``cmd_*`` functions."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from harness.cliargs import RUN_INTERRUPTED, RUN_TERMINATED, parser
from harness.clirun import Terminated, cmd_run, records_rel, refuse_shadowing, report
from harness.clitools import cmd_compare_arms, cmd_configs, cmd_data, cmd_node, cmd_verify, table
from harness.compare_cmd import cmd_compare
from prereg.errors import HarnessError, InputError
from prereg.formats.record import RecordFormatError

_N = TypeVar("_N", int, float)  # a flag's kind of number

if TYPE_CHECKING:
    from analysis.calibration_study import CalibrationPlan
    from harness.protocol import Protocol


def cmd_plan(args: argparse.Namespace) -> int:
    from harness.plan import make_plan, plan_sha256
    from harness.protocol import load_protocol

    proto = load_protocol(args.protocol)  # read by the core's reader, the public audit's
    runs = make_plan(proto)
    if args.json:
        print(
            json.dumps(
                {
                    "protocol": proto.spec.id,
                    "protocol_sha256": proto.sha256,
                    "plan_sha256": plan_sha256(runs),
                    "runs": [r.to_json() for r in runs],
                },
                indent=1,
            )
        )
        return 0
    rows = [
        {
            "#": r.order,
            "study": r.study,
            "config": r.config,
            "unit": r.unit.rsplit(".", 1)[-1],
            "pos": r.position,
            "role": r.role,
            "arm": r.arm,
            "seed": r.seed,
            "steps": r.steps,
            # lockstep: in one process with its partner; "first" takes the first block of block_steps
            "lockstep": ""
            if not r.lockstep
            else f"steps {'first' if r.steps_first else 'second'}, blocks of {r.block_steps}",
        }
        for r in runs
    ]
    cols = ["#", "study", "config", "unit", "pos", "role", "arm", "seed", "steps"]
    print(table(rows, cols + (["lockstep"] if any(r.lockstep for r in runs) else [])))
    print(
        f"\n{len(runs)} runs; protocol {proto.spec.id} sha256 {proto.sha256}; plan sha256 {plan_sha256(runs)}"
    )
    if proto.defaults_note():
        print(proto.defaults_note())
    for s in proto.studies:
        if s.lockstep and len(s.seeds) % 4:
            print(
                f"note: lockstep study {s.name} has {len(s.seeds)} pairs per configuration: build order and "
                f"first block are balanced in each group of four pairs; the last {len(s.seeds) % 4} are a "
                "seeded draw of the four combinations (a multiple of 4 balances both exactly)"
            )
    return 0


def cmd_tag(args: argparse.Namespace) -> int:
    refuse_shadowing()
    from harness.freeze import manifest_sha256, tag
    from harness.protocol import load_protocol

    proto = load_protocol(args.protocol)
    info, m = tag(proto, sign=args.sign)
    print(
        f"tagged {info.name} -> {info.commit} (protocol sha256 {proto.sha256}){' signed' if args.sign else ''}"
    )
    print(
        f"freeze manifest sha256 {manifest_sha256(m)}: {len(m['configs'])} configurations, plan of "
        f"{m['plan']['runs']} runs, frozen entries {', '.join(sorted(m['trees']))}, code of "
        f"{', '.join(sorted(m['code']))}"
    )
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from harness.protocol import load_protocol
    from prereg.formats.record import load_started, seal
    from prereg.formats.summary import derive, load_records
    from prereg.render.page import write_page

    proto = load_protocol(args.protocol)
    records = load_records(proto.records_path)
    if not records:
        raise HarnessError(
            f"no records in {proto.records_path}; run the study first: harness run {proto.relpath}"
        )
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise InputError(f"--out {args.out}: not a folder")
    summary = derive(records, load_started(proto.records_path))  # as harness report derives summary.json
    path = write_page(
        summary,
        proto.records_path,
        out,
        records_rel=records_rel(proto),
        summary_sha256=seal(summary.to_json())["sha256"],
    )
    print(f"wrote {path}")
    return 0


def _reconciled(proto: Protocol) -> None:
    from harness.ledger import reconcile_study

    note = reconcile_study(proto)  # the chain is the truth: a crash may have left MANIFEST behind it
    if note:
        print(note, file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    from harness.protocol import load_protocol

    proto = load_protocol(args.protocol)
    _reconciled(proto)
    beside = None
    if args.beside:
        beside = Path(args.beside)
        if not (beside / "summary.json").is_file():
            raise InputError(
                f"--beside {args.beside}: no summary.json there (an earlier study's records folder)"
            )
    report(proto, args.format, args.quiet, beside, signs=bool(args.sign))
    if args.sign:
        from harness.freeze import sign_result
        from harness.ledger import head_of, load_entries

        entries = load_entries(proto.records_path)
        if not entries:
            raise InputError(f"{proto.records_path}: no ledger entries: nothing to sign")
        head = head_of(entries, "")
        print(sign_result(proto, head["seq"], head["sha256"], seal_plots=True))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from analysis.calibrate import budget, calibrate
    from harness.plan import make_plan
    from harness.protocol import load_protocol
    from prereg.formats.summary import load_records

    pilot = load_protocol(args.pilot)
    rows = calibrate(load_records(pilot.records_path))
    if not rows:
        raise HarnessError(
            f"no ok baseline runs in {pilot.records_path}; run the pilot first: harness run {args.pilot}"
        )
    if not (args.slower >= 1.0 and args.slower < 1e6):
        raise InputError(
            f"--slower {args.slower:g}: a factor of at least 1 (how much slower a machine may be)"
        )
    n_runs = len(make_plan(load_protocol(args.target))) if args.target else None
    shown = []
    for config, r in rows.items():
        row = {
            "config": config,
            "pilot_runs": r["runs"],
            "val_target_bpb": f"{r['val_target_bpb']:.2f}",
            "device_s_per_run": f"{r['device_s_per_run']:.2f}",
        }
        if n_runs:
            row["budget_if_all_runs_like_this"] = f"{budget(r['device_s_per_run'], n_runs, args.slower):.0f}"
        shown.append(row)
    print(table(shown, list(shown[0])))
    print(
        "\nrule: analysis/calibrate.py (median baseline validation BPB at 75% of steps, rounded up; "
        "budget = median device s per run x runs x 1.5"
        + (f" x {args.slower:g} (--slower)" if args.slower != 1.0 else "")
        + ", rounded up to a minute)"
    )
    return 0


def cmd_calibration_verdict(args: argparse.Namespace) -> int:
    """``harness calibration-verdict RECORDS``: which design to use here, per effect class."""
    from analysis.calibration_study import verdict_lines
    from prereg.calibrated import refuse_other_machine
    from prereg.formats.summary import derive, load_records

    refuse_other_machine(list(args.records), None)  # one machine's calibrations, never a mix
    runs = []
    for name in args.records:
        folder = Path(name)
        if not (folder / "MANIFEST").is_file() and not any(folder.glob("*.record.json")):
            raise InputError(
                f"{folder}: not a records folder (run the calibration first: harness run PROTOCOL)"
            )
        records = load_records(folder)
        rows = [r if isinstance(r, dict) else dict(r) for r in (derive(records).planted or [])]
        if not rows:
            raise InputError(
                f"{folder}: no planted studies: not a calibration (harness calibration-study writes one)"
            )
        loads = [
            float(r.env["loadavg"][0])
            for r in records
            if isinstance(r.env, dict) and isinstance(r.env.get("loadavg"), list) and r.env["loadavg"]
        ]
        runs.append((name, rows, loads))
    print("\n".join(verdict_lines(runs, os.cpu_count() or 1)))
    return 0


def cmd_calibration_study(args: argparse.Namespace) -> int:
    from analysis.calibration_study import pilot_step_cpu_us, protocol_text
    from harness.protocol import load_protocol
    from prereg.files import atomic_write
    from prereg.formats.record import load_records

    out = Path(args.out)
    if out.exists():
        raise InputError(f"{out} exists; the calibration study is written anew, never over a file")
    pilot = load_protocol(args.pilot)
    try:
        step_us, runs = pilot_step_cpu_us(load_records(pilot.records_path), args.config)
    except ValueError as e:
        raise HarnessError(
            f"{pilot.records_path}: {e} (run the pilot first: harness run {args.pilot})"
        ) from e
    designs = _numbers("--designs", args.designs, int)
    _check_calibration_counts(args, designs)
    text, counts = protocol_text(_calibration_plan(args, pilot, step_us, runs, designs))
    atomic_write(out, text.encode(), overwrite=False)
    try:
        load_protocol(out)
    except InputError:
        out.unlink()
        raise
    print(
        f"wrote {out}: {sum(counts.values())} pairs ({', '.join(f'{k} {v}' for k, v in counts.items())}); "
        f"a step of {args.config} took {step_us:.0f} us of CPU time in the pilot ({runs} baseline runs)"
    )
    print(f"run it: harness run {out}")
    return 0


def _numbers(flag: str, text: str, kind: Callable[[str], _N]) -> tuple[_N, ...]:
    """A flag's comma-separated numbers, none negative (else InputError naming the flag)."""
    try:
        out = tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise InputError(f"{flag} {text!r}: a comma-separated list of numbers") from e
    if not out or any(v < 0 for v in out):
        raise InputError(f"{flag} {text!r}: a comma-separated list of numbers, none negative")
    return out


def _check_calibration_counts(args: argparse.Namespace, designs: tuple[int, ...]) -> None:
    """InputError unless every design has at least 2 pairs and the steps outlast the warm-up by
    the longest block."""
    for flag, v in (
        ("--pairs", args.pairs),
        ("--coverage-pairs", args.coverage_pairs),
    ):
        if v < 2:
            raise InputError(f"{flag} {v}: at least 2 pairs")
    if args.matmul_pairs == 1 or args.matmul_pairs < 0:
        raise InputError(f"--matmul-pairs {args.matmul_pairs}: 0 (no matmul plant) or at least 2 pairs")
    if args.steps <= args.warmup_steps or max(designs) > args.steps - args.warmup_steps:
        raise InputError(f"--steps {args.steps}: more than --warmup-steps and at least the longest block")
    if args.truth_runs and (args.truth_runs < 2 or args.plant_pairs < 2):
        raise InputError("--truth-runs and --plant-pairs: 0 (none) or at least 2")
    if args.truth_runs and args.truth_steps < args.warmup_steps + 4 * args.toggle_steps:
        raise InputError(
            f"--truth-steps {args.truth_steps}: at least the warm-up and two rounds of --toggle-steps "
            f"blocks ({args.warmup_steps + 4 * args.toggle_steps}), so both kinds of step are timed"
        )


def _calibration_plan(
    args: argparse.Namespace, pilot: Protocol, step_us: float, runs: int, designs: tuple[int, ...]
) -> CalibrationPlan:
    """The calibration study's plan from the flags and the pilot's step time."""
    from analysis.calibration_study import CalibrationPlan

    return CalibrationPlan(
        id=args.id,
        config=args.config,
        pilot=str(pilot.relpath),
        pilot_command=f"harness run {pilot.relpath}",
        step_cpu_us=step_us,
        pilot_runs=runs,
        sizes=_numbers("--sizes", args.sizes, float),
        designs=designs,
        pairs=args.pairs,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        matmul_n=args.matmul,
        matmul_pairs=args.matmul_pairs,
        coverage_sizes=_numbers("--coverage-sizes", args.coverage_sizes, float),
        coverage_designs=_numbers("--coverage-designs", args.coverage_designs, int),
        coverage_pairs=args.coverage_pairs,
        replicate_pairs=args.replicate_pairs,
        seed_base=args.seed_base,
        order_seed=args.order_seed,
        threads=pilot.spec.threads or 1,
        flags=_given_flags(args),
        plants=_plants(args.plants),
        plant_pairs=args.plant_pairs,
        truth_runs=args.truth_runs,
        toggle_steps=args.toggle_steps,
        truth_steps=args.truth_steps,
        load=args.load,
    )


def _plants(text: str) -> tuple[tuple[str, int], ...]:
    """``--plants``: KIND:SIZE pairs, each a valid plant (else InputError naming it)."""
    from prereg.planted import KINDS, plant_problems

    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        kind, _, size = item.partition(":")
        if kind not in KINDS or not size.isdigit():
            raise InputError(f"--plants {item!r}: KIND:SIZE with KIND one of {', '.join(KINDS)}")
        problems = plant_problems({"kind": kind, KINDS[kind][0]: int(size)}, command=False)
        if problems:
            raise InputError(f"--plants {item!r}: {problems[0][1]}")
        out.append((kind, int(size)))
    return tuple(out)


_CALIBRATION_FLAGS = (
    "id",
    "sizes",
    "designs",
    "pairs",
    "steps",
    "warmup_steps",
    "matmul",
    "matmul_pairs",
    "coverage_sizes",
    "coverage_designs",
    "coverage_pairs",
    "replicate_pairs",
    "seed_base",
    "order_seed",
    "plants",
    "plant_pairs",
    "truth_runs",
    "toggle_steps",
    "truth_steps",
    "load",
)


def _given_flags(args: argparse.Namespace) -> str:
    """The calibration command's flags that differ from their defaults, as a user would type them."""
    from harness.cliargs import parser

    defaults = parser().parse_args(["calibration-study", "p", "--out", "o"])
    return "".join(
        f" --{k.replace('_', '-')} {shlex.quote(str(getattr(args, k)))}"
        for k in _CALIBRATION_FLAGS
        if getattr(args, k) != getattr(defaults, k)
    )


def _calibration_bias(calibration: str, target: Any) -> Any:
    """``harness power --calibration``: the target design's bias from the calibration's records,
    refused where they were measured on another CPU model than this machine's, or are missing."""
    from analysis.power import calibration_bias
    from harness.machine import cpu_model
    from harness.protocol import load_protocol
    from prereg.calibrated import refuse_other_machine
    from prereg.formats.record import load_records
    from prereg.formats.summary import derive

    cal = load_protocol(calibration)
    if cal.records_path.is_dir():  # its bias is this machine's only if it was measured here
        refuse_other_machine([str(cal.records_path)], cpu_model())
    planted = derive(load_records(cal.records_path)).planted if cal.records_path.is_dir() else None
    if not planted:
        raise HarnessError(
            f"--calibration {calibration}: no planted studies in {cal.records_path}; "
            f"run it first: harness run {calibration}"
        )
    return calibration_bias(planted, target.summary())


def cmd_power(args: argparse.Namespace) -> int:
    from analysis.power import cited, legend, plan, table_rows
    from harness.protocol import load_protocol
    from prereg.formats.record import load_records

    pilot = load_protocol(args.pilot)
    target = load_protocol(args.target)
    records = load_records(pilot.records_path)
    if not records:
        raise HarnessError(
            f"no records in {pilot.records_path}; run the pilot first: harness run {args.pilot}"
        )
    effects = {}
    for item in args.effect or []:
        hid, _, value = item.partition("=")
        try:
            effects[hid] = float(value)
        except ValueError as e:
            raise HarnessError(f"--effect takes HYPOTHESIS=VALUE, got {item!r}") from e
    rows = plan(records, target.summary(), effects)
    bias = _calibration_bias(args.calibration, target) if args.calibration else None
    if "descriptive" in target.spec.hypotheses:
        print(
            f"{target.path}: descriptive protocol ({target.spec.hypotheses['descriptive']}); nothing to power"
        )
        return 0
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=1))
        return 0
    shown = table_rows(rows, bias)
    if not shown:
        print(f"no A/A pairs in {pilot.records_path} for the target's configurations")
        return 1
    print(table(shown, list(shown[0])))
    origins = target.spec.origins or {}  # the typed protocol's: sentences, validated by its reader
    print("\n" + legend(rows))
    if bias is not None:
        from prereg.calibrated import SIGN

        print(
            "design bias, calibration: the target design's estimate less the planted truth in "
            f"{args.calibration}'s records (95%; {SIGN}: a bias reads the change as costing more), "
            "on the hypothesis' clock (docs/decisions.md, 'The design chosen by its bias', 'One sign convention')"
        )
    _replicates_note(target.summary())
    print(f"{target.path}: origins.seeds cites {cited(str(origins.get('seeds') or ''))}")
    return 0


def _replicates_note(target: dict[str, Any]) -> None:
    """How ``harness power`` planned a replicated target's t rules."""
    replicates = (target.get("replicates") or {}).get("count")
    if replicates:
        print(
            f"replicates: {replicates}: each t rule is planned as a replicated protocol decides it, a t "
            f"with {replicates - 1} degrees of freedom on the replicates' means, at no spread between "
            "them (a spread widens the interval and lowers the power; docs/decisions.md, 'Replicates')"
        )


def cmd_status(args: argparse.Namespace) -> int:
    from harness.execute.state import status_table, unfinished
    from harness.ledger import describe, head_of, load_entries
    from harness.protocol import load_protocol

    proto = load_protocol(args.protocol)
    _reconciled(proto)
    rows, spent = status_table(proto)
    head = head_of(load_entries(proto.records_path) if proto.records_path.is_dir() else [], "")
    unended = unfinished(proto)
    if args.json:
        print(
            json.dumps(
                {
                    "protocol": proto.spec.id,
                    "rows": rows,
                    "device_seconds_spent": spent,
                    "budget_device_seconds": proto.spec.budget_device_seconds,
                    "ledger_head": head,
                    "interrupted_without_record": unended,
                },
                indent=1,
            )
        )
        return 0
    print(
        table(
            rows,
            [
                "study",
                "config",
                "runs",
                "done",
                "failed",
                "interrupted_attempts",
                "superseded_attempts",
                "pending",
            ],
        )
    )
    for u in unended:
        print(
            f"{'running' if u['running'] else 'interrupted'}: {u['run_id']} attempt {u['attempt']} started at "
            f"{u['started_at']} on {u['node']} (ledger seq {u['seq']}) has no ending"
            + ("" if u["running"] else "; the next harness run records it")
        )
    print(
        f"\nbudget: {spent:.1f} of {proto.spec.budget_device_seconds:.0f} device seconds spent; records in {proto.records_path}"
    )
    print(describe(head) if head["seq"] else "ledger: no records yet")
    if head["seq"]:
        print("publish this head (commit it, post it): any later rewrite of the records cannot match it")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from harness.scaffold import Scaffold, write
    from prereg.errors import InputError

    path = Path(args.protocol)
    if path.suffix not in (".yaml", ".yml"):
        raise InputError(f"{path}: a protocol file ends in .yaml")
    for flag, v in (("--pairs", args.pairs), ("--steps", args.steps), ("--block-steps", args.block_steps)):
        if v < 1:
            raise InputError(f"{flag} {v}: must be at least 1")
    if not args.timeout > 0:
        raise InputError(f"--timeout {args.timeout}: must be positive")
    s = Scaffold(
        id=args.id or path.stem,
        baseline=args.arm_command,
        candidate=args.candidate_command or args.arm_command,
        baseline_ref=args.baseline_ref,
        candidate_ref=args.candidate_ref,
        metric=args.metric,
        target=args.target,
        better=args.better,
        margin=args.margin,
        design=args.design,
        block_steps=args.block_steps,
        configs=tuple(args.config or ["small"]),
        pairs=args.pairs,
        steps=args.steps,
        timeout_s=args.timeout,
        device=args.device,
    )
    write(path, s)
    print(
        f"wrote {path}: a complete protocol (not preregistered), checked as harness plan checks it.\n"
        f"next: harness plan {path}; commit it; harness run {path}; harness audit <its records folder>"
    )
    if s.baseline == s.candidate and s.baseline_ref == s.candidate_ref:
        print(
            "note: both arms run the same command at the same commit (an A/A study): give "
            "--candidate-command or --baseline-ref/--candidate-ref to compare a change"
        )
    return 0


def cmd_audit(argv: list[str]) -> int:
    """``harness audit ...``: the public audit with its own arguments, from any folder (a user's own
    repository too): its entry point ``analysis/public_audit.py``, found beside this harness, run
    as ``python -I -S`` on the standard library alone, as a reader runs it (``python -m audit``
    runs the same command line)."""
    import subprocess

    from harness.packages import package_dirs

    script = next((d / "public_audit.py" for d in package_dirs() if d.name == "analysis"), None)
    if script is None or not script.is_file():
        from prereg.errors import InputError

        raise InputError("the audit's entry point (analysis/public_audit.py) is not beside this harness")
    args = argv[1:] if argv[:1] == ["--"] else argv
    return subprocess.run([sys.executable, "-I", "-S", str(script), *args]).returncode


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "configs": cmd_configs,
    "data": cmd_data,
    "verify": cmd_verify,
    "plan": cmd_plan,
    "tag": cmd_tag,
    "run": cmd_run,
    "status": cmd_status,
    "report": cmd_report,
    "calibrate": cmd_calibrate,
    "calibration-study": cmd_calibration_study,
    "calibration-verdict": cmd_calibration_verdict,
    "power": cmd_power,
    "node": cmd_node,
    "compare-arms": cmd_compare_arms,
    "publish": cmd_publish,
    "init": cmd_init,
    "compare": cmd_compare,
}


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll reports an error or hang-up)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError as e:  # not standard output's (re-raised by _main): a message, exit 2
        print(f"harness: error: {e.filename or 'a pipe'}: {e.strerror or e}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["audit"]:  # its arguments are the audit's own (harness audit --help lists them)
        return cmd_audit(argv[1:])
    args = parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except HarnessError as e:
        print(f"harness {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except RecordFormatError as e:
        print(
            f"harness {args.command}: error: {e} (a record or MANIFEST that is not in the harness's format: "
            "restore it from version control; the audit names every damaged file)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        if args.command == "run":
            print(
                "harness run: interrupted: the attempt in progress is recorded as interrupted, charged "
                "its time until the stop (never the pause; under --ray, when the study resumes); run the same "
                "command again to continue",
                file=sys.stderr,
            )
            return RUN_INTERRUPTED
        print(f"harness {args.command}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(
            "harness run: terminated (SIGTERM): the attempt in progress is recorded as interrupted, "
            "charged its time until the stop; run the same command again to continue",
            file=sys.stderr,
        )
        return RUN_TERMINATED
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe: the message below says which (main's caller gets exit 2)
        # the reader of our output went away (``harness plan ... | head -1``): nothing is wrong with
        # what was done, and nobody is left to tell; exit as a process killed by SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as e:  # a file the harness could not write or read: a message, exit 2, no traceback
        print(
            f"harness {args.command}: error: {e.filename or 'a file'}: {e.strerror or e}; fix it and run the same "
            "command again",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())

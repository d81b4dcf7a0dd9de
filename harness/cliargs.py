"""The ``harness`` command line's arguments: one parser, its subcommands and their help.

The commands themselves are in :mod:`harness.cli`; every flag has help (a test walks this parser).
"""

from __future__ import annotations

import argparse

from harness.scaffold import DEFAULT_COMMAND
from prereg.designs import PAIRED, design_named, design_names

#: The --device choices of every subcommand that takes one.
DEVICES = ["auto", "cpu", "cuda", "mps"]
DEVICE_HELP = "auto (mps, then cuda, then cpu), cpu, cuda or mps"


#: ``harness run``'s exit statuses, each with what it means and what to do (``harness run --help``
#: lists them; docs/decisions.md "How harness run ends" too; tests/test_run_endings.py checks each).
RUN_COMPLETE, RUN_FAILED_RUNS, RUN_REFUSED, RUN_BUDGET_STOP, RUN_NOT_DONE, RUN_NO_REPORT = 0, 1, 2, 3, 4, 5
RUN_INTERRUPTED, RUN_TERMINATED = 130, 143
RUN_ENDINGS: list[tuple[int, str]] = [
    (
        RUN_COMPLETE,
        "complete: every planned run ended ok, or the preregistered sequential rule stopped the study "
        "at a look; the report is written and printed",
    ),
    (
        RUN_FAILED_RUNS,
        "complete, with failed runs (recorded with their reasons, counted in the report, which is "
        "written), or stopped by the failure rule (every run of an arm failed before its first step: "
        "the reason and logs are printed); --retry-failed runs their units again whole, up to max_attempts",
    ),
    (
        RUN_REFUSED,
        "refused or an error: bad input (the file, key and line are named), a frozen study that "
        "differs from its tag, a file that cannot be read or written; nothing half-written",
    ),
    (
        RUN_BUDGET_STOP,
        "stopped by the budget rule: a result, not an error; the report (its banner says so), the "
        "page and the summary are written and the decisions printed; running again stops the same way",
    ),
    (
        RUN_NOT_DONE,
        "runs left that this runner did not start (units another runner holds); run the same "
        "command again when it ends",
    ),
    (
        RUN_NO_REPORT,
        "the runs ended as the line before says, but the report could not be written (the analysis "
        "error is named); the records are untouched: write it with harness report after a fix",
    ),
    (
        RUN_INTERRUPTED,
        "interrupted (Ctrl-C): the attempt in progress is recorded as interrupted, charged its time "
        "until the stop (under --ray: when the study resumes); run the same command again to continue",
    ),
    (RUN_TERMINATED, "terminated (SIGTERM): as for an interruption"),
]


def run_epilog() -> str:
    import textwrap

    lines = ["exit status:"]
    for code, text in RUN_ENDINGS:
        lines.append(textwrap.fill(text, width=78, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7))
    return "\n".join(lines)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cotangent-harness")
    except PackageNotFoundError:
        return "unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="harness", description="Preregistered paired-seed training-speed experiments."
    )
    p.add_argument("--version", action="version", version=f"harness {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    _data_commands(sub)
    _protocol_commands(sub)
    _planning_commands(sub)
    _compare_arms_command(sub)
    _calibration_study_command(sub)
    v = sub.add_parser(
        "calibration-verdict",
        help="a calibration's one-screen verdict: per effect class, the design to use here and its bias",
    )
    v.add_argument(
        "records",
        nargs="+",
        help="the calibration's records folder (records/<id>); several (quiet and loaded): the design "
        "whose worst bound over all of them is nearest zero",
    )
    _init_command(sub)
    _compare_command(sub)
    _audit_commands(sub)
    return p


def _data_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``configs``, ``data`` and ``verify``: the configurations, corpora and the method's checks."""
    s = sub.add_parser("configs", help="list configurations with parameter counts")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s = sub.add_parser("data", help="fetch or verify a corpus; pin a local corpus file")
    s.add_argument(
        "action", choices=["fetch", "verify", "pin"], help="fetch a corpus, verify one, or pin a local file"
    )
    s.add_argument(
        "corpus", help="wikitext-2 or pydoc-topics; for verify also a protocol (its corpus); for pin a file"
    )
    s.add_argument("--name", help="pin: the local corpus's name (default: the file's stem)")
    s.add_argument(
        "--split", default="0.9,0.05,0.05", help="pin: train,valid,test fractions (default 0.9,0.05,0.05)"
    )
    s.add_argument("--dir", help="data directory (default $HARNESS_DATA or runs/data)")
    s.add_argument(
        "--url", action="append", help="mirror URL to try (repeatable; default: the built-in list)"
    )
    s.add_argument(
        "--pins", help="JSON file of sizes and sha256 to verify against instead of the built-in pins"
    )
    s = sub.add_parser("verify", help="bitwise checks of the method against native on a device")
    s.add_argument("--device", default="cpu", choices=DEVICES, help=DEVICE_HELP + " (default: cpu)")
    s.add_argument(
        "--save", action="store_true", help="record matched paths for this device and torch version"
    )
    s.add_argument(
        "--no-clients",
        action="store_true",
        help="skip the real clients' loops (Trainer, accelerate, Lightning, timm, torchtune; CPU only)",
    )


def _protocol_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``plan``, ``tag``, ``run``, ``status`` and ``report``: each takes a protocol file."""
    for name, help_ in (
        ("plan", "print the complete run list"),
        ("tag", "freeze a committed protocol with a git tag"),
        ("run", "execute a protocol"),
        ("status", "done, failed, interrupted and pending runs"),
        ("report", "tables, plots and summary.json from the records"),
    ):
        extra: dict[str, object] = (
            {"epilog": run_epilog(), "formatter_class": argparse.RawDescriptionHelpFormatter}
            if name == "run"
            else {}
        )
        s = sub.add_parser(name, help=help_, **extra)  # type: ignore[arg-type]
        s.add_argument("protocol", help="the protocol file (protocols/<id>.yaml)")
        if name in ("plan", "status"):
            s.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if name == "tag":
            s.add_argument(
                "--sign",
                action="store_true",
                help="sign the tag with git (gpg.format ssh or openpgp, "
                "user.signingkey); the audit verifies it with "
                "--allowed-signers",
            )
        if name == "run":
            _run_arguments(s)
        if name == "report":
            _report_arguments(s)


def _run_arguments(s: argparse.ArgumentParser) -> None:
    """``harness run``'s own flags."""
    s.add_argument("--quiet", action="store_true", help="plain log lines, no live display")
    s.add_argument(
        "--anchor",
        metavar="REMOTE",
        help="push the ledger head to REMOTE's refs/ledger/protocol-"
        "<id> after every unit (a git remote name or URL)",
    )
    s.add_argument(
        "--retry-failed",
        action="store_true",
        help="execute units with a failed run again, whole and in plan order, up to the protocol's max_attempts",
    )
    s.add_argument(
        "--allow-torch-mismatch",
        action="store_true",
        help="run although the installed torch differs from the protocol's torch_version",
    )
    s.add_argument("--no-report", action="store_true", help="do not write the report after the run")
    s.add_argument(
        "--replicate",
        type=int,
        metavar="K",
        help="a replicated protocol (replicates: {count, min_gap_s}): run replicate K's units only",
    )
    s.add_argument(
        "--executor",
        metavar="NAME",
        help="where the units run: local (this machine, the default) or ray (a Ray cluster: --ray's "
        "address, else auto)",
    )
    s.add_argument(
        "--ray", metavar="ADDRESS", help="execute on a Ray cluster (auto, or host:port): --executor ray there"
    )


def _report_arguments(s: argparse.ArgumentParser) -> None:
    """``harness report``'s own flags."""
    s.add_argument("--format", choices=["csv", "parquet"], help="also export the per-run table")
    s.add_argument("--quiet", action="store_true", help="do not print the report")
    s.add_argument(
        "--sign",
        action="store_true",
        help="sign the ledger head as tag result-<id> (kept as RESULT in the records folder) with "
        "git's signing, as harness tag --sign signs; the audit verifies it with --allowed-signers",
    )
    s.add_argument(
        "--beside",
        metavar="FOLDER",
        help="an earlier study's records folder (its summary.json): the page and report show "
        "the same configurations' results beside this study's",
    )


def _planning_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``publish``, ``power`` and ``node``: the study page, the pairs needed, a Ray node."""
    s = sub.add_parser("publish", help="the study page: one self-contained HTML file from the records")
    s.add_argument("protocol", help="the protocol file whose records to publish")
    s.add_argument(
        "--out", metavar="DIR", help="folder to write index.html into (default: the records folder)"
    )
    s = sub.add_parser("power", help="pairs needed per hypothesis, from a pilot's A/A pairs")
    s.add_argument("pilot", help="the pilot protocol (already run)")
    s.add_argument("--target", required=True, help="the protocol whose hypotheses are planned")
    s.add_argument(
        "--effect",
        action="append",
        metavar="ID=VALUE",
        help="assumed true effect of a hypothesis, any type (favourable direction, estimand units; "
        "default 0)",
    )
    s.add_argument(
        "--calibration",
        metavar="PROTOCOL",
        help="a calibration study already run (harness calibration-study): print each design's measured "
        "bias beside the detectable effect",
    )
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s = sub.add_parser("node", help="start a Ray node that offers this machine's timing devices")
    s.add_argument("--device", required=True, choices=DEVICES, help=DEVICE_HELP)
    s.add_argument("--address", help="the head's host:port (omit to start the head)")
    s.add_argument("--port", type=int, default=6379, help="the head's port (head only)")
    s.add_argument("--devices", type=int, help="timing devices offered (default: 1; CUDA: every visible GPU)")
    s.add_argument(
        "--no-block", action="store_true", help="return once the node runs (ray start without --block)"
    )


def _compare_arms_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``compare-arms``: two arms in lockstep on one seed."""
    s = sub.add_parser("compare-arms", help="two arms in lockstep on one seed: where their bits part")
    s.add_argument("baseline", help="a built-in arm or a plug-in module:function")
    s.add_argument("candidate", help="a built-in arm or a plug-in module:function")
    s.add_argument("--config", required=True, help="a configuration name (harness configs lists them)")
    s.add_argument("--steps", type=int, default=20, help="training steps in lockstep (default 20)")
    s.add_argument("--seed", type=int, default=0, help="the seed both arms share (default 0)")
    s.add_argument("--device", default="cpu", choices=DEVICES, help=DEVICE_HELP + " (default: cpu)")
    s.add_argument(
        "--corpus",
        default="pydoc-topics",
        help="pydoc-topics, wikitext-2, or a protocol file whose corpus to use (a local corpus)",
    )
    s.add_argument("--data-dir", help="data directory for wikitext-2 (default $HARNESS_DATA or runs/data)")
    s.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    s.add_argument("--json", action="store_true", help="print JSON: the summary and every step")


def _calibration_study_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``calibration-study``: planted effects through every design."""
    s = sub.add_parser(
        "calibration-study",
        help="write a calibration study from a pilot: planted effects through every design (their bias)",
    )
    s.add_argument("pilot", help="the pilot protocol (already run): its baseline runs give the step time")
    s.add_argument(
        "--config", default="tiny_transformer", help="the configuration (default tiny_transformer)"
    )
    s.add_argument("--out", required=True, help="the protocol file to write (refused if it exists)")
    s.add_argument("--id", default="calibration-cpu", help="the study's id (default calibration-cpu)")
    s.add_argument("--sizes", default="0.5,1,2,5", help="spin sizes, percent of a step (default 0.5,1,2,5)")
    s.add_argument(
        "--designs", default="0,1,10,50", help="block sizes, 0 a process per arm (default 0,1,10,50)"
    )
    s.add_argument("--pairs", type=int, default=8, help="pairs per design and size (default 8)")
    s.add_argument("--steps", type=int, default=200, help="steps per run (default 200)")
    s.add_argument("--warmup-steps", type=int, default=10, help="warm-up steps timed apart (default 10)")
    s.add_argument("--matmul", type=int, default=288, help="the cache-heavy plant's n (default 288)")
    s.add_argument(
        "--matmul-pairs", type=int, default=12, help="pairs per design for it, 0 for none (default 12)"
    )
    s.add_argument(
        "--coverage-sizes",
        "--coverage-size",
        default="2",
        help="the sizes coverage is counted at, comma-separated (default 2)",
    )
    s.add_argument(
        "--coverage-designs", default="1,10", help="designs whose coverage is counted (default 1,10)"
    )
    s.add_argument("--coverage-pairs", type=int, default=80, help="their pairs at that size (default 80)")
    s.add_argument("--replicate-pairs", type=int, default=4, help="pairs per replicate study (default 4)")
    s.add_argument("--seed-base", type=int, default=900000, help="the first seed (default 900000)")
    s.add_argument("--order-seed", type=int, default=20261204, help="the plan's order seed")
    s.add_argument(
        "--plants",
        default="",
        help="other plants, KIND:SIZE comma-separated (gather:4194304, copy:1048576, alloc:4194304, "
        "sleep:50, matmul:200; prereg/planted.py), each through every design",
    )
    s.add_argument("--plant-pairs", type=int, default=12, help="pairs per design for each (default 12)")
    s.add_argument(
        "--truth-runs",
        type=int,
        default=0,
        help="runs of each plant's truth study: the plant on and off in its own process (default 0: none)",
    )
    s.add_argument("--toggle-steps", type=int, default=2, help="a truth study's blocks (default 2)")
    s.add_argument("--truth-steps", type=int, default=600, help="a truth study's steps (default 600)")
    s.add_argument(
        "--load",
        default="",
        help="the load the machine will be kept under while it runs, as a command (written into the "
        "protocol; e.g. 'python benchmarks/load.py --busy 1 --memory-mib 256'); default: none, quiet",
    )


def _init_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``init``: a commented protocol for the user's own training script."""
    s = sub.add_parser(
        "init",
        help="write a complete, commented protocol for your own training script (never over a file)",
    )
    s.add_argument("protocol", help="the protocol file to write (protocols/<id>.yaml; refused if it exists)")
    s.add_argument("--id", help="the study's id (default: the file's name without .yaml)")
    s.add_argument(
        "--command",
        dest="arm_command",
        default=DEFAULT_COMMAND,
        help=f"both arms' command line, split as a shell would (default: {DEFAULT_COMMAND!r})".replace(
            "%", "%%"
        ),
    )
    s.add_argument("--candidate-command", help="the candidate's command line (default: --command's)")
    s.add_argument("--baseline-ref", help="run the baseline at this full commit id (a git worktree)")
    s.add_argument("--candidate-ref", help="run the candidate at this full commit id (a git worktree)")
    s.add_argument("--metric", default="val_loss", help="the metric your script reports (default val_loss)")
    s.add_argument("--target", type=float, default=3.0, help="the metric's target (default 3.0)")
    s.add_argument("--better", default="lower", choices=["lower", "higher"], help="default lower")
    s.add_argument(
        "--margin", type=float, help="add a quality test: the metric may be worse by at most this much"
    )
    pair_designs = [n for n in design_names() if design_named(n).pairwise]  # a command study is a pair
    s.add_argument("--design", default=PAIRED.name, choices=pair_designs, help=f"default {PAIRED.name}")
    s.add_argument("--block-steps", type=int, default=1, help="lockstep: steps per turn (default 1)")
    s.add_argument("--config", action="append", help="a configuration label, {config} (default: small)")
    s.add_argument("--pairs", type=int, default=12, help="pairs (seeds) per configuration (default 12)")
    s.add_argument("--steps", type=int, default=200, help="steps your script reports (default 200)")
    s.add_argument("--timeout", type=float, default=600, help="one run's limit in seconds (default 600)")
    s.add_argument("--device", default="cpu", choices=DEVICES, help="what {device} says (default: cpu)")


def _compare_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``compare``: two commands, or one command at two commits, from question to answer."""
    s = sub.add_parser(
        "compare",
        help="is my change faster? two commands, or one at two commits: a study written, run and reported",
    )
    s.add_argument("--base-cmd", help="the baseline's command line (with --head-cmd)")
    s.add_argument("--head-cmd", help="the candidate's command line (with --base-cmd)")
    s.add_argument("--base", help="the baseline's commit (a ref; with --head and a command after --)")
    s.add_argument("--head", help="the candidate's commit (default HEAD; the tree must be clean)")
    s.add_argument("--steps", type=int, help="steps the command reports (default: its own --steps N)")
    s.add_argument("--pairs", type=int, default=12, help="pairs at most (default 12; looks at thirds)")
    s.add_argument(
        "--effect-class",
        default="cache-heavy",
        choices=["allocation", "bandwidth", "cache-heavy", "context-free", "wall-only"],
        help="the class of the change (docs/decisions.md, 'Effect classes'): cache-heavy (default: an "
        "optimizer or kernel change), bandwidth, allocation, context-free (CPU work only), or wall-only "
        "(sleep, I/O, waiting: decided on the wall clock); the calibration's best estimator for it is used",
    )
    s.add_argument(
        "--fail-above", metavar="PCT", help="exit 6 when a slowdown beyond PCT (e.g. 1%%) is established"
    )
    s.add_argument("--markdown", metavar="FILE", help="also write the answer as a pull-request comment")
    s.add_argument("--metric", default="val_loss", help="the metric the script reports (default val_loss)")
    s.add_argument("--timeout", type=float, default=600, help="one run's limit in seconds (default 600)")
    s.add_argument("--id", help="the study's id (default compare-<UTC time>)")
    s.add_argument(
        "command_argv", nargs=argparse.REMAINDER, help="-- COMMAND: the command, at --base and --head"
    )


def _audit_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``audit`` and ``calibrate``: the public audit and a pilot's preregistration numbers."""
    s = sub.add_parser(
        "audit",
        help="the public audit of records folders (standard library only; as python -m audit)",
        add_help=False,
    )
    s.add_argument("args", nargs=argparse.REMAINDER, help="python -m audit --help lists them")
    s = sub.add_parser("calibrate", help="preregistration numbers from a pilot's records (targets, budget)")
    s.add_argument("pilot", help="the pilot protocol (already run)")
    s.add_argument("--target", help="the protocol being calibrated (for its run count)")
    s.add_argument(
        "--slower",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="size the budget for a machine FACTOR times slower than the pilot's (default 1; the demo "
        "uses 3, so it finishes on slow or busy machines)",
    )

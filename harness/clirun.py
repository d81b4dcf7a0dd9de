"""``harness run``: executing a study, how the run ends (its exit status and message:
:data:`harness.cliargs.RUN_ENDINGS`), and the report it writes when the run is a result."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cliargs import RUN_BUDGET_STOP, RUN_COMPLETE, RUN_FAILED_RUNS, RUN_NO_REPORT, RUN_NOT_DONE
from prereg.errors import HarnessError, InputError, Terminated
from prereg.tag import remote_problem

if TYPE_CHECKING:
    from harness.execute.state import RunEnd
    from harness.protocol import Protocol

#: Installed packages the harness imports; a copy of one inside the study's folder (an ignored
#: ``yaml/`` beside the code) would shadow it for a runner started there with ``python -m``.
_INSTALLED = ("yaml", "filelock", "numpy", "torch", "safetensors", "scipy", "pandas", "matplotlib")


def refuse_shadowing() -> None:
    """Refuse, before anything imports them, installed packages shadowed from the working directory."""
    import importlib.util

    from prereg.errors import RefusedError

    here = Path.cwd().resolve()
    for name in _INSTALLED:
        if name in sys.modules:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
        if origin is not None and origin.is_relative_to(here) and "site-packages" not in origin.parts:
            raise RefusedError(
                f"{origin}: a module {name!r} in the study's folder shadows the installed package; "
                "nothing was run: remove it (a frozen study imports only its tracked code)"
            )


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def cmd_run(args: argparse.Namespace) -> int:
    refuse_shadowing()
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    from harness.execute.registry import executor_named
    from harness.execute.runner import Runner
    from harness.protocol import load_protocol

    proto = load_protocol(args.protocol)
    live = sys.stdout.isatty() and not args.quiet
    echo = _echo(live)
    executor = executor_named(args.executor, args.ray)
    if args.anchor is not None and remote_problem(args.anchor) is not None:
        raise InputError(f"--anchor {args.anchor}: {remote_problem(args.anchor)}; nothing was run")
    runner = Runner(
        proto,
        echo=echo,
        live=live,
        retry_failed=args.retry_failed,
        allow_torch_mismatch=args.allow_torch_mismatch,
        executor=executor,
        anchor=args.anchor,
        replicate=args.replicate,
    )
    end = runner.run()
    code, message = run_ending(proto, end)
    return _report_after_run(args, proto, code, message)


def _echo(live: bool) -> Callable[[str], None]:
    """The runner's echo: a line starting with a carriage return is a live status line, written
    in place on a terminal and dropped elsewhere; any other line clears it first."""

    def echo(msg: str) -> None:
        if msg.startswith("\r"):
            if live:
                sys.stdout.write(msg)
                sys.stdout.flush()
            return
        if live:
            sys.stdout.write("\r\033[K")
        print(msg, flush=True)

    return echo


def _report_after_run(args: argparse.Namespace, proto: Protocol, code: int, message: str) -> int:
    """The report written after the runs (unless ``--no-report`` or the run did not end with
    records to report), the closing message and the answer; the exit status."""
    report_now = not args.no_report and code in (RUN_COMPLETE, RUN_FAILED_RUNS, RUN_BUDGET_STOP)
    answer = ""
    if report_now and any(proto.records_path.glob("*.record.json")):
        try:
            answer = report(proto, fmt=None, quiet=False, answer_after=True, signs=_signed_this_head(proto))
        except HarnessError:
            raise
        except Exception as e:  # noqa: BLE001 - the runs are recorded; say what failed, no traceback
            print(message, flush=True)
            print(
                f"harness run: the report could not be written ({type(e).__name__}: {e}); the records "
                f"in {proto.records_path} are untouched: after a fix, write it with: harness report "
                f"{proto.relpath}",
                file=sys.stderr,
                flush=True,
            )
            return RUN_NO_REPORT
        seal_plots(proto)
    print(message, flush=True)
    if answer:
        print(answer, flush=True)  # the answer last: each configuration's effect and decisions
    return code


def _signed_this_head(proto: Protocol) -> bool:
    """Whether the records folder's ``RESULT`` signs the ledger's head as it stands (the run signed it)."""
    from harness.ledger import head_of, load_entries
    from prereg.tag import RESULT_FILE, parse_result

    kept = proto.records_path / RESULT_FILE
    old = parse_result(kept.read_bytes()) if kept.is_file() and not kept.is_symlink() else None
    if old is None:
        return False
    head = head_of(load_entries(proto.records_path), "")
    return (old["seq"], old["sha256"]) == (head["seq"], head["sha256"])


def seal_plots(proto: Protocol) -> None:
    """Where the run signed its ledger head (``RESULT``), sign it again sealing the PNG plots the
    report has just drawn (:func:`harness.freeze.sign_result`), so a replaced plot fails the audit."""
    from harness.freeze import sign_result
    from harness.ledger import head_of, load_entries

    if not _signed_this_head(proto):
        return  # the run signed no head, or another one: harness report --sign signs it
    head = head_of(load_entries(proto.records_path), "")
    try:
        print(sign_result(proto, head["seq"], head["sha256"], seal_plots=True), flush=True)
    except HarnessError as e:
        print(f"  result: WARNING: the plots were not sealed: {e}", flush=True)


def run_ending(proto: Protocol, end: RunEnd) -> tuple[int, str]:
    """The exit status and closing message of ``harness run`` (:data:`harness.cliargs.RUN_ENDINGS`);
    of a replicated protocol's ``--replicate K``, for that replicate's runs, and what comes next."""
    code, message = _ending(proto, end)
    if end.replicate is None:
        return code, message
    k, count = end.replicate
    message = f"replicate {k} of {count}: {message}"
    if k < count and not end.left:
        message += (
            f"\nNext: harness run {proto.relpath} --replicate {k + 1}, at least "
            f"{(proto.spec.replicates or {}).get('min_gap_s')} s after this replicate's last entry on this machine "
            "(or at once on another machine)"
        )
    return code, message


def _ending(proto: Protocol, end: RunEnd) -> tuple[int, str]:
    where = f"records in {proto.records_path}"
    if end.stopped_for_budget:
        b = end.budget
        spent = (
            f"{b.spent:.1f} of {b.budget:.0f} device seconds spent; the next unit, {b.unit}, would need "
            f"about {b.expected:.1f} s more"
            if b is not None
            else "the budget is spent"
        )
        done = end.planned - end.left
        then = (
            "This is the preregistered study's result: the budget is part of its protocol, so nothing "
            "more runs (running the same command again stops at once, the same way)."
            if proto.spec.preregistered
            else "To run the rest, raise budget_device_seconds in a new version of the protocol (a new "
            "id or records_dir, its origin stated) and run that; this protocol stops here every time."
        )
        failed = f", {end.failed} failed (recorded)" if end.failed else ""
        return RUN_BUDGET_STOP, (
            f"STOPPED BY THE BUDGET RULE: {done} of {end.planned} runs done{failed}, {end.left} not "
            f"started; {spent}. The report above is the study's result (its banner says so); {where}.\n"
            + then
        )
    if end.stopped_at_look is not None and end.left:
        look = end.stopped_at_look
        return RUN_COMPLETE, (
            f"STOPPED AT LOOK {look['look']} by the preregistered sequential rule ({look['stop']}, "
            f"{look['pairs']} pairs): {end.planned - end.left} of {end.planned} runs done, {end.left} not "
            f"needed. The report above is the study's result; {where}."
        )
    if end.stopped_for_failure is not None:
        return RUN_FAILED_RUNS, (
            f"STOPPED BY THE FAILURE RULE: {end.planned - end.left} of {end.planned} runs done, {end.failed} "
            f"failed, {end.left} not started: every run of an arm failed before its first training step "
            f"({end.stopped_for_failure}); each failed run's reason and logs are printed above. Fix what "
            "is missing, then run the same command again: it goes on with the next unit (the failed "
            f"one stays failed; --retry-failed runs it again where max_attempts allows); {where}"
        )
    if end.left:
        held = (
            f"{end.held_elsewhere} of them in units another runner holds (harness status shows what "
            "runs now); "
            if end.held_elsewhere
            else ""
        )
        return RUN_NOT_DONE, (
            f"{end.left} of {end.planned} runs not done: {held}run the same command again "
            f"{'once it ends ' if end.held_elsewhere else ''}to do what is left; {where}"
        )
    if end.failed:
        return RUN_FAILED_RUNS, (
            f"all {end.planned} runs ended; {end.failed} failed (recorded with their reasons; the "
            "report's flow counts them); harness run --retry-failed runs their units again whole, up to "
            f"the protocol's max_attempts; {where}"
        )
    return RUN_COMPLETE, f"all {end.planned} runs finished ok; {where}"


def sealed_plots_of(proto: Protocol) -> dict[str, str] | None:
    """The PNG plots the records folder's signed result head (``RESULT``) seals, by name (None: no
    head, or one signed before plots were sealed)."""
    from prereg.tag import RESULT_FILE, parse_result

    kept = proto.records_path / RESULT_FILE
    got = parse_result(kept.read_bytes()) if kept.is_file() and not kept.is_symlink() else None
    return got["plots"] if got is not None else None


def report(
    proto: Protocol,
    fmt: str | None,
    quiet: bool,
    beside: Path | None = None,
    answer_after: bool = False,
    signs: bool = False,
) -> str:
    """Write the study's summary, report, page (and ``fmt`` export) from its records, ``beside`` an
    earlier study's records folder if given; print the report, then the answer (each configuration's
    effect in percent and its decisions) last, unless the caller prints it after its own last line
    (``answer_after``). Returns the answer's lines. Plots a signed result head seals are redrawn only
    where the caller then signs the head again (``signs``): otherwise they are left, and it says so."""
    from analysis.report import write_report

    if not any(proto.records_path.glob("*.record.json")):
        raise HarnessError(
            f"no records in {proto.records_path}; run the study first: harness run {proto.relpath}"
        )
    sealed = sealed_plots_of(proto)
    keep = sealed is not None and not signs
    out = write_report(
        proto.records_path,
        export=fmt,
        records_rel=records_rel(proto),
        beside=beside,
        beside_rel=None if beside is None else beside.as_posix(),
        keep_plots=keep,
    )
    if keep:
        print(
            f"plots: the {len(out.plots)} PNG plot(s) in {proto.records_path} were left as the signed result "
            f"head (RESULT) seals them ({len(sealed or {})}), not redrawn: harness report --sign redraws "
            "them and signs the head again",
            flush=True,
        )
    if not quiet:
        print(out.markdown)
        print(
            f"wrote {out.summary_path}, {out.report_path}, {out.page_path}"
            + (f", {out.export_path}" if out.export_path else "")
        )
        if not answer_after:
            print(out.answer)
    return out.answer


def records_rel(proto: Protocol) -> str:
    """The records folder as a command run from the study's root names it."""
    path = proto.records_path.resolve()
    root = proto.root.resolve()
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)

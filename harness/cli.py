"""The ``harness`` command line: argparse subcommands dispatched from a dict of ``cmd_*`` functions."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.errors import HarnessError, InputError
from harness.records import RecordFormatError


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def cmd_configs(args: argparse.Namespace) -> int:
    from harness.config import all_configs, config_dir
    from harness.models import build_model, count_parameters

    rows = []
    for c in all_configs(config_dir()):
        n = count_parameters(build_model(c.model, 0))
        rows.append({
            "name": c.name, "family": c.model.family, "parameters": n, "millions": f"{n / 1e6:.3g}M",
            "d_model": c.model.d_model, "layers": c.model.n_layers, "context": c.model.context,
            "batch": c.train.batch_size, "sha256": c.sha256,
        })
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(_table(rows, ["name", "family", "parameters", "millions", "d_model", "layers", "context", "batch"]))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from harness import data

    if args.action == "pin":
        return _pin(Path(args.corpus), args.name, args.split)
    if args.corpus.endswith((".yaml", ".yml")):
        if args.action != "verify":
            raise InputError("a protocol's corpus is verified (harness data verify PROTOCOL), not fetched")
        from harness.protocol import load_protocol

        c = load_protocol(args.corpus).corpus_data()
        for split, digest in c.sha256().items():
            print(f"verified {c.name} {split}: {len(c.split(split))} bytes, sha256 {digest}")
        return 0
    if args.corpus != "wikitext-2":
        if args.corpus == "pydoc-topics":
            c = data.load_corpus("pydoc-topics")
            print(f"pydoc-topics is embedded (no download): {', '.join(f'{s} {len(c.split(s))} bytes' for s in data.SPLITS)}")
            return 0
        raise InputError(f"unknown corpus {args.corpus!r}: wikitext-2, pydoc-topics, or a protocol file to verify its "
                         "corpus")
    directory = Path(args.dir) if args.dir else data.default_data_dir()
    pins = data.load_pins(Path(args.pins)) if args.pins else None
    if args.action == "fetch":
        url, paths = data.fetch_wikitext2(directory, args.url or None, pins)
        print(f"fetched from {url}")
    else:
        paths = data.verify_wikitext2(directory, pins)
    for split, p in paths.items():
        print(f"verified {split}: {p} ({p.stat().st_size} bytes, sha256 {data.sha256_file(p)})")
    return 0


def _pin(path: Path, name: str | None, split: str) -> int:
    from harness.data.corpora import pin_block
    from harness.protocol import project_root

    if not path.is_file():
        raise InputError(f"no such file {path}")
    if len(split.split(",")) != 3:
        raise InputError(f"--split needs three fractions (train,valid,test), got {split!r}")
    print(pin_block(path, name or path.stem, split.split(","), project_root(path)))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from harness.cotangent.verify import run_checks
    from harness.devices import resolve

    return run_checks(resolve(args.device), save=args.save, echo=print)


def cmd_plan(args: argparse.Namespace) -> int:
    from harness.plan import make_plan, plan_sha256
    from harness.protocol import load_protocol
    from harness.yamlio import audit_readable, load

    proto = load_protocol(args.protocol)
    audit_readable(load(proto.path))  # what the harness accepts, the public audit reads
    runs = make_plan(proto)
    if args.json:
        print(json.dumps({"protocol": proto.id, "protocol_sha256": proto.sha256, "plan_sha256": plan_sha256(runs),
                          "runs": [r.as_dict() for r in runs]}, indent=1))
        return 0
    rows = [{"#": r.order, "study": r.study, "config": r.config, "unit": r.unit.rsplit(".", 1)[-1],
             "pos": r.position, "role": r.role, "arm": r.arm, "seed": r.seed, "steps": r.steps} for r in runs]
    print(_table(rows, ["#", "study", "config", "unit", "pos", "role", "arm", "seed", "steps"]))
    print(f"\n{len(runs)} runs; protocol {proto.id} sha256 {proto.sha256}; plan sha256 {plan_sha256(runs)}")
    return 0


#: Installed packages the harness imports; a copy of one inside the study's folder (an ignored
#: ``yaml/`` beside the code) would shadow it for a runner started there with ``python -m``.
_INSTALLED = ("yaml", "filelock", "numpy", "torch", "safetensors", "scipy", "pandas", "matplotlib")


def _refuse_shadowing() -> None:
    """Refuse, before anything imports them, installed packages shadowed from the working directory."""
    import importlib.util

    from harness.errors import RefusedError

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
            raise RefusedError(f"{origin}: a module {name!r} in the study's folder shadows the installed package; "
                               "nothing was run: remove it (a frozen study imports only its tracked code)")


def cmd_tag(args: argparse.Namespace) -> int:
    _refuse_shadowing()
    from harness.freeze import manifest_sha256, tag
    from harness.protocol import load_protocol

    proto = load_protocol(args.protocol)
    info, m = tag(proto, sign=args.sign)
    print(f"tagged {info.name} -> {info.commit} (protocol sha256 {proto.sha256}){' signed' if args.sign else ''}")
    print(f"freeze manifest sha256 {manifest_sha256(m)}: {len(m['configs'])} configurations, plan of "
          f"{m['plan']['runs']} runs, frozen entries {', '.join(sorted(m['trees']))}, code of "
          f"{', '.join(sorted(m['code']))}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    _refuse_shadowing()
    from harness.execute.runner import Runner
    from harness.protocol import load_protocol

    proto = load_protocol(args.protocol)
    live = sys.stdout.isatty() and not args.quiet

    def echo(msg: str) -> None:
        if msg.startswith("\r"):
            if live:
                sys.stdout.write(msg)
                sys.stdout.flush()
            return
        if live:
            sys.stdout.write("\r\033[K")
        print(msg, flush=True)

    executor = None
    if args.ray:
        from harness.execute.ray import RayExecutor

        executor = RayExecutor(args.ray)
    runner = Runner(proto, echo=echo, live=live, retry_failed=args.retry_failed,
                    allow_torch_mismatch=args.allow_torch_mismatch, executor=executor, anchor=args.anchor)
    from harness.execute.state import status_table

    left = runner.run()
    if left:
        print(f"{left} runs not done; run the same command again to continue")
        return 1
    failed = sum(r["failed"] for r in status_table(proto)[0])
    print(f"all {len(runner.runs)} runs finished ({failed} failed, recorded); records in {proto.records_path}")
    code = 0
    if not args.no_report:
        code = _report(proto, fmt=None, quiet=False)
    return 1 if failed else code


def _report(proto: Any, fmt: str | None, quiet: bool) -> int:
    from analysis.report import write_report

    if not any(proto.records_path.glob("*.record.json")):
        raise HarnessError(f"no records in {proto.records_path}; run the study first: harness run {proto.relpath}")
    out = write_report(proto.records_path, export=fmt, records_rel=_records_rel(proto))
    if not quiet:
        print(out.markdown)
        print(f"wrote {out.summary_path}, {out.report_path}, {out.page_path}"
              + (f", {out.export_path}" if out.export_path else ""))
    return 0


def _records_rel(proto: Any) -> str:
    """The records folder as a command run from the study's root names it."""
    path = proto.records_path.resolve()
    root = proto.root.resolve()
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def cmd_publish(args: argparse.Namespace) -> int:
    from analysis.page import write_page
    from analysis.summary import derive, load_records
    from harness.protocol import load_protocol
    from harness.records import seal

    proto = load_protocol(args.protocol)
    records = load_records(proto.records_path)
    if not records:
        raise HarnessError(f"no records in {proto.records_path}; run the study first: harness run {proto.relpath}")
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise InputError(f"--out {args.out}: not a folder")
    path = write_page(seal(derive(records)), proto.records_path, out, records_rel=_records_rel(proto))
    print(f"wrote {path}")
    return 0


def _reconciled(proto: Any) -> None:
    from harness.ledger import reconcile_study

    note = reconcile_study(proto)  # the chain is the truth: a crash may have left MANIFEST behind it
    if note:
        print(note, file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    from harness.protocol import load_protocol

    proto = load_protocol(args.protocol)
    _reconciled(proto)
    return _report(proto, args.format, args.quiet)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from analysis.calibrate import budget, calibrate
    from analysis.summary import load_records
    from harness.plan import make_plan
    from harness.protocol import load_protocol

    pilot = load_protocol(args.pilot)
    rows = calibrate(load_records(pilot.records_path))
    if not rows:
        raise HarnessError(f"no ok baseline runs in {pilot.records_path}; run the pilot first: harness run {args.pilot}")
    n_runs = len(make_plan(load_protocol(args.target))) if args.target else None
    table = []
    for config, r in rows.items():
        row = {"config": config, "pilot_runs": r["runs"], "val_target_bpb": f"{r['val_target_bpb']:.2f}",
               "device_s_per_run": f"{r['device_s_per_run']:.2f}"}
        if n_runs:
            row["budget_if_all_runs_like_this"] = f"{budget(r['device_s_per_run'], n_runs):.0f}"
        table.append(row)
    print(_table(table, list(table[0])))
    print("\nrule: analysis/calibrate.py (median baseline validation BPB at 75% of steps, rounded up; "
          "budget = median device s per run x runs x 1.5, rounded up to a minute)")
    return 0


def cmd_power(args: argparse.Namespace) -> int:
    from analysis.power import cited, legend, plan, table_rows
    from harness import yamlio
    from harness.protocol import load_protocol
    from harness.records import load_records

    pilot = load_protocol(args.pilot)
    target = load_protocol(args.target)
    records = load_records(pilot.records_path)
    if not records:
        raise HarnessError(f"no records in {pilot.records_path}; run the pilot first: harness run {args.pilot}")
    effects = {}
    for item in args.effect or []:
        hid, _, value = item.partition("=")
        try:
            effects[hid] = float(value)
        except ValueError as e:
            raise HarnessError(f"--effect takes HYPOTHESIS=VALUE, got {item!r}") from e
    rows = plan(records, target.summary(), effects)
    if "descriptive" in target.hypotheses:
        print(f"{target.path}: descriptive protocol ({target.hypotheses['descriptive']}); nothing to power")
        return 0
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=1))
        return 0
    table = table_rows(rows)
    if not table:
        print(f"no A/A pairs in {pilot.records_path} for the target's configurations")
        return 1
    print(_table(table, list(table[0])))
    origins = yamlio.load(target.path).data.get("origins") or {}  # validated by load_protocol: sentences
    print("\n" + legend(rows))
    print(f"{target.path}: origins.seeds cites {cited(str(origins.get('seeds') or ''))}")
    return 0


def cmd_node(args: argparse.Namespace) -> int:
    import os
    import shutil

    from harness.execute.ray import node_command

    device = args.device
    if device == "auto":
        from harness.devices import resolve

        device = resolve("auto").type
    cmd = node_command(device, args.address, args.port, args.devices, block=not args.no_block)
    exe = shutil.which("ray")
    if exe is None:
        raise HarnessError("harness node needs Ray: python -m pip install -e '.[ray]'")
    print(" ".join(cmd), flush=True)
    os.execv(exe, [exe, *cmd[1:]])
    return 0  # not reached


def cmd_compare_arms(args: argparse.Namespace) -> int:
    import sys as _sys

    import torch

    from harness.compare import compare_arms, summary
    from harness.config import config_dir, find_config
    from harness.devices import resolve

    _sys.path.insert(0, str(Path.cwd()))  # plug-ins are imported from the study's root, as the worker does
    from harness.arms import ARMS
    from harness.arms import resolve as resolve_arm

    for which, name in (("baseline", args.baseline), ("candidate", args.candidate)):
        try:
            resolve_arm(name)
        except ImportError as e:
            raise InputError(f"{which} arm {name!r}: cannot import it ({e}); a plug-in is module:function "
                             f"importable from {Path.cwd()}, a built-in arm one of {', '.join(ARMS)}") from e
        except ValueError as e:
            raise InputError(f"{which} arm: {e}") from e
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = find_config(args.config, config_dir())
    if args.corpus.endswith((".yaml", ".yml")):  # the corpus a protocol names, verified
        from harness.protocol import load_protocol

        corpus = load_protocol(args.corpus).corpus_data()
    else:
        from harness.data import load_corpus

        corpus = load_corpus(args.corpus, args.data_dir)
    rows = compare_arms(args.baseline, args.candidate, cfg.path, args.steps, args.seed, resolve(args.device), corpus)
    s = summary(rows)
    if args.json:
        print(json.dumps({"summary": s, "steps": [r.as_dict() for r in rows]}, indent=1))
        return 0
    table = [{"step": r.step, "loss (baseline)": f"{r.loss_baseline:.6f}", "loss (candidate)": f"{r.loss_candidate:.6f}",
              "loss bits": "=" if r.loss_equal else "differ", "grads bits": "=" if r.grads_equal else "differ",
              "weights bits": "=" if r.weights_equal else "differ", "max ULP": r.max_ulp, "max |diff|": f"{r.max_abs:.3g}"}
             for r in rows]
    print(_table(table, list(table[0])))
    if s["bitwise_equal"]:
        print(f"\n{args.candidate} is bitwise {args.baseline} over {s['steps']} steps: losses, gradients and weights")
    else:
        print(f"\nfirst divergent step {s['first_divergent_step']}; largest weight distance {s['max_ulp']} ULP "
              f"({s['max_abs']:.3g} absolute); final loss difference {s['final_loss_difference']:+.3g}")
    return 0


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
        print(json.dumps({"protocol": proto.id, "rows": rows, "device_seconds_spent": spent,
                          "budget_device_seconds": proto.budget_device_seconds, "ledger_head": head,
                          "interrupted_without_record": unended}, indent=1))
        return 0
    print(_table(rows, ["study", "config", "runs", "done", "failed", "interrupted_attempts", "superseded_attempts",
                        "pending"]))
    for u in unended:
        print(f"{'running' if u['running'] else 'interrupted'}: {u['run_id']} attempt {u['attempt']} started at "
              f"{u['started_at']} on {u['node']} (ledger seq {u['seq']}) has no ending"
              + ("" if u["running"] else "; the next harness run records it"))
    print(f"\nbudget: {spent:.1f} of {proto.budget_device_seconds:.0f} device seconds spent; records in {proto.records_path}")
    print(describe(head) if head["seq"] else "ledger: no records yet")
    if head["seq"]:
        print("publish this head (commit it, post it): any later rewrite of the records cannot match it")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "configs": cmd_configs, "data": cmd_data, "verify": cmd_verify, "plan": cmd_plan, "tag": cmd_tag,
    "run": cmd_run, "status": cmd_status, "report": cmd_report, "calibrate": cmd_calibrate, "power": cmd_power,
    "node": cmd_node, "compare-arms": cmd_compare_arms, "publish": cmd_publish,
}


#: The --device choices of every subcommand that takes one.
DEVICES = ["auto", "cpu", "cuda", "mps"]
DEVICE_HELP = "auto (mps, then cuda, then cpu), cpu, cuda or mps"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cotangent-harness")
    except PackageNotFoundError:
        return "unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harness", description="Preregistered paired-seed training-speed experiments.")
    p.add_argument("--version", action="version", version=f"harness {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("configs", help="list configurations with parameter counts")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s = sub.add_parser("data", help="fetch or verify a corpus; pin a local corpus file")
    s.add_argument("action", choices=["fetch", "verify", "pin"], help="fetch a corpus, verify one, or pin a local file")
    s.add_argument("corpus", help="wikitext-2 or pydoc-topics; for verify also a protocol (its corpus); for pin a file")
    s.add_argument("--name", help="pin: the local corpus's name (default: the file's stem)")
    s.add_argument("--split", default="0.9,0.05,0.05", help="pin: train,valid,test fractions (default 0.9,0.05,0.05)")
    s.add_argument("--dir", help="data directory (default $HARNESS_DATA or runs/data)")
    s.add_argument("--url", action="append", help="mirror URL to try (repeatable; default: the built-in list)")
    s.add_argument("--pins", help="JSON file of sizes and sha256 to verify against instead of the built-in pins")
    s = sub.add_parser("verify", help="bitwise checks of the method against native on a device")
    s.add_argument("--device", default="cpu", choices=DEVICES, help=DEVICE_HELP + " (default: cpu)")
    s.add_argument("--save", action="store_true", help="record matched paths for this device and torch version")
    for name, help_ in (("plan", "print the complete run list"), ("tag", "freeze a committed protocol with a git tag"),
                        ("run", "execute a protocol"), ("status", "done, failed, interrupted and pending runs"),
                        ("report", "tables, plots and summary.json from the records")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("protocol", help="the protocol file (protocols/<id>.yaml)")
        if name in ("plan", "status"):
            s.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if name == "tag":
            s.add_argument("--sign", action="store_true", help="sign the tag with git (gpg.format ssh or openpgp, "
                                                               "user.signingkey); the audit verifies it with "
                                                               "--allowed-signers")
        if name == "run":
            s.add_argument("--quiet", action="store_true", help="plain log lines, no live display")
            s.add_argument("--anchor", metavar="REMOTE", help="push the ledger head to REMOTE's refs/ledger/protocol-"
                                                              "<id> after every unit (a git remote name or URL)")
            s.add_argument("--retry-failed", action="store_true", help="execute units with a failed run again, whole and in plan order, up to the protocol's max_attempts")
            s.add_argument("--allow-torch-mismatch", action="store_true",
                           help="run although the installed torch differs from the protocol's torch_version")
            s.add_argument("--no-report", action="store_true", help="do not write the report after the run")
            s.add_argument("--ray", metavar="ADDRESS", help="execute on a Ray cluster (auto, or host:port)")
        if name == "report":
            s.add_argument("--format", choices=["csv", "parquet"], help="also export the per-run table")
            s.add_argument("--quiet", action="store_true", help="do not print the report")
    s = sub.add_parser("publish", help="the study page: one self-contained HTML file from the records")
    s.add_argument("protocol", help="the protocol file whose records to publish")
    s.add_argument("--out", metavar="DIR", help="folder to write index.html into (default: the records folder)")
    s = sub.add_parser("power", help="pairs needed per hypothesis, from a pilot's A/A pairs")
    s.add_argument("pilot", help="the pilot protocol (already run)")
    s.add_argument("--target", required=True, help="the protocol whose hypotheses are planned")
    s.add_argument("--effect", action="append", metavar="ID=VALUE",
                   help="assumed true effect of a hypothesis, any type (favourable direction, estimand units; "
                        "default 0)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s = sub.add_parser("node", help="start a Ray node that offers this machine's timing devices")
    s.add_argument("--device", required=True, choices=DEVICES, help=DEVICE_HELP)
    s.add_argument("--address", help="the head's host:port (omit to start the head)")
    s.add_argument("--port", type=int, default=6379, help="the head's port (head only)")
    s.add_argument("--devices", type=int, help="timing devices offered (default: 1; CUDA: every visible GPU)")
    s.add_argument("--no-block", action="store_true", help="return once the node runs (ray start without --block)")
    s = sub.add_parser("compare-arms", help="two arms in lockstep on one seed: where their bits part")
    s.add_argument("baseline", help="a built-in arm or a plug-in module:function")
    s.add_argument("candidate", help="a built-in arm or a plug-in module:function")
    s.add_argument("--config", required=True, help="a configuration name (harness configs lists them)")
    s.add_argument("--steps", type=int, default=20, help="training steps in lockstep (default 20)")
    s.add_argument("--seed", type=int, default=0, help="the seed both arms share (default 0)")
    s.add_argument("--device", default="cpu", choices=DEVICES, help=DEVICE_HELP + " (default: cpu)")
    s.add_argument("--corpus", default="pydoc-topics",
                   help="pydoc-topics, wikitext-2, or a protocol file whose corpus to use (a local corpus)")
    s.add_argument("--data-dir", help="data directory for wikitext-2 (default $HARNESS_DATA or runs/data)")
    s.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    s.add_argument("--json", action="store_true", help="print JSON: the summary and every step")
    s = sub.add_parser("calibrate", help="preregistration numbers from a pilot's records (targets, budget)")
    s.add_argument("pilot", help="the pilot protocol (already run)")
    s.add_argument("--target", help="the protocol being calibrated (for its run count)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except HarnessError as e:
        print(f"harness {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except RecordFormatError as e:
        print(f"harness {args.command}: error: {e} (a record or MANIFEST that is not in the harness's format: "
              "restore it from version control; the audit names every damaged file)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"harness {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # a file the harness could not write or read: a message, exit 2, no traceback
        print(f"harness {args.command}: error: {e.filename or 'a file'}: {e.strerror or e}; fix it and run the same "
              "command again", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

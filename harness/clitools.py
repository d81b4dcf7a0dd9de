"""The ``harness`` subcommands that do not run a study: configurations, corpora, method checks, Ray
nodes and lockstep arm comparison (the study's commands are in :mod:`harness.cli`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from prereg.errors import HarnessError, InputError

if TYPE_CHECKING:
    from harness.compare import StepRow


def table(rows: Sequence[Mapping[str, object]], columns: list[str]) -> str:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [
        max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)
    ]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def cmd_configs(args: argparse.Namespace) -> int:
    from harness.config import all_configs, config_dir
    from harness.models import build_model, count_parameters

    rows = []
    for c in all_configs(config_dir()):
        n = count_parameters(build_model(c.model, 0))
        rows.append(
            {
                "name": c.name,
                "family": c.model.family,
                "parameters": n,
                "millions": f"{n / 1e6:.3g}M",
                "d_model": c.model.d_model,
                "layers": c.model.n_layers,
                "context": c.model.context,
                "batch": c.train.batch_size,
                "sha256": c.sha256,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(
            table(rows, ["name", "family", "parameters", "millions", "d_model", "layers", "context", "batch"])
        )
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
            print(
                f"pydoc-topics is embedded (no download): {', '.join(f'{s} {len(c.split(s))} bytes' for s in data.SPLITS)}"
            )
            return 0
        raise InputError(
            f"unknown corpus {args.corpus!r}: wikitext-2, pydoc-topics, or a protocol file to verify its "
            "corpus"
        )
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
    from cotangent.verify import run_checks
    from harness.devices import resolve

    device = resolve(args.device)
    status = run_checks(device, save=args.save, echo=print)
    if device.type == "cpu" and not args.no_clients:
        from cotangent.clients import check_clients

        status = 1 if check_clients(print) else status
    return status


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
    _check_arms(args.baseline, args.candidate)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = find_config(args.config, config_dir())
    if args.corpus.endswith((".yaml", ".yml")):  # the corpus a protocol names, verified
        from harness.protocol import load_protocol

        corpus = load_protocol(args.corpus).corpus_data()
    else:
        from harness.data import load_corpus

        corpus = load_corpus(args.corpus, args.data_dir)
    rows = compare_arms(
        args.baseline, args.candidate, cfg.path, args.steps, args.seed, resolve(args.device), corpus
    )
    s = summary(rows)
    if args.json:
        print(json.dumps({"summary": s, "steps": [r.as_dict() for r in rows]}, indent=1))
        return 0
    _print_comparison(args.baseline, args.candidate, rows, s)
    return 0


def _check_arms(baseline: str, candidate: str) -> None:
    """InputError naming the arm that cannot be imported (a plug-in) or is not one (a built-in)."""
    from harness.arms import ARMS
    from harness.arms import resolve as resolve_arm

    for which, name in (("baseline", baseline), ("candidate", candidate)):
        try:
            resolve_arm(name)
        except ImportError as e:
            raise InputError(
                f"{which} arm {name!r}: cannot import it ({e}); a plug-in is module:function "
                f"importable from {Path.cwd()}, a built-in arm one of {', '.join(ARMS)}"
            ) from e
        except ValueError as e:
            raise InputError(f"{which} arm: {e}") from e


def _print_comparison(baseline: str, candidate: str, rows: list[StepRow], s: Mapping[str, object]) -> None:
    """The comparison's table, one row a step, and its one-line verdict."""
    shown = [
        {
            "step": r.step,
            "loss (baseline)": f"{r.loss_baseline:.6f}",
            "loss (candidate)": f"{r.loss_candidate:.6f}",
            "loss bits": "=" if r.loss_equal else "differ",
            "grads bits": "=" if r.grads_equal else "differ",
            "weights bits": "=" if r.weights_equal else "differ",
            "max ULP": r.max_ulp,
            "max |diff|": f"{r.max_abs:.3g}",
        }
        for r in rows
    ]
    print(table(shown, list(shown[0])))
    if s["bitwise_equal"]:
        print(f"\n{candidate} is bitwise {baseline} over {s['steps']} steps: losses, gradients and weights")
    else:
        print(
            f"\nfirst divergent step {s['first_divergent_step']}; largest weight distance {s['max_ulp']} ULP "
            f"({s['max_abs']:.3g} absolute); final loss difference {s['final_loss_difference']:+.3g}"
        )

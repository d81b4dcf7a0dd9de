"""Command arms: a study whose two arms are programs of their own (a ``train.py``), read from a
protocol and refused at plan time, naming the file, key and line, when they cannot run as planned.

A command study names its arms as a mapping with the keys ``baseline`` and ``candidate``, each::

    {command: ["python", "train.py", "--seed", "{seed}", "--out", "{out}"],   # an argument list, no shell
     cwd: ".",                # inside the repository (of the ref's checkout, for a ref arm)
     env: {ARM_KEY: value},   # added to the allow-listed environment: prereg.commands.env_problem
     timeout_s: 600,          # the wall-clock limit of one run (a run past it is killed and failed)
     ref: <40 or 64 hex>,     # optional: run in a clean checkout of that commit (a git worktree)
     reporter: true,          # false: a script that cannot be changed; then metrics_regex
     metrics_regex: {val_loss: 'val loss ([0-9.]+)'}}

and the study its ``metric`` (``name``, ``target``, ``better``), which its endpoints
``time_to_target`` and ``final_metric`` read. Placeholders (:data:`PLACEHOLDERS`) in the argument
list are replaced per run; any other ``{name}`` is refused.
"""

from __future__ import annotations

import math
import re
import shutil
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict, cast

from harness import gitutil
from harness.codepath import CODE_PATH
from prereg.commands import arm_of, env_problem, metric_of
from prereg.protocol.schema import Document, Field, KeyPath, mapping, one_of

#: What a command's arguments may name: the run's seed, its reporter file, its configuration label,
#: the protocol's device and threads, the planned steps and the run's id.
PLACEHOLDERS = ("seed", "out", "config", "device", "threads", "steps", "run_id")
#: Environment names a command arm may not set: the harness's own, and what changes a code path
#: without the protocol saying so in its own keys (``threads``, ``device``).
RESERVED = ("HARNESS_", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT")
ROLES = ("baseline", "candidate")
#: What says which accelerator a process sees: the protocol's ``device`` and the harness's to set.
DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_ARM = {
    "command": Field(list),
    "cwd": Field(str, required=False, default="."),
    "env": Field(dict, required=False, default=None),
    "timeout_s": Field(
        (int, float),
        check=lambda v: None if math.isfinite(v) and v > 0 else "a finite number of seconds above 0",
    ),
    "ref": Field(str, required=False, default=None),
    "reporter": Field(bool, required=False, default=True),
    "metrics_regex": Field(dict, required=False, default=None),
}
_METRIC = {
    "name": Field(str, check=lambda v: None if v.strip() else "a metric's name, not empty"),
    "target": Field((int, float), check=lambda v: None if math.isfinite(v) else "must be a finite number"),
    "better": Field(str, required=False, default="lower", check=one_of("lower", "higher")),
}


class _Arm(TypedDict):
    command: list[str]  # the argument list, placeholders unfilled
    cwd: str  # relative to the repository (or the ref's checkout)
    env: dict[str, str]
    timeout_s: float
    ref: str | None  # a full commit id, or None: the working tree
    reporter: bool


class CommandArm(_Arm, total=False):
    """One command arm as a spec holds it (:func:`prereg.commands.arm_of`)."""

    metrics_regex: dict[str, str]  # an arm without the reporter: each metric's expression


class Metric(TypedDict):
    """A command study's metric (:func:`prereg.commands.metric_of`)."""

    name: str
    target: float
    better: str  # "lower" or "higher"


def is_command_arms(value: object) -> bool:
    """Whether a study's ``arms`` names command arms (a mapping) rather than built-in or plug-in ones."""
    return isinstance(value, dict)


def parse_arms(doc: Document, value: Mapping[str, object], kp: KeyPath, root: Path) -> dict[str, CommandArm]:
    """A command study's two arms, each checked (the module's text says what is refused)."""
    if sorted(value) != sorted(ROLES):
        raise doc.error(kp, "command arms are a mapping of exactly two arms: baseline and candidate")
    out = {}
    for role in ROLES:
        out[role] = _arm(doc, value[role], kp + (role,), root)
    return out


def _arm(doc: Document, value: object, kp: KeyPath, root: Path) -> CommandArm:
    """One command arm checked in order: its argument list and placeholders, its working directory
    and commit, its environment, its metrics; normalised by the core."""
    if isinstance(value, str):
        raise doc.error(
            kp,
            "a command arm is a mapping with an argument list (command: [program, arg, ...]); a shell "
            "string is refused: the harness runs no shell",
        )
    a = mapping(doc, value, kp, _ARM)
    argv = a["command"]
    if not argv:
        raise doc.error(kp + ("command",), "the argument list is empty")
    _check_arguments(doc, argv, kp)
    _check_where(doc, a, kp, root)
    _check_env(doc, a["env"] or {}, kp)
    _check_metrics(doc, a, kp)
    return cast(CommandArm, arm_of(a))  # the core's normalisation: the plan and the audit read the arm alike


def _check_arguments(doc: Document, argv: list[object], kp: KeyPath) -> None:
    """Each argument a string whose placeholders are known ones."""
    for i, arg in enumerate(argv):
        if not isinstance(arg, str):
            raise doc.error(kp + ("command", i), f"each argument is a string, got {arg!r} (quote it)")
        for name in _placeholders(doc, arg, kp + ("command", i)):
            if name not in PLACEHOLDERS:
                raise doc.error(
                    kp + ("command", i),
                    f"unknown placeholder {{{name}}} (known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})",
                )


def _check_where(doc: Document, a: dict[str, Any], kp: KeyPath, root: Path) -> None:
    """The arm's working directory a relative folder inside the repository, its ``ref`` (if any) a
    full commit id of the repository, and (without a ref) its program found."""
    argv = a["command"]
    cwd = a["cwd"]
    if Path(cwd).is_absolute() or ".." in Path(cwd).parts:
        raise doc.error(
            kp + ("cwd",), f"{cwd!r}: the working directory is a relative path inside the repository"
        )
    ref = a["ref"]
    if ref is not None:
        if not _SHA.match(ref):
            raise doc.error(
                kp + ("ref",),
                f"{ref!r} is not a full commit id (40 or 64 lowercase hex digits): a branch or a short id "
                "can move after the tag; write the commit's full id (git rev-parse <name>)",
            )
        repo = gitutil.toplevel(root)
        got = gitutil.git(repo, "cat-file", "-t", ref, check=False) if repo else None
        if got is None or got.returncode != 0 or got.stdout.strip() != "commit":
            raise doc.error(kp + ("ref",), f"{ref}: not a commit of the repository at {repo or root}")
    elif not (root / cwd).resolve().is_relative_to(root.resolve()) or not (root / cwd).is_dir():
        raise doc.error(kp + ("cwd",), f"{cwd!r}: not a folder inside the repository {root}")
    if ref is None:
        _program(doc, argv, kp + ("command",), root / cwd)


def _check_env(doc: Document, env: Mapping[object, object], kp: KeyPath) -> None:
    """Each environment variable a valid name, not one the harness sets, with a string value."""
    for k, v in env.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise doc.error(kp + ("env",), f"{k!r} is not an environment variable's name")
        if any(
            k == r or (r.endswith("_") and k.startswith(r)) for r in (*RESERVED, *CODE_PATH, *DEVICE_VARS)
        ):
            raise doc.error(
                kp + ("env", k), f"{k} is the harness's to set (the protocol's threads and device say it)"
            )
        if env_problem(k) is not None:
            raise doc.error(kp + ("env", k), str(env_problem(k)))
        if not isinstance(v, str):
            raise doc.error(kp + ("env", k), f"environment values are strings, got {v!r} (quote it)")


def _check_metrics(doc: Document, a: dict[str, Any], kp: KeyPath) -> None:
    """``metrics_regex`` exactly where the arm has no reporter, each an expression with one group."""
    patterns = a["metrics_regex"]
    if not a["reporter"]:
        if not patterns:
            raise doc.error(
                kp + ("metrics_regex",),
                "an arm without the reporter (reporter: false) reads its metrics from its output: "
                "metrics_regex: {metric: 'expression with (one group)'}",
            )
    if a["reporter"] and patterns:
        raise doc.error(
            kp + ("metrics_regex",), "metrics_regex is for an arm without the reporter (reporter: false)"
        )
    for name, pattern in (patterns or {}).items():
        try:
            groups = re.compile(pattern).groups if isinstance(pattern, str) else -1
        except re.error as e:
            raise doc.error(kp + ("metrics_regex", name), f"not a regular expression: {e}") from None
        if groups != 1:
            raise doc.error(kp + ("metrics_regex", name), "an expression with exactly one group: the number")


def _program(doc: Document, argv: list[str], kp: KeyPath, cwd: Path) -> None:
    """The program is found (on PATH, or a file in the working directory), and a Python script
    that ``python`` is given is a file there (a ref arm's are checked in its checkout, at run time)."""
    prog = argv[0]
    if "{" in prog:
        return
    if prog not in ("python", "python3") and shutil.which(prog) is None and not (cwd / prog).is_file():
        raise doc.error(kp + (0,), f"command not found: {prog} (not on PATH, nor a file in {cwd})")
    if prog in ("python", "python3") and len(argv) > 1 and argv[1].endswith(".py") and "{" not in argv[1]:
        if not (cwd / argv[1]).is_file():
            raise doc.error(kp + (1,), f"{argv[1]}: no such script in {cwd}")


def _placeholders(doc: Document, arg: str, kp: KeyPath) -> list[str]:
    try:
        parts = list(string.Formatter().parse(arg))
    except ValueError as e:
        raise doc.error(kp, f"{arg!r}: {e} (write a literal brace as {{{{ or }}}})") from None
    for _, name, spec, conversion in parts:
        if name is not None and (spec or conversion):
            raise doc.error(
                kp, f"{arg!r}: a placeholder is a bare name ({{{name}}}), without a format or conversion"
            )
    return [name for _, name, _, _ in parts if name is not None]


def parse_metric(doc: Document, value: object, kp: KeyPath) -> Metric:
    """A command study's ``metric`` (the core's reader made sure it has one): the name its scripts
    report, the target and which way is better."""
    m = mapping(doc, value, kp, _METRIC)
    return cast(Metric, metric_of(m))  # the core's: name, target (a float), better


def substitute(arg: str, values: dict[str, str]) -> str:
    """One argument with its placeholders replaced (``{{`` and ``}}`` are literal braces)."""
    return arg.format_map(values)

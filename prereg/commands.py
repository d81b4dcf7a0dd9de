"""A study of command arms: its arms and metric read and refused (each key declared in
:mod:`prereg.protocol.schema`: :data:`~prereg.protocol.schema.COMMAND_ARM`,
:data:`~prereg.protocol.schema.METRIC`), and as every run's spec holds them. One home: the
protocol's reader (:func:`prereg.protocol.read.protocol_of`), the plan
(:func:`prereg.plan.plan_from_protocol`) and the protocol summary all read a protocol's command arms
here, so the audit recomputes the same specs from the tagged file; the harness
(``harness/commandarm.py``) checks on top what needs the file system (the working directory, the
commit, the program).

A command study names its arms as a mapping with the keys ``baseline`` and ``candidate``, each::

    {command: ["python", "train.py", "--seed", "{seed}", "--out", "{out}"],   # an argument list, no shell
     cwd: ".",                # inside the repository (of the ref's checkout, for a ref arm)
     env: {ARM_KEY: value},   # added to the allow-listed environment: env_problem
     timeout_s: 600,          # the wall-clock limit of one run (a run past it is killed and failed)
     ref: <40 or 64 hex>,     # optional: run in a clean checkout of that commit (a git worktree)
     reporter: true,          # false: a script that cannot be changed; then metrics_regex
     metrics_regex: {val_loss: 'val loss ([0-9.]+)'}}

and the study its ``metric`` (``name``, ``target``, ``better``), which its endpoints
``time_to_target`` and ``final_metric`` read. Placeholders (:data:`PLACEHOLDERS`) in the argument
list are replaced per run; any other ``{name}`` is refused.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from prereg.protocol.schema import COMMAND_ARM, METRIC, CommandArm, Document, KeyPath, Metric, mapping

if TYPE_CHECKING:
    from prereg.protocol.model import Protocol

ROLES = ("baseline", "candidate")
#: What a command's arguments may name: the run's seed, its reporter file, its configuration label,
#: the protocol's device and threads, the planned steps and the run's id.
PLACEHOLDERS = ("seed", "out", "config", "device", "threads", "steps", "run_id")

#: Variables that change what a run computes or how fast: a runner refuses to start while one is
#: set (the protocol says what they would say: ``threads``, ``torch_version``, the arms), rather
#: than run the study in a state its protocol does not name; a command arm's ``env`` may not set one
#: (``harness.codepath`` reads this list for the executors).
CODE_PATH = (
    "COTANGENT_NATIVE",
    "CC",
    "ATEN_CPU_CAPABILITY",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONOPTIMIZE",
    "PYTHONINSPECT",
    "PYTHONSAFEPATH",
    "HARNESS_VERIFIED",
    "HARNESS_CODE_PATH",
    "HARNESS_FRESH_ROOTS",
    "HARNESS_EXEMPT",
    "COTANGENT_PHASE_SHA256",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_MAX_CPU_ISA",
)
#: Environment names a command arm may not set: the harness's own, and what changes a code path
#: without the protocol saying so in its own keys (``threads``, ``device``).
RESERVED = ("HARNESS_", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT")
#: What says which accelerator a process sees: the protocol's ``device`` and the harness's to set.
DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: The names an arm's ``env`` may set beside names of the script's own (:data:`OWN_PREFIX`): what
#: training scripts' libraries read to switch off network access, telemetry, progress bars and
#: tokenizer threads, and cuBLAS's workspace for deterministic kernels. None of them loads code,
#: changes the interpreter, the dynamic loader or the C library, or says what the protocol's own
#: keys say (``threads``, ``device``: the harness sets those variables). Every other name is refused:
#: ``PYTHONPYCACHEPREFIX`` would import bytecode from outside the repository, ``PYTHONMALLOC``,
#: ``GLIBC_TUNABLES`` and ``MALLOC_*`` change the allocator under one arm, ``LD_DEBUG`` the loader,
#: ``PATH`` and ``HOME`` which programs and configuration files run.
ENV_ALLOWED = (
    "TOKENIZERS_PARALLELISM",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HF_EVALUATE_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_DISABLE_TELEMETRY",
    "HF_HUB_DISABLE_PROGRESS_BARS",
    "HF_HUB_DISABLE_SYMLINKS_WARNING",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN",
    "TRANSFORMERS_VERBOSITY",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS",
    "DATASETS_VERBOSITY",
    "WANDB_MODE",
    "WANDB_DISABLED",
    "WANDB_SILENT",
    "WANDB_CONSOLE",
    "DO_NOT_TRACK",
    "NO_COLOR",
    "CUBLAS_WORKSPACE_CONFIG",
)
#: A name of the script's own starts with this, then capitals, digits and underscores
#: (``ARM_DATA_DIR``): no interpreter, loader, C library or framework variable does.
OWN_PREFIX = "ARM_"
_OWN = re.compile(r"ARM_[A-Z0-9_]+")
#: What the refusal says of a name by its start.
_CONTROLS = (
    ("PYTHON", "an interpreter control"),
    ("LD_", "a dynamic loader control"),
    ("DYLD_", "a dynamic loader control"),
    ("GLIBC_", "a C library control"),
    ("MALLOC_", "a C library allocator control"),
)


def env_problem(name: str) -> str | None:
    """Why an arm's ``env`` may not set ``name`` (None when it may): it is neither one of
    :data:`ENV_ALLOWED` nor a name of the script's own (``ARM_`` and capitals, digits, ``_``)."""
    if name in ENV_ALLOWED or _OWN.fullmatch(name):
        return None
    what = next((w for start, w in _CONTROLS if name.startswith(start)), "not on the allow-list")
    return (
        f"{name} is {what}: an arm's env takes the names a training script's libraries read "
        f"({', '.join(ENV_ALLOWED)}) and names of the script's own, {OWN_PREFIX}NAME "
        "(capitals, digits, _), which no interpreter, loader or C library reads"
    )


def is_command_study(st: Mapping[str, object]) -> bool:
    """Whether a study (its YAML mapping) names command arms: ``arms`` a mapping of the two roles."""
    return isinstance(st.get("arms"), dict)


def arm_of(raw: Mapping[str, Any]) -> CommandArm:
    """One command arm as a spec holds it: every key, defaults filled in."""
    regex = raw.get("metrics_regex")
    bad = [p for p in map(env_problem, map(str, raw.get("env") or {})) if p]
    if bad:
        raise ValueError(f"a command arm's env: {bad[0]}")
    arm: CommandArm = {
        "command": [str(a) for a in raw["command"]],
        "cwd": raw.get("cwd", "."),
        "env": {str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        "timeout_s": float(raw["timeout_s"]),
        "ref": raw.get("ref"),
        "reporter": bool(raw.get("reporter", True)),
    }
    if regex:
        arm["metrics_regex"] = {str(k): str(v) for k, v in regex.items()}
    return arm


def metric_of(raw: Mapping[str, Any]) -> Metric:
    """A command study's metric: ``name``, ``target`` (a float) and ``better`` (default ``lower``)."""
    return {"name": str(raw["name"]), "target": float(raw["target"]), "better": raw.get("better", "lower")}


def commands_of(arms: Mapping[str, Any]) -> dict[str, CommandArm]:
    """A command study's arms (its ``arms`` mapping) by role, in role order."""
    return {role: arm_of(arms[role]) for role in ROLES}


def label_sha256(label: str) -> str:
    """A command study's configuration is a label (what ``{config}`` says): its sha256 is the label's."""
    return hashlib.sha256(label.encode("utf-8")).hexdigest()


def refs_of(spec: Protocol) -> list[str]:
    """Every commit the typed protocol's command arms name (``ref``), once each, sorted."""
    return sorted(
        {a["ref"] for st in spec.studies if st.commands for a in commands_of(st.arms).values() if a["ref"]}
    )


def command_arms(doc: Document, value: object, kp: KeyPath) -> dict[str, CommandArm]:
    """A command study's two arms (its ``arms`` mapping at ``kp``), each checked by its keys
    (:data:`~prereg.protocol.schema.COMMAND_ARM`) and the rules that need no file system (the module's
    text says what is refused), as every spec holds them (:func:`arm_of`)."""
    if not isinstance(value, dict) or set(value) != set(ROLES):
        raise doc.error(kp, "command arms are a mapping of exactly two arms: baseline and candidate")
    return {role: _arm(doc, value[role], kp + (role,)) for role in ROLES}


def _arm(doc: Document, value: object, kp: KeyPath) -> CommandArm:
    """One command arm checked in order: its argument list and placeholders, the form of its working
    directory and commit, its environment, its metrics; normalised by :func:`arm_of`."""
    if isinstance(value, str):
        raise doc.error(
            kp,
            "a command arm is a mapping with an argument list (command: [program, arg, ...]); a shell "
            "string is refused: the harness runs no shell",
        )
    a = mapping(doc, value, kp, COMMAND_ARM)
    if not a["command"]:
        raise doc.error(kp + ("command",), "the argument list is empty")
    _check_arguments(doc, a["command"], kp)
    _check_where(doc, a, kp)
    _check_env(doc, a["env"] or {}, kp)
    _check_metrics(doc, a, kp)
    return arm_of(a)


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


def _check_where(doc: Document, a: Mapping[str, Any], kp: KeyPath) -> None:
    """The arm's working directory a relative path that does not climb out (``..``), its ``ref`` (if
    any) a full commit id: the harness finds the folder and the commit in the repository."""
    cwd = a["cwd"]
    if cwd.startswith("/") or ".." in PurePosixPath(cwd).parts:
        raise doc.error(
            kp + ("cwd",), f"{cwd!r}: the working directory is a relative path inside the repository"
        )
    ref = a["ref"]
    if ref is not None and not _SHA.match(ref):
        raise doc.error(
            kp + ("ref",),
            f"{ref!r} is not a full commit id (40 or 64 lowercase hex digits): a branch or a short id "
            "can move after the tag; write the commit's full id (git rev-parse <name>)",
        )


def _check_env(doc: Document, env: Mapping[object, object], kp: KeyPath) -> None:
    """Each environment variable a valid name, not one the harness sets, on the allow-list
    (:func:`env_problem`), with a string value."""
    for k, v in env.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise doc.error(kp + ("env",), f"{k!r} is not an environment variable's name")
        if any(
            k == r or (r.endswith("_") and k.startswith(r)) for r in (*RESERVED, *CODE_PATH, *DEVICE_VARS)
        ):
            raise doc.error(
                kp + ("env", k), f"{k} is the harness's to set (the protocol's threads and device say it)"
            )
        problem = env_problem(k)
        if problem is not None:
            raise doc.error(kp + ("env", k), problem)
        if not isinstance(v, str):
            raise doc.error(kp + ("env", k), f"environment values are strings, got {v!r} (quote it)")


def _check_metrics(doc: Document, a: Mapping[str, Any], kp: KeyPath) -> None:
    """``metrics_regex`` exactly where the arm has no reporter, each an expression with one group."""
    patterns = a["metrics_regex"]
    if not a["reporter"] and not patterns:
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


def checked_metric(doc: Document, value: object, kp: KeyPath) -> Metric:
    """A command study's ``metric`` at ``kp``, checked by its keys
    (:data:`~prereg.protocol.schema.METRIC`): the name its scripts report, the target and which way
    is better (:func:`metric_of`)."""
    return metric_of(mapping(doc, value, kp, METRIC))

"""A study of command arms (``harness/commandarm.py`` reads and refuses them): its arms and metric as
every run's spec holds them. One home: the plan (:func:`prereg.plan.plan_from_protocol`),
the protocol summary and the harness's reader all normalise a protocol's command arms here, so the
audit recomputes the same specs from the tagged file."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prereg.protocol.model import Protocol

ROLES = ("baseline", "candidate")

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


def arm_of(raw: dict[str, Any]) -> dict[str, Any]:
    """One command arm as a spec holds it: every key, defaults filled in."""
    regex = raw.get("metrics_regex")
    bad = [p for p in map(env_problem, map(str, raw.get("env") or {})) if p]
    if bad:
        raise ValueError(f"a command arm's env: {bad[0]}")
    return {
        "command": [str(a) for a in raw["command"]],
        "cwd": raw.get("cwd", "."),
        "env": {str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        "timeout_s": float(raw["timeout_s"]),
        "ref": raw.get("ref"),
        "reporter": bool(raw.get("reporter", True)),
        **({"metrics_regex": {str(k): str(v) for k, v in regex.items()}} if regex else {}),
    }


def metric_of(raw: dict[str, Any]) -> dict[str, Any]:
    """A command study's metric: ``name``, ``target`` (a float) and ``better`` (default ``lower``)."""
    return {"name": str(raw["name"]), "target": float(raw["target"]), "better": raw.get("better", "lower")}


def commands_of(arms: dict[str, Any]) -> dict[str, dict[str, Any]]:
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

"""A study of command arms (``harness/commandarm.py`` reads and refuses them): its arms and metric as
every run's spec holds them. One home: the plan (:func:`prereg.plan.plan_from_protocol`),
the protocol summary and the harness's reader all normalise a protocol's command arms here, so the
audit recomputes the same specs from the tagged file."""

from __future__ import annotations

import hashlib
from typing import Any

ROLES = ("baseline", "candidate")


def is_command_study(st: dict[str, Any]) -> bool:
    """Whether a study (its YAML mapping) names command arms: ``arms`` a mapping of the two roles."""
    return isinstance(st.get("arms"), dict)


def arm_of(raw: dict[str, Any]) -> dict[str, Any]:
    """One command arm as a spec holds it: every key, defaults filled in."""
    regex = raw.get("metrics_regex")
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


def commands_of(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A command study's arms by role, in role order."""
    return {role: arm_of(st["arms"][role]) for role in ROLES}


def label_sha256(label: str) -> str:
    """A command study's configuration is a label (what ``{config}`` says): its sha256 is the label's."""
    return hashlib.sha256(label.encode("utf-8")).hexdigest()


def refs_of(doc: dict[str, Any]) -> list[str]:
    """Every commit a protocol's command arms name (``ref``), once each, sorted."""
    return sorted(
        {
            a["ref"]
            for st in doc["studies"]
            if is_command_study(st)
            for a in commands_of(st).values()
            if a["ref"]
        }
    )

"""Plug-ins named by import path (``module:attribute``): recognised and located without importing
them, so that ``harness plan``, ``tag`` and ``status`` stay free of torch and of the plug-in's code.
A plug-in's source file is part of what a protocol's tag freezes (:mod:`harness.freeze`)."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path

PLUGIN_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")


def is_plugin(name: str) -> bool:
    return bool(PLUGIN_RE.match(name))


def source_of(name: str, root: Path | None = None) -> Path | None:
    """The file the plug-in ``module:attribute`` is loaded from (the study's ``root`` first on the
    path, as for the worker, which runs there), or ``None`` if it cannot be found."""
    if not is_plugin(name):
        return None
    added = root is not None and str(root) not in sys.path
    if added:
        sys.path.insert(0, str(root))
    try:
        spec = importlib.util.find_spec(name.partition(":")[0])
    except (ImportError, ValueError):
        return None
    finally:
        if added:
            sys.path.remove(str(root))
    return Path(spec.origin) if spec is not None and spec.origin else None


def fingerprint(name: str, root: Path | None = None) -> dict[str, str]:
    path = source_of(name, root)
    if path is None:
        raise LookupError(name)
    return {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}

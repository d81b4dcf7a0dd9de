"""The code-path variables: environment variables that change what a run computes or how fast.

The list itself is the core's (:data:`prereg.commands.CODE_PATH`: the protocol's reader refuses a
command arm that sets one); this leaf of the harness (it imports nothing else of the project's)
gives it to the executors (:mod:`harness.execute.hermetic`, which refuses to start a runner while
one is set), and the records (:mod:`harness.execute.training`, :mod:`harness.execute.commands`)
read the variables they record (:data:`RECORDED`)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from prereg.commands import CODE_PATH

__all__ = ["CODE_PATH", "RECORDED", "recorded_environment", "refused_environment"]


def refused_environment(environ: dict[str, str] | None = None) -> list[str]:
    """The code-path variables set in ``environ`` (default: this process's), each with its value."""
    environ = dict(os.environ) if environ is None else environ
    return [f"{k}={environ[k]}" for k in CODE_PATH if k in environ]


#: Variables that choose a path only where the code reading them leaves the choice open
#: (``COTANGENT_MODE``: ``PackedAdamW`` built without ``mode``; the study's own arms name
#: ``mode="packed"``): neither refused nor passed to workers by the runner, but a command arm's
#: ``env`` may set one, and a run records each one its process saw set (the record's
#: ``env.code_path_env``), so a run under another mode says so in its record.
RECORDED = ("COTANGENT_MODE",)


def recorded_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The :data:`RECORDED` variables set in ``environ`` (default: this process's), with their values."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in RECORDED if k in environ}

"""The code-path variables: environment variables that change what a run computes or how fast.

A leaf (it imports nothing of the project's), so the protocol's checks (:mod:`harness.commandarm`,
which refuses a command arm that sets one) and the executors (:mod:`harness.execute.hermetic`, which
refuses to start a runner while one is set) read the one list without importing each other, and
the records (:mod:`harness.execute.training`, :mod:`harness.execute.commands`) read the variables
they record (:data:`RECORDED`)."""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Variables that change what a run computes or how fast: a runner refuses to start while one is
#: set (the protocol says what they would say: ``threads``, ``torch_version``, the arms), rather
#: than run the study in a state its protocol does not name.
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

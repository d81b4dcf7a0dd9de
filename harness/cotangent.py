"""The method's old home, kept for users' scripts and plug-ins that import ``harness.cotangent``:
the method is the top-level package :mod:`cotangent` now (it imports nothing of the harness)."""

from __future__ import annotations

import warnings

from cotangent import CPU_BLOCK_BYTES, EXACT_PATHS, ExactPaths, PackedAdamW, clip_grad_norm_, exact_paths

warnings.warn(
    "harness.cotangent moved to the top-level package cotangent: import cotangent instead",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["CPU_BLOCK_BYTES", "EXACT_PATHS", "ExactPaths", "PackedAdamW", "clip_grad_norm_", "exact_paths"]

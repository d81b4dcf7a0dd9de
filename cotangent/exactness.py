"""Which of the method's paths are bitwise native on a device type, and where that is recorded.

Exactness is a property of (device type, dtype, kernel). :data:`EXACT_PATHS` lists what is known
to be bitwise native; everything else takes the native path. ``harness verify --device D --save``
checks every path on a device and writes what matched to ``verified/<device>-torch<version>.json``,
a file tracked with the study (so a protocol's tag freezes it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class ExactPaths:
    """What the method may use on one device type without leaving native arithmetic.

    Attributes
    ----------
    bucketed_norm_dtypes
        dtypes whose batched ``B x (K/2) x 2`` 2-norm reduction is bitwise the per-tensor norm
        native clipping uses. Others use the native scalar path.
    update
        ``"views"``: one fused call over per-parameter views (exact wherever native is fused);
        ``"aligned"``: cache-line-aligned parameters as one flat view, the rest as views;
        ``"flat"``: one fused call per flat buffer.
    origin
        Where the entry comes from.
    """

    bucketed_norm_dtypes: frozenset[torch.dtype]
    update: str
    origin: str


#: Built-in table. CPU entries are checked by this project's test suite and ``harness verify``;
#: CUDA and MPS start on the native-exact paths until ``harness verify --device D --save`` on
#: that machine records what matched (see :func:`exact_paths`).
EXACT_PATHS: dict[str, ExactPaths] = {
    "cpu": ExactPaths(
        frozenset({torch.float32, torch.float64, torch.bfloat16}),
        "aligned",
        "CPU kernel structure (module docstring); tests/test_cotangent.py; harness verify --device cpu",
    ),
}
_NATIVE_ONLY = ExactPaths(frozenset(), "views", "no verification on this device type: native paths")
_SAVED: dict[str, ExactPaths] = {}


def exact_paths(device_type: str) -> ExactPaths:
    """Return the exact paths for ``device_type``.

    Order: built-in table; then a verification file written by ``harness verify --save``
    (:func:`saved_path`) for the running
    torch version; otherwise native paths only.
    """
    if device_type in EXACT_PATHS:
        return EXACT_PATHS[device_type]
    if device_type in _SAVED:
        return _SAVED[device_type]
    paths = _NATIVE_ONLY
    saved = load_saved(device_type)
    if saved is not None:
        paths = saved
    _SAVED[device_type] = paths
    return paths


def saved_path(device_type: str) -> Path:
    """``$HARNESS_VERIFIED``, else ``verified/<device>-torch<version>.json`` under the working directory."""
    env = os.environ.get("HARNESS_VERIFIED")
    if env:
        return Path(env)
    version = torch.__version__.split("+")[0]
    return Path("verified") / f"{device_type}-torch{version}.json"


def load_saved(device_type: str) -> ExactPaths | None:
    path = saved_path(device_type)
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("device_type") != device_type or data.get("torch") != torch.__version__:
        return None
    dtypes = frozenset(getattr(torch, name) for name in data["bucketed_norm_dtypes"])
    return ExactPaths(dtypes, data["update"], f"verified on this machine: {path}")

"""Bitwise checks of the method's paths against native PyTorch on one device (``harness verify``)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch


def saved_path(device_type: str) -> Path:
    env = os.environ.get("HARNESS_VERIFIED")
    if env:
        return Path(env)
    version = torch.__version__.split("+")[0]
    return Path("runs") / "verified" / f"{device_type}-torch{version}.json"


def load_saved(device_type: str) -> Any:
    from harness.cotangent import ExactPaths

    path = saved_path(device_type)
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("device_type") != device_type or data.get("torch") != torch.__version__:
        return None
    dtypes = frozenset(getattr(torch, name) for name in data["bucketed_norm_dtypes"])
    return ExactPaths(dtypes, data["update"], f"verified on this machine: {path}")

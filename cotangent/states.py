"""State dicts as native ``AdamW`` writes and loads them, checked and normalised for the flat buffers."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

#: Group settings that would take native AdamW off its fused path after loading, and what they must be.
_FUSED_PATH = {"foreach": (None, False), "capturable": (False,), "differentiable": (False,)}


def check_loadable(state_dict: dict[str, Any]) -> None:
    """Refuse, before anything is modified, a state dict whose parameter groups native fused AdamW
    would run off its fused path after loading it (``load_state_dict`` takes every group setting
    from the state dict, so native itself would change kernels, and PackedAdamW is the fused path)."""
    groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
    if not isinstance(groups, list):
        raise ValueError(
            "state_dict must be a dict with a 'param_groups' list, as Optimizer.state_dict() returns"
        )
    for k, group in enumerate(groups):
        if not isinstance(group, dict):
            raise ValueError(f"state_dict['param_groups'][{k}] is {type(group).__name__}, not a dict")
        if group.get("fused") is not True:
            raise ValueError(
                f"state_dict['param_groups'][{k}] has fused={group.get('fused', '(absent)')!r}: loaded into "
                "torch.optim.AdamW(fused=True) it would switch native off its fused kernel (load_state_dict takes "
                "group settings from the state dict), and PackedAdamW is the fused path. Set "
                f"state_dict['param_groups'][{k}]['fused'] = True to resume on the fused kernel"
            )
        for key, allowed in _FUSED_PATH.items():
            if group.get(key, allowed[0]) not in allowed:
                raise ValueError(
                    f"state_dict['param_groups'][{k}] has {key}={group[key]!r}, which native AdamW would run off its "
                    f"fused path; PackedAdamW is the fused path (set it to {allowed[0]!r} to load it there)"
                )


def to_state_tensors(state: dict[str, Any]) -> dict[str, Any]:
    """One parameter's loaded state with a Python-number ``step`` as the float32 tensor native
    fused AdamW makes of it (``AdamW.__setstate__``)."""
    out = dict(state)
    step = out.get("step")
    if step is not None and not isinstance(step, Tensor):
        out["step"] = torch.tensor(float(step), dtype=torch.float32)
    return out


def saved_state(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of one parameter's state that outlives the buffers it views."""
    return {k: v.clone() if isinstance(v, Tensor) else v for k, v in to_state_tensors(state).items()}

"""Parameter groups as native ``AdamW`` keeps and validates them, and what packing can take."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

#: Keys native ``AdamW`` keeps in a parameter group; kept so state dicts load both ways with
#: native's fused path intact.
NATIVE_GROUP_KEYS: dict[str, Any] = {
    "foreach": None,
    "fused": True,
    "capturable": False,
    "differentiable": False,
    "decoupled_weight_decay": True,
}


def validated(
    lr: Any, betas: Any, eps: Any, weight_decay: Any, amsgrad: Any, maximize: Any
) -> dict[str, Any]:
    """Hyperparameters checked by native ``AdamW`` itself (built over a probe tensor, so every
    error is native's), returned in native's normal form (tensor betas as 0-dim tensors)."""
    probe = torch.optim.AdamW(
        [torch.zeros(1, requires_grad=True)],
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        amsgrad=amsgrad,
        maximize=maximize,
        fused=True,
    )
    g = probe.param_groups[0]
    return {k: g[k] for k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")}


def check_group(group: dict[str, Any], k: int, defaults: dict[str, Any]) -> None:
    """Refuse, before anything is modified, what PackedAdamW cannot do as native does."""
    if not isinstance(group, dict) or "params" not in group:
        raise TypeError(f"parameter group {k} must be a dict with a 'params' entry")
    if isinstance(group["params"], Tensor):
        group["params"] = [group["params"]]
    elif isinstance(group["params"], set):
        raise TypeError(
            "optimizer parameters need to be organized in ordered collections, but the ordering "
            "of tensors in sets will change between runs. Please use a list instead."
        )
    else:
        plist = list(group["params"])
        first: dict[int, int] = {}
        for i, p in enumerate(plist):
            j = first.setdefault(id(p), i)
            if j != i:
                raise ValueError(
                    f"parameter group {k} lists one parameter twice (entries {j} and {i}): native AdamW "
                    "warns and then updates it twice per step; PackedAdamW packs each parameter once and "
                    "cannot, so it refuses: list each parameter once (a tied weight is one parameter)"
                )
        group["params"] = plist
    hyper = {
        key: group.get(key, defaults[key])
        for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")
    }
    group.update({key: v for key, v in validated(**hyper).items() if key in group})
    for key, bad in (("foreach", True), ("capturable", True), ("differentiable", True), ("fused", False)):
        if key in group and group[key] is bad:
            raise ValueError(
                f"parameter group {k}: {key}={bad} cannot be packed (PackedAdamW is the fused path)"
            )
    for i, p in enumerate(group["params"]):
        where = f"parameter {i} of group {k} (shape {tuple(p.shape) if isinstance(p, Tensor) else '?'})"
        if not isinstance(p, Tensor):
            raise TypeError(f"optimizer can only optimize Tensors, but {where} is {type(p).__name__}")
        if p.layout != torch.strided:
            raise ValueError(f"PackedAdamW requires dense parameters; {where} is {p.layout}")
        if not torch.is_floating_point(p):
            raise ValueError(f"PackedAdamW requires floating-point parameters; {where} is {p.dtype}")
        if not p.is_leaf:
            raise ValueError(f"optimizer can only optimize leaf Tensors; {where} is not a leaf")
        if not p.is_contiguous():
            raise ValueError(
                f"PackedAdamW packs parameters contiguously; {where} has strides {p.stride()} (channels_last or "
                "a transposed view): packing it would change its memory format and the bits native computes. "
                "Make it contiguous first, or optimize it with torch.optim.AdamW(fused=True)"
            )
        if p.grad is not None and (p.grad.layout != torch.strided or not p.grad.is_contiguous()):
            raise ValueError(f"PackedAdamW requires dense contiguous gradients; {where} has another layout")


def lr_on(kwargs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The fused call's keyword arguments with a tensor learning rate on ``device``, as native does."""
    lr = kwargs["lr"]
    if isinstance(lr, Tensor) and lr.device != device and lr.device.type != "cpu":
        return {**kwargs, "lr": lr.to(device)}
    return kwargs


def step_hooks_registered(opt: torch.optim.Optimizer) -> bool:
    """Are step pre/post hooks registered (on ``opt`` or globally)? Then the one-pass phase makes the
    three calls, so that they run exactly as around ``step()``."""
    from torch.optim import optimizer as _optimizer

    return bool(
        opt._optimizer_step_pre_hooks
        or opt._optimizer_step_post_hooks
        or _optimizer._global_optimizer_pre_hooks
        or _optimizer._global_optimizer_post_hooks
    )


def fused_kwargs(group: dict[str, Any], pg: int) -> dict[str, Any]:
    """Keyword arguments of ``torch._fused_adamw_`` for parameter group ``pg``, as native passes them."""
    for key in ("foreach", "capturable", "differentiable"):
        if group.get(key):
            raise RuntimeError(
                f"PackedAdamW: parameter group {pg} sets {key}={group[key]!r}; only the fused path is packed"
            )
    if group.get("fused") is False:
        raise RuntimeError(
            f"PackedAdamW: parameter group {pg} sets fused=False; PackedAdamW is the fused path"
        )
    beta1, beta2 = (b.squeeze() if isinstance(b, Tensor) and b.dim() else b for b in group["betas"])
    return dict(
        amsgrad=group["amsgrad"],
        lr=group["lr"],
        beta1=beta1,
        beta2=beta2,
        weight_decay=group["weight_decay"],
        eps=group["eps"],
        maximize=group["maximize"],
    )


def amp_tensors(opt: torch.optim.Optimizer, device: torch.device) -> tuple[Tensor | None, Tensor | None]:
    """``grad_scale`` and ``found_inf`` as ``GradScaler`` sets them on a fused optimizer around
    ``step`` (``_step_supports_amp_scaling``), on ``device``; None where unset."""
    scale, inf = getattr(opt, "grad_scale", None), getattr(opt, "found_inf", None)
    return (None if scale is None else scale.to(device), None if inf is None else inf.to(device))

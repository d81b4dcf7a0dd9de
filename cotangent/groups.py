"""Parameter groups as native ``AdamW`` keeps and validates them, and what packing can take."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cotangent.pack import dense

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


def check_native_kwargs(**given: Any) -> None:
    """Native ``AdamW``'s path keywords: the values that keep native on its fused kernel are taken
    (PackedAdamW is that path); any other is refused by name, before anything is modified."""
    fine = {
        "foreach": (None, False),
        "capturable": (False,),
        "differentiable": (False,),
        "fused": (None, True),
    }
    why = {
        "foreach": "native refuses fused=True with foreach=True; the foreach path computes other bits",
        "capturable": "the capturable (CUDA graph) form of the step is not packed",
        "differentiable": "native's fused path does not support differentiable=True",
        "fused": "native's for-loop path computes other bits than the fused kernel PackedAdamW reproduces",
    }
    for key, value in given.items():
        if value not in fine[key] or (value is not None and not isinstance(value, bool)):
            raise ValueError(
                f"PackedAdamW: {key}={value!r} cannot give native fused AdamW's bits ({why[key]}); "
                f"PackedAdamW is torch.optim.AdamW(fused=True): leave {key} at {fine[key][0]!r}, or use "
                f"torch.optim.AdamW({key}={value!r}) itself"
            )


def unnamed(group: dict[str, Any], k: int) -> list[Any]:
    """The group's parameters, with ``named_parameters()`` pairs taken apart as native's
    ``add_param_group`` does (the names go to ``param_names``)."""
    plist = list(group["params"])
    names = [q[0] for q in plist if isinstance(q, tuple)]
    if not names:
        return plist
    if len(names) != len(plist):
        raise ValueError("all optimizer params should be with/without names. Some param names are missing")
    bad = [i for i, q in enumerate(plist) if len(q) != 2]
    if bad:
        raise TypeError(
            f"parameter {bad[0]} of group {k} is a tuple of {len(plist[bad[0]])}, not (name, parameter)"
        )
    group["param_names"] = names
    return [q[1] for q in plist]


def sharers(params: list[Tensor]) -> list[tuple[int, int]]:
    """``(i, extra)`` for each parameter ``i`` whose memory ``extra`` tensors besides the parameters
    share (a view, a ``p.detach()`` handle): one storage use count per parameter, compared with
    the parameters on that storage."""
    sharing: dict[int, set[int]] = {}
    storage_of = torch._C.TensorBase.untyped_storage  # not a GradSlot's, which would mark it escaped
    for p in params:
        if p.numel():
            sharing.setdefault(storage_of(p).data_ptr(), set()).add(id(p))
    out = []
    for i, p in enumerate(params):
        if not p.numel():
            continue
        storage = storage_of(p)
        # holders: the parameters on this storage, and ``storage`` here
        extra = torch._C._storage_Use_Count(storage._cdata) - len(sharing[storage.data_ptr()]) - 1
        if extra > 0:
            out.append((i, extra))
    return out


def check_unshared(params: list[Tensor], again: bool = False) -> None:
    """Refuse, before anything is modified, a parameter whose memory another tensor shares (a view
    such as ``p.t()`` cached in ``__init__``, a ``p.detach()`` handle kept by an EMA or a logger,
    the tensor an ``nn.Parameter`` was made from): packing moves each parameter into the flat
    buffer, so that tensor would keep the initial weights while natively it follows every step
    (:func:`sharers`). ``again``: packing again (``set_mode("packed")`` after native for good),
    where the tensor is one held now (taken at any time, or a graph autograd still holds)."""
    for i, extra in sharers(params)[:1]:
        p = params[i]
        head = f"PackedAdamW: parameter {i} (shape {tuple(p.shape)}) shares its memory with {extra} other tensor(s)"
        if again:
            raise ValueError(
                f"{head}: a view or p.detach() handle held now (an EMA, a logger, a cached p.t()), or a graph "
                "autograd still holds (a forward whose backward has not run, backward(retain_graph=True)). "
                "set_mode('packed') moves the parameter into a flat buffer and that tensor would keep the "
                "current weights, where natively it follows every step: drop the handle (a copy, "
                "p.detach().clone(), is fine) or run the backward first, then call set_mode('packed') again; "
                "nothing was changed and the optimizer keeps stepping natively"
            )
        raise ValueError(
            f"{head}: a view taken before the optimizer was built (p.t() cached in __init__, a p.detach() "
            "handle kept by an EMA or a logger, the tensor an nn.Parameter was made from). Packing moves the "
            "parameter into a flat buffer and that tensor would keep the initial weights, where natively it "
            "follows every step: build PackedAdamW first and take views after, or drop the handle "
            "(a copy, p.detach().clone(), is fine)"
        )


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
        plist = unnamed(group, k)
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
        if not dense(p):
            raise ValueError(
                f"PackedAdamW packs each parameter in its own memory order, which needs its elements to be "
                f"one block without gaps or overlaps; {where} has strides {p.stride()} (a strided slice or an "
                "expanded tensor): make it contiguous first, or optimize it with torch.optim.AdamW(fused=True)"
            )
        if p.grad is not None and p.grad.layout != torch.strided:
            raise ValueError(f"PackedAdamW requires dense gradients; {where} has a {p.grad.layout} one")


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

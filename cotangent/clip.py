"""``clip_grad_norm_``: a drop-in for ``torch.nn.utils.clip_grad_norm_`` with batched norms."""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from cotangent.norms import bucketed_total_norm, check_finite, clip_coef
from cotangent.pack import Pack


def clip_grad_norm_(
    parameters: Tensor | Iterable[Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """Clip the gradient norm of ``parameters``; a drop-in for ``torch.nn.utils.clip_grad_norm_``.

    Same signature, return value (the total norm tensor) and handling of ``None`` gradients,
    empty lists and non-finite norms. The total norm and every clipped gradient are bitwise
    native's on the paths listed in :data:`EXACT_PATHS`; every other case takes native's path.

    When the parameters are those of a :class:`PackedAdamW` (in its order, or in any order that
    names each once, beside tensors without a gradient), the buckets are zero-copy views of its flat
    gradient buffer, the norms are summed in ``parameters``' order and the clip multiply is one call
    per buffer.

    Traced by Dynamo (inside ``torch.compile``) it is native's call, so the compiled graph and its
    bits are compiled native's.
    """
    if torch.compiler.is_compiling():  # traced by Dynamo: native's clip, compiled as native's is
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    else:
        is_generator = isinstance(parameters, types.GeneratorType)
        parameters = list(parameters)
        if is_generator and len(parameters) == 0:
            warnings.warn(
                "`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=3
            )
    norm_type = float(norm_type)
    max_norm = float(max_norm)
    found = Pack.covering(parameters)  # every parameter of a pack, in its order or another
    pack = found[0] if found is not None else None
    if found is not None and norm_type == 2.0 and foreach is None:
        perm = found[1]
        if found[0].sync_grads() is None:
            pack = found[0]
            total = pack.total_norm(pack.backward.collect() if pack.backward is not None else None, perm)
            check_finite(total, norm_type, error_if_nonfinite)
            pack.scale_grads(clip_coef(max_norm, total), total)
            return total
    # after the sync, .grad is a slot's alias exactly where a gradient was produced
    grads = [p.grad for p in parameters if p.grad is not None]
    total = bucketed_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    if grads:
        torch.nn.utils.clip_grads_with_norm_(grads_as_params(grads), max_norm, total, foreach)
        if pack is not None:
            pack.settle()  # the clip's own writes into the packed buffer
    return total


class GradHolder:
    """Minimal stand-in so ``clip_grads_with_norm_`` multiplies exactly the given gradients."""

    __slots__ = ("grad",)

    def __init__(self, grad: Tensor) -> None:
        self.grad = grad


def grads_as_params(grads: list[Tensor]) -> list[Any]:
    return [GradHolder(g) for g in grads]

"""Per-parameter gradient norms: native's, and batched where that is bitwise native.

Parameters with equal element count ``K`` form a bucket reduced as one ``B x (K/2) x 2`` view;
the scalar norms are put back in the order native clipping stacks them, and the final reduction
and the clip coefficient are native's (``torch.nn.utils.get_total_norm``, ``clip_grads_with_norm_``).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

from cotangent.exactness import exact_paths

#: Smallest element count worth batching; shorter tensors use native scalar norms.
MIN_BUCKET_NUMEL = 32


def native_uses_foreach(tensors: list[Tensor], device: torch.device, foreach: bool | None) -> bool:
    from torch.utils._foreach_utils import _device_has_foreach_support, _has_foreach_support

    if foreach is None:
        return _has_foreach_support(tensors, device)
    return bool(foreach) and _device_has_foreach_support(device)


def native_norms(
    tensors: list[Tensor], device: torch.device, norm_type: float, foreach: bool | None
) -> list[Tensor]:
    if not tensors:
        return []
    if native_uses_foreach(tensors, device, foreach):
        return list(torch._foreach_norm(tensors, norm_type))
    if foreach:
        raise RuntimeError(f"foreach=True was passed, but can't use the foreach API on {device.type} tensors")
    return [torch.linalg.vector_norm(g, norm_type) for g in tensors]


def bucketable(numel: int, count: int) -> bool:
    return count >= 2 and numel >= MIN_BUCKET_NUMEL and numel % 2 == 0


def bucket_norm(rows: Tensor, k: int) -> Tensor:
    """2-norms of the rows of a ``B x K`` block, reduced as a ``B x (K/2) x 2`` view."""
    return torch.linalg.vector_norm(rows.view(-1, k // 2, 2), 2.0, dim=(1, 2))


def group_norms(
    tensors: list[Tensor], device: torch.device, dtype: torch.dtype, foreach: bool | None
) -> Tensor:
    """Norms of one (device, dtype) group, in the group's order, batching where exact."""
    exact = exact_paths(device.type)
    if dtype not in exact.bucketed_norm_dtypes or foreach is not None:
        return torch.stack(native_norms(tensors, device, 2.0, foreach))
    by_numel: dict[int, list[int]] = {}
    out: list[Tensor | None] = [None] * len(tensors)
    scalar_idx: list[int] = []
    for i, t in enumerate(tensors):
        if t.is_contiguous():
            by_numel.setdefault(t.numel(), []).append(i)
        else:  # native reduces a strided tensor in memory order; a row copy would reorder the sum
            scalar_idx.append(i)
    for numel, idx in by_numel.items():
        if bucketable(numel, len(idx)):
            # Stacking copies: this is part of the method's cost when gradients are not packed.
            rows = torch.stack([tensors[i].reshape(-1) for i in idx])
            norms = bucket_norm(rows, numel)
            for j, i in enumerate(idx):
                out[i] = norms[j]
        else:
            scalar_idx.extend(idx)
    if scalar_idx:
        scalar_idx.sort()
        for i, n in zip(scalar_idx, native_norms([tensors[i] for i in scalar_idx], device, 2.0, foreach)):
            out[i] = n
    return torch.stack(out)  # type: ignore[arg-type]


def bucketed_total_norm(
    grads: list[Tensor], norm_type: float, error_if_nonfinite: bool, foreach: bool | None
) -> Tensor:
    """Native ``get_total_norm`` with batched per-tensor norms for ``norm_type == 2``."""
    if len(grads) == 0:
        return torch.tensor(0.0)
    if norm_type != 2.0:
        return torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    first_device = grads[0].device
    grouped = _group_tensors_by_device_and_dtype([list(grads)])  # native's grouping and group order
    pieces = [
        group_norms(cast("list[Tensor]", device_tensors), device, dtype, foreach).to(first_device)
        for (device, dtype), ([device_tensors], _) in grouped.items()
    ]
    total = torch.linalg.vector_norm(torch.cat(pieces), norm_type)
    check_finite(total, norm_type, error_if_nonfinite)
    return total


def check_finite(total: Tensor, norm_type: float, error_if_nonfinite: bool) -> None:
    if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
            "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
            "anyway, set `error_if_nonfinite=False`"
        )


@torch.no_grad()
def clip_coef(max_norm: float, total: Tensor) -> Tensor:
    return torch.clamp(max_norm / (total + 1e-6), max=1.0)

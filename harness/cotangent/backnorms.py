"""Per-parameter gradient norms taken while backward runs (``PackedAdamW(backward_norms=True)``).

When backward has finished a parameter's gradient (its post-accumulate-grad hook), its 2-norm is
computed at once, while the gradient is still in cache, by the call native clipping makes for it
(``torch.linalg.vector_norm`` of the tensor; on the devices and dtypes where this module engages,
a bucket row of the phase's batched reduction has the same bits, see
:mod:`harness.cotangent.norms`). With the norm the hook remembers two version counters: the
gradient slot's own (:func:`~harness.cotangent.pack.grad_alias`: every in-place write PyTorch
counts, backward's accumulation, a user's ``mul_``, native ``clip_grad_norm_``'s ``_foreach_mul_``,
writes through views and ``detach()``) and the flat gradient buffer's (the optimizer's own writes,
and a user's through ``flat_groups``). The phase uses a remembered norm only if both are unchanged;
otherwise it computes that norm again, so the total norm, the clip coefficient and every update are
the bits of the two-pass phase in every loop whose writes PyTorch counts.

PyTorch does not count writes through ``.data``, ``.numpy()`` or DLPack (autograd cannot see them
either), so a loop that changes gradients that way between backward and the phase (for example
``p.grad.data.mul_(c)``) would be clipped with the norm backward saw. That is why the mode is
opt-in: ``backward_norms=False`` (default) reads every gradient in the phase, whatever wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from harness.cotangent.exactness import exact_paths
from harness.cotangent.norms import native_uses_foreach


class GroupLayout(Protocol):
    """What the norms read of a flat group (:class:`~harness.cotangent.pack.FlatGroup`)."""

    device: torch.device
    dtype: torch.dtype
    index: list[int]
    grad: Tensor


class PackLayout(Protocol):
    """What the norms read of the flat layout (:class:`~harness.cotangent.pack.Pack` implements
    it), so this module never imports the layout's."""

    n: int
    where: list[tuple[int, int]]
    grad_views: list[Tensor]

    @property
    def groups(self) -> Sequence[GroupLayout]: ...


#: Above this share of stale norms the phase reads every gradient in one batched pass instead.
MAX_STALE_SHARE = 0.5


def engages(device: torch.device, dtype: torch.dtype) -> bool:
    """True where one tensor's ``vector_norm`` is bitwise the norm the phase computes for it: the
    batched norm is exact for ``dtype`` on the device type, and native clipping's per-tensor norm
    is ``vector_norm`` there: on CPU ``torch._foreach_norm`` runs its per-tensor fallback
    (``linalg_vector_norm`` of each), elsewhere native must not use the foreach norm at all (a
    multi-tensor kernel whose per-tensor bits are not claimed here)."""
    if dtype not in exact_paths(device.type).bucketed_norm_dtypes:
        return False
    return device.type == "cpu" or not native_uses_foreach(
        [torch.empty(0, device="meta", dtype=dtype)], device, None
    )


class BackwardNorms:
    """The norms backward produced, with the versions they are valid for.

    Parameters
    ----------
    pack
        The flat layout whose gradient slots are watched. Every (device, dtype) group must
        :func:`engage`; otherwise :attr:`why_not` says which does not and nothing is recorded.
    """

    def __init__(self, pack: PackLayout) -> None:
        self.pack = pack
        # per group, the norms in packed order; each parameter writes its own 0-d view of it (out=)
        self.buffers = [torch.empty(len(g.index), dtype=g.dtype, device=g.device) for g in pack.groups]
        self.slots: list[Tensor] = [self.buffers[gi][j] for gi, j in pack.where]
        self.valid = [False] * pack.n
        self.seen: list[tuple[int, int]] = [(-1, -1)] * pack.n
        self.why_not: str | None = None
        for g in pack.groups:
            if not engages(g.device, g.dtype):
                self.why_not = f"{str(g.dtype).replace('torch.', '')} gradients on {g.device.type}: per-tensor norms are not claimed bitwise there"
                break

    def record(self, i: int) -> None:
        """Norm of parameter ``i``'s gradient slot now (``vector_norm`` written into its place in the
        group's buffer, ``out=``: the same kernel, bit for bit), remembered with the versions it holds for."""
        pack = self.pack
        view = pack.grad_views[i]
        torch.linalg.vector_norm(view, 2.0, out=self.slots[i])
        self.valid[i] = True
        self.seen[i] = (view._version, pack.groups[pack.where[i][0]].grad._version)

    def clear(self) -> None:
        """The gradients were consumed (zeroed or released): nothing remembered holds."""
        self.valid = [False] * self.pack.n

    def fresh(self, i: int) -> bool:
        pack = self.pack
        return self.valid[i] and self.seen[i] == (
            pack.grad_views[i]._version,
            pack.groups[pack.where[i][0]].grad._version,
        )

    def collect(self) -> list[Tensor] | None:
        """Per group, the norms in packed order (stale ones computed again), or ``None`` when the
        mode does not engage or more than :data:`MAX_STALE_SHARE` of them are stale (then one
        batched pass reads every gradient, as without this mode)."""
        if self.why_not is not None:
            return None
        stale = [i for i in range(self.pack.n) if not self.fresh(i)]
        if len(stale) > MAX_STALE_SHARE * self.pack.n:
            return None
        for i in stale:
            self.record(i)
        return self.buffers

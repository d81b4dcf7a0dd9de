"""Per-parameter gradient norms taken while backward runs (``PackedAdamW(backward_norms=True)``).

When backward has finished a parameter's gradient (its post-accumulate-grad hook), its 2-norm is
computed at once, while the gradient is still in cache, by the call native clipping makes for it
(``torch.linalg.vector_norm`` of the tensor; on the devices and dtypes where this module engages,
a bucket row of the phase's batched reduction has the same bits, see
:mod:`cotangent.norms`). With the norm the hook remembers two version counters: the
gradient slot's own (:func:`~cotangent.pack.grad_alias`: every in-place write PyTorch
counts, backward's accumulation, a user's ``mul_``, native ``clip_grad_norm_``'s ``_foreach_mul_``,
writes through views and ``detach()``) and the flat gradient buffer's (the optimizer's own writes,
and a user's through ``flat_groups``). The phase uses a remembered norm only if both are unchanged;
otherwise it computes that norm again, so the total norm, the clip coefficient and every update are
the bits of the two-pass phase in every loop whose writes PyTorch counts.

PyTorch does not count writes through ``.data``, ``.numpy()`` or DLPack (autograd cannot see them
either). So while the mode is on, each gradient slot is a :class:`GradSlot`: a ``torch.Tensor``
subclass (PyTorch's ``__torch_function__`` disabled, so every operation on it runs as on a plain
tensor and returns one) whose ``.data`` (read or assigned), ``.numpy()``, ``__array__``,
``__dlpack__``, ``untyped_storage()`` and ``storage()`` mark the slot *escaped*: from then on its
norm is always computed again in the phase, since an alias taken that way may be written at any
later time. So does ``is_sparse``, which ``GradScaler.unscale_`` asks of each gradient just before
unscaling it with a kernel that does not count the write: with a GradScaler the norms are computed
in the phase (exact, and no faster than ``backward_norms=False``). A loop that writes
``p.grad.data.mul_(c)`` between backward and the phase therefore gets the two-pass phase's bits (a
little slower for those parameters). Not seen: the same forms applied to a view or a detached copy
of the gradient (``p.grad[0].data``, ``p.grad.detach().numpy()``), the C-level routes that bypass
Python methods (``torch.utils.dlpack.to_dlpack(p.grad)``, ``torch.Tensor.numpy(p.grad)``,
``t.set_(p.grad)``) and raw pointers (``data_ptr()``); for such loops keep
``backward_norms=False`` (default), which reads every gradient in the phase, whatever wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from cotangent.exactness import exact_paths
from cotangent.norms import native_uses_foreach


class GradSlot(Tensor):
    """A gradient slot that notices the ways to reach its memory that PyTorch does not count.

    Created by :meth:`of` over a slot tensor (same memory, same version counter). Every
    ``.data`` access, ``.numpy()``, ``__array__``, ``__dlpack__``, ``untyped_storage()`` and
    ``storage()`` sets :attr:`escaped` for good; :class:`BackwardNorms` never trusts a norm
    remembered for an escaped slot. ``__torch_function__`` is PyTorch's disabled one: operations
    cost what they cost on a plain tensor and return plain tensors.
    """

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]
    escaped: bool

    @staticmethod
    def of(slot: Tensor) -> GradSlot:
        out = torch.Tensor._make_subclass(GradSlot, slot, False)  # detach: same memory and version counter
        out.escaped = False
        return out

    def _escape(self) -> None:
        self.escaped = True

    @property
    def data(self) -> Tensor:
        self._escape()
        return torch._C.TensorBase.data.__get__(self)  # type: ignore[attr-defined]

    @data.setter
    def data(self, value: Tensor) -> None:
        self._escape()
        torch._C.TensorBase.data.__set__(self, value)  # type: ignore[attr-defined]

    def numpy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._escape()
        return super().numpy(*args, **kwargs)

    def __array__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._escape()
        return super().__array__(*args, **kwargs)

    def __dlpack__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._escape()
        return super().__dlpack__(*args, **kwargs)

    def untyped_storage(self):  # type: ignore[no-untyped-def]
        self._escape()
        return super().untyped_storage()

    def storage(self):  # type: ignore[no-untyped-def]
        self._escape()
        return super().storage()

    @property
    def is_sparse(self) -> bool:  # type: ignore[override]
        # GradScaler.unscale_ asks each gradient this just before unscaling it in place with a
        # kernel that does not count the write (_amp_foreach_non_finite_check_and_unscale_)
        self._escape()
        return False

    def __deepcopy__(self, memo: dict) -> Tensor:  # a copy is a plain tensor, as native's gradient
        return torch.Tensor.clone(self).detach()

    def __reduce_ex__(self, protocol):  # type: ignore[no-untyped-def]
        # saved and pickled as a plain tensor (torch.load(weights_only=True) reads it back)
        return torch.Tensor.__reduce_ex__(self.as_subclass(Tensor), protocol)


class GroupLayout(Protocol):
    """What the norms read of a flat group (:class:`~cotangent.pack.FlatGroup`)."""

    device: torch.device
    dtype: torch.dtype
    index: list[int]
    grad: Tensor


class PackLayout(Protocol):
    """What the norms read of the flat layout (:class:`~cotangent.pack.Pack` implements
    it), so this module never imports the layout's."""

    n: int
    where: list[tuple[int, int]]
    grad_views: list[Tensor]
    params: list[Tensor]

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
        if self.why_not is None:  # watch the writes PyTorch does not count (GradSlot)
            for i, view in enumerate(pack.grad_views):
                slot = GradSlot.of(view)
                if pack.params[i].grad is view:
                    pack.params[i].grad = slot
                pack.grad_views[i] = slot

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
        view = pack.grad_views[i]
        return (
            self.valid[i]
            and not getattr(view, "escaped", True)  # a plain tensor (Pack.adopt): computed again
            and self.seen[i]
            == (
                view._version,
                pack.groups[pack.where[i][0]].grad._version,
            )
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

"""Cotangent gradient handling: exact bucketed clipping and a packed fused AdamW.

The work between ``loss.backward()`` and the next parameter update, made cheaper while every
bit stays what native PyTorch computes:

* :func:`clip_grad_norm_` is a drop-in for :func:`torch.nn.utils.clip_grad_norm_`. Per-parameter
  norms are computed in batches (parameters with equal element count ``K`` form a bucket reduced
  as one ``B x (K/2) x 2`` view), the scalar norms are put back in the order native clipping stacks
  them, and the final reduction and the clip coefficient are native's.
* :class:`PackedAdamW` lays parameters, gradients and both moments out as flat buffers in one
  coordinate order and applies ``torch._fused_adamw_``, the kernel behind
  ``torch.optim.AdamW(fused=True)``, over views of them.
* :meth:`PackedAdamW.clip_step_zero_grad` runs clip + step + zero_grad as one pass over memory
  (per-parameter norms first, then block by block: scale, fused update, zero, while the block
  is in cache), bit for bit the three calls. The candidate arm uses it. For float32 on x86-64
  CPUs it runs as two calls into C (:mod:`harness.native`: the bucketed norms, then one loop that
  scales, updates and zeroes), used only after a self-check shows it bitwise the running torch.
* :data:`ARMS` / :func:`build_arm` name the four cells of the study's 2x2 factorial.

Exactness is a property of (device type, dtype, kernel). :data:`EXACT_PATHS` lists what is known
to be bitwise native; everything else takes the native path. ``harness verify --device D`` checks
every path on a device and prints what matched.

Why the CPU entries are exact (PyTorch 2.6 - 2.14 CPU kernels):

* 2-norm of a contiguous float32/float64/bfloat16 tensor reduced over its last dimension takes the
  vectorised "reduce last dim" kernel, one output row at a time, and a full reduction of one
  tensor coalesces to the same kernel with one row; so row ``b`` of a ``B x K`` reduction is the
  bits of ``vector_norm(t_b)``.
* The fused AdamW CPU kernel splits a tensor into per-thread chunks of whole cache lines and runs
  a vectorised body over each chunk with a scalar (double-promoted) tail. Only the last
  ``numel % vector_width`` elements of each tensor take the tail, whatever the thread count. A
  flat run of parameters whose sizes are all multiples of one cache line therefore has no tail
  element in either layout, and the coordinatewise update is identical (``aligned`` update mode).
  Parameters of other sizes are updated through their own views in the same kernel call.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

from harness import native
from harness.names import ARMS

__all__ = [
    "ARMS",
    "EXACT_PATHS",
    "Arm",
    "PackedAdamW",
    "build_arm",
    "clip_grad_norm_",
    "exact_paths",
]

#: Smallest element count worth batching; shorter tensors use native scalar norms.
MIN_BUCKET_NUMEL = 32


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
    (``$HARNESS_VERIFIED`` or ``runs/verified/<device>-torch<version>.json``) for the running
    torch version; otherwise native paths only.
    """
    if device_type in EXACT_PATHS:
        return EXACT_PATHS[device_type]
    if device_type in _SAVED:
        return _SAVED[device_type]
    paths = _NATIVE_ONLY
    from harness.verify import load_saved  # local import: verify imports this module

    saved = load_saved(device_type)
    if saved is not None:
        paths = saved
    _SAVED[device_type] = paths
    return paths


# --------------------------------------------------------------------------------------------
# Clipping
# --------------------------------------------------------------------------------------------


def _native_uses_foreach(tensors: list[Tensor], device: torch.device, foreach: bool | None) -> bool:
    from torch.utils._foreach_utils import _device_has_foreach_support, _has_foreach_support

    if foreach is None:
        return _has_foreach_support(tensors, device)
    return bool(foreach) and _device_has_foreach_support(device)


def _native_norms(tensors: list[Tensor], device: torch.device, norm_type: float, foreach: bool | None) -> list[Tensor]:
    if not tensors:
        return []
    if _native_uses_foreach(tensors, device, foreach):
        return list(torch._foreach_norm(tensors, norm_type))
    if foreach:
        raise RuntimeError(f"foreach=True was passed, but can't use the foreach API on {device.type} tensors")
    return [torch.linalg.vector_norm(g, norm_type) for g in tensors]


def _bucketable(numel: int, count: int) -> bool:
    return count >= 2 and numel >= MIN_BUCKET_NUMEL and numel % 2 == 0


def _bucket_norm(rows: Tensor, k: int) -> Tensor:
    """2-norms of the rows of a ``B x K`` block, reduced as a ``B x (K/2) x 2`` view."""
    return torch.linalg.vector_norm(rows.view(-1, k // 2, 2), 2.0, dim=(1, 2))


def _group_norms(tensors: list[Tensor], device: torch.device, dtype: torch.dtype, foreach: bool | None) -> Tensor:
    """Norms of one (device, dtype) group, in the group's order, batching where exact."""
    exact = exact_paths(device.type)
    if dtype not in exact.bucketed_norm_dtypes or foreach is not None:
        return torch.stack(_native_norms(tensors, device, 2.0, foreach))
    by_numel: dict[int, list[int]] = {}
    for i, t in enumerate(tensors):
        by_numel.setdefault(t.numel(), []).append(i)
    out: list[Tensor | None] = [None] * len(tensors)
    scalar_idx: list[int] = []
    for numel, idx in by_numel.items():
        if _bucketable(numel, len(idx)):
            # Stacking copies: this is part of the method's cost when gradients are not packed.
            rows = torch.stack([tensors[i].reshape(-1) for i in idx])
            norms = _bucket_norm(rows, numel)
            for j, i in enumerate(idx):
                out[i] = norms[j]
        else:
            scalar_idx.extend(idx)
    if scalar_idx:
        scalar_idx.sort()
        for i, n in zip(scalar_idx, _native_norms([tensors[i] for i in scalar_idx], device, 2.0, foreach)):
            out[i] = n
    return torch.stack(out)  # type: ignore[arg-type]


def _total_norm(grads: list[Tensor], norm_type: float, error_if_nonfinite: bool, foreach: bool | None) -> Tensor:
    """Native ``get_total_norm`` with batched per-tensor norms for ``norm_type == 2``."""
    if len(grads) == 0:
        return torch.tensor(0.0)
    if norm_type != 2.0:
        return torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    first_device = grads[0].device
    grouped = _group_tensors_by_device_and_dtype([grads])  # native's grouping and group order
    pieces = [
        _group_norms(device_tensors, device, dtype, foreach).to(first_device)
        for (device, dtype), ([device_tensors], _) in grouped.items()
    ]
    total = torch.linalg.vector_norm(torch.cat(pieces), norm_type)
    _check_finite(total, norm_type, error_if_nonfinite)
    return total


def _check_finite(total: Tensor, norm_type: float, error_if_nonfinite: bool) -> None:
    if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
            "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
            "anyway, set `error_if_nonfinite=False`"
        )


@torch.no_grad()
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

    When the parameters are exactly those of a :class:`PackedAdamW` (same order), the buckets
    are zero-copy views of its flat gradient buffer and the clip multiply is one call per buffer.
    """
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
    pack = _Pack.of(parameters)
    if pack is not None and norm_type == 2.0 and foreach is None:
        produced = pack.sync_grads()
        if produced is None:
            total = pack.total_norm()
            _check_finite(total, norm_type, error_if_nonfinite)
            pack.scale_grads(_clip_coef(max_norm, total))
            return total
        grads = [pack.grad_views[i] for i in produced]
    else:
        grads = [p.grad for p in parameters if p.grad is not None]
    total = _total_norm(grads, norm_type, error_if_nonfinite, foreach)
    if grads:
        torch.nn.utils.clip_grads_with_norm_(grads_as_params(grads), max_norm, total, foreach)
    return total


def _clip_coef(max_norm: float, total: Tensor) -> Tensor:
    return torch.clamp(max_norm / (total + 1e-6), max=1.0)


class _GradHolder:
    """Minimal stand-in so ``clip_grads_with_norm_`` multiplies exactly the given gradients."""

    __slots__ = ("grad",)

    def __init__(self, grad: Tensor) -> None:
        self.grad = grad


def grads_as_params(grads: list[Tensor]) -> list[Any]:
    return [_GradHolder(g) for g in grads]


# --------------------------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------------------------

_CACHE_LINE_BYTES = 64

#: Default cache blocking of the fused gradient phase on CPU (:meth:`PackedAdamW.clip_step_zero_grad`):
#: bytes of each flat buffer one block covers. ``benchmarks/grad_phase.py --block-sweep`` compares sizes.
CPU_BLOCK_BYTES = 2 * 2**20


@dataclass
class _Block:
    """One step of the fused phase: scale ``grad``, one fused AdamW call over ``lists``, zero ``grad``."""

    grad: Tensor
    lists: tuple[list[Tensor], ...]  # params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps


@dataclass
class _FlatGroup:
    """One (device, dtype) group: flat buffers and the per-parameter views into them."""

    device: torch.device
    dtype: torch.dtype
    index: list[int]  # positions in the optimizer's parameter list, in packed order
    offsets: list[int]
    numels: list[int]
    param: Tensor
    grad: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor
    max_exp_avg_sq: Tensor | None
    steps: Tensor  # float32, one counter per parameter, packed order
    buckets: list[tuple[int, int, int, list[int]]]  # (start, count, numel, packed positions)
    aligned_end: int  # parameters [0, aligned_end) are cache-line multiples, laid out first

    def slot(self, buf: Tensor, j: int, shape: torch.Size) -> Tensor:
        return buf[self.offsets[j] : self.offsets[j] + self.numels[j]].view(shape)


class _Pack:
    """Flat layout shared by :class:`PackedAdamW` and :func:`clip_grad_norm_`."""

    _registry: dict[int, _Pack] = {}

    def __init__(self, params: list[Tensor], amsgrad: bool, release: bool = False) -> None:
        self.params = params
        self.n = len(params)
        self.release_mode = release
        # slots whose memory may not hold -0.0 (released pages read +0.0): filled by the hook
        self.dirty = [False] * self.n
        self.ids = tuple(id(p) for p in params)
        self.grad_views: list[Tensor] = [None] * self.n  # type: ignore[list-item]
        self.produced = [False] * self.n
        self.groups: list[_FlatGroup] = []
        self.where: list[tuple[int, int]] = [(0, 0)] * self.n  # (group, packed position)
        self.uniform_steps = True
        order: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, p in enumerate(params):
            order.setdefault((p.device, p.dtype), []).append(i)
        for gi, ((device, dtype), idx) in enumerate(order.items()):
            self.groups.append(self._build_group(gi, device, dtype, idx, amsgrad))
        # Native clipping's norm order: its grouping (hash order of (device, dtype)) over params.
        grouped = _group_tensors_by_device_and_dtype([list(params)], with_indices=True)
        native_positions: list[int] = []
        for _key, (_lists, indices) in grouped.items():
            native_positions.extend(indices)
        base = 0
        flat_of: dict[int, int] = {}
        for g in self.groups:
            for j, i in enumerate(g.index):
                flat_of[i] = base + j
            base += len(g.index)
        packed_pos = [flat_of[i] for i in native_positions]
        self.native_perm = torch.tensor(packed_pos, dtype=torch.long)
        self._perm_on: dict[torch.device, Tensor] = {}
        self.first_device = params[0].device
        self.hooks = [p.register_hook(self._make_hook(i)) for i, p in enumerate(params)]
        self._same_device = all(g.device == self.first_device for g in self.groups)
        for p in params:
            _Pack._registry[id(p)] = self

    def _build_group(
        self, gi: int, device: torch.device, dtype: torch.dtype, idx: list[int], amsgrad: bool
    ) -> _FlatGroup:
        unit = _CACHE_LINE_BYTES // torch.empty((), dtype=dtype).element_size()
        numel = {i: self.params[i].numel() for i in idx}
        # Aligned parameters first, then by size (largest first) so equal sizes are adjacent.
        ordered = sorted(idx, key=lambda i: (numel[i] % unit != 0, -numel[i], i))
        offsets, numels = [], []
        total = 0
        for i in ordered:
            offsets.append(total)
            numels.append(numel[i])
            total += numel[i]
        aligned_end = sum(1 for i in ordered if numel[i] % unit == 0)
        kw = {"device": device, "dtype": dtype}
        flat_p = torch.empty(total, **kw)
        flat_g = torch.full((total,), -0.0, **kw)
        group = _FlatGroup(
            device=device,
            dtype=dtype,
            index=ordered,
            offsets=offsets,
            numels=numels,
            param=flat_p,
            grad=flat_g,
            exp_avg=torch.zeros(total, **kw),
            exp_avg_sq=torch.zeros(total, **kw),
            max_exp_avg_sq=torch.zeros(total, **kw) if amsgrad else None,
            steps=torch.zeros(len(ordered), dtype=torch.float32, device=device),
            buckets=[],
            aligned_end=aligned_end,
        )
        with torch.no_grad():
            for j, i in enumerate(ordered):
                p = self.params[i]
                view = group.slot(flat_p, j, p.shape)
                view.copy_(p)
                p.data = view  # the parameter now lives in the flat buffer; old storage is freed
                gview = group.slot(flat_g, j, p.shape)
                if p.grad is not None:  # a gradient that exists at construction is kept
                    gview.copy_(p.grad)
                    self.produced[i] = True
                p.grad = gview
                self.grad_views[i] = gview
                self.where[i] = (gi, j)
        j = 0
        while j < len(ordered):
            k = j
            while k < len(ordered) and numels[k] == numels[j]:
                k += 1
            group.buckets.append((offsets[j], k - j, numels[j], list(range(j, k))))
            j = k
        return group

    def _make_hook(self, i: int) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            if grad.requires_grad:
                raise RuntimeError("PackedAdamW does not support backward with create_graph=True")
            if grad.layout != torch.strided:
                raise RuntimeError("PackedAdamW requires dense gradients (got a sparse gradient)")
            if self.dirty[i]:  # runs before AccumulateGrad adds into the slot
                self.grad_views[i].fill_(-0.0)
                self.dirty[i] = False
            self.produced[i] = True

        return hook

    @classmethod
    def of(cls, parameters: list[Tensor]) -> _Pack | None:
        if not parameters:
            return None
        pack = cls._registry.get(id(parameters[0]))
        if pack is None or len(parameters) != pack.n:
            return None
        if any(a is not b for a, b in zip(parameters, pack.params)):
            return None
        return pack

    def restore_view(self, i: int) -> None:
        gview = self.grad_views[i]
        gview.fill_(-0.0)
        self.dirty[i] = False
        self.params[i].grad = gview

    def sync_grads(self) -> list[int] | None:
        """Reconcile ``.grad`` attributes with the flat buffer.

        Returns ``None`` when every parameter's gradient was produced (the fast path), otherwise
        the sorted positions of the parameters that have a gradient this step.
        """
        for i, p in enumerate(self.params):
            g = p.grad
            view = self.grad_views[i]
            if g is view:
                continue
            if g is None:
                self.produced[i] = False
                self.restore_view(i)
                continue
            if g.layout != torch.strided:
                raise RuntimeError("PackedAdamW requires dense gradients (got a sparse gradient)")
            if g.requires_grad:
                raise RuntimeError("PackedAdamW does not support backward with create_graph=True")
            if g.shape != view.shape or g.dtype != view.dtype or g.device != view.device:
                raise RuntimeError(
                    f"parameter {i}: .grad was replaced by a tensor of shape {tuple(g.shape)}, "
                    f"{g.dtype}, {g.device}; PackedAdamW needs {tuple(view.shape)}, {view.dtype}, {view.device}"
                )
            with torch.no_grad():
                view.copy_(g)
            p.grad = view
            self.dirty[i] = False
            self.produced[i] = True
        if all(self.produced):
            return None
        return [i for i in range(self.n) if self.produced[i]]

    def total_norm(self) -> Tensor:
        """Total 2-norm with every gradient present, from zero-copy bucket views."""
        pieces: list[Tensor] = []
        for g in self.groups:
            exact = exact_paths(g.device.type)
            batched = g.dtype in exact.bucketed_norm_dtypes
            norms: list[Tensor] = []
            for start, count, numel, positions in g.buckets:
                if batched and _bucketable(numel, count):
                    norms.append(_bucket_norm(g.grad[start : start + count * numel], numel))
                else:
                    views = [self.grad_views[g.index[j]] for j in positions]
                    norms.append(torch.stack(_native_norms(views, g.device, 2.0, None)))
            pieces.append(torch.cat(norms).to(self.first_device))
        flat = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        perm = self._perm_on.get(flat.device)
        if perm is None:
            perm = self._perm_on[flat.device] = self.native_perm.to(flat.device)
        return torch.linalg.vector_norm(flat.index_select(0, perm), 2.0)

    def scale_grads(self, coef: Tensor) -> None:
        for g in self.groups:
            g.grad.mul_(coef.to(g.device))

    def zero_grads(self) -> None:
        if self.release_mode:
            self.release_grads()
        else:
            for g in self.groups:
                g.grad.fill_(-0.0)
        self.reset_views()

    def release_grads(self) -> None:
        """Zero the gradient buffers by giving their pages back to the OS (``release_grads``
        mode); the hooks fill each slot with -0.0 again just before backward accumulates into it,
        so gradient memory comes back as backward produces it, as native's does."""
        for g in self.groups:
            span = native.release_pages(g.grad)
            if span is None:
                g.grad.fill_(-0.0)
                continue
            lo, hi = span
            g.grad[:lo].fill_(-0.0)
            g.grad[hi:].fill_(-0.0)
        self.dirty = [True] * self.n

    def consumed(self) -> None:
        """No gradient produced yet (after the buffer was zeroed with every ``.grad`` its view)."""
        self.produced = [False] * self.n

    def reset_views(self) -> None:
        """Every ``.grad`` the view of its slot, none produced yet (after the buffer was zeroed)."""
        for i, p in enumerate(self.params):
            if p.grad is not self.grad_views[i]:
                p.grad = self.grad_views[i]
            self.produced[i] = False

    def release(self) -> None:
        for h in self.hooks:
            h.remove()
        for p in self.params:
            if _Pack._registry.get(id(p)) is self:
                del _Pack._registry[id(p)]


# --------------------------------------------------------------------------------------------
# Optimizer
# --------------------------------------------------------------------------------------------

#: Keys native ``AdamW`` keeps in a parameter group; kept so state dicts load both ways with
#: native's fused path intact.
_NATIVE_GROUP_KEYS: dict[str, Any] = {
    "foreach": None,
    "fused": True,
    "capturable": False,
    "differentiable": False,
    "decoupled_weight_decay": True,
}


class PackedAdamW(torch.optim.Optimizer):
    """AdamW over flat buffers, bitwise equal to ``torch.optim.AdamW(..., fused=True)``.

    On construction every parameter becomes a view of one flat buffer per (device, dtype),
    equal-size parameters adjacent; gradients are preallocated views of a flat gradient buffer
    in the same order, so backward accumulates into it in place; both moments live in flat
    buffers in the same order; the step counters are one float32 buffer.

    Parameters
    ----------
    params
        Parameters (or one parameter group). Exactly one group; dense floating-point
        parameters; shared parameters are packed and updated once.
    lr, betas, eps, weight_decay, amsgrad, maximize
        As ``torch.optim.AdamW``. ``lr`` may be a float or a tensor.
    update
        ``"auto"`` (the device's verified mode, :func:`exact_paths`), ``"views"``, ``"aligned"``
        or ``"flat"``. ``"flat"`` on CPU is faster and not bitwise native when a parameter's size
        is not a multiple of the vector width (a few low bits differ after tens of steps).
    block_bytes
        Bytes of each flat buffer one block of :meth:`clip_step_zero_grad` covers on CPU
        (default :data:`CPU_BLOCK_BYTES`). Speed only: every block size gives the same bits.
    release_grads
        ``False`` (default): the gradient buffer stays allocated between steps (zeroed with
        -0.0), so peak memory exceeds native's by up to the gradients' bytes, which native frees
        after each step. ``True``: zeroing gives the buffer's pages back to the OS (Linux) and
        each slot is filled with -0.0 again when backward reaches its parameter, so peak memory
        follows native's; the page faults cost time in backward. Same bits either way.
    kernel
        ``"auto"``: :meth:`clip_step_zero_grad` runs in C (:mod:`harness.native`) where that is
        verified bitwise (one float32 CPU buffer whose parameters are all multiples of 16
        elements, a kernel that built and passed its self-check); ``"torch"``: always PyTorch's
        kernels. Speed only: both give the same bits. :meth:`phase_kernel` says which runs.

    Notes
    -----
    Requirements, each refused with an error naming it: one parameter group; dense floating-point
    parameters; no sparse gradients; no ``create_graph`` backward. A parameter whose gradient was
    not produced in a step is left untouched by that step, as native AdamW leaves a ``None``
    gradient. A ``.grad`` replaced by the user is copied into the flat buffer at the next step
    and the view restored; a ``.grad`` set to ``None`` counts as no gradient.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        amsgrad: bool = False,
        maximize: bool = False,
        update: str = "auto",
        block_bytes: int = CPU_BLOCK_BYTES,
        kernel: str = "auto",
        release_grads: bool = False,
    ) -> None:
        if kernel not in ("auto", "torch"):
            raise ValueError(f"kernel must be auto or torch, not {kernel!r}")
        if update not in ("auto", "views", "aligned", "flat"):
            raise ValueError(f"update must be auto, views, aligned or flat, not {update!r}")
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, not {block_bytes}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameters: {betas}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        plist = list(params)
        if plist and isinstance(plist[0], dict):
            if len(plist) != 1:
                raise ValueError(f"PackedAdamW requires exactly one parameter group, got {len(plist)}")
            group0 = dict(plist[0])
            raw = list(group0.pop("params"))
            if group0:
                raise ValueError(
                    "PackedAdamW takes hyperparameters as arguments, not per-group options: " + ", ".join(group0)
                )
        else:
            raw = plist
        unique: list[Tensor] = []
        seen: set[int] = set()
        for p in raw:
            if not isinstance(p, Tensor):
                raise TypeError(f"PackedAdamW expects tensors, got {type(p).__name__}")
            if id(p) not in seen:
                seen.add(id(p))
                unique.append(p)
        if not unique:
            raise ValueError("PackedAdamW got an empty parameter list")
        for i, p in enumerate(unique):
            if p.layout != torch.strided:
                raise ValueError(f"PackedAdamW requires dense parameters; parameter {i} is {p.layout}")
            if not torch.is_floating_point(p):
                raise ValueError(f"PackedAdamW requires floating-point parameters; parameter {i} is {p.dtype}")
            if not p.is_leaf:
                raise ValueError(f"PackedAdamW requires leaf parameters; parameter {i} is not a leaf")
            if p.grad is not None and p.grad.layout != torch.strided:
                raise ValueError(f"PackedAdamW requires dense gradients; parameter {i} has a sparse gradient")
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
            **_NATIVE_GROUP_KEYS,
        )
        super().__init__(unique, defaults)
        self._requested_update = update
        self.block_bytes = block_bytes
        self.kernel = kernel
        self._pack = _Pack(unique, amsgrad, release=release_grads)
        self._build_state()
        self._build_plans()

    # -- layout --------------------------------------------------------------------------
    def _mode(self, g: _FlatGroup) -> str:
        if self._requested_update != "auto":
            return self._requested_update
        return exact_paths(g.device.type).update

    def _build_state(self) -> None:
        pack = self._pack
        for g in pack.groups:
            for j, i in enumerate(g.index):
                p = pack.params[i]
                st: dict[str, Tensor] = {
                    "step": g.steps[j],
                    "exp_avg": g.slot(g.exp_avg, j, p.shape),
                    "exp_avg_sq": g.slot(g.exp_avg_sq, j, p.shape),
                }
                if g.max_exp_avg_sq is not None:
                    st["max_exp_avg_sq"] = g.slot(g.max_exp_avg_sq, j, p.shape)
                self.state[p] = st

    def _view_lists(self, g: _FlatGroup, positions: list[int]) -> tuple[list[Tensor], ...]:
        ps, gs, ms, vs, xs, ss = [], [], [], [], [], []
        for j in positions:
            p = self._pack.params[g.index[j]]
            st = self.state[p]
            ps.append(p.detach())
            gs.append(self._pack.grad_views[g.index[j]])
            ms.append(st["exp_avg"])
            vs.append(st["exp_avg_sq"])
            if g.max_exp_avg_sq is not None:
                xs.append(st["max_exp_avg_sq"])
            ss.append(g.steps[j])
        return ps, gs, ms, vs, xs, ss

    def _lists_for(self, g: _FlatGroup) -> tuple[list[Tensor], ...]:
        """Tensor lists for the fused call when every parameter of ``g`` has a gradient."""
        mode = self._mode(g)
        n = len(g.index)
        flat_upto = {"views": 0, "aligned": g.aligned_end, "flat": n}[mode]
        if flat_upto <= 1:
            return self._view_lists(g, list(range(n)))
        end = g.offsets[flat_upto - 1] + g.numels[flat_upto - 1]
        ps, gs, ms, vs, xs, ss = self._view_lists(g, list(range(flat_upto, n)))
        ps.insert(0, g.param[:end])
        gs.insert(0, g.grad[:end])
        ms.insert(0, g.exp_avg[:end])
        vs.insert(0, g.exp_avg_sq[:end])
        if g.max_exp_avg_sq is not None:
            xs.insert(0, g.max_exp_avg_sq[:end])
        ss.insert(0, g.steps[0])
        return ps, gs, ms, vs, xs, ss

    def _blocks_for(self, g: _FlatGroup) -> list[_Block]:
        """Blocks of the fused phase for ``g``, in the order they run.

        On CPU in ``aligned`` mode the cache-line-aligned run is cut into blocks of
        ``block_bytes`` at cache-line boundaries (no block has a scalar-tail element,
        so each block's update is the bits of the whole run's), the other parameters form one
        block of per-parameter views. Blocks run from the end of the buffer back, so the first
        ones find the gradients the norm pass read last still in cache. Elsewhere one block
        covers the buffer (on a GPU one launch beats several).
        """
        mode = self._mode(g)
        if g.device.type != "cpu" or mode != "aligned" or g.aligned_end == 0:
            return [_Block(g.grad, self._lists_for(g))]
        end = g.offsets[g.aligned_end - 1] + g.numels[g.aligned_end - 1]
        size = g.grad.element_size()
        unit = _CACHE_LINE_BYTES // size
        step = max(unit, self.block_bytes // size // unit * unit)
        blocks: list[_Block] = []
        for s in range(0, end, step):
            e = min(s + step, end)
            xs = [g.max_exp_avg_sq[s:e]] if g.max_exp_avg_sq is not None else []
            lists = ([g.param[s:e]], [g.grad[s:e]], [g.exp_avg[s:e]], [g.exp_avg_sq[s:e]], xs, [g.steps[0]])
            blocks.append(_Block(g.grad[s:e], lists))
        if g.aligned_end < len(g.index):
            blocks.append(_Block(g.grad[end:], self._view_lists(g, list(range(g.aligned_end, len(g.index))))))
        blocks.reverse()
        return blocks

    def _build_plans(self) -> None:
        self._fast_lists = [self._lists_for(g) for g in self._pack.groups]
        self._blocks = [self._blocks_for(g) for g in self._pack.groups]
        self._native: _NativePhase | None | bool = False  # False: not decided yet
        self._native_why: str | None = None

    def _native_blocker(self) -> str | None:
        """Why this optimizer's buffers are outside what ``phase.c`` covers, or ``None``."""
        groups = self._pack.groups
        if self.kernel == "torch":
            return "kernel='torch' was requested"
        if len(groups) != 1:
            return "parameters span more than one (device, dtype)"
        g = groups[0]
        if g.device.type != "cpu" or g.dtype != torch.float32:
            return f"phase.c covers float32 on CPU, not {str(g.dtype).replace('torch.', '')} on {g.device.type}"
        if g.aligned_end != len(g.index):
            return "a parameter's element count is not a multiple of 16"
        return None

    def _native_phase(self) -> _NativePhase | None:
        if self._native is False:
            why = self._native_blocker()
            k = None if why is not None else native.kernel()
            if why is None and k is None:
                why = native.unavailable_reason()
            self._native = _NativePhase(k, self._pack) if k is not None else None
            self._native_why = why
        return self._native  # type: ignore[return-value]

    def phase_kernel(self) -> str:
        """Which code runs :meth:`clip_step_zero_grad` when every gradient is present, and why."""
        plan = self._native_phase()
        if plan is not None:
            return f"phase.c ({plan.kernel.describe()})"
        return f"torch kernels ({self._native_why})"

    def _kwargs(self) -> dict[str, Any]:
        group = self.param_groups[0]
        if len(self.param_groups) != 1:
            raise RuntimeError("PackedAdamW requires exactly one parameter group")
        beta1, beta2 = group["betas"]
        return dict(
            amsgrad=group["amsgrad"], lr=group["lr"], beta1=beta1, beta2=beta2,
            weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
            grad_scale=None, found_inf=None,
        )

    @staticmethod
    def _lr_on(kwargs: dict[str, Any], device: torch.device) -> dict[str, Any]:
        lr = kwargs["lr"]
        if isinstance(lr, Tensor) and lr.device != device and lr.device.type != "cpu":
            return {**kwargs, "lr": lr.to(device)}
        return kwargs

    # -- public --------------------------------------------------------------------------
    @property
    def flat_groups(self) -> list[_FlatGroup]:
        """The flat buffers, one entry per (device, dtype)."""
        return self._pack.groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradient buffer and keep every ``.grad`` a view of it.

        ``set_to_none`` is accepted for compatibility and ignored: setting gradients to ``None``
        (native's default) would detach them from the flat buffer. The buffer is filled with
        ``-0.0``, the additive identity of IEEE arithmetic (``-0.0 + x == x`` bit for bit, ``+0.0``
        would turn a ``-0.0`` gradient into ``+0.0``), so the next backward's in-place
        accumulation leaves exactly the bits native would store. With ``release_grads=True`` the
        buffer's pages are given back to the OS instead; they read ``+0.0`` until backward, where
        each parameter's hook fills its slot with ``-0.0`` just before accumulation.
        """
        del set_to_none
        self._pack.zero_grads()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        kwargs = self._kwargs()
        pack = self._pack
        produced = pack.sync_grads()
        for gi, g in enumerate(pack.groups):
            if produced is None and pack.uniform_steps:
                g.steps.add_(1)
                lists = self._fast_lists[gi]
            else:
                have = set(produced) if produced is not None else set(range(pack.n))
                positions = [j for j, i in enumerate(g.index) if i in have]
                if not positions:
                    continue
                lists = self._view_lists(g, positions)
                torch._foreach_add_(lists[5], 1)
            torch._fused_adamw_(*lists, **self._lr_on(kwargs, g.device))  # type: ignore[arg-type]
        if produced is not None:
            pack.uniform_steps = False
        return loss

    @torch.no_grad()
    def clip_step_zero_grad(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False) -> Tensor:
        """The whole gradient phase in one pass over memory; returns the total gradient norm.

        Bit for bit the same parameters, optimizer state, gradients and return value as::

            total = clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite)
            optimizer.step()
            optimizer.zero_grad()

        The per-parameter norms are read first (they decide the clip coefficient); then, block
        by block (:meth:`_blocks_for`), the gradients are scaled by the coefficient, the fused
        AdamW kernel updates the block, and the block's gradients are zeroed while they are
        still in cache. Every coordinate goes through the same operations as in the three calls;
        only the order in which memory is visited changes. Where :meth:`phase_kernel` names
        ``phase.c``, the same operations run as two C calls (norms, total and coefficient; then
        one loop that scales, updates and zeroes each element). Cases off the fast path (a
        gradient missing this step, per-parameter step counts, another norm type) make the three
        calls.
        """
        pack = self._pack
        kwargs = self._kwargs()
        produced = pack.sync_grads()
        if produced is not None or not pack.uniform_steps or float(norm_type) != 2.0:
            total = clip_grad_norm_(pack.params, max_norm, norm_type, error_if_nonfinite)
            self.step()
            self.zero_grad()
            return total
        plan = self._native_phase()
        if plan is not None:
            total = plan.run(float(max_norm), self.param_groups[0], error_if_nonfinite, zero=not pack.release_mode)
        else:
            total = pack.total_norm()
            _check_finite(total, 2.0, error_if_nonfinite)
            coef = _clip_coef(float(max_norm), total)
            for gi, g in enumerate(pack.groups):
                g.steps.add_(1)
                c = coef.to(g.device)
                kw = self._lr_on(kwargs, g.device)
                for block in self._blocks[gi]:
                    block.grad.mul_(c)
                    torch._fused_adamw_(*block.lists, **kw)  # type: ignore[arg-type]
                    if not pack.release_mode:
                        block.grad.fill_(-0.0)
        if pack.release_mode:
            pack.release_grads()
        pack.consumed()  # sync_grads left every .grad its view; the phase did not touch them
        return total

    def state_dict(self) -> dict[str, Any]:
        """Native per-parameter form (clones), loadable by ``torch.optim.AdamW`` and back."""
        sd = super().state_dict()
        sd["state"] = {k: {n: t.clone() for n, t in v.items()} for k, v in sd["state"].items()}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load per-parameter state (ours or native ``AdamW``'s) into the flat buffers."""
        super().load_state_dict(state_dict)
        pack = self._pack
        loaded = {p: dict(self.state[p]) for p in pack.params if p in self.state}
        self._build_state()
        with torch.no_grad():
            for p, st in loaded.items():
                mine = self.state[p]
                for key, view in mine.items():
                    if key in st:
                        view.copy_(st[key])
                    elif key == "max_exp_avg_sq":
                        view.zero_()
            for g in pack.groups:
                steps = g.steps.tolist()
                if len(set(steps)) > 1:
                    pack.uniform_steps = False
        self._build_plans()
        group = self.param_groups[0]
        for key, value in _NATIVE_GROUP_KEYS.items():
            group.setdefault(key, value)

    def __del__(self) -> None:  # pragma: no cover - best effort
        pack = getattr(self, "_pack", None)
        if pack is not None:
            pack.release()


class _NativePhase:
    """The gradient phase of one float32 CPU buffer in ``phase.c`` (:mod:`harness.native`)."""

    def __init__(self, kernel: native.Kernel, pack: _Pack) -> None:
        g = pack.groups[0]
        self.kernel = kernel
        self.group = g
        self.offsets = torch.tensor(g.offsets, dtype=torch.int64)
        self.numels = torch.tensor(g.numels, dtype=torch.int64)
        # equal sizes are adjacent in the buffer (the buckets): their rows are reduced together
        self.first, self.rows = native.tasks_for(g.numels)
        self.perm = pack.native_perm  # native clipping's order, as positions in the buffer
        self.norms = torch.empty(len(g.index))
        self.scratch = torch.empty(len(g.index))
        self.coef = torch.empty(())
        self.hyper = native.Hyper(coef=self.coef.data_ptr(), steps=g.steps.data_ptr(), count=len(g.index),
                                  sq_form=kernel.sq_form, chunk=native.UPDATE_CHUNK)

    def run(self, max_norm: float, group: dict[str, Any], error_if_nonfinite: bool, zero: bool = True) -> Tensor:
        g, k, h = self.group, self.kernel, self.hyper
        threads = torch.get_num_threads()
        k.row_norms(g.grad, self.offsets, self.numels, self.first, self.rows, self.norms, threads)
        total = torch.empty(())
        k.total_coef(self.norms, self.perm, self.scratch, max_norm, total, self.coef)
        _check_finite(total, 2.0, error_if_nonfinite)
        h.lr = float(group["lr"])
        h.beta1, h.beta2 = (float(b) for b in group["betas"])
        h.weight_decay, h.eps = float(group["weight_decay"]), float(group["eps"])
        h.amsgrad, h.maximize, h.threads = int(bool(group["amsgrad"])), int(bool(group["maximize"])), threads
        h.zero = int(zero)
        k.update(g.param, g.grad, g.exp_avg, g.exp_avg_sq, g.max_exp_avg_sq, h)
        return total


# --------------------------------------------------------------------------------------------
# The study's arms
# --------------------------------------------------------------------------------------------



@dataclass
class Arm:
    """Gradient handling for one arm: ``clip()`` then ``step()`` then ``zero_grad()``, or :meth:`phase`."""

    name: str
    params: list[Tensor]
    optimizer: torch.optim.Optimizer
    max_norm: float | None
    clip_fn: Callable[..., Tensor]

    def clip(self) -> Tensor | None:
        if self.max_norm is None:
            return None
        return self.clip_fn(self.params, self.max_norm)

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def phase(self) -> Tensor | None:
        """The gradient phase: clip, optimizer step, zero the gradients.

        The candidate (bucketed norms + :class:`PackedAdamW`) runs it as one pass,
        :meth:`PackedAdamW.clip_step_zero_grad`, bit for bit the three calls.
        """
        if self.max_norm is not None and self.clip_fn is clip_grad_norm_ and isinstance(self.optimizer, PackedAdamW):
            return self.optimizer.clip_step_zero_grad(self.max_norm)
        norm = self.clip()
        self.step()
        self.zero_grad()
        return norm

    def set_lr(self, lr: float | Tensor) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr


def _native_clip(params: Sequence[Tensor], max_norm: float) -> Tensor:
    return torch.nn.utils.clip_grad_norm_(params, max_norm)


def build_arm(
    arm: str,
    params: Iterable[Tensor],
    *,
    lr: float | Tensor,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    max_norm: float | None = 1.0,
    update: str = "auto",
    block_bytes: int = CPU_BLOCK_BYTES,
    kernel: str = "auto",
    release_grads: bool = False,
) -> Arm:
    """Build one arm of the factorial over ``params`` (unique, in order)."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; known: {', '.join(ARMS)}")
    plist: list[Tensor] = []
    seen: set[int] = set()
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            plist.append(p)
    norms, opt = ARMS[arm]
    optimizer: torch.optim.Optimizer
    if opt == "packed":
        optimizer = PackedAdamW(plist, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, update=update,
                                block_bytes=block_bytes, kernel=kernel, release_grads=release_grads)
    else:
        optimizer = torch.optim.AdamW(plist, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
    clip_fn = clip_grad_norm_ if norms == "bucketed" else _native_clip
    if norms == "scalar" and opt == "packed":
        clip_fn = _native_clip_packed
    return Arm(arm, plist, optimizer, max_norm, clip_fn)


def _native_clip_packed(params: Sequence[Tensor], max_norm: float) -> Tensor:
    """Native scalar clipping over a packed optimizer's gradients that were produced this step."""
    plist = list(params)
    pack = _Pack.of(plist)
    if pack is None:
        return torch.nn.utils.clip_grad_norm_(plist, max_norm)
    produced = pack.sync_grads()
    idx = range(pack.n) if produced is None else produced
    grads = [pack.grad_views[i] for i in idx]
    return torch.nn.utils.clip_grad_norm_(grads_as_params(grads), max_norm)  # type: ignore[arg-type]

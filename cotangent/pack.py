"""The flat layout: parameters, gradients and both moments as flat buffers in one coordinate order."""

from __future__ import annotations

import bisect
import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

from cotangent.backnorms import BackwardNorms, GradSlot
from cotangent.exactness import exact_paths
from cotangent.kernel import release_pages
from cotangent.norms import bucket_norm, bucketable, native_norms

CACHE_LINE_BYTES = 64

#: Default cache blocking of the fused gradient phase on CPU (:meth:`PackedAdamW.clip_step_zero_grad`):
#: bytes of each flat buffer one block covers. ``benchmarks/grad_phase.py --block-sweep`` compares sizes.
CPU_BLOCK_BYTES = 2 * 2**20

RELEASE_MIN_BYTES = 4 << 20
"""Gradient bytes from which ``release_grads="auto"`` gives the pages back after each phase: 4 MiB
(a million float32 parameters). Below it the buffer stays allocated: its memory is well under 1% of
a PyTorch process's resident set, and refaulting its pages would slow backward (measured on the
tiny configurations: forward + backward 1.10x native's when released, 1.04x when kept)."""


@dataclass
class Block:
    """One step of the fused phase: scale ``grad``, one fused AdamW call over ``lists``, zero ``grad``."""

    grad: Tensor
    lists: tuple[list[Tensor], ...]  # params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps


@dataclass
class FlatGroup:
    """One (device, dtype) group: flat buffers and the per-parameter views into them."""

    device: torch.device
    dtype: torch.dtype
    index: list[int]  # positions in the optimizer's parameter list, in packed order
    offsets: list[int]
    numels: list[int]
    param: Tensor
    grad: Tensor
    pg: int  # the optimizer's parameter group (buffers never cross groups)
    exp_avg: Tensor
    exp_avg_sq: Tensor
    max_exp_avg_sq: Tensor | None
    steps: Tensor  # float32, one counter per parameter, packed order
    buckets: list[tuple[int, int, int, list[int]]]  # (start, count, numel, packed positions)
    aligned_end: int  # parameters [0, aligned_end) are cache-line multiples, laid out first
    strides: list[tuple[int, ...]]  # each parameter's own strides (its memory order), packed order

    def slot(self, buf: Tensor, j: int, shape: torch.Size) -> Tensor:
        """Packed position ``j`` of ``buf`` as its parameter is laid out: its bytes in the
        parameter's own memory order (channels_last included), viewed with its strides."""
        return torch.as_strided(buf, shape, self.strides[j], buf.storage_offset() + self.offsets[j])

    def state_slot(self, key: str, j: int, shape: torch.Size) -> Tensor:
        """Packed position ``j``'s state tensor ``key`` (``"step"``, ``"exp_avg"``, ``"exp_avg_sq"``,
        ``"max_exp_avg_sq"``) as the optimizer's state holds it: an alias of its slot with storage of
        its own (:func:`own_storage`), not a view, so that rebound in place (the state leaving the
        buffers, a tensor leaving the state) it keeps no view of a buffer alive."""
        if key == "step":
            return own_storage(self.steps[j])
        return own_storage(self.slot(getattr(self, key), j, shape))


def dense(t: Tensor) -> bool:
    """Does ``t`` cover exactly ``t.numel()`` consecutive elements (no gaps, no overlaps), in
    whatever order its strides give (contiguous, channels_last, a transposed leaf)? Then it can
    be packed in its own memory order."""
    if t.numel() == 0:
        return True
    expected = 1
    for stride, size in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def same_order(a: Tensor, b: Tensor) -> bool:
    """Do ``a`` and ``b`` have one shape and one memory order (equal strides wherever a dimension
    has more than one element; a size-1 dimension's stride says nothing)?"""
    return a.shape == b.shape and all(x == y for x, y, n in zip(a.stride(), b.stride(), a.shape) if n > 1)


def grad_alias(flat: Tensor, offset: int, shape: torch.Size, strides: tuple[int, ...]) -> Tensor:
    """An alias of ``flat[offset : offset + numel]`` laid out with ``strides`` (its parameter's
    memory order, as native's gradient follows its parameter's) with its own version counter and,
    where the device exports DLPack, its own storage.

    A view (``flat[a:b].view(shape)``) shares its base's version counter, so it cannot tell which
    slot was written; an alias made through DLPack (:func:`own_storage`) counts its own in-place
    writes (backward's accumulation included) and is saved as its own bytes (``torch.save`` of a
    gradient writes that gradient, not the whole buffer). Elsewhere a tensor ``set_`` onto the
    same storage, which counts its own writes too.
    """
    view = torch.as_strided(flat, shape, strides, flat.storage_offset() + offset)
    alias = own_storage(view)
    if alias is not view:
        return alias
    out = torch.empty(0, dtype=flat.dtype, device=flat.device)  # pragma: no cover - no DLPack
    return out.set_(flat.untyped_storage(), flat.storage_offset() + offset, shape, strides)


def own_storage(view: Tensor) -> Tensor:
    """A tensor over the same memory as ``view`` whose storage is its own (through DLPack): a
    parameter made of it lives in the flat buffer, and a checkpoint writer that groups tensors by
    storage (safetensors' shared-tensor removal, ``torch.save``'s storage sharing) sees one tensor
    per storage, as natively, not one buffer shared by all. The DLPack capsule keeps the flat
    buffer alive as long as the parameter. Where a device cannot export DLPack, the view itself."""
    try:
        alias = torch.from_dlpack(view)
    except (RuntimeError, TypeError, BufferError):  # pragma: no cover - a device without DLPack
        return view
    if (
        alias.data_ptr() != view.data_ptr() or alias.shape != view.shape or alias.stride() != view.stride()
    ):  # pragma: no cover
        return view
    return alias


class Pack:
    """Flat layout shared by :class:`PackedAdamW` and :func:`clip_grad_norm_`."""

    _registry: dict[int, Pack] = {}

    def __init__(
        self,
        params: list[Tensor],
        amsgrad: list[bool],
        group_of: list[int],
        release: bool = False,
        reuse: Pack | None = None,
    ) -> None:
        self.params = params
        # the parameter buffers of an earlier layout, by (group, device, dtype) and the parameters in
        # packed order: a group laid out the same again keeps its memory (views of it stay valid)
        old = reuse.params if reuse is not None else []
        self._reusable = {
            (g.pg, g.device, g.dtype): ([id(old[i]) for i in g.index], g.param)
            for g in (reuse.groups if reuse is not None else [])
        }
        self.n = len(params)
        self.release_mode = release
        # slots whose memory may not hold -0.0 (released pages read +0.0): filled by the hook
        self.dirty = [False] * self.n
        self.ids = tuple(id(p) for p in params)
        self.grad_views: list[Tensor] = [None] * self.n  # type: ignore[list-item]
        # produced[i]: parameter i has a gradient, exactly where native's ``.grad`` is not None. Then
        # ``.grad`` is the slot's alias (or a tensor the user assigned, copied in at the next sync);
        # otherwise ``.grad`` is None, as natively, and the slot holds -0.0 (or is dirty, see above).
        self.produced = [False] * self.n
        self.groups: list[FlatGroup] = []
        self.where: list[tuple[int, int]] = [(0, 0)] * self.n  # (group, packed position)
        self.uniform_steps = True
        self._lay_out_groups(group_of, amsgrad)
        self.ptrs = [p.data_ptr() for p in params]
        self.strides = [p.stride() for p in params]  # each parameter's memory order, as packed
        self.grad_ptrs = [v.data_ptr() for v in self.grad_views]
        # Each gradient slot is an alias of the flat buffer with a version counter of its own (see
        # grad_alias): a slot without a gradient that was written anyway (through a reference kept
        # from an earlier step) shows a version this class did not see, and is filled with -0.0
        # again before backward accumulates into it.
        self.known = [v._version for v in self.grad_views]
        # position of each parameter in the concatenated per-parameter norms (groups in order)
        self.flat_of = self._flat_positions()
        self.native_perm = self._perm_for(list(range(self.n)))  # clipping the optimizer's order
        self._orders: dict[tuple[int, ...], tuple[Tensor, list[Tensor]] | None] = {}
        self._perm_on: dict[tuple[int, torch.device], tuple[Tensor, Tensor]] = {}
        self.first_device = params[0].device
        self.backward: BackwardNorms | None = (
            None  # norms taken in backward (PackedAdamW(backward_norms=True))
        )
        self.hooks = self._register_hooks()
        self._same_device = all(g.device == self.first_device for g in self.groups)
        for p in params:
            Pack._registry[id(p)] = self
        # slots the hook made a .grad in the running backward (or torch.autograd.grad), checked when it
        # ends (after_backward), and whether that check is queued
        self.attached: list[int] = []
        self.queued = False
        # Python references to each gradient slot that are ours (lists of the fused calls, p.grad):
        # one more means the user kept the tensor (g = p.grad), see kept()
        self.base_refs = self.refs()
        self.relaid = False  # a slot was given a new tensor (detach_kept): the calls' lists are stale
        self.native = False  # stepping natively (mode "native"): no hooks, backward's own gradients

    def _lay_out_groups(self, group_of: list[int], amsgrad: list[bool]) -> None:
        """One flat group per (parameter group, device, dtype), in the order first met."""
        order: dict[tuple[int, torch.device, torch.dtype], list[int]] = {}
        for i, p in enumerate(self.params):
            order.setdefault((group_of[i], p.device, p.dtype), []).append(i)
        for gi, ((pg, device, dtype), idx) in enumerate(order.items()):
            self.groups.append(self._build_group(gi, pg, device, dtype, idx, amsgrad[pg]))

    def _flat_positions(self) -> dict[int, int]:
        """Each parameter's position in the concatenated per-parameter norms (groups in order)."""
        flat_of: dict[int, int] = {}
        base = 0
        for g in self.groups:
            for j, i in enumerate(g.index):
                flat_of[i] = base + j
            base += len(g.index)
        return flat_of

    def _register_hooks(self) -> list:
        """The gradient and post-accumulate hooks of every parameter that requires a gradient.
        Which parameters had no hook dictionary before is remembered (:meth:`_drop_hooks`)."""
        hooks = []
        self.bare = [(p._backward_hooks is None, p._post_accumulate_grad_hooks is None) for p in self.params]
        for i, p in enumerate(self.params):
            if p.requires_grad:
                hooks.append(p.register_hook(self._make_hook(i)))
                hooks.append(p.register_post_accumulate_grad_hook(self._make_post_hook(i)))
        return hooks

    def to_native(self, release: bool = False) -> None:
        """Deliver no more gradients into the slots (the optimizer steps natively): the hooks are
        removed. A gradient that lives in a slot stays ``.grad``, the same tensor (natively a
        ``.grad`` that exists is the same tensor for good, ``zero_grad(set_to_none=False)`` zeroes
        it and backward accumulates into it in place; so does it here, and a ``g = p.grad`` kept
        follows); the slot then counts as produced until ``.grad`` is something else
        (:meth:`to_packed`). ``release``: the gradient buffers' pages go back to the OS
        (:meth:`release_free`), so that gradient memory is native's."""
        self._drop_hooks()
        for i, p in enumerate(self.params):
            if p.grad is self.grad_views[i]:
                continue
            if self.produced[i]:
                self.dirty[i] = True
            self.produced[i] = False
        if self.backward is not None:
            self.backward.clear()
        self.queued, self.attached = False, []
        self.native = True
        if release:
            self.release_free()

    def release_free(self) -> None:
        """:meth:`release_grads` over the groups where no slot is a ``.grad`` (stepping natively a
        slot that was ``.grad`` at the switch stays it, see :meth:`to_native`). A slot tensor the user
        kept that is no longer ``.grad`` (natively zeroed with ``set_to_none=True`` meanwhile) takes
        its values as its own memory first (:meth:`detach_kept`): natively it keeps them."""
        held = [i for i in self.kept() if self.params[i].grad is not self.grad_views[i]]
        if held:
            self.detach_kept(held)
        live = {self.where[i][0] for i, p in enumerate(self.params) if p.grad is self.grad_views[i]}
        self.release_grads(skip=live)

    def to_packed(self) -> list[int]:
        """Deliver gradients into the slots again: the hooks are back. A slot that is no longer
        ``.grad`` (``zero_grad()`` natively) is dirty (refilled with -0.0 before backward
        accumulates into it), and a slot tensor the user kept takes its values as its own memory
        first (:meth:`detach_kept`), as native's kept ``.grad``. A gradient backward stored natively
        meanwhile is copied into its slot at the next sync (or by the post hook when backward
        accumulates into it), as a ``.grad`` the user assigned; their positions are returned (a
        reference kept to such a tensor is no longer ``.grad`` from then on)."""
        moved = []
        for i, p in enumerate(self.params):
            if p.grad is self.grad_views[i]:
                continue
            if p.grad is not None:
                moved.append(i)
            if self.produced[i]:
                self.produced[i] = False
                self.dirty[i] = True
        kept = [i for i in self.kept() if self.params[i].grad is not self.grad_views[i]]
        if kept:
            self.detach_kept(kept)
        if not self.hooks:
            self.hooks = self._register_hooks()
        self.settle()
        self.native = False
        return moved

    def _perm_for(self, positions: list[int]) -> Tensor:
        """Native clipping's norm order over the parameters at ``positions`` (in that order): its
        grouping by (device, dtype), as positions in the concatenated packed norms."""
        grouped = _group_tensors_by_device_and_dtype([[self.params[i] for i in positions]], with_indices=True)
        order: list[int] = []
        for _key, (_lists, indices) in grouped.items():
            order.extend(self.flat_of[positions[k]] for k in indices)
        return torch.tensor(order, dtype=torch.long)

    def order_of(self, parameters: list[Tensor]) -> Tensor | None:
        """The norm order of ``clip_grad_norm_(parameters)`` as positions in the concatenated
        packed norms, when ``parameters`` names every packed parameter exactly once and nothing
        else that has a gradient now (native's clip skips tensors whose ``.grad`` is None); else
        ``None`` (the caller then runs native's clip itself)."""
        key = tuple(id(p) for p in parameters)
        if key == self.ids:
            return self.native_perm
        if key not in self._orders:
            where = {id(p): i for i, p in enumerate(self.params)}
            mine = [where[id(p)] for p in parameters if id(p) in where]
            others = [p for p in parameters if id(p) not in where]  # held: their ids stay theirs
            whole = len(mine) == self.n and len(set(mine)) == self.n
            if len(self._orders) >= 16:
                self._orders.clear()
            self._orders[key] = (self._perm_for(mine), others) if whole else None
        entry = self._orders[key]
        if entry is None or any(p.grad is not None for p in entry[1]):
            return None
        return entry[0]

    def _build_group(
        self, gi: int, pg: int, device: torch.device, dtype: torch.dtype, idx: list[int], amsgrad: bool
    ) -> FlatGroup:
        unit = CACHE_LINE_BYTES // torch.empty((), dtype=dtype).element_size()
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
        old = self._reusable.get((pg, device, dtype))
        same = old is not None and old[0] == [id(self.params[i]) for i in ordered]
        flat_p = old[1] if old is not None and same else torch.empty(total, device=device, dtype=dtype)
        flat_g = torch.full((total,), -0.0, device=device, dtype=dtype)
        group = FlatGroup(
            device=device,
            dtype=dtype,
            index=ordered,
            offsets=offsets,
            numels=numels,
            param=flat_p,
            grad=flat_g,
            pg=pg,
            exp_avg=torch.zeros(total, device=device, dtype=dtype),
            exp_avg_sq=torch.zeros(total, device=device, dtype=dtype),
            max_exp_avg_sq=torch.zeros(total, device=device, dtype=dtype) if amsgrad else None,
            steps=torch.zeros(len(ordered), dtype=torch.float32, device=device),
            buckets=[],
            aligned_end=aligned_end,
            strides=[self.params[i].stride() for i in ordered],
        )
        with torch.no_grad():
            for j, i in enumerate(ordered):
                p = self.params[i]
                if not same:
                    view = group.slot(flat_p, j, p.shape)
                    view.copy_(p)
                    p.data = own_storage(
                        view
                    )  # the parameter now lives in the flat buffer; old storage is freed
                gview = grad_alias(flat_g, offsets[j], p.shape, group.strides[j])
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
        def hook(grad: Tensor) -> None:  # runs before AccumulateGrad adds into the parameter's .grad
            if grad.requires_grad:
                raise RuntimeError("PackedAdamW does not support backward with create_graph=True")
            if grad.layout != torch.strided:
                raise RuntimeError("PackedAdamW requires dense gradients (got a sparse gradient)")
            p = self.params[i]
            if p.data_ptr() != self.ptrs[i]:
                self.check_params()
            view = self.grad_views[i]
            if view.data_ptr() != self.grad_ptrs[i]:
                self.check_rebound()
            if p.grad is None:
                # Natively AccumulateGrad stores the new gradient. A slot known to hold -0.0 becomes the
                # .grad and takes it in place (-0.0 + g is g, bit for bit); any other slot (released
                # pages, an old gradient) is left out: AccumulateGrad stores the gradient as natively,
                # and the post hook copies it into the slot (one pass, pages touched as backward
                # produces them, so gradient memory grows as native's does).
                if not (self.dirty[i] or self.produced[i] or view._version != self.known[i]):
                    p.grad = view
                    # torch.autograd.grad runs this hook but never accumulates: when the graph task
                    # ends, a slot nothing was accumulated into is no .grad again (after_backward)
                    self.attached.append(i)
                    if not self.queued:
                        self.queued = True
                        torch.autograd.Variable._execution_engine.queue_callback(self.after_backward)
            elif self.dirty[i] and p.grad is view:
                view.fill_(-0.0)
                self.dirty[i] = False

        return hook

    def _make_post_hook(self, i: int) -> Callable[[Tensor], None]:
        def post(param: Tensor) -> None:  # after AccumulateGrad wrote into .grad
            g = param.grad
            if g is None:  # a hook that ran before this one stepped and zeroed it (optimizer in backward)
                return
            if g is not self.grad_views[i] and self.kept_slot(i):  # the slot's tensor is the user's
                self.detach_kept([i])
            view = self.grad_views[i]
            if (
                g is not view
                and g.layout == torch.strided
                and g.shape == view.shape
                and g.dtype == view.dtype
                and g.device == view.device
            ):
                view.copy_(g)
                param.grad = view
                self.dirty[i] = False
            self.produced[i] = True
            self.known[i] = view._version
            if self.backward is not None and param.grad is view:
                self.backward.record(i)  # while the gradient is in cache (backward_norms=True)

        return post

    def after_backward(self) -> None:
        """The end of a backward or ``torch.autograd.grad`` in which the hook made slots ``.grad``:
        a slot nothing accumulated into (``autograd.grad`` computes gradients without accumulating)
        is no ``.grad`` again, as natively ``p.grad`` stays None."""
        self.queued = False
        attached, self.attached = self.attached, []
        for i in attached:
            view = self.grad_views[i]
            if not self.produced[i] and self.params[i].grad is view and view._version == self.known[i]:
                self.params[i].grad = None

    def ref_count(self, i: int) -> int:
        """Python references to slot ``i``'s tensor, less the one ``p.grad`` holds."""
        view = self.grad_views[i]
        return sys.getrefcount(view) - (self.params[i].grad is view)

    def refs(self) -> list[int]:
        return [self.ref_count(i) for i in range(self.n)]

    def kept_slot(self, i: int) -> bool:
        """Does someone besides this layout hold slot ``i``'s tensor (``g = p.grad`` kept)?"""
        return self.ref_count(i) > self.base_refs[i]

    def kept(self) -> list[int]:
        """The slots whose tensor the user holds (a ``.grad`` kept without a clone, for logging).
        O(parameters) reference counts: no tensor is read."""
        return [i for i in range(self.n) if self.ref_count(i) > self.base_refs[i]]

    def detach_kept(self, kept: list[int]) -> None:
        """Natively a ``.grad`` kept across ``zero_grad()`` is the user's: it keeps its values and
        the next backward makes a new one. So each kept slot tensor takes a copy of its values as
        its own memory, and the slot a new tensor over the flat buffer (:attr:`relaid`: the fused
        calls' lists are built again)."""
        with torch.no_grad():
            for i in kept:
                old = self.grad_views[i]
                own = old.detach().clone()
                old.set_(own.untyped_storage(), 0, own.shape, own.stride())
                gi, j = self.where[i]
                g = self.groups[gi]
                fresh = grad_alias(g.grad, g.offsets[j], own.shape, g.strides[j])
                if isinstance(old, GradSlot) or (self.backward is not None and self.backward.why_not is None):
                    fresh = GradSlot.of(fresh)
                if self.params[i].grad is old:
                    self.params[i].grad = None
                    self.produced[i] = False
                    self.dirty[i] = True  # the slot's memory still holds the old values
                self.grad_views[i] = fresh
                self.known[i] = fresh._version
                del old, own, fresh
                self.base_refs[i] = self.ref_count(i)
        self.relaid = True

    def adopt(self, kept: dict[int, Tensor]) -> None:
        """Natively a ``.grad`` that exists is the same tensor for good (``zero_grad(set_to_none=False)``
        zeroes it, backward accumulates into it in place), so a ``g = p.grad`` kept follows. Each
        tensor in ``kept`` (position: the tensor that was ``.grad`` before this layout was built,
        whose values its slot now holds) becomes the slot itself: rebound in place onto the slot's
        memory (its object, class and version counter kept; not through a ``GradSlot``'s ``.data``,
        which would mark it escaped) and ``.grad`` again."""
        for i, t in kept.items():
            fresh = self.grad_views[i]
            if self.params[i].grad is not fresh or not same_order(t, fresh):
                continue
            torch._C.TensorBase.data.__set__(t, fresh)  # type: ignore[attr-defined]
            self.params[i].grad = t
            self.grad_views[i] = t
            self.grad_ptrs[i] = t.data_ptr()
            self.known[i] = t._version
            del fresh

    def keep_grads(self, kept: dict[int, Tensor]) -> None:
        """Gradients backward made while stepping natively that stay ``.grad`` stepping packed again
        (position: the tensor): their values go into their slots, then each is its slot
        (:meth:`adopt`)."""
        with torch.no_grad():
            for i in kept:
                view = self.grad_views[i]
                view.copy_(kept[i])
                self.params[i].grad = view
                self.produced[i], self.dirty[i] = True, False
        self.adopt(kept)

    def check_params(self) -> None:
        """Refuse a parameter rebound or converted after packing (``p.data = t``, ``model.double()``,
        ``.half()``, ``.to(dtype)``) before anything moves, naming it."""
        for i, p in enumerate(self.params):
            if p.data_ptr() == self.ptrs[i]:
                continue
            shape = tuple(p.shape)
            packed = self.groups[self.where[i][0]].dtype
            if p.dtype != packed or p.device != self.groups[self.where[i][0]].device:
                raise RuntimeError(
                    f"parameter {i} (shape {shape}) was converted to {p.dtype} on {p.device} after PackedAdamW "
                    f"was built (model.double(), .half(), .to(...)); its packed buffers are {packed}: convert "
                    "the model first, then build the optimizer (or build a new one and load_state_dict into it)"
                )
            if p.stride() != self.strides[i]:
                raise RuntimeError(
                    f"parameter {i} (shape {shape}) was converted to another memory format (strides "
                    f"{p.stride()}, packed with {self.strides[i]}: model.to(memory_format=torch.channels_last) "
                    "or .contiguous()) after PackedAdamW was built; its packed buffers keep the memory order it "
                    "had: convert the model first, then build the optimizer (or build a new one and "
                    "load_state_dict into it)"
                )
            raise RuntimeError(
                f"parameter {i} (shape {shape}) was rebound (p.data = ...) after PackedAdamW was "
                "built; the optimizer updates its flat buffer, not the new tensor: copy into the parameter "
                "in place (p.data.copy_(...)) or build the optimizer after changing the parameters"
            )

    def settle(self) -> None:
        """Every write into the gradient slots so far was ours or backward's."""
        self.known = [v._version for v in self.grad_views]

    @classmethod
    def check_unheld(cls, params: list[Tensor], mine: Pack | None = None) -> None:
        """Refuse, before anything is modified, parameters another live :class:`PackedAdamW` has
        packed (a scheduler or callback still holding the first optimizer, a notebook cell run
        again): packing them again would move them out of the first one's buffers while it still
        hooks their backward. An optimizer no longer referenced, kept only by a reference cycle, is
        collected first (its layout is then released)."""
        for attempt in range(2):
            held = [(i, p) for i, p in enumerate(params) if cls._registry.get(id(p)) not in (None, mine)]
            if not held:
                return
            if attempt == 0:
                gc.collect()
        i, p = held[0]
        raise RuntimeError(
            f"PackedAdamW: another PackedAdamW already holds these parameters (parameter {i}, shape "
            f"{tuple(p.shape)}, and {len(held) - 1} more) and is still alive (a scheduler, a callback or "
            "a variable holding the first optimizer, a notebook cell run again); its parameters live in "
            "its flat buffers and its hooks deliver their gradients there: keep using the first one, or "
            "drop every reference to it (del optimizer, scheduler) before building the new one"
        )

    @classmethod
    def memory_ranges(cls, besides: Pack | None = None) -> list[tuple[int, int]]:
        """``[start, end)`` addresses of the flat buffers of every live layout but ``besides``, sorted
        (:func:`in_ranges`): the memory another live :class:`PackedAdamW` steps (parameters,
        gradients, state)."""
        packs = {id(pack): pack for pack in cls._registry.values() if pack is not besides}
        out: list[tuple[int, int]] = []
        for pack in packs.values():
            for g in pack.groups:
                for buf in (g.param, g.grad, g.exp_avg, g.exp_avg_sq, g.max_exp_avg_sq, g.steps):
                    if buf is not None and buf.numel():
                        out.append((buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()))
        return sorted(out)

    @classmethod
    def of(cls, parameters: list[Tensor]) -> Pack | None:
        if not parameters:
            return None
        pack = cls._registry.get(id(parameters[0]))
        if pack is None or len(parameters) != pack.n:
            return None
        if any(a is not b for a, b in zip(parameters, pack.params)):
            return None
        return pack

    @classmethod
    def covering(cls, parameters: list[Tensor]) -> tuple[Pack, Tensor] | None:
        """The pack whose every parameter ``parameters`` names once (in any order, beside tensors
        without a gradient), with the norm order of that list (:meth:`order_of`), or ``None``."""
        for p in parameters:
            pack = cls._registry.get(id(p))
            if pack is not None and pack.native:  # its gradients are backward's own: native's clip
                return None
            if pack is not None:
                perm = pack.order_of(parameters)
                return None if perm is None else (pack, perm)
        return None

    def sync_grads(self) -> list[int] | None:
        """Reconcile ``.grad`` attributes with the flat buffer.

        Returns ``None`` when every parameter's gradient was produced (the fast path), otherwise
        the sorted positions of the parameters that have a gradient this step.
        """
        for i, p in enumerate(self.params):
            if self.grad_views[i].data_ptr() != self.grad_ptrs[i]:  # p.grad.data = t: refused
                self.check_rebound()
            if p.data_ptr() != self.ptrs[i]:
                self.check_params()
            g = p.grad
            view = self.grad_views[i]
            if g is view:
                if not self.produced[i]:
                    if view._version != self.known[i]:
                        # attached by the hook and accumulated into, before the post-accumulate hook
                        # ran: a user's hook registered first (an optimizer stepped in backward)
                        self.produced[i] = True
                    else:  # attached by the hook, nothing accumulated (torch.autograd.grad)
                        p.grad = None
                continue
            if g is None:
                if self.produced[i]:  # set to None by the user (model.zero_grad(), p.grad = None)
                    self.produced[i] = False
                    self.dirty[i] = True  # the slot holds the old gradient: refilled before backward
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
        self.settle()
        self.queued, self.attached = False, []  # a backward that raised may have left its check queued
        if all(self.produced):
            return None
        return [i for i in range(self.n) if self.produced[i]]

    def check_rebound(self) -> None:
        """Refuse a gradient given other memory (``p.grad.data = t``) before anything moves.

        Natively ``t`` then *is* the gradient's memory: clipping and ``zero_()`` write into it and
        backward accumulates into it. Here every gradient lives in the flat buffer, so no copy
        could keep both that aliasing and native's bits; the error names the parameter and the
        two ways that work."""
        for i, view in enumerate(self.grad_views):
            if view.data_ptr() != self.grad_ptrs[i]:
                raise RuntimeError(
                    f"parameter {i} (shape {tuple(self.params[i].shape)}): its .grad was given other memory "
                    "(p.grad.data = t); PackedAdamW keeps every gradient in its flat buffer, so that memory "
                    "would not be the gradient as natively: write into the gradient in place "
                    "(p.grad.copy_(t)) or assign a new one (p.grad = t)"
                )

    def total_norm(self, norms: list[Tensor] | None = None, perm: Tensor | None = None) -> Tensor:
        """Total 2-norm with every gradient present, from zero-copy bucket views, or from the
        per-parameter ``norms`` of each group in packed order (:meth:`BackwardNorms.collect`),
        summed in the order ``perm`` (:meth:`order_of`; default the optimizer's parameters')."""
        if norms is None:
            norms = [self.group_norms(g) for g in self.groups]
        pieces = [n.to(self.first_device) for n in norms]
        flat = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        order = self.native_perm if perm is None else perm
        key = (id(order), flat.device)
        cached = self._perm_on.get(key)
        if cached is None or cached[0] is not order:  # the entry holds its order: an id is not reused
            if len(self._perm_on) >= 16:
                self._perm_on.clear()
            cached = self._perm_on[key] = (order, order.to(flat.device))
        return torch.linalg.vector_norm(flat.index_select(0, cached[1]), 2.0)

    def group_norms(self, g: FlatGroup) -> Tensor:
        """Per-parameter norms of one group in packed order: a bucket of equal sizes as one batched
        reduction over its zero-copy view where that is exact, native's per-tensor norms otherwise."""
        batched = g.dtype in exact_paths(g.device.type).bucketed_norm_dtypes
        rows: list[Tensor] = []
        for start, count, numel, positions in g.buckets:
            if batched and bucketable(numel, count):
                rows.append(bucket_norm(g.grad[start : start + count * numel], numel))
            else:
                views = [self.grad_views[g.index[j]] for j in positions]
                rows.append(torch.stack(native_norms(views, g.device, 2.0, None)))
        return torch.cat(rows)

    def scale_grads(self, coef: Tensor, total: Tensor) -> None:
        """Clipping's multiply. A finite ``total`` (every gradient finite): one call per buffer,
        elementwise the same as native's. Otherwise native's own call over the same per-parameter
        tensors, so that every NaN keeps the sign and payload native's loops give it."""
        if bool(total.isfinite()):
            for g in self.groups:
                g.grad.mul_(coef.to(g.device))
            return
        by_device: dict[torch.device, list[Tensor]] = {}
        for i in range(self.n):
            by_device.setdefault(self.grad_views[i].device, []).append(self.grad_views[i])
        for device, views in by_device.items():
            torch._foreach_mul_(views, coef.to(device))

    def zero_grads(self, set_to_none: bool = True) -> None:
        """``zero_grad``: with ``set_to_none`` every ``.grad`` becomes None, as natively (the buffer
        holds -0.0, the additive identity, for the next backward); without, the gradients that
        exist become +0.0, as native's ``grad.zero_()`` leaves them (and are stepped with it)."""
        self.check_rebound()
        if set_to_none:
            kept = self.kept()
            if kept:
                self.detach_kept(kept)
        if not set_to_none:
            for p in self.params:
                if p.grad is not None:
                    p.grad.zero_()  # the slot's alias, or a tensor the user assigned (copied in at the sync)
            self.settle()
            return
        if self.release_mode:
            self.release_grads()
        else:
            for g in self.groups:
                g.grad.fill_(-0.0)
            self.dirty = [False] * self.n
        self.consumed()

    def release_grads(self, skip: set[int] | frozenset[int] = frozenset()) -> None:
        """Zero the gradient buffers by giving their pages back to the OS (``release_grads``
        mode); backward's gradient for each parameter is then stored as natively and copied into
        its slot by the post-accumulate hook, so gradient memory comes back as backward produces
        it, as native's does. A buffer whose pages cannot be released (not Linux, not CPU memory)
        is filled with -0.0 instead and accumulated into in place."""
        for k, g in enumerate(self.groups):
            if k in skip:
                continue
            span = release_pages(g.grad)
            if span is None:
                g.grad.fill_(-0.0)
                for i in g.index:
                    self.dirty[i] = False
                continue
            lo, hi = span
            g.grad[:lo].fill_(-0.0)
            g.grad[hi:].fill_(-0.0)
            for i in g.index:
                self.dirty[i] = True

    def consumed(self) -> None:
        """No parameter has a gradient (after the buffer was zeroed): every ``.grad`` None, as
        native's ``zero_grad()`` leaves it."""
        for i, p in enumerate(self.params):
            if p.grad is not None:
                p.grad = None
            self.produced[i] = False
        if self.backward is not None:
            self.backward.clear()
        self.settle()

    def _drop_hooks(self) -> None:
        """Remove our hooks. A parameter that had no hook dictionary before they were registered
        gets none again where no other hook was added meanwhile: an empty dictionary left behind
        keeps autograd calling into Python for each parameter's gradient (about a microsecond
        each, every backward), which natively it does not. The post-accumulate hook's C++ wrapper
        stays with an empty dictionary (PyTorch has no call that unsets it)."""
        for h in self.hooks:
            h.remove()
        self.hooks = []
        for p, (pre, post) in zip(self.params, self.bare):
            if pre and p._backward_hooks is not None and not p._backward_hooks:
                p._backward_hooks = None
            if post and p._post_accumulate_grad_hooks is not None and not p._post_accumulate_grad_hooks:
                p._post_accumulate_grad_hooks = None  # type: ignore[assignment]

    def release(self) -> None:
        self._drop_hooks()
        for p in self.params:
            if Pack._registry.get(id(p)) is self:
                del Pack._registry[id(p)]


def in_ranges(ranges: list[tuple[int, int]], t: Tensor) -> bool:
    """Does ``t``'s memory start inside one of ``ranges`` (sorted, disjoint: :meth:`Pack.memory_ranges`)?"""
    k = bisect.bisect_right(ranges, (t.data_ptr(), sys.maxsize)) - 1
    return k >= 0 and t.data_ptr() < ranges[k][1]

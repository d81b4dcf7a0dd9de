"""``PackedAdamW``: AdamW over flat buffers, bitwise ``torch.optim.AdamW(fused=True)``."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from harness.cotangent import kernel
from harness.cotangent.clip import clip_grad_norm_
from harness.cotangent.exactness import exact_paths
from harness.cotangent.groups import NATIVE_GROUP_KEYS, check_group, lr_on, step_hooks_registered, validated
from harness.cotangent.kernel.phase import KernelPhase, kernel_blocker
from harness.cotangent.norms import check_finite, clip_coef
from harness.cotangent.pack import CACHE_LINE_BYTES, CPU_BLOCK_BYTES, Block, FlatGroup, Pack


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
        defaults = dict(validated(lr, betas, eps, weight_decay, amsgrad, maximize), **NATIVE_GROUP_KEYS)
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for k, group in enumerate(groups):  # everything checked before anything is modified
            check_group(group, k, defaults)
        self._pack: Pack | None = None
        self._release = release_grads
        super().__init__(groups, defaults)
        self._requested_update = update
        self.block_bytes = block_bytes
        self.kernel = kernel
        self._pack_all()

    def _pack_all(self) -> None:
        params: list[Tensor] = []
        group_of: list[int] = []
        for k, group in enumerate(self.param_groups):
            for p in group["params"]:
                params.append(p)
                group_of.append(k)
        amsgrad = [bool(g["amsgrad"]) for g in self.param_groups]
        self._pack = Pack(params, amsgrad, group_of, release=self._release)
        self._build_state()
        self._build_plans()

    def _repack(self) -> None:
        """Lay every group out again (after ``add_param_group`` or loading a state dict), keeping
        each parameter's state and whether it has a gradient."""
        old = self._pack
        assert old is not None
        saved = {p: {k: v.clone() for k, v in self.state[p].items()} for p in old.params if p in self.state}
        with torch.no_grad():
            for i, p in enumerate(old.params):  # a gradient that exists survives; an empty view does not
                if old.attach[i] or p.grad is not None:
                    p.grad = old.grad_views[i].clone() if old.produced[i] else None
        old.release()
        self._pack_all()
        self._restore(saved)

    def _restore(self, saved: dict[Tensor, dict[str, Tensor]]) -> None:
        pack = self._pack
        assert pack is not None
        with torch.no_grad():
            for p, st in saved.items():
                for key, view in self.state[p].items():
                    if key in st:
                        view.copy_(st[key])
                    elif key == "max_exp_avg_sq":
                        view.zero_()
            pack.uniform_steps = all(len(set(g.steps.tolist())) <= 1 for g in pack.groups) and \
                len({float(g.steps[0]) for g in pack.groups if len(g.index)}) <= 1
        self._build_plans()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Native's ``add_param_group``, then the new parameters are packed (their own buffers)."""
        if getattr(self, "_pack", None) is None:  # during construction
            super().add_param_group(param_group)
            return
        check_group(param_group, len(self.param_groups), self.defaults)
        super().add_param_group(param_group)
        self._repack()

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        raise TypeError(
            "PackedAdamW cannot be deep-copied: its parameters are views of its flat buffers, which a copy "
            "would not share; copy the model, build a new PackedAdamW over the copy and load state_dict() into it"
        )

    # -- layout --------------------------------------------------------------------------
    def _mode(self, g: FlatGroup) -> str:
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

    def _view_lists(self, g: FlatGroup, positions: list[int]) -> tuple[list[Tensor], ...]:
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

    def _lists_for(self, g: FlatGroup) -> tuple[list[Tensor], ...]:
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

    def _blocks_for(self, g: FlatGroup) -> list[Block]:
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
            return [Block(g.grad, self._lists_for(g))]
        end = g.offsets[g.aligned_end - 1] + g.numels[g.aligned_end - 1]
        size = g.grad.element_size()
        unit = CACHE_LINE_BYTES // size
        step = max(unit, self.block_bytes // size // unit * unit)
        blocks: list[Block] = []
        for s in range(0, end, step):
            e = min(s + step, end)
            xs = [g.max_exp_avg_sq[s:e]] if g.max_exp_avg_sq is not None else []
            lists = ([g.param[s:e]], [g.grad[s:e]], [g.exp_avg[s:e]], [g.exp_avg_sq[s:e]], xs, [g.steps[0]])
            blocks.append(Block(g.grad[s:e], lists))
        if g.aligned_end < len(g.index):
            blocks.append(Block(g.grad[end:], self._view_lists(g, list(range(g.aligned_end, len(g.index))))))
        blocks.reverse()
        return blocks

    def _build_plans(self) -> None:
        self._fast_lists = [self._lists_for(g) for g in self._pack.groups]
        self._blocks = [self._blocks_for(g) for g in self._pack.groups]
        self._native: KernelPhase | None | bool = False  # False: not decided yet
        self._native_why: str | None = None

    def _native_phase(self) -> KernelPhase | None:
        if self._native is False:
            why = kernel_blocker(self.kernel, self._pack.groups, self.param_groups)
            k = None if why is not None else kernel.kernel()
            if why is None and k is None:
                why = kernel.unavailable_reason()
            self._native = KernelPhase(k, self._pack) if k is not None else None
            self._native_why = why
        return self._native  # type: ignore[return-value]

    def phase_kernel(self) -> str:
        """Which code runs :meth:`clip_step_zero_grad` when every gradient is present, and why."""
        plan = self._native_phase()
        if plan is not None:
            return f"phase.c ({plan.kernel.describe()})"
        return f"torch kernels ({self._native_why})"

    def _kwargs(self, pg: int) -> dict[str, Any]:
        group = self.param_groups[pg]
        for key in ("foreach", "capturable", "differentiable"):
            if group.get(key):
                raise RuntimeError(f"PackedAdamW: parameter group {pg} sets {key}={group[key]!r}; only the fused "
                                   "path is packed")
        if group.get("fused") is False:
            raise RuntimeError(f"PackedAdamW: parameter group {pg} sets fused=False; PackedAdamW is the fused path")
        beta1, beta2 = (b.squeeze() if isinstance(b, Tensor) and b.dim() else b for b in group["betas"])
        return dict(
            amsgrad=group["amsgrad"], lr=group["lr"], beta1=beta1, beta2=beta2,
            weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
            grad_scale=None, found_inf=None,
        )

    # -- public --------------------------------------------------------------------------
    @property
    def flat_groups(self) -> list[FlatGroup]:
        """The flat buffers, one entry per (device, dtype)."""
        return self._pack.groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradient buffer and keep every ``.grad`` a view of it.

        ``set_to_none=True`` (native's default): no parameter has a gradient until backward (or
        the user) writes one; ``.grad`` stays a view rather than ``None``, so that backward
        accumulates into the flat buffer. ``set_to_none=False``: as native's ``grad.zero_()``,
        every parameter that had a gradient keeps a ``+0.0`` one and is stepped with it (moments
        and weight decay move it). With ``set_to_none=True`` the buffer is filled with
        ``-0.0``, the additive identity of IEEE arithmetic (``-0.0 + x == x`` bit for bit, ``+0.0``
        would turn a ``-0.0`` gradient into ``+0.0``), so the next backward's in-place
        accumulation leaves exactly the bits native would store. With ``release_grads=True`` the
        buffer's pages are given back to the OS instead; they read ``+0.0`` until backward, where
        each parameter's hook fills its slot with ``-0.0`` just before accumulation.
        """
        assert self._pack is not None
        self._pack.zero_grads(set_to_none)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        pack = self._pack
        assert pack is not None
        produced = pack.sync_grads()
        for gi, g in enumerate(pack.groups):
            kwargs = self._kwargs(g.pg)
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
            torch._fused_adamw_(*lists, **lr_on(kwargs, g.device))  # type: ignore[arg-type]
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
        assert pack is not None
        produced = pack.sync_grads()
        if (produced is not None or not pack.uniform_steps or float(norm_type) != 2.0 or step_hooks_registered(self)
                or pack.fill != -0.0):
            total = clip_grad_norm_(pack.params, max_norm, norm_type, error_if_nonfinite)
            self.step()
            self.zero_grad()
            return total
        plan = self._native_phase()
        if plan is not None:
            total = plan.run(float(max_norm), self.param_groups[pack.groups[0].pg], error_if_nonfinite,
                             zero=not pack.release_mode)
        else:
            total = pack.total_norm()
            check_finite(total, 2.0, error_if_nonfinite)
            coef = clip_coef(float(max_norm), total)
            for gi, g in enumerate(pack.groups):
                g.steps.add_(1)
                c = coef.to(g.device)
                kw = lr_on(self._kwargs(g.pg), g.device)
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
        """Load per-parameter state (ours or native ``AdamW``'s, older versions included: group keys
        they lack take native's defaults) into the flat buffers."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for key, value in {"amsgrad": False, "maximize": False, **NATIVE_GROUP_KEYS}.items():
                group.setdefault(key, value)
        assert self._pack is not None
        loaded = {p: dict(self.state[p]) for p in self._pack.params if p in self.state}
        self._repack()
        self._restore(loaded)

    def __del__(self) -> None:  # pragma: no cover - best effort
        pack = getattr(self, "_pack", None)
        if pack is not None:
            pack.release()

"""The gradient phase of float32 CPU buffers in ``phase.c``, one or more parameter groups.

``phase.c`` covers tensors whose element counts are multiples of 16 (one cache line), which the
flat layout puts first in each buffer (``FlatGroup.aligned_end``). The other tensors of a buffer
(a classifier's bias of 10, a stem's 24 channels) take PyTorch's own kernels in the same phase:
their norms ``torch.linalg.vector_norm`` each (native clipping's per-tensor norm on CPU), written
into the same array, so the one total and coefficient cover every tensor; their update one
``torch._fused_adamw_`` call over their views (native's call, scalar tails included), after the C
loop over the aligned run has counted the step."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cotangent.groups import fused_kwargs, lr_on
from cotangent.kernel import UPDATE_CHUNK, Hyper, Kernel, tasks_for
from cotangent.norms import check_finite
from cotangent.pack import FlatGroup, Pack
from cotangent.plans import view_lists


class _GroupPlan:
    """One flat buffer's norm tasks, its slice of the norms and its update's arguments."""

    def __init__(self, kernel: Kernel, pack: Pack, g: FlatGroup, norms: Tensor, coef: Tensor) -> None:
        self.group = g
        a = g.aligned_end  # [0, a): phase.c; [a, n): PyTorch's kernels on the tensors' views
        self.offsets = torch.tensor(g.offsets[:a], dtype=torch.int64)
        self.numels = torch.tensor(g.numels[:a], dtype=torch.int64)
        # equal sizes are adjacent in the buffer (the buckets): their rows are reduced together
        self.first, self.rows = tasks_for(g.numels[:a])
        self.norms = norms  # this buffer's slice of the phase's norms, in packed order
        self.end = g.offsets[a - 1] + g.numels[a - 1] if a else 0
        self.runs = (g.param[: self.end], g.grad[: self.end], g.exp_avg[: self.end], g.exp_avg_sq[: self.end])
        self.max_run = None if g.max_exp_avg_sq is None else g.max_exp_avg_sq[: self.end]
        tail = list(range(a, len(g.index)))
        self.tail = view_lists(pack, g, tail) if tail else None
        self.tail_norms = [norms[j] for j in tail]
        self.tail_grad = g.grad[self.end :]
        self.hyper = Hyper(
            coef=coef.data_ptr(),
            steps=g.steps.data_ptr(),
            count=len(g.index),
            sq_form=kernel.sq_form,
            chunk=UPDATE_CHUNK,
        )


class KernelPhase:
    """The gradient phase of float32 CPU buffers in ``phase.c`` (:mod:`harness.native`).

    Each flat buffer (one per parameter group) has its own norm tasks and its own hyperparameters
    (learning rate, weight decay, betas, eps, amsgrad); the per-tensor norms of every buffer go into
    one array, whose total is taken in the clip's order over all of them (``perm``) and gives
    the one clip coefficient every buffer is scaled by, as ``clip_grad_norm_`` over all parameters.
    """

    def __init__(self, kernel: Kernel, pack: Pack) -> None:
        self.kernel = kernel
        count = sum(len(g.index) for g in pack.groups)
        self.norms = torch.empty(count)
        self.scratch = torch.empty(count)
        self.coef = torch.empty(())
        self.plans: list[_GroupPlan] = []
        base = 0
        for g in pack.groups:
            n = len(g.index)
            self.plans.append(_GroupPlan(kernel, pack, g, self.norms[base : base + n], self.coef))
            base += n

    def total(
        self,
        max_norm: float,
        error_if_nonfinite: bool,
        perm: Tensor,
        norms: list[Tensor] | None = None,
    ) -> Tensor:
        """Per-tensor norms (or the given ones, one tensor per buffer in packed order: taken in
        backward), the total norm (returned) in the order ``perm`` (positions in the concatenated
        norms: :meth:`Pack.order_of`) and the clip coefficient
        (kept for :meth:`update`)."""
        k = self.kernel
        if norms is None:
            threads = torch.get_num_threads()
            for plan in self.plans:
                k.row_norms(
                    plan.group.grad, plan.offsets, plan.numels, plan.first, plan.rows, plan.norms, threads
                )
                if plan.tail is not None:
                    for grad, out in zip(plan.tail[1], plan.tail_norms):
                        torch.linalg.vector_norm(grad, 2.0, out=out)
            flat = self.norms
        else:
            flat = norms[0] if len(norms) == 1 else torch.cat(norms)
        total = torch.empty(())
        k.total_coef(flat, perm, self.scratch, max_norm, total, self.coef)
        check_finite(total, 2.0, error_if_nonfinite)
        return total

    def update(
        self,
        param_groups: list[dict[str, Any]],
        zero: bool,
        grad_scale: Tensor | None,
        found_inf: Tensor | None,
    ) -> None:
        """For every buffer, with its group's hyperparameters: step counters + 1; per element clip,
        AdamW (gradients divided by ``grad_scale`` first, the whole update skipped where
        ``found_inf`` is 1, as native's fused kernel does), -0.0 (``zero``); counters - ``found_inf``.
        The tensors outside the aligned run then take native's fused call over their views, with
        the counters already advanced (where ``found_inf`` is 1 that call returns untouched)."""
        scale = None if grad_scale is None else grad_scale.to("cpu", torch.float32)
        inf = None if found_inf is None else found_inf.to("cpu", torch.float32)
        threads = torch.get_num_threads()
        for plan in self.plans:
            g, h, group = plan.group, plan.hyper, param_groups[plan.group.pg]
            h.lr = float(group["lr"])
            h.beta1, h.beta2 = (float(b) for b in group["betas"])
            h.weight_decay, h.eps = float(group["weight_decay"]), float(group["eps"])
            h.amsgrad, h.maximize = int(bool(group["amsgrad"])), int(bool(group["maximize"]))
            h.threads, h.zero = threads, int(zero)
            h.grad_scale = None if scale is None else scale.data_ptr()
            h.found_inf = None if inf is None else inf.data_ptr()
            p, gr, m, v = plan.runs
            self.kernel.update(p, gr, m, v, plan.max_run, h)
            if plan.tail is not None:
                with torch.no_grad():
                    plan.tail_grad.mul_(self.coef)
                    kw = lr_on(fused_kwargs(group, g.pg), g.device)
                    torch._fused_adamw_(*plan.tail, **kw, grad_scale=scale, found_inf=inf)
                    if zero:
                        plan.tail_grad.fill_(-0.0)


def kernel_blocker(choice: str, groups: list[Any], param_groups: list[dict[str, Any]]) -> str | None:
    """Why an optimizer's flat buffers are outside what ``phase.c`` covers, or ``None``."""
    if choice == "torch":
        return "kernel='torch' was requested"
    if not groups:
        return "no parameters"
    for g in groups:
        if g.device.type != "cpu" or g.dtype != torch.float32:
            return (
                f"phase.c covers float32 on CPU, not {str(g.dtype).replace('torch.', '')} on {g.device.type}"
            )
        if param_groups[g.pg]["maximize"]:
            return f"maximize=True in parameter group {g.pg} (a NaN gradient's sign is not reproduced)"
    return None

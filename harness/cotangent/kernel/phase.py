"""The gradient phase of float32 CPU buffers in ``phase.c``, one or more parameter groups."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from harness.cotangent.kernel import UPDATE_CHUNK, Hyper, Kernel, tasks_for
from harness.cotangent.norms import check_finite
from harness.cotangent.pack import FlatGroup, Pack


class _GroupPlan:
    """One flat buffer's norm tasks, its slice of the norms and its update's arguments."""

    def __init__(self, kernel: Kernel, g: FlatGroup, norms: Tensor, coef: Tensor) -> None:
        self.group = g
        self.offsets = torch.tensor(g.offsets, dtype=torch.int64)
        self.numels = torch.tensor(g.numels, dtype=torch.int64)
        # equal sizes are adjacent in the buffer (the buckets): their rows are reduced together
        self.first, self.rows = tasks_for(g.numels)
        self.norms = norms  # this buffer's slice of the phase's norms, in packed order
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
            self.plans.append(_GroupPlan(kernel, g, self.norms[base : base + n], self.coef))
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
        ``found_inf`` is 1, as native's fused kernel does), -0.0 (``zero``); counters - ``found_inf``."""
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
            self.kernel.update(g.param, g.grad, g.exp_avg, g.exp_avg_sq, g.max_exp_avg_sq, h)


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
        if g.aligned_end != len(g.index):
            return f"a parameter's element count is not a multiple of 16 (parameter group {g.pg})"
        if param_groups[g.pg]["maximize"]:
            return f"maximize=True in parameter group {g.pg} (a NaN gradient's sign is not reproduced)"
    return None

"""The gradient phase of one float32 CPU buffer in ``phase.c``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from harness.cotangent.kernel import UPDATE_CHUNK, Hyper, Kernel, tasks_for
from harness.cotangent.norms import check_finite
from harness.cotangent.pack import Pack


class KernelPhase:
    """The gradient phase of one float32 CPU buffer in ``phase.c`` (:mod:`harness.native`)."""

    def __init__(self, kernel: Kernel, pack: Pack) -> None:
        g = pack.groups[0]
        self.kernel = kernel
        self.group = g
        self.offsets = torch.tensor(g.offsets, dtype=torch.int64)
        self.numels = torch.tensor(g.numels, dtype=torch.int64)
        # equal sizes are adjacent in the buffer (the buckets): their rows are reduced together
        self.first, self.rows = tasks_for(g.numels)
        self.perm = pack.native_perm  # native clipping's order, as positions in the buffer
        self.norms = torch.empty(len(g.index))
        self.scratch = torch.empty(len(g.index))
        self.coef = torch.empty(())
        self.hyper = Hyper(
            coef=self.coef.data_ptr(),
            steps=g.steps.data_ptr(),
            count=len(g.index),
            sq_form=kernel.sq_form,
            chunk=UPDATE_CHUNK,
        )

    def total(self, max_norm: float, error_if_nonfinite: bool, norms: Tensor | None = None) -> Tensor:
        """Per-tensor norms (or the given ones, in packed order: taken in backward), the total norm
        (returned) and the clip coefficient (kept for :meth:`update`)."""
        g, k = self.group, self.kernel
        if norms is None:
            norms = self.norms
            k.row_norms(
                g.grad, self.offsets, self.numels, self.first, self.rows, norms, torch.get_num_threads()
            )
        total = torch.empty(())
        k.total_coef(norms, self.perm, self.scratch, max_norm, total, self.coef)
        check_finite(total, 2.0, error_if_nonfinite)
        return total

    def update(
        self, group: dict[str, Any], zero: bool, grad_scale: Tensor | None, found_inf: Tensor | None
    ) -> None:
        """Step counters + 1; per element clip, AdamW (gradients divided by ``grad_scale`` first,
        the whole update skipped where ``found_inf`` is 1, as native's fused kernel does), -0.0
        (``zero``); counters - ``found_inf``."""
        g, k, h = self.group, self.kernel, self.hyper
        h.lr = float(group["lr"])
        h.beta1, h.beta2 = (float(b) for b in group["betas"])
        h.weight_decay, h.eps = float(group["weight_decay"]), float(group["eps"])
        h.amsgrad, h.maximize = int(bool(group["amsgrad"])), int(bool(group["maximize"]))
        h.threads, h.zero = torch.get_num_threads(), int(zero)
        scale = None if grad_scale is None else grad_scale.to("cpu", torch.float32)
        inf = None if found_inf is None else found_inf.to("cpu", torch.float32)
        h.grad_scale = None if scale is None else scale.data_ptr()
        h.found_inf = None if inf is None else inf.data_ptr()
        k.update(g.param, g.grad, g.exp_avg, g.exp_avg_sq, g.max_exp_avg_sq, h)


def kernel_blocker(choice: str, groups: list[Any], param_groups: list[dict[str, Any]]) -> str | None:
    """Why an optimizer's flat buffers are outside what ``phase.c`` covers, or ``None``."""
    if choice == "torch":
        return "kernel='torch' was requested"
    if len(groups) != 1:
        return "parameters span more than one parameter group or (device, dtype)"
    g = groups[0]
    if g.device.type != "cpu" or g.dtype != torch.float32:
        return f"phase.c covers float32 on CPU, not {str(g.dtype).replace('torch.', '')} on {g.device.type}"
    if g.aligned_end != len(g.index):
        return "a parameter's element count is not a multiple of 16"
    if param_groups[g.pg]["maximize"]:
        return "maximize=True (a NaN gradient's sign is not reproduced)"
    return None

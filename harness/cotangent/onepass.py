"""The one-pass gradient phase of :meth:`PackedAdamW.clip_step_zero_grad` (clip + step + zero_grad)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from harness.cotangent.clip import clip_grad_norm_
from harness.cotangent.groups import amp_tensors, fused_kwargs, lr_on, step_hooks_registered
from harness.cotangent.norms import check_finite, clip_coef

if TYPE_CHECKING:
    from harness.cotangent.adamw import PackedAdamW


def clip_step_zero_grad(opt: PackedAdamW, max_norm: float, norm_type: float, error_if_nonfinite: bool) -> Tensor:
    """The body of :meth:`PackedAdamW.clip_step_zero_grad` (see its docstring)."""
    pack = opt._pack
    assert pack is not None
    produced = pack.sync_grads()
    if produced is not None or not pack.uniform_steps or float(norm_type) != 2.0 or step_hooks_registered(opt):
        total = clip_grad_norm_(pack.params, max_norm, norm_type, error_if_nonfinite)
        opt.step()
        opt.zero_grad()
        return total
    plan = opt._native_phase()
    remembered = pack.backward.collect() if pack.backward is not None else None
    if plan is not None:
        total = plan.total(float(max_norm), error_if_nonfinite, None if remembered is None else remembered[0])
        coef = plan.coef
    else:
        total = pack.total_norm(remembered)
        check_finite(total, 2.0, error_if_nonfinite)
        coef = clip_coef(float(max_norm), total)
    opt._phase = (total, coef)
    try:
        opt.step()
    finally:
        skipped, opt._phase = opt._phase is not None, None
    if skipped:  # a wrapper of step did not call it: the clip and zero_grad happen all the same
        pack.scale_grads(coef, total)
        opt.zero_grad()
    return total


def phase_update(opt: PackedAdamW, total: Tensor, coef: Tensor) -> None:
    """Scale, update and zero every block (or ``phase.c``'s one loop), then every ``.grad`` None."""
    pack = opt._pack
    assert pack is not None
    plan = opt._native_phase()
    cpu = any(g.device.type == "cpu" for g in pack.groups)
    if cpu and not bool(total.isfinite()):
        # A non-finite gradient: native's calls over per-parameter tensors, so that every NaN
        # takes the sign and payload native's loops (vector body or scalar tail) give it.
        pack.scale_grads(coef, total)
        opt._update(per_parameter=True)
        pack.zero_grads(True)
        return
    if plan is not None:
        scale, inf = amp_tensors(opt, torch.device("cpu"))
        plan.update(opt.param_groups[pack.groups[0].pg], not pack.release_mode, scale, inf)
    else:
        for gi, g in enumerate(pack.groups):
            g.steps.add_(1)
            c = coef.to(g.device)
            scale, inf = amp_tensors(opt, g.device)
            kw = lr_on(fused_kwargs(opt.param_groups[g.pg], g.pg), g.device)
            for block in opt._blocks[gi]:
                block.grad.mul_(c)
                torch._fused_adamw_(*block.lists, **kw, grad_scale=scale, found_inf=inf)
                if not pack.release_mode:
                    block.grad.fill_(-0.0)
            if inf is not None:
                g.steps.sub_(inf)
    if pack.release_mode:
        pack.release_grads()
    pack.consumed()  # every .grad None, as native's zero_grad() leaves it

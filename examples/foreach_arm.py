"""A plug-in arm: native clipping and AdamW on the ``foreach`` (multi-tensor) path instead of ``fused``.

A real, different change: the same algorithm on other kernels, so the arithmetic may differ in
its low bits (``harness compare-arms native examples.foreach_arm:build`` shows how much) and the
speed may differ (the protocol ``examples/foreach.yaml`` measures it). It follows the contract in
``harness/arms.py``: it receives the model's parameters and training settings, returns an object
with ``phase()``, ``set_lr()``, ``zero_grad()`` and ``optimizer``, and never touches the clock,
the batches or the seed.
"""

from __future__ import annotations

import torch

from harness.arms import ArmContext


class ForeachAdamW:
    def __init__(self, ctx: ArmContext) -> None:
        t = ctx.train
        self.params = ctx.params
        self.max_norm = t.clip_norm
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=t.lr,
            betas=(t.beta1, t.beta2),
            eps=t.eps,
            weight_decay=t.weight_decay,
            foreach=True,
        )

    def phase(self) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm, foreach=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)


def build(ctx: ArmContext) -> ForeachAdamW:
    return ForeachAdamW(ctx)

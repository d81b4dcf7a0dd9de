"""The study's arms: the four cells of the 2x2 factorial (norms x optimizer) over one contract."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from harness.cotangent import PackedAdamW, clip_grad_norm_
from harness.cotangent.clip import grads_as_params
from harness.cotangent.pack import CPU_BLOCK_BYTES, Pack
from harness.names import ARMS

__all__ = ["ARMS", "Arm", "build_arm"]




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
    pack = Pack.of(plist)
    if pack is None:
        return torch.nn.utils.clip_grad_norm_(plist, max_norm)
    produced = pack.sync_grads()
    idx = range(pack.n) if produced is None else produced
    grads = [pack.grad_views[i] for i in idx]
    return torch.nn.utils.clip_grad_norm_(grads_as_params(grads), max_norm)  # type: ignore[arg-type]

"""Arms: what a run does between ``loss.backward()`` and the next forward, behind one small contract.

The contract (built-in arms and plug-ins alike). An arm is a function ``build(ctx: ArmContext) ->
GradientPhase``, named in a protocol by a built-in name (``native``, ``bucketed``, ``packed``,
``cotangent``: the four cells of the study's 2x2 factorial) or by import path
(``mypkg.arms:build``).

* It receives :class:`ArmContext`: the model, its parameters (unique, in order), the
  configuration's training settings (learning rate, betas, eps, weight decay, clipping threshold)
  and the device.
* It returns a :class:`GradientPhase`: ``phase()``, which the worker calls after every backward
  (clip, update, zero the gradients: everything until the next forward, timed with the step),
  ``set_lr(lr)``, which the worker calls before every step with the schedule's value, and
  ``zero_grad()``, and it exposes its ``optimizer`` (state dicts, reports).
* It must not touch the clock, the data order or the seed: the worker times the step around it,
  draws the batches itself, and checks that building the arm and its first phase leave the global
  random state as they found it (a plug-in that draws random numbers fails the run, named).

Like AlgoPerf's ``init_optimizer_state`` / ``update_params``, but smaller: the harness owns the
model, the data and the loss; the arm owns only the gradient phase.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from cotangent import PackedAdamW, clip_grad_norm_
from cotangent.clip import grads_as_params
from cotangent.pack import CPU_BLOCK_BYTES, Pack
from harness.names import ARMS
from harness.plugins import is_plugin

if TYPE_CHECKING:
    from harness.config import TrainConfig

__all__ = ["ARMS", "Arm", "ArmContext", "GradientPhase", "build_arm", "is_plugin", "resolve"]


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
        if (
            self.max_norm is not None
            and self.clip_fn is clip_grad_norm_
            and isinstance(self.optimizer, PackedAdamW)
        ):
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
    release_grads: bool | str = False,
    backward_norms: bool = False,
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
        optimizer = PackedAdamW(
            plist,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            update=update,
            block_bytes=block_bytes,
            kernel=kernel,
            release_grads=release_grads,
            backward_norms=backward_norms,
            mode="packed",  # a study's arm is the packed method; mode="auto" would measure and may switch
        )
    else:
        optimizer = torch.optim.AdamW(
            plist, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True
        )
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
    return torch.nn.utils.clip_grad_norm_(grads_as_params(grads), max_norm)


# --------------------------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArmContext:
    """What an arm's ``build`` receives."""

    model: torch.nn.Module
    params: list[torch.nn.Parameter]  # the model's parameters, unique, in order
    train: TrainConfig  # lr, beta1, beta2, eps, weight_decay, clip_norm, ...
    device: torch.device


class GradientPhase(Protocol):
    """What an arm's ``build`` returns (:class:`Arm` is the built-in one)."""

    optimizer: torch.optim.Optimizer

    def phase(self) -> Tensor | None: ...

    def set_lr(self, lr: float) -> None: ...

    def zero_grad(self) -> None: ...


def _builtin(name: str) -> Callable[[ArmContext], GradientPhase]:
    def build(ctx: ArmContext) -> GradientPhase:
        t = ctx.train
        return build_arm(
            name,
            ctx.params,
            lr=t.lr,
            betas=(t.beta1, t.beta2),
            eps=t.eps,
            weight_decay=t.weight_decay,
            max_norm=t.clip_norm,
        )

    return build


def resolve(name: str) -> Callable[[ArmContext], GradientPhase]:
    """The ``build`` function of a built-in arm or of a plug-in (``module:function``)."""
    if name in ARMS:
        return _builtin(name)
    if not is_plugin(name):
        raise ValueError(
            f"unknown arm {name!r}: a built-in name ({', '.join(ARMS)}) or an import path module:function"
        )
    module, _, fn = name.partition(":")
    build = getattr(importlib.import_module(module), fn, None)
    if not callable(build):
        raise ValueError(f"arm {name!r}: {module} has no function {fn}")
    return build

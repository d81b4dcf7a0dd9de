"""The one-pass gradient phase (clip + step + zero_grad) of :class:`~cotangent.PackedAdamW`,
a part of that class kept in its own module (:class:`OnePass`, one of its bases)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from cotangent.clip import clip_grad_norm_
from cotangent.groups import amp_tensors, fused_kwargs, lr_on, step_hooks_registered
from cotangent.norms import check_finite, clip_coef

if TYPE_CHECKING:
    from cotangent.kernel.phase import KernelPhase
    from cotangent.pack import Block, Pack


class OnePass(torch.optim.Optimizer):
    """``clip_step_zero_grad`` and the update it runs inside ``step``: the base of
    :class:`~cotangent.PackedAdamW`, which sets the attributes and implements the methods
    declared here (so this module never imports the optimizer's)."""

    _pack: Pack
    _phase: tuple[Tensor, Tensor, bool] | None  # (total, coef, set_to_none) of a phase routed through step
    _blocks: list[list[Block]]
    _armed: dict | None = None  # clip_in_step's arguments
    _in_armed = False
    last_total_norm: Tensor | None = None
    #: Steps that took the one-pass phase (not native's three calls), since construction.
    one_pass_steps = 0

    def _native_phase(self) -> KernelPhase | None:
        raise NotImplementedError

    def _update(self, per_parameter: bool = False) -> None:
        raise NotImplementedError

    def _mark(self, positions: list[int] | None) -> None:
        raise NotImplementedError

    def _check_layout(self) -> None:
        raise NotImplementedError

    def _own_params(self) -> list[Tensor]:
        raise NotImplementedError

    mode: str
    _quiet: int

    def _tick(self) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def clip_step_zero_grad(
        self,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
        *,
        parameters: Tensor | Iterable[Tensor] | None = None,
        set_to_none: bool = True,
    ) -> Tensor:
        """The whole gradient phase in one pass over memory; returns the total gradient norm.

        Bit for bit the same parameters, optimizer state, gradients and return value as::

            total = clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite)
            optimizer.step()
            optimizer.zero_grad(set_to_none)

        ``parameters`` is what the replaced ``clip_grad_norm_`` call takes (``model.parameters()``
        in most loops): the total norm sums the per-parameter norms in that order, so it is the
        same float. ``None``: the optimizer's parameters in the order it was given them, which is
        only known to be the replaced call's order with one parameter group; with more than one
        (decay and no-decay groups) ``parameters`` is required and its absence is refused before
        anything is modified (the groups' order would change the total norm's last bit). A
        ``parameters`` that names every parameter of the optimizer once, in any order, plus any
        others that have no gradient, takes the one pass; anything else (a parameter left out,
        named twice, another tensor with a gradient) makes the three calls.

        The per-parameter norms are read first (they decide the clip coefficient), or taken from
        backward (``backward_norms=True``, where still valid); then, block by block
        (:func:`~cotangent.plans.blocks_for`), the gradients are scaled by the coefficient,
        the fused AdamW kernel updates the block, and the block's gradients are zeroed while they are
        still in cache. Every coordinate goes through the same operations as in the three calls; only
        the order in which memory is visited changes. Where :meth:`phase_kernel` names ``phase.c``,
        the same operations run as two C calls (norms, total and coefficient; then, per parameter
        group with its own hyperparameters, one loop that scales, updates and zeroes each element).
        The update runs inside ``self.step()``, so whatever wraps ``step`` (an LR scheduler counting
        steps, a profiler) sees one step, as around the three calls. Cases off the fast path (a
        gradient missing this step, per-parameter step counts, another norm type, step hooks) make
        the three calls.

        Traced by Dynamo (inside a ``torch.compile``-d train step, or compiled alone) it is the
        three calls as compiled native runs them: native's ``clip_grad_norm_`` traced into the
        graph (Inductor's norms, not eager ones), then :meth:`step` and :meth:`zero_grad`, which
        run eagerly (the fused kernel the compiled native step calls too).
        """
        if torch.compiler.is_compiling():
            total = torch.nn.utils.clip_grad_norm_(
                self._clip_list(parameters), max_norm, norm_type, error_if_nonfinite
            )
            self.step()
            self.zero_grad(set_to_none)
            return total
        return self._phase_then_tick(max_norm, norm_type, error_if_nonfinite, parameters, set_to_none)

    def _phase_then_tick(
        self,
        max_norm: float,
        norm_type: float,
        error_if_nonfinite: bool,
        parameters: Tensor | Iterable[Tensor] | None,
        set_to_none: bool,
    ) -> Tensor:
        """The eager phase in the optimizer's mode; its end (not its own ``zero_grad``) ends the iteration."""
        self._quiet += 1
        try:
            if self.mode == "native":  # native's three calls, the optimizer stepping natively
                total = torch.nn.utils.clip_grad_norm_(
                    self._clip_list(parameters), max_norm, norm_type, error_if_nonfinite
                )
                self.step()
                self.zero_grad(set_to_none)
            else:
                total = self._one_pass(max_norm, norm_type, error_if_nonfinite, parameters, set_to_none)
        finally:
            self._quiet -= 1
        if not self._quiet:
            self._tick()
        return total

    @torch.compiler.disable  # traced by Dynamo its self-checks would be compiled; it runs eagerly
    def _one_pass(
        self,
        max_norm: float,
        norm_type: float,
        error_if_nonfinite: bool,
        parameters: Tensor | Iterable[Tensor] | None,
        set_to_none: bool,
    ) -> Tensor:
        self._check_layout()
        clip_list = self._clip_list(parameters)
        produced = self._pack.sync_grads()
        perm = self._pack.order_of(clip_list)
        if self._off_fast_path(produced, perm, norm_type, set_to_none):
            total = clip_grad_norm_(clip_list, max_norm, norm_type, error_if_nonfinite)
            self.step()
            self.zero_grad(set_to_none)
            return total
        total, coef = self._total_and_coef(max_norm, error_if_nonfinite, perm)
        self._step_in_phase(total, coef, set_to_none)
        return total

    def _clip_list(self, parameters: Tensor | Iterable[Tensor] | None) -> list[Tensor]:
        """The tensors the replaced clip takes: ``parameters`` as a list, or the optimizer's own
        (refused, before anything is modified, when they span more than one parameter group)."""
        if parameters is None:
            spanned = [k for k, g in enumerate(self.param_groups) if g["params"]]
            if len(spanned) > 1:
                raise ValueError(
                    f"clip_step_zero_grad: the parameters span {len(spanned)} parameter groups, so the order "
                    "in which the clip it replaces sums their norms is not known (it changes the total "
                    "norm's last bit): pass parameters=model.parameters(), or whatever your "
                    "clip_grad_norm_ call takes"
                )
            return self._pack.params if self._pack is not None else self._own_params()
        return [parameters] if isinstance(parameters, Tensor) else list(parameters)

    def _off_fast_path(
        self, produced: list[int] | None, perm: Tensor | None, norm_type: float, set_to_none: bool
    ) -> bool:
        """Whether this phase makes native's three calls instead of the one pass."""
        pack = self._pack
        return (
            produced is not None
            or perm is None
            or not pack.uniform_steps
            or float(norm_type) != 2.0
            or step_hooks_registered(self)
            or (set_to_none and bool(pack.kept()))  # a kept .grad: zero_grad gives it its own memory first
        )

    def _total_and_coef(
        self, max_norm: float, error_if_nonfinite: bool, perm: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The total norm (in the replaced clip's order ``perm``) and the clip coefficient."""
        assert perm is not None  # off the fast path without it
        pack = self._pack
        plan = self._native_phase()
        remembered = pack.backward.collect() if pack.backward is not None else None
        if plan is not None:
            total = plan.total(float(max_norm), error_if_nonfinite, perm, remembered)
            return total, plan.coef
        total = pack.total_norm(remembered, perm)
        check_finite(total, 2.0, error_if_nonfinite)
        return total, clip_coef(float(max_norm), total)

    def _step_in_phase(self, total: Tensor, coef: Tensor, set_to_none: bool) -> None:
        """``self.step()`` carrying the phase, so whatever wraps ``step`` sees one step; a wrapper
        that did not call it leaves the clip and ``zero_grad`` to be done here all the same."""
        pack = self._pack  # the layout the total was taken on
        self._phase = (total, coef, bool(set_to_none))
        try:
            self.step()
        finally:
            skipped, self._phase = self._phase is not None, None
        if skipped:
            pack.scale_grads(coef, total)
            self.zero_grad(set_to_none)

    def clip_in_step(
        self,
        max_norm: float | None,
        parameters: Tensor | Iterable[Tensor] | None = None,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
    ) -> None:
        """Make every later ``step()`` the whole phase, for loops one does not own.

        A training framework that calls ``optimizer.step()`` and then ``zero_grad()`` (the Hugging
        Face ``Trainer``, accelerate, Lightning) takes the one pass of :meth:`clip_step_zero_grad`
        with its clipping turned off (``max_grad_norm=0``, no ``gradient_clip_val``) and this
        optimizer told what to clip: each ``step()`` is then bit for bit::

            clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite)
            step()
            zero_grad()  # set_to_none, as native's default

        and the total norm is kept in :attr:`last_total_norm`. ``step(closure)`` (Lightning's
        automatic optimization) runs the closure first, as native's step does. ``parameters`` is the list the
        replaced clip takes (``model.parameters()``; required with more than one parameter
        group, as for :meth:`clip_step_zero_grad`); it is read once, here. The framework's own
        ``zero_grad()`` after the step finds every ``.grad`` None, as natively. A ``GradScaler``
        step that has not unscaled the gradients first is refused (the clip would see scaled
        ones); after ``scaler.unscale_(optimizer)`` it is the native order. Step pre/post hooks
        are refused at the step (they would run around the whole phase, not between the clip and
        ``zero_grad``). :attr:`one_pass_steps` counts the steps that took the one pass.
        ``max_norm=None`` disarms.
        """
        if max_norm is None:
            self._armed = None
            return
        plist = (
            None
            if parameters is None
            else ([parameters] if isinstance(parameters, Tensor) else list(parameters))
        )
        if plist is None and sum(1 for g in self.param_groups if g["params"]) > 1:
            raise ValueError(
                "clip_in_step: the parameters span more than one parameter group: pass "
                "parameters=model.parameters(), or whatever the replaced clip_grad_norm_ takes"
            )
        self._armed = {
            "max_norm": float(max_norm),
            "norm_type": float(norm_type),
            "error_if_nonfinite": bool(error_if_nonfinite),
            "parameters": plist,
        }

    def _armed_step(self) -> None:
        """``step()`` while :meth:`clip_in_step` is armed: the whole phase."""
        if getattr(self, "grad_scale", None) is not None:
            raise RuntimeError(
                "clip_in_step: GradScaler.step was called on scaled gradients; call "
                "scaler.unscale_(optimizer) before scaler.step(optimizer), as before a native clip"
            )
        if step_hooks_registered(self):
            raise RuntimeError(
                "clip_in_step: step pre/post hooks are registered; they run around step(), while the clip it "
                "replaces ran before them and zero_grad after them, so their order would change: call "
                "clip_step_zero_grad in the loop instead, or remove the hooks"
            )
        armed = self._armed
        assert armed is not None
        self._in_armed = True
        try:
            self.last_total_norm = self.clip_step_zero_grad(
                armed["max_norm"],
                armed["norm_type"],
                armed["error_if_nonfinite"],
                parameters=armed["parameters"],
            )
        finally:
            self._in_armed = False

    def _phase_update(self, total: Tensor, coef: Tensor, set_to_none: bool = True) -> None:
        """Scale, update and zero every block (or ``phase.c``'s loops), then every ``.grad`` None
        (``set_to_none``) or +0.0 (as native's ``zero_grad(set_to_none=False)``)."""
        pack = self._pack
        plan = self._native_phase()
        self.one_pass_steps += 1
        self._mark(None)  # the fast path has every gradient: every parameter has state from here on
        cpu = any(g.device.type == "cpu" for g in pack.groups)
        if cpu and not bool(total.isfinite()):
            # A non-finite gradient: native's calls over per-parameter tensors, so that every NaN
            # takes the sign and payload native's loops (vector body or scalar tail) give it.
            pack.scale_grads(coef, total)
            self._update(per_parameter=True)
            pack.zero_grads(set_to_none)
            return
        zero = set_to_none and not pack.release_mode  # -0.0 written in the pass, while in cache
        if plan is not None:
            scale, inf = amp_tensors(self, torch.device("cpu"))
            plan.update(self.param_groups, zero, scale, inf)
        else:
            for gi, g in enumerate(pack.groups):
                g.steps.add_(1)
                c = coef.to(g.device)
                scale, inf = amp_tensors(self, g.device)
                kw = lr_on(fused_kwargs(self.param_groups[g.pg], g.pg), g.device)
                for block in self._blocks[gi]:
                    block.grad.mul_(c)
                    torch._fused_adamw_(*block.lists, **kw, grad_scale=scale, found_inf=inf)
                    if zero:
                        block.grad.fill_(-0.0)
                if inf is not None:
                    g.steps.sub_(inf)
        if not set_to_none:  # every gradient stays, +0.0, as native's grad.zero_()
            pack.zero_grads(False)
            return
        if pack.release_mode:
            pack.release_grads()
        pack.consumed()  # every .grad None, as native's zero_grad() leaves it

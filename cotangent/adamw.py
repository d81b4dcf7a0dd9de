"""``PackedAdamW``: AdamW over flat buffers, bitwise ``torch.optim.AdamW(fused=True)``."""

from __future__ import annotations

import collections
import gc
import logging
import platform
import warnings
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from torch import Tensor

import cotangent.kernel as kernel
from cotangent.backnorms import BackwardNorms
from cotangent.exactness import exact_paths
from cotangent.groups import (
    NATIVE_GROUP_KEYS,
    amp_tensors,
    check_group,
    check_native_kwargs,
    check_unshared,
    fused_kwargs,
    lr_on,
    sharers,
    validated,
)
from cotangent.kernel.phase import KernelPhase, kernel_blocker
from cotangent.modes import Chooser, resolve, user_stacklevel
from cotangent.onepass import OnePass
from cotangent.pack import CPU_BLOCK_BYTES, RELEASE_MIN_BYTES, FlatGroup, Pack, in_ranges, same_order
from cotangent.plans import blocks_for, lists_for, view_lists
from cotangent.states import (
    STATE_KEYS,
    Changes,
    WatchedState,
    check_fits,
    check_kept,
    check_loadable,
    kept_on_load,
    planned_state,
    saved_state,
    slot_misfit,
    to_state_tensors,
    watched_by,
    watched_entry,
    watched_state,
)


def own_copy(t: Tensor) -> Tensor:
    """A copy of ``t`` with storage of its own and ``t``'s strides (its memory order), as native
    keeps a parameter, its gradient and its state."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


class PackedAdamW(OnePass):
    """AdamW over flat buffers, bitwise equal to ``torch.optim.AdamW(..., fused=True)``.

    On construction every parameter becomes a view of one flat buffer per (device, dtype),
    equal-size parameters adjacent; gradients are preallocated views of a flat gradient buffer
    in the same order, so backward accumulates into it in place; both moments live in flat
    buffers in the same order; the step counters are one float32 buffer.

    Parameters
    ----------
    params
        Parameters, or parameter groups as native's (each with its own lr, betas, eps,
        weight_decay, amsgrad; decay and no-decay groups take ``phase.c`` too); dense
        floating-point parameters; shared parameters are packed and updated once, a parameter
        listed twice is refused.
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
        -0.0) and backward accumulates into it in place: the fast phase, for peak memory above
        native's by up to the gradients' bytes, which native frees after each step (0.9-3.0% on
        the benchmark's models, ``docs/benchmark.md``). ``True``: zeroing gives the gradient
        buffer's pages back to the OS (``madvise``); when backward reaches a parameter, its
        gradient is stored as natively and copied into its slot, so gradient memory comes back as
        backward produces it and peak memory follows native's, at the price of the pages' faults
        in the next backward (the phase's gain is lost on CPU). ``"auto"``: ``True`` on Linux when
        the gradients take at least :data:`RELEASE_MIN_BYTES`, else ``False``. Same bits in
        every mode.
    kernel
        ``"auto"``: :meth:`clip_step_zero_grad` runs in C (:mod:`cotangent.kernel`) where that is
        verified bitwise (float32 CPU buffers, one per parameter group, and a kernel that built
        and passed its self-check; parameters whose sizes are not multiples of 16 elements take
        PyTorch's kernels inside that phase); ``"torch"``: always PyTorch's
        kernels. Speed only: both give the same bits. :meth:`phase_kernel` says which runs.
    backward_norms
        ``True``: each gradient's norm is computed when backward finishes it, while it is in cache
        (:mod:`~cotangent.backnorms`), and :meth:`clip_step_zero_grad` (and
        :func:`clip_grad_norm_` over these parameters) use it if the gradient's version counters
        are unchanged, so the phase reads the gradients once. Same bits for every write PyTorch
        counts (accumulation, clipping by the user, in-place ops), and for writes through
        ``p.grad.data``, ``p.grad.numpy()`` or DLPack, which mark the slot so that its norm is
        computed again (:class:`~cotangent.backnorms.GradSlot`). Not seen: those forms
        on a view or a detached copy of a gradient, and raw pointers; hence ``False`` by default.
    mode
        ``"packed"``: gradients are delivered into the flat buffer and the phase is packed (all of
        the above). ``"native"``: backward stores its own gradients, :meth:`clip_step_zero_grad`
        is ``torch.nn.utils.clip_grad_norm_``, then native's fused AdamW call over per-parameter
        tensors and native's ``zero_grad``; the state stays in the flat buffers. ``"auto"``:
        packed, then measured over the first iterations (:mod:`cotangent.modes`): where packed
        iterations are slower than native ones, it steps natively from then on and says so once
        (a ``UserWarning`` naming the measurement; :attr:`mode_report`). ``None`` (default): the
        environment variable ``COTANGENT_MODE``, else ``"auto"``. Every mode, and every switch
        between them (:meth:`set_mode`), gives native's bits: the state is carried over exactly.
    foreach, capturable, differentiable, fused
        As ``torch.optim.AdamW``, at the values that keep native on its fused kernel (``fused``
        None or True, ``foreach`` None or False, the others False); any other value is refused,
        naming it. ``params`` may be ``named_parameters()``, as natively (names go to each
        group's ``param_names``).

    Notes
    -----
    Requirements, each refused with an error naming it: dense floating-point parameters, each
    listed once; no sparse gradients; no ``create_graph`` backward. A parameter whose gradient was
    not produced in a step is left untouched by that step, as native AdamW leaves a ``None``
    gradient; optimizer state exists as native's does (an entry from a parameter's first step
    with a gradient, none before and none for a parameter that never had one), and
    ``state_dict()`` equals native's at every step. Each parameter lives in the flat buffer's
    memory through a storage of its own, so checkpoint writers (safetensors, ``torch.save``,
    ``torch.distributed.checkpoint``) keep every tensor. A ``.grad`` replaced by the user is
    copied into the flat buffer at the next step and the view restored; a ``.grad`` set to ``None`` counts as no gradient. ``.grad`` is None
    exactly where native's is (after ``zero_grad()``, before backward reaches a parameter).

    Training-code patterns (``torch.autograd.grad`` over the parameters, an optimizer stepped in
    backward, ``optimizer.state`` reset or its tensors replaced, ``param_groups`` changed in place,
    a ``.grad`` kept across ``zero_grad()``, views of parameters) give native's bits or are
    refused by name before anything moves; ``docs/method.md`` lists each.

    As native fused AdamW, :meth:`step` takes part in ``GradScaler``'s protocol
    (``_step_supports_amp_scaling``): it divides the gradients by ``self.grad_scale`` inside the
    fused kernel and skips the update where ``self.found_inf`` is 1 (the step counters get + 1,
    then - ``found_inf``), and :meth:`clip_step_zero_grad` does the same within the phase.
    """

    _step_supports_amp_scaling = True
    _pack: Pack  # set by _pack_all once the groups exist (add_param_group during construction sees none)

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
        release_grads: bool | str = False,
        backward_norms: bool = False,
        mode: str | None = None,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        check_native_kwargs(
            foreach=foreach, capturable=capturable, differentiable=differentiable, fused=fused
        )
        if kernel not in ("auto", "torch"):
            raise ValueError(f"kernel must be auto or torch, not {kernel!r}")
        if update not in ("auto", "views", "aligned", "flat"):
            raise ValueError(f"update must be auto, views, aligned or flat, not {update!r}")
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, not {block_bytes}")
        if backward_norms not in (True, False):
            raise ValueError(f"backward_norms must be True or False, not {backward_norms!r}")
        if release_grads not in (True, False, "auto"):
            raise ValueError(f"release_grads must be True, False or 'auto', not {release_grads!r}")
        defaults = dict(validated(lr, betas, eps, weight_decay, amsgrad, maximize), **NATIVE_GROUP_KEYS)
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for k, group in enumerate(groups):  # everything checked before anything is modified
            check_group(group, k, defaults)
        Pack.check_unheld([p for g in groups for p in g["params"]])
        check_unshared([p for g in groups for p in g["params"]])
        if release_grads == "auto":  # the OS can take pages back (madvise): gradient memory as native's
            grad_bytes = sum(
                p.numel() * p.element_size() for g in groups for p in {id(q): q for q in g["params"]}.values()
            )
            release_grads = platform.system() == "Linux" and grad_bytes >= RELEASE_MIN_BYTES
        self._release = bool(release_grads)
        self._backward_norms = bool(backward_norms)
        self._phase: tuple[Tensor, Tensor, bool] | None = None  # (total, coef, set_to_none) of a phase
        self._stated: set[int] = set()  # ids of the parameters with state (native's lazy state: _mark)
        self._changes = Changes()  # raised by any write into self.state or an entry (_sync_state)
        self._init_mode(resolve(mode))  # checked (ValueError) before anything is modified
        super().__init__(groups, defaults)
        self._requested_update = update
        self.block_bytes = block_bytes
        self.kernel = kernel
        self._lay_out()

    def _init_mode(self, asked: str) -> None:
        #: ``"packed"`` or ``"native"``: how the optimizer steps now (:meth:`set_mode`).
        self.mode = "native" if asked == "native" else "packed"
        self._chooser = Chooser() if asked == "auto" else None
        #: What ``mode="auto"`` measured and chose, once it has (else None).
        self.mode_report: str | None = None
        self._stepped = False  # a step ran since the last end of a phase (_tick)
        self._quiet = 0  # inside clip_step_zero_grad: its own zero_grad is not the phase's end
        #: Native for good: the parameters, gradients and state have storage of their own, the
        #: packed buffers are freed and ``_pack`` is None (:meth:`_own_storage`).
        self._own = False
        #: the report of a native-for-good decision whose move is still to come (_settle_own)
        self._pending_own: str | None = None
        self._warned_own = False
        self._warned_grad = False  # a natively made .grad moved into the packed buffer (_switch)

    def _lay_out(self) -> None:
        """The layout at construction: packed, then, for ``mode="native"``, native for good. A
        ``.grad`` that exists stays the same tensor (:meth:`_grads_to_keep`)."""
        self._pack_all(self._grads_to_keep())
        if self.mode == "native" and self._chooser is None:
            self._own_storage()

    def _pack_all(
        self, grads: dict[int, Tensor] | None = None, held: dict[int, dict[str, Tensor]] | None = None
    ) -> None:
        """Lay the groups out. ``grads`` (by parameter id: its ``.grad`` now) and ``held`` (by
        parameter id: its state tensors now) stay those tensors, each rebound in place onto its
        slot (:meth:`Pack.adopt`, :meth:`_build_state`), as natively they are the same for good."""
        params: list[Tensor] = []
        group_of: list[int] = []
        for k, group in enumerate(self.param_groups):
            for p in group["params"]:
                params.append(p)
                group_of.append(k)
        amsgrad = [bool(g["amsgrad"]) for g in self.param_groups]
        self._pack = Pack(
            params, amsgrad, group_of, release=self._release, reuse=getattr(self, "_pack", None)
        )
        if self._backward_norms:
            self._pack.backward = BackwardNorms(self._pack)
            self._pack.base_refs = self._pack.refs()  # its slots are new tensors
        if grads:  # after base_refs: a reference the user holds to an adopted tensor counts as kept
            self._pack.adopt({i: grads[id(p)] for i, p in enumerate(params) if id(p) in grads})
        if self.mode == "native":
            self._pack.to_native(release=self._chooser is None)
        self._build_state(held or {})
        self._build_plans()
        # the groups as laid out: a group or a parameter list changed in place is seen (_sync_groups)
        self._laid_out = [(g, list(map(id, g["params"]))) for g in self.param_groups]
        if self._chooser is not None:  # CUDA kernels run asynchronously: auto times them done
            cuda = any(g.device.type == "cuda" for g in self._pack.groups)
            self._chooser.sync = torch.cuda.synchronize if cuda else None

    def _repack(self, keep_state: bool = True) -> None:
        """Lay every group out again (after ``add_param_group``, ``param_groups`` changed in place
        or loading a state dict), keeping each parameter's state and whether it has a gradient.
        A ``.grad`` stays the same tensor (its values copied into the new slot, then it is that
        slot, :meth:`Pack.adopt`): a slot gradient, and one backward made while stepping natively
        whose memory nothing else shares. ``keep_state``: each state tensor stays the same object
        too (natively ``add_param_group`` leaves the state alone; loading replaces it)."""
        old = self._pack
        assert old is not None
        state = self.state
        saved = {p: saved_state(state[p]) for p in old.params if state.get(p)}
        held = self._held_state() if keep_state else {}
        grads = self._grads_to_keep(old)
        old.release()
        self._drop_plans()  # our references to the old slots go first (Pack.kept: the user's are the others)
        old.grad_views, old.backward = [], None
        self._pack_all(grads, held)
        del grads, held
        self._restore(saved)
        if keep_state:  # state and its entries stay the same objects, as natively
            self._keep_containers(state)

    def _grads_to_keep(self, old: Pack | None = None) -> dict[int, Tensor]:
        """The ``.grad`` tensors that stay themselves in a new layout (by parameter id,
        :meth:`Pack.adopt`), as natively a ``.grad`` is the same tensor for good: a slot of the
        ``old`` layout that holds a gradient, and any other gradient in its parameter's strides
        whose memory no other tensor shares (a view of it would keep the old bytes: that one is
        copied into its slot). A slot the hook attached while nothing accumulated into it becomes
        None, as natively; the gradient of a parameter taken out of ``param_groups`` stays its
        ``.grad``, in memory of its own."""
        params = self._own_params()
        out = self._slot_grads(old, {id(p) for p in params}) if old is not None else {}
        uses = collections.Counter(id(p.grad) for p in params if p.grad is not None)
        for p in params:
            g = p.grad
            if g is None or id(p) in out or uses[id(g)] > 1 or g.requires_grad or not same_order(g, p):
                continue  # one tensor the .grad of two parameters: each copied into its slot
            if not sharers([g]):
                out[id(p)] = g
        return out

    @staticmethod
    def _slot_grads(old: Pack, laid: set[int]) -> dict[int, Tensor]:
        """:meth:`_grads_to_keep`'s slots of the ``old`` layout (``laid``: the ids of the parameters
        laid out anew)."""
        out: dict[int, Tensor] = {}
        for i, p in enumerate(old.params):
            if p.grad is not old.grad_views[i]:
                continue
            if not old.produced[i]:
                p.grad = None
            elif id(p) in laid:
                out[id(p)] = p.grad
            else:
                torch._C.TensorBase.data.__set__(p.grad, own_copy(p.grad))  # type: ignore[attr-defined]
        return out

    def _held_state(self) -> dict[int, dict[str, Tensor]]:
        """Each parameter's state tensors that are its state now (by parameter id), to stay its
        state tensors in a new layout: the entries' tensors that are the layout's own (the
        slots), or, native for good, every state tensor."""
        out: dict[int, dict[str, Tensor]] = {}
        for p, entry in self.state.items():
            mine = entry if self._own else self._slots.get(p, {})
            out[id(p)] = {k: t for k, t in entry.items() if isinstance(t, Tensor) and mine.get(k) is t}
        return out

    def _restore(self, saved: dict[Tensor, dict[str, Tensor]]) -> None:
        pack = self._pack
        assert pack is not None
        with torch.no_grad():
            for p, st in saved.items():
                if p not in self._slots:  # taken out of param_groups: native keeps its entry
                    dict.__setitem__(self.state, p, st)
                    continue
                for key, view in self._slots[p].items():
                    if key in st:
                        view.copy_(st[key])
                    elif key == "max_exp_avg_sq":
                        view.zero_()
        self._uniform_steps()
        self._build_plans()

    def _uniform_steps(self) -> None:
        """Whether every step counter is equal (the fast path's one ``step`` per flat run, and
        ``phase.c``'s), read from the buffers; the counters' versions as of now (:meth:`_steps_written`)."""
        pack = self._pack
        pack.uniform_steps = (
            all(len(set(g.steps.tolist())) <= 1 for g in pack.groups)
            and len({float(g.steps[0]) for g in pack.groups if len(g.index)}) <= 1
        )
        self._step_versions = self._versions_of_steps()

    def _versions_of_steps(self) -> int:
        return sum(st["step"]._version for st in self._slots.values())

    def _steps_written(self) -> bool:
        """Was a step counter written in place through the state since :meth:`_uniform_steps`
        (``state[p]["step"].zero_()``, ``+= 1``)? Each entry's ``step`` has a version counter of
        its own, which only such a write moves (the optimizer's own updates write the buffer)."""
        return self._versions_of_steps() != self._step_versions

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Native's ``add_param_group``, then the new parameters are packed (their own buffers)."""
        if getattr(self, "_pack", None) is None:  # during construction, or native for good
            if getattr(self, "_own", False):
                check_group(param_group, len(self.param_groups), self.defaults)
                Pack.check_unheld(param_group["params"])
            super().add_param_group(param_group)
            return
        self._check_layout()
        check_group(param_group, len(self.param_groups), self.defaults)
        Pack.check_unheld(param_group["params"], self._pack)
        check_unshared(param_group["params"])
        super().add_param_group(param_group)
        self._repack()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(
            "PackedAdamW cannot be pickled (pickle, torch.save(optimizer)): its parameters are views of its flat "
            "buffers, which an unpickled copy would not share with the model; save optimizer.state_dict() "
            "instead and load it into a PackedAdamW (or torch.optim.AdamW(fused=True)) built over the model"
        )

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

    def _build_state(self, held: dict[int, dict[str, Tensor]] | None = None) -> None:
        """Every parameter's state views (``_slots``); ``self.state`` holds those of the parameters
        that have state, as native's: a parameter gets its entry at the first step it has a
        gradient in (:meth:`_mark`), never before and never without one. A tensor in ``held`` (by
        parameter id and key) is rebound in place onto its slot and is that slot (its values are
        restored by the caller): the state tensor the user holds stays the state."""
        pack = self._pack
        held = held or {}
        # every parameter's state views, as laid out: what self.state's entries are compared with
        self._slots: dict[Tensor, dict[str, Tensor]] = {}
        for g in pack.groups:
            keys = STATE_KEYS if g.max_exp_avg_sq is not None else STATE_KEYS[:3]
            for j, i in enumerate(g.index):
                p = pack.params[i]
                st = {key: g.state_slot(key, j, p.shape) for key in keys}
                for key, t in held.get(id(p), {}).items():
                    slot = st.get(key)
                    if slot is not None and (t.shape, t.dtype, t.device) == (
                        slot.shape,
                        slot.dtype,
                        slot.device,
                    ):
                        torch._C.TensorBase.data.__set__(t, slot)  # type: ignore[attr-defined]
                        st[key] = t
                self._slots[p] = st
        self.state = watched_state(
            {p: self._slots[p] for p in pack.params if id(p) in self._stated}, self._changes
        )
        self._watch()
        self._step_versions = self._versions_of_steps()
        self._all_stated = len(self._stated) == pack.n

    def _watch(self) -> None:
        """``self.state`` as it is now is what :meth:`_sync_state` compares the next writes with:
        written through our watched containers, the flag says so (O(1) per step); a container the
        user put in (a plain ``defaultdict`` as ``state``, a plain dict as an entry) stays the
        optimizer's, as natively, and is compared at every step (O(parameters))."""
        state = self.state
        self._watched = state
        self._changes.seen = False
        self._scan = not watched_by(state, self._changes) or any(
            not watched_by(e, self._changes) for p, e in dict.items(state) if p in self._slots
        )

    def _mark(self, positions: list[int] | None) -> None:
        """The parameters at ``positions`` (``None``: all) are stepped: each gets its state entry
        if it has none yet, as native's ``_init_group`` makes it for every parameter with a gradient."""
        if self._all_stated:
            return
        pack = self._pack
        for i in range(pack.n) if positions is None else positions:
            p = pack.params[i]
            if id(p) not in self._stated:
                self._stated.add(id(p))
                entry = self.state.get(p)
                if isinstance(
                    entry, dict
                ):  # empty (_sync_state): the same dict, filled as native's _init_group
                    dict.update(entry, self._slots[p])
                    self._scan = self._scan or not watched_by(entry, self._changes)
                else:
                    dict.__setitem__(self.state, p, watched_entry(self._slots[p], self._changes))
        self._all_stated = len(self._stated) == pack.n

    def _build_plans(self) -> None:
        pack = self._pack
        before = pack.refs()
        self._fast_lists = [lists_for(pack, g, self._mode(g)) for g in pack.groups]
        self._blocks = [blocks_for(pack, g, self._mode(g), self.block_bytes) for g in pack.groups]
        self._native: KernelPhase | None | bool = False  # False: not decided yet
        self._native_threads = torch.get_num_threads()  # the kernel's forms are verified per thread count
        self._native_why: str | None = None
        self._state_lists: list[tuple[list[Tensor], ...]] | None = None  # mode "native"'s (_native_update)
        self._count_own_refs(before)
        pack.relaid = False

    def _count_own_refs(self, before: list[int]) -> None:
        """The references to the gradient slots that the lists just built (or dropped) hold are
        ours: :meth:`Pack.kept` counts only the others."""
        pack = self._pack
        pack.base_refs = [b + now - was for b, now, was in zip(pack.base_refs, pack.refs(), before)]

    def _drop_plans(self) -> None:
        """Our lists of the slots and parameters (the fused calls', the kernel's) go, counted out
        of ``base_refs`` (:meth:`Pack.kept` counts only the user's references); built again by
        :meth:`_build_plans`."""
        before = self._pack.refs()
        self._fast_lists, self._blocks = [], []
        self._native, self._state_lists = False, None
        self._count_own_refs(before)

    def _native_phase(self) -> KernelPhase | None:
        if self._native is False or self._native_threads != torch.get_num_threads():
            self._native_threads = torch.get_num_threads()
            why = kernel_blocker(self.kernel, self._pack.groups, self.param_groups)
            k = None if why is not None else kernel.kernel()
            if why is None and k is None:
                why = kernel.unavailable_reason()
            before = self._pack.refs()
            self._native = KernelPhase(k, self._pack) if k is not None else None
            self._native_why = why
            self._count_own_refs(before)
        return self._native  # type: ignore[return-value]

    def phase_kernel(self) -> str:
        """Which code runs :meth:`clip_step_zero_grad` when every gradient is present, and why."""
        if self.mode == "native":
            why = self.mode_report if self.mode_report is not None else "mode='native'"
            return f"native (clip_grad_norm_ and the fused AdamW call; {why})"
        plan = self._native_phase()
        where = (
            f"phase.c ({plan.kernel.describe()})"
            if plan is not None
            else f"torch kernels ({self._native_why})"
        )
        back = self._pack.backward
        if back is not None:
            where += (
                "; norms in backward" if back.why_not is None else f"; norms in the phase ({back.why_not})"
            )
        return where

    # -- packed or native ----------------------------------------------------------------
    def set_mode(self, mode: str) -> None:
        """Step ``"packed"`` or ``"native"`` from now on (between steps, not during a backward).

        The state stays where it is, so the switch carries ``exp_avg``, ``exp_avg_sq`` and ``step``
        over exactly; a gradient that exists keeps its bits (packed to native: it becomes a tensor
        of its own, as backward would have stored it; native to packed: it is copied into its slot
        at the next step). Stepping natively, the gradient buffer's pages are given back to the OS
        (Linux), so gradient memory is native's; while ``mode="auto"`` measures they stay.

        Native for good (``mode="native"`` at construction, ``"auto"`` once it chose native), the
        parameters have storage of their own: ``set_mode("packed")`` packs them again as at
        construction (refused, naming it, where another tensor shares a parameter's memory)."""
        if mode == "packed":  # the user's choice replaces a native-for-good move still to come
            self._pending_own = None
        if self._own:
            if mode == "packed":
                self._pack_again()
                return
            if mode == "native":
                return
        self._switch(mode, release=True)

    def _switch(self, mode: str, release: bool) -> None:
        if mode not in ("packed", "native"):
            raise ValueError(f"set_mode: mode must be 'packed' or 'native', not {mode!r}")
        if mode == self.mode:
            if release and mode == "native":
                self._pack.release_free()
            return
        if mode == "native":
            self._pack.to_native(release)
        else:
            moved = self._keep_moved(self._pack.to_packed())
            self._uniform_steps()
            if moved and not self._warned_grad:
                self._warned_grad = True
                i = moved[0]
                warnings.warn(
                    f"PackedAdamW: parameter {i}'s .grad (and {len(moved) - 1} more) was made by a backward that "
                    "ran natively (p.grad None before it), and another tensor shares its memory (a view of it held "
                    "now) or it is the .grad of two parameters; stepping packed again it is copied into the packed "
                    "gradient buffer at the next step and p.grad becomes that buffer's tensor, so a reference kept "
                    "to the old p.grad no longer follows it (natively it stays p.grad): drop the view before the "
                    "switch, or read p.grad again after it",
                    UserWarning,
                    stacklevel=user_stacklevel(),
                )
        self.mode = mode

    def _keep_moved(self, moved: list[int]) -> list[int]:
        """Gradients backward made while stepping natively (``moved``, positions) stay ``.grad``
        stepping packed again, as natively: their values go into their slots and each becomes its
        slot (:meth:`Pack.keep_grads`), where :meth:`_grads_to_keep` allows it. Our lists of the
        slots go first (so that :meth:`Pack.kept` counts only the user's references) and are built
        again. Returns the positions that could not (copied into their slots at the next step)."""
        if not moved:
            return moved
        pack = self._pack
        keep = self._grads_to_keep()
        kept = {i: keep[id(pack.params[i])] for i in moved if id(pack.params[i]) in keep}
        if kept:
            self._drop_plans()
            pack.keep_grads(kept)
            self._build_plans()
        return [i for i in moved if i not in kept]

    def _tick(self) -> None:
        """The end of a gradient phase (after a step): ``mode="auto"`` times the iteration and
        picks the next one's mode; once it has decided, it says so once if it steps natively."""
        if not self._stepped or self._chooser is None:
            return
        self._stepped = False
        chooser = self._chooser
        upcoming = chooser.tick(self.mode)
        self._switch(upcoming, release=chooser.decided is not None)  # pages kept while it measures
        if chooser.decided is not None:
            self._chooser = None
            self.mode_report = chooser.report
            if chooser.decided == "native":  # moved at once, or at the next step (_settle_own)
                if self._own_storage() is None:
                    warnings.warn(self.mode_report or "", UserWarning, stacklevel=user_stacklevel())
                else:
                    self._pending_own = chooser.report
            else:
                logging.getLogger("cotangent").info(chooser.report)

    def _native_refusals(self) -> None:
        """What the native mode refuses before anything moves, as the packed mode does: a rebound
        parameter, a sparse gradient."""
        pack = self._pack
        for i, p in enumerate(pack.params):
            if p.data_ptr() != pack.ptrs[i]:
                pack.check_params()
            if p.grad is not None and p.grad.layout != torch.strided:
                raise RuntimeError("PackedAdamW requires dense gradients (got a sparse gradient)")

    def _native_update(self) -> None:
        """Native's fused step (mode ``"native"``): ``torch._fused_adamw_`` over each parameter that
        has a gradient, with backward's own gradient and its state's views, per flat group
        (native's grouping by parameter group, device and dtype)."""
        pack = self._pack
        self._native_refusals()
        have = [i for i, p in enumerate(pack.params) if p.grad is not None]
        self._mark(have)
        if self._state_lists is None:  # every parameter and its state's views, per group
            self._state_lists = []
            for g in pack.groups:
                ps, _, ms, vs, xs, steps = view_lists(pack, g, list(range(len(g.index))))
                self._state_lists.append((ps, ms, vs, xs, steps))  # no slot kept: see Pack.kept
        for g, lists in zip(pack.groups, self._state_lists):
            self._native_group(g, lists)
        if len(have) < pack.n:
            pack.uniform_steps = False

    def _native_group(self, g: FlatGroup, lists: Any) -> None:
        """One flat group's native fused step over its parameters that have a gradient."""
        pack = self._pack
        positions = [j for j, i in enumerate(g.index) if pack.params[i].grad is not None]
        if not positions:
            return
        ps, ms, vs, xs, steps = ([t[j] for j in positions] if t else t for t in lists)
        gs = [t for t in (pack.params[g.index[j]].grad for j in positions) if t is not None]
        self._fused_call(g.pg, g.device, (ps, gs, ms, vs, xs, steps))

    def _fused_call(self, pg: int, device: torch.device, lists: tuple[list[Tensor], ...]) -> None:
        """Native fused AdamW's call for parameter group ``pg`` on ``device``: the steps counted,
        ``torch._fused_adamw_`` (``GradScaler``'s scale and ``found_inf`` as native passes them),
        a step that found an inf not counted."""
        steps = lists[5]
        kwargs = fused_kwargs(self.param_groups[pg], pg)
        torch._foreach_add_(steps, 1)
        scale, inf = amp_tensors(self, device)
        torch._fused_adamw_(*lists, **lr_on(kwargs, device), grad_scale=scale, found_inf=inf)
        if inf is not None:
            torch._foreach_sub_(steps, [inf] * len(steps))

    # -- native for good -----------------------------------------------------------------
    def _own_storage(self) -> str | None:
        """Native for good (``mode="native"`` at construction, ``"auto"`` once it chose native):
        each parameter, its gradient and its state get storage of their own, laid out as native's
        (the parameter's strides), with the same bits; the hooks are removed, the layout leaves
        the registry and the packed buffers are freed. What the user holds stays valid: the
        Parameter objects, ``param_groups``, ``state``, its entries and their tensors (each rebound
        in place, ``t.data = own``), a ``p.grad`` (rebound in place too), a scheduler holding the
        optimizer.

        The rule at this moment (:meth:`_blocker`): where another tensor shares the packed memory of
        a parameter or of a state tensor, it would keep the packed bytes while natively it follows
        every step, so then nothing moves: the optimizer keeps stepping natively over the packed
        layout (the same bits, the buffers kept) and the reason is returned. Returns None where
        the storage moved."""
        pack = self._pack
        self._check_layout()  # what the user changed in state and groups, applied first
        self._drop_plans()  # our own views of the parameters (.detach()) go
        why = self._blocker()
        if why is not None:
            self._build_plans()
            return why
        with torch.no_grad():
            for i, p in enumerate(pack.params):
                p.data = own_copy(p.detach())
                if p.grad is not None and p.grad is pack.grad_views[i]:  # kept by to_native: the same
                    p.grad.data = own_copy(p.grad)  # tensor, rebound in place (a reference kept follows)
            for p, entry in self.state.items():
                slots = self._slots.get(p, {})
                for key, t in entry.items():
                    if isinstance(t, Tensor) and slots.get(key) is t:
                        t.data = own_copy(t)
        pack.release()  # hooks removed, out of the registry
        pack.backward = None
        self._pack, self._slots, self._native = None, {}, None  # type: ignore[assignment]
        self._own = True
        return None

    def _blocker(self) -> str | None:
        """Why the parameters cannot leave the packed buffers now, or None: a tensor besides ours
        shares the memory of a parameter or of a state tensor (:func:`sharers`, one storage use
        count each), which natively would follow every step and here would keep the packed bytes."""
        pack = self._pack
        held = sharers(pack.params)
        if held:
            i, extra = held[0]
            return (
                f"parameter {i} (shape {tuple(pack.params[i].shape)}) shares its memory with {extra} other "
                "tensor(s): a view or p.detach() handle held now, or a graph autograd still holds (a forward "
                "whose backward has not run, backward(retain_graph=True))"
            )
        names = [(i, key) for i, p in enumerate(pack.params) for key in self._slots.get(p, {})]
        held = sharers([self._slots[pack.params[i]][key] for i, key in names])
        if held:
            k, extra = held[0]
            i, key = names[k]
            return (
                f"state[p][{key!r}] of parameter {i} (shape {tuple(pack.params[i].shape)}) shares its memory "
                f"with {extra} other tensor(s): a view of it held now (state[p][{key!r}].view(-1), a slice)"
            )
        return None

    def _settle_own(self) -> None:
        """Native for good was decided (:meth:`_tick`) but the storage could not move then: tried
        again at each step (after backward, when autograd holds no saved tensor), until it moves.
        The decision is reported once: where it moved, as chosen; where it still cannot at the
        first step after the decision, with the reason (the buffers stay allocated meanwhile)."""
        report = self._pending_own
        assert report is not None
        why = self._own_storage()
        if why is None:
            self._pending_own = None
            if self._warned_own:
                logging.getLogger("cotangent").info("%s; the parameters left the packed buffers", report)
                self.mode_report = report
            else:
                warnings.warn(report, UserWarning, stacklevel=user_stacklevel())
            return
        if not self._warned_own:
            self._warned_own = True
            self.mode_report = (
                f"{report}; {why}, so the parameters keep their packed storage for now (native's bits; "
                "the packed buffers stay allocated; tried again at each step)"
            )
            warnings.warn(self.mode_report, UserWarning, stacklevel=user_stacklevel())

    def _own_update(self) -> None:
        """Native fused AdamW's step over tensors of their own (native for good): ``_init_group``'s
        lazy state (a parameter's entry at its first step with a gradient: float32 ``step`` 0,
        zero moments in the parameter's memory format), one fused call per parameter group,
        device and dtype."""
        for k, group in enumerate(self.param_groups):
            lists: dict[tuple[torch.device, torch.dtype], tuple[list[Tensor], ...]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.layout != torch.strided:
                    raise RuntimeError("PackedAdamW requires dense gradients (got a sparse gradient)")
                st = self.state[p]
                if len(st) == 0:
                    st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if group["amsgrad"]:
                        st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                ps, gs, ms, vs, xs, ss = lists.setdefault((p.device, p.dtype), ([], [], [], [], [], []))
                ps.append(p)
                gs.append(p.grad)
                ms.append(st["exp_avg"])
                vs.append(st["exp_avg_sq"])
                if group["amsgrad"]:
                    xs.append(st["max_exp_avg_sq"])
                ss.append(st["step"])
            for (device, _), one in lists.items():
                self._fused_call(k, device, one)

    def _own_params(self) -> list[Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def _pack_again(self) -> None:
        """``set_mode("packed")`` after native for good: laid out as at construction (checked
        first, as there, and :meth:`_check_repackable`). What the user holds stays the optimizer's,
        as natively: each ``.grad`` and each state tensor is the same object, rebound in place onto
        its slot (its values kept), and ``state`` and its entries are the same objects."""
        params = self._own_params()
        Pack.check_unheld(params)
        check_unshared(params, again=True)
        self._check_repackable(params)
        state = self.state
        saved = {p: saved_state(st) for p, st in state.items() if st}
        held = self._held_state()
        grads = self._grads_to_keep()
        self._stated = {id(p) for p in saved}
        self._own, self.mode = False, "packed"
        self._pack_all(grads, held)
        del grads, held
        self._restore(saved)
        self._keep_containers(state)

    def _check_repackable(self, params: list[Tensor]) -> None:
        """Refuse ``set_mode("packed")``, before anything is modified, where a gradient or a state
        tensor could not stay the same tensor in the packed layout: another tensor shares its
        memory (a view of it held now would keep the old bytes, where natively it follows every
        step), or it is not laid out as its slot would be (a gradient or moment in other strides
        than its parameter's, a moment of another dtype, a ``step`` that is not a float32 number)."""
        names, tensors = [], []
        for i, p in enumerate(params):
            where = f"parameter {i} (shape {tuple(p.shape)})"
            if p.grad is not None:
                names.append(f"p.grad of {where}")
                tensors.append(p.grad)
                if not same_order(p.grad, p):
                    self._refuse_repack(
                        f"p.grad of {where} has strides {p.grad.stride()}, the parameter {p.stride()}"
                    )
            for key, t in self.state.get(p, {}).items():
                if not isinstance(t, Tensor):
                    continue
                names.append(f"state[p][{key!r}] of {where}")
                tensors.append(t)
                misfit = slot_misfit(key, t, p)
                if misfit is not None:
                    self._refuse_repack(f"state[p][{key!r}] of {where} is {misfit}")
        for k, extra in sharers(tensors)[:1]:
            self._refuse_repack(
                f"{names[k]} shares its memory with {extra} other tensor(s): a view of it held now "
                f"(.view(-1), a slice, .t()), which natively follows every step and would keep the current values"
            )

    @staticmethod
    def _refuse_repack(what: str) -> None:
        raise ValueError(
            f"PackedAdamW: set_mode('packed'): {what}. Packing keeps each gradient and state tensor the same "
            "object, rebound onto the packed buffers: drop the view (a copy, .clone(), is fine) or assign the "
            "tensor in its parameter's layout, then call set_mode('packed') again; nothing was changed and the "
            "optimizer keeps stepping natively"
        )

    def _keep_containers(self, state: Any) -> None:
        """After a new layout (:meth:`_pack_again`, :meth:`_repack` keeping the state): ``state`` (the
        object the user holds, ours or one the user put in) and its entries stay the optimizer's, as
        natively, updated in place with what the layout built (the same tensors, rebound, or new ones
        over the packed memory), in their order; keys of the user's own beside them stay, and so
        does an entry of a parameter no longer in ``param_groups``."""
        if not isinstance(state, dict):
            return
        for p, entry in dict.items(self.state):
            was = dict.get(state, p)
            if isinstance(was, dict) and p in self._slots:
                dict.update(was, entry)
            elif was is None:
                dict.__setitem__(state, p, entry)
        if isinstance(state, WatchedState):
            state.changes = self._changes
        self.state = cast(Any, state)  # the user's dict, whatever its type (a defaultdict natively)
        self._watch()

    # -- public --------------------------------------------------------------------------
    @property
    def flat_groups(self) -> list[FlatGroup]:
        """The flat buffers, one entry per (device, dtype); none once native for good."""
        return self._pack.groups if self._pack is not None else []

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Native's ``zero_grad``, over the flat gradient buffer.

        ``set_to_none=True`` (native's default): every ``.grad`` becomes None, as natively; the
        buffer is filled with ``-0.0``, the additive identity of IEEE arithmetic (``-0.0 + x == x``
        bit for bit, ``+0.0`` would turn a ``-0.0`` gradient into ``+0.0``), and each parameter's
        hook makes its slot the ``.grad`` just before backward accumulates into it, so the
        accumulation leaves exactly the bits native would store. ``set_to_none=False``: as
        native's ``grad.zero_()``, every parameter that had a gradient keeps a ``+0.0`` one and is
        stepped with it (moments and weight decay move it). With ``release_grads=True`` the
        buffer's pages are given back to the OS instead; the hook fills a slot with ``-0.0``
        again before backward accumulates into it. Stepping natively (``mode="native"``, or
        ``"auto"`` once it has chosen native), it is native's own ``torch.optim.Optimizer.zero_grad`` and
        nothing else (no hook, no clock, no bookkeeping: the gradients are backward's own).
        """
        if self.mode == "native" and self._chooser is None:  # native's, as native's costs
            return torch.optim.Optimizer.zero_grad(self, set_to_none)
        self._zero_grad(set_to_none)

    @torch.compiler.disable  # the layout's bookkeeping runs eagerly inside a compiled train step
    def _zero_grad(self, set_to_none: bool) -> None:
        assert self._pack is not None
        if self.mode == "native":
            super().zero_grad(set_to_none)
        else:
            self._sync_groups()
            self._pack.zero_grads(set_to_none)
            if self._pack.relaid:
                self._build_plans()
        if not self._quiet:
            self._tick()

    def _check_layout(self) -> None:
        """What the user changed since the last step, before anything is modified: the state
        (:meth:`_sync_state`), the groups (:meth:`_sync_groups`), a gradient slot given back to
        the user (:meth:`Pack.detach_kept`); and refused, a group whose ``amsgrad`` was switched
        after the buffers were laid out (the maximum buffer exists exactly for amsgrad groups)."""
        self._sync_state()
        self._sync_groups()
        if self._pack.relaid:
            self._build_plans()
        if self._pack.uniform_steps and self._steps_written():  # one step counter written in place
            self._uniform_steps()
        for g in self._pack.groups:
            if bool(self.param_groups[g.pg]["amsgrad"]) != (g.max_exp_avg_sq is not None):
                raise RuntimeError(
                    f"PackedAdamW: parameter group {g.pg} changed amsgrad after the optimizer was built; "
                    "its buffers were laid out for the other value (build a new optimizer)"
                )

    def _sync_state(self) -> None:
        """``self.state`` as the user left it, applied as native's next step reads it
        (:func:`~cotangent.states.planned_state`, every check first): an entry removed or emptied
        (``state.clear()``, ``del state[p]``, ``state = defaultdict(dict)``) starts that parameter again
        from zero moments and step 0 at its next step with a gradient; a tensor put in place of one
        (``state[p]["exp_avg"] = t``, ``state[p] = {...}``, before the parameter's first step too)
        is its state from then on: its values go into the slot and it becomes that slot, rebound in
        place. A tensor that stops being the state keeps its values in memory of its own and no
        longer moves (:meth:`_let_go`), as natively. ``state`` and its entries stay the objects the
        user left. O(1) when nothing was written (a flag the watched containers raise)."""
        if not self._scan and self.state is self._watched and not self._changes.seen:
            return
        pack = self._pack
        plan = planned_state(self.state, pack.params, self._slots, self._stated)  # checked first
        where = {id(p): i for i, p in enumerate(pack.params)}
        with torch.no_grad():
            for (
                p,
                key,
            ) in plan.leaving:  # all of them first: a tensor leaving one place may be adopted at another
                self._let_go(p, key, where[id(p)])
            for p in plan.reset:
                self._stated.discard(id(p))
                for slot in self._slots[p].values():
                    slot.zero_()
            for p, values in plan.adopt.items():
                for key, t in values.items():
                    self._slots[p][key].copy_(t)
                    torch._C.TensorBase.data.__set__(t, self._slots[p][key])  # type: ignore[attr-defined]
                    self._slots[p][key] = t
        self._stated.update(id(p) for p in plan.fresh)
        self._all_stated = len(self._stated) == pack.n
        self._watch()
        if plan.leaving:
            self._uniform_steps()

    def _let_go(self, p: Tensor, key: str, i: int) -> None:
        """``state[p][key]``'s tensor stops being the state: it takes its values as memory of its own
        (rebound in place, so a reference kept keeps them and no longer moves, as natively) and the
        slot gets a new tensor over the packed memory."""
        old = self._slots[p][key]
        torch._C.TensorBase.data.__set__(old, own_copy(old))  # type: ignore[attr-defined]
        gi, j = self._pack.where[i]
        self._slots[p][key] = self._pack.groups[gi].state_slot(key, j, p.shape)

    def _sync_groups(self) -> None:
        """``param_groups`` as the user left it: a group's parameter list changed in place (a
        parameter appended, removed or replaced) or the groups reordered, appended or replaced
        are checked as ``add_param_group`` checks them and laid out again, each parameter's state
        kept, so that every parameter is stepped with its group's hyperparameters as natively.
        O(parameters) identity comparisons."""
        groups = self.param_groups
        laid = self._laid_out
        if len(groups) == len(laid) and all(
            g is was and list(map(id, g["params"])) == ids for g, (was, ids) in zip(groups, laid)
        ):
            return
        seen: dict[int, int] = {}
        packed = {id(p) for p in self._pack.params}
        new: list[Tensor] = []
        for k, g in enumerate(groups):
            if isinstance(g, dict):
                missing = [key for key in self.defaults if key not in g]
                if missing:
                    raise KeyError(
                        f"PackedAdamW: parameter group {k} lacks {missing} (a dict put into param_groups "
                        "directly; native's step would raise KeyError): use add_param_group(), which fills them"
                    )
            check_group(g, k, self.defaults)
            for p in g["params"]:
                if seen.setdefault(id(p), k) != k:
                    raise ValueError(
                        f"PackedAdamW: a parameter of shape {tuple(p.shape)} is in parameter groups {seen[id(p)]} "
                        f"and {k} (param_groups changed in place); native's add_param_group refuses that: "
                        "keep each parameter in one group"
                    )
                if id(p) not in packed:
                    new.append(p)
        Pack.check_unheld(new, self._pack)
        check_unshared(new)
        self._sync_state()  # what the user did to the state first (zero_grad comes here without it)
        self._repack()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Native's ``step``. Traced by Dynamo (a ``torch.compile``-d train step) as compiled native's
        is: the closure traced, a :meth:`clip_in_step` clip as native's traced clip, the update
        eagerly (:meth:`_step`: the fused kernel compiled native calls too)."""
        if not torch.compiler.is_compiling():
            return self._step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._armed is not None and not self._in_armed:
            self._armed_step()
        else:
            self._step()
        return loss

    @torch.compiler.disable  # the layout's bookkeeping and the fused kernel run eagerly under compile
    @torch.no_grad()
    def _step(self, closure: Callable[[], Any] | None = None) -> Any:
        if self._pending_own is not None:
            self._settle_own()
        if not self._own:
            self._check_layout()
        self._stepped = True  # the end of this phase is an iteration's end (_tick)
        if self._phase is not None:  # clip_step_zero_grad's update, called through (a wrapped) step
            total, coef, set_to_none = self._phase
            self._phase = None
            self._phase_update(total, coef, set_to_none)
            return None
        if self._armed is not None and not self._in_armed:  # clip_in_step: the whole phase
            loss = None
            if closure is not None:  # forward and backward first, as native's step(closure)
                with torch.enable_grad():
                    loss = closure()
            self._armed_step()
            return loss
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._own:
            self._own_update()
        elif self.mode == "native":
            self._native_update()
        else:
            self._update()
        return loss

    def _update(self, per_parameter: bool = False) -> None:
        """Native's fused step over every parameter that has a gradient.

        With ``maximize`` (or ``per_parameter``) the call takes per-parameter tensors, as native's:
        the sign a NaN gradient leaves in ``exp_avg_sq`` under ``maximize`` depends on whether ATen
        ran a tensor's update inline or in its parallel region (the compiler folded the negation
        differently in each), which depends on the tensor's size, so a flat run would change it.
        """
        pack = self._pack
        assert pack is not None
        produced = pack.sync_grads()
        self._mark(produced)
        for gi, g in enumerate(pack.groups):
            kwargs = fused_kwargs(self.param_groups[g.pg], g.pg)
            if produced is None and pack.uniform_steps and not (per_parameter or kwargs["maximize"]):
                steps = [g.steps]
                lists = self._fast_lists[gi]
            else:
                have = set(produced) if produced is not None else set(range(pack.n))
                positions = [j for j, i in enumerate(g.index) if i in have]
                if not positions:
                    continue
                lists = view_lists(pack, g, positions)
                steps = lists[5]
            torch._foreach_add_(steps, 1)
            scale, inf = amp_tensors(self, g.device)
            torch._fused_adamw_(*lists, **lr_on(kwargs, g.device), grad_scale=scale, found_inf=inf)
            if inf is not None:
                torch._foreach_sub_(steps, [inf] * len(steps))
        if produced is not None:
            pack.uniform_steps = False

    def state_dict(self) -> dict[str, Any]:
        """Native's ``state_dict``: the per-parameter form, loadable by ``torch.optim.AdamW`` and back,
        holding the state tensors themselves, as native's does (they are the optimizer's state and
        follow its steps; ``copy.deepcopy`` or ``torch.save`` it for a snapshot). Each entry is a
        plain dict with the entry's items (native's holds the entry itself): ``torch.load`` with
        ``weights_only=True`` reads plain dicts only."""
        sd = super().state_dict()
        sd["state"] = {k: dict(v) if isinstance(v, dict) else v for k, v in sd["state"].items()}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load per-parameter state (ours or native ``AdamW``'s, older versions included: group keys
        they lack take native's defaults, a Python-number ``step`` becomes a float32 tensor as native
        fused AdamW makes it) into the flat buffers. As natively, a loaded tensor that native's load
        keeps (its dtype and device already the parameter's; a ``step`` float32) is the state from
        then on: its values go into its slot and it becomes that slot, rebound in place
        (:meth:`_adopt_loaded`), so the loaded dict's tensors follow every step; one native casts is
        copied and keeps its values, as natively. Refused before anything is modified: a state dict
        whose groups would take native off its fused path (``fused`` unset or False, ``foreach``,
        ``capturable``, ``differentiable``), one that does not fit the parameters position by
        position (:func:`~cotangent.states.check_fits` names the first mismatch), and a kept tensor
        that cannot become its slot (:func:`~cotangent.states.check_kept`): a failed load leaves the
        optimizer and the state dict exactly as they were."""
        check_loadable(state_dict)
        check_fits(state_dict, self.param_groups)
        adopt = self._loaded_to_adopt(state_dict)  # checked: refused before anything moves
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for key, value in {"amsgrad": False, "maximize": False, **NATIVE_GROUP_KEYS}.items():
                group.setdefault(key, value)
        if self._own:  # native's: the loaded tensors are the state, a number step a float32 tensor
            for p, st in self.state.items():
                if st and not isinstance(st.get("step"), Tensor):
                    st.update(to_state_tensors(st))
                    st["step"] = st["step"].to(p.device)
            return
        assert self._pack is not None
        order = list(self.state.items())  # native's loaded state: the state dict's order and keys
        ours = {id(p) for p in self._pack.params}
        loaded = {
            p: to_state_tensors(st) for p, st in order if st and isinstance(p, Tensor) and id(p) in ours
        }
        self._stated = {id(p) for p in loaded}  # as native's: the entries the state dict holds
        self._repack(keep_state=False)  # natively the loaded tensors replace the state
        self._restore(loaded)
        self._adopt_loaded(loaded, adopt)
        self._in_loaded_order(order)

    def _loaded_to_adopt(self, state_dict: dict[str, Any]) -> set[int]:
        """The ids of the loaded tensors that become the state itself (:meth:`_adopt_loaded`): those
        native's load keeps (:func:`~cotangent.states.kept_on_load`), checked first
        (:func:`~cotangent.states.check_kept`), but for one that lives in the buffers of another
        live ``PackedAdamW`` (its state, from its ``state_dict()``): natively the two optimizers
        would share that tensor, which here stays the other's and is copied. Native for good, the
        load is native's own and none is adopted here."""
        if self._own:
            return set()
        kept = kept_on_load(state_dict, self.param_groups)
        for attempt in range(2):  # an optimizer kept only by a reference cycle is collected first
            ranges = Pack.memory_ranges(besides=self._pack)
            others = {id(c) for c in kept if in_ranges(ranges, c.tensor)}
            if not others or attempt:
                break
            gc.collect()
        kept = [c for c in kept if id(c) not in others]
        check_kept(kept, self._pack.params)
        return {id(c.tensor) for c in kept}

    def _adopt_loaded(self, loaded: dict[Tensor, dict[str, Any]], adopt: set[int]) -> None:
        """After a load has put the values into the new slots: each loaded tensor in ``adopt`` (by id,
        :meth:`_loaded_to_adopt`) becomes its slot, rebound in place over the slot's memory with its
        own strides (``t.data = ...``), as natively the loaded tensor is the state and follows every
        step; the user's dict keeps the same objects, with the same values."""
        if not adopt:
            return
        with torch.no_grad():
            for p, st in loaded.items():
                slots = self._slots.get(p, {})
                for key, slot in list(slots.items()):
                    t = st.get(key)
                    if isinstance(t, Tensor) and id(t) in adopt:
                        over = torch.as_strided(slot, t.shape, t.stride(), slot.storage_offset())
                        torch._C.TensorBase.data.__set__(t, over)  # type: ignore[attr-defined]
                        slots[key] = t
        self._step_versions = self._versions_of_steps()

    def _in_loaded_order(self, order: list[tuple[Any, Any]]) -> None:
        """After a load, ``state`` as native's load builds it: the entries in the state dict's order
        (``order``: native's loaded state), each with its keys in the saved order (the state
        tensors ours, over the new slots; keys of the user's own beside them, and entries of keys
        that are no parameter, as loaded)."""
        entries: dict[Any, Any] = {}
        for k, st in order:
            if not isinstance(st, dict):
                entries[k] = st
                continue
            mine = self._slots.get(k, {}) if isinstance(k, Tensor) and id(k) in self._stated else {}
            entry = {key: mine.get(key, v) for key, v in st.items()}
            entry.update({key: t for key, t in mine.items() if key not in entry})
            entries[k] = entry
        self.state = watched_state(entries, self._changes)
        self._watch()

    def __del__(self) -> None:  # pragma: no cover - best effort
        pack = getattr(self, "_pack", None)
        if pack is not None:
            pack.release()

"""State dicts as native ``AdamW`` writes and loads them, checked and normalised for the flat buffers."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch import Tensor

from cotangent.groups import sharers
from cotangent.pack import same_order

#: A parameter's state keys, in the order native fused AdamW makes them (the last: amsgrad groups).
STATE_KEYS = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")

#: Group settings that would take native AdamW off its fused path after loading, and what they must be.
_FUSED_PATH = {"foreach": (None, False), "capturable": (False,), "differentiable": (False,)}


def check_loadable(state_dict: dict[str, Any]) -> None:
    """Refuse, before anything is modified, a state dict whose parameter groups native fused AdamW
    would run off its fused path after loading it (``load_state_dict`` takes every group setting
    from the state dict, so native itself would change kernels, and PackedAdamW is the fused path)."""
    groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
    if not isinstance(groups, list):
        raise ValueError(
            "state_dict must be a dict with a 'param_groups' list, as Optimizer.state_dict() returns"
        )
    for k, group in enumerate(groups):
        if not isinstance(group, dict):
            raise ValueError(f"state_dict['param_groups'][{k}] is {type(group).__name__}, not a dict")
        if group.get("fused") is not True:
            raise ValueError(
                f"state_dict['param_groups'][{k}] has fused={group.get('fused', '(absent)')!r}: loaded into "
                "torch.optim.AdamW(fused=True) it would switch native off its fused kernel (load_state_dict takes "
                "group settings from the state dict), and PackedAdamW is the fused path. Set "
                f"state_dict['param_groups'][{k}]['fused'] = True to resume on the fused kernel"
            )
        for key, allowed in _FUSED_PATH.items():
            if group.get(key, allowed[0]) not in allowed:
                raise ValueError(
                    f"state_dict['param_groups'][{k}] has {key}={group[key]!r}, which native AdamW would run off its "
                    f"fused path; PackedAdamW is the fused path (set it to {allowed[0]!r} to load it there)"
                )


def check_fits(state_dict: dict[str, Any], groups: list[dict[str, Any]]) -> None:
    """Refuse, before anything is modified, a state dict that does not fit the optimizer's
    parameters position by position, naming the first mismatch: the number of groups, of
    parameters in a group, and for each parameter's saved state its keys, each moment's shape and
    dtype (a floating-point tensor of the parameter's shape, which native casts to the parameter's
    dtype) and its ``step`` (a number or a 0-dim tensor). Native loads such a state dict and
    fails at its next step (or steps the wrong moments); a partial load would leave the optimizer
    half-loaded."""
    saved = state_dict["param_groups"]
    if len(saved) != len(groups):
        raise ValueError(
            f"state_dict has {len(saved)} parameter groups, the optimizer {len(groups)}; nothing was loaded"
        )
    state = state_dict.get("state")
    if not isinstance(state, dict):
        raise ValueError(f"state_dict['state'] is {type(state).__name__}, not a dict; nothing was loaded")
    for k, (was, group) in enumerate(zip(saved, groups)):
        keys = was.get("params")
        if not isinstance(keys, list) or len(keys) != len(group["params"]):
            n = len(keys) if isinstance(keys, list) else type(keys).__name__
            raise ValueError(
                f"state_dict['param_groups'][{k}] has {n} parameters, the optimizer's group {k} "
                f"{len(group['params'])}; nothing was loaded"
            )
        needed = ["step", "exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if was.get("amsgrad") else [])
        for i, (key, p) in enumerate(zip(keys, group["params"])):
            entry = state.get(key)
            if entry:
                _check_loaded(f"group {k}, parameter {i} (state_dict['state'][{key!r}])", entry, p, needed)


def _check_loaded(where: str, entry: Any, p: Tensor, needed: list[str]) -> None:
    """One parameter's saved state against the parameter it would be loaded into."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: the state is {type(entry).__name__}, not a dict; nothing was loaded")
    missing = [key for key in needed if key not in entry]
    if missing:
        raise ValueError(f"{where}: the state lacks {missing}; nothing was loaded")
    step = entry["step"]
    if isinstance(step, Tensor) and step.dim() != 0 or not isinstance(step, (Tensor, int, float)):
        got = f"a tensor of shape {tuple(step.shape)}" if isinstance(step, Tensor) else type(step).__name__
        raise ValueError(f"{where}: step is {got}, not a number or a 0-dim tensor; nothing was loaded")
    for key in needed[1:]:
        value = entry[key]
        if not isinstance(value, Tensor):
            raise ValueError(f"{where}: {key} is {type(value).__name__}, not a tensor; nothing was loaded")
        if value.shape != p.shape or not value.is_floating_point():
            raise ValueError(
                f"{where}: {key} has shape {tuple(value.shape)} and dtype {value.dtype}, the parameter shape "
                f"{tuple(p.shape)} and dtype {p.dtype} (parameters in another order, or another model's state "
                "dict); nothing was loaded"
            )


def native_keeps(key: str, value: Any, p: Tensor) -> bool:
    """Does native fused AdamW's ``load_state_dict`` make ``value`` itself parameter ``p``'s state
    tensor ``key``? It casts each loaded tensor with ``.to(dtype=..., device=...)``
    (``Optimizer._process_value_according_to_param_policy``: a ``step`` to float32 on ``p``'s
    device, fused; a moment to ``p``'s dtype and device), which returns the same tensor where both
    already match; elsewhere the state is a cast copy and the loaded tensor keeps its values."""
    if not isinstance(value, Tensor):
        return False
    dtype = torch.float32 if key == "step" else p.dtype
    return value.dtype == dtype and value.device == p.device


@dataclass
class Kept:
    """A loaded tensor native's ``load_state_dict`` keeps as parameter ``p``'s state tensor ``key``
    (:func:`kept_on_load`); ``where`` names it in the state dict."""

    where: str
    key: str
    tensor: Tensor
    p: Tensor


def kept_on_load(state_dict: dict[str, Any], groups: list[dict[str, Any]]) -> list[Kept]:
    """Each tensor of ``state_dict`` (checked by :func:`check_fits`) that natively becomes the
    state itself when loaded into an optimizer over ``groups`` (:func:`native_keeps`): the keys
    of the saved group's state (``max_exp_avg_sq`` where it has ``amsgrad``), whose group settings
    the load takes."""
    out: list[Kept] = []
    state = state_dict["state"]
    for k, (was, group) in enumerate(zip(state_dict["param_groups"], groups)):
        keys = STATE_KEYS if was.get("amsgrad") else STATE_KEYS[:3]
        for i, (pid, p) in enumerate(zip(was["params"], group["params"])):
            entry = state.get(pid)
            for key in keys if entry else ():
                if native_keeps(key, entry[key], p):
                    where = f"state_dict['state'][{pid!r}][{key!r}] (group {k}, parameter {i}, shape {tuple(p.shape)})"
                    out.append(Kept(where, key, entry[key], p))
    return out


def check_kept(kept: list[Kept], params: list[Tensor]) -> None:
    """Refuse, before anything is loaded, a loaded tensor that natively becomes the state itself
    (``kept``, :func:`kept_on_load`) but could not become its packed slot, where it follows every
    step as natively: another memory order than its parameter's (:func:`slot_misfit`: native's
    fused kernel would pair other elements), a parameter or gradient of the optimizer (``params``),
    one tensor (or one memory) loaded at two places (natively updated twice per step), and a tensor
    whose memory another tensor shares (a view of it, or the tensor it views), which natively would
    follow its steps and here would keep the values it has."""
    ours = {id(q): "a parameter" for q in params}
    ours.update({id(q.grad): "a gradient" for q in params if q.grad is not None})
    for c in kept:
        misfit = slot_misfit(c.key, c.tensor, c.p)
        if misfit is not None:
            _refuse_load(
                f"{c.where} is {misfit}: natively it becomes the state as it is (it has the parameter's dtype "
                "and device); load it in the parameter's layout (torch.empty_like(p).copy_(t))"
            )
        if id(c.tensor) in ours:
            _refuse_load(
                f"{c.where} is {ours[id(c.tensor)]} of this optimizer: natively the two would be one tensor, "
                "updated twice per step; load a copy (.clone())"
            )
    twice = _overlapping(kept)
    if twice is not None:
        _refuse_load(
            f"{twice[0].where} and {twice[1].where} are one tensor or share memory: natively the loaded "
            "tensor becomes the state at both places, updated twice per step; load a copy at each (.clone())"
        )
    for k, extra in sharers([c.tensor for c in kept])[:1]:
        _refuse_load(
            f"{kept[k].where} shares its memory with {extra} other tensor(s) (a view of it, or the tensor it "
            "views): natively they would follow its steps once it is the state; here it becomes the optimizer's "
            "packed memory and they would keep the values it has; load a copy (.clone()) or drop the view"
        )


def _overlapping(kept: list[Kept]) -> tuple[Kept, Kept] | None:
    """Two of ``kept`` over overlapping memory (the same tensor twice included), or None: sorted by
    device and address, an overlap shows between neighbours."""
    spans = sorted(
        (str(t.device), t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), n)
        for n, t in enumerate(c.tensor for c in kept)
        if t.numel()
    )
    for (device, _, end, m), (other, start, _, n) in zip(spans, spans[1:]):
        if device == other and start < end:
            return kept[m], kept[n]
    return None


def _refuse_load(what: str) -> NoReturn:
    raise ValueError(f"PackedAdamW: load_state_dict: {what}; nothing was loaded")


def to_state_tensors(state: dict[str, Any]) -> dict[str, Any]:
    """One parameter's loaded state with a Python-number ``step`` as the float32 tensor native
    fused AdamW makes of it (``AdamW.__setstate__``)."""
    out = dict(state)
    step = out.get("step")
    if step is not None and not isinstance(step, Tensor):
        out["step"] = torch.tensor(float(step), dtype=torch.float32)
    return out


def saved_state(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of one parameter's state that outlives the buffers it views."""
    return {k: v.clone() if isinstance(v, Tensor) else v for k, v in to_state_tensors(state).items()}


class Changes:
    """A flag the watched state containers raise on any write (:class:`WatchedState`)."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False


def _watching(base: type) -> type:
    """``base`` (a dict type) with every mutating method raising ``self.changes.seen`` first."""

    def wrap(name: str) -> Any:
        method = getattr(base, name)

        def mutate(self: Any, *args: Any, **kwargs: Any) -> Any:
            self.changes.seen = True
            return method(self, *args, **kwargs)

        mutate.__name__ = name
        return mutate

    names = ("__setitem__", "__delitem__", "clear", "pop", "popitem", "setdefault", "update", "__ior__")
    return type(f"Watched{base.__name__.capitalize()}", (base,), {n: wrap(n) for n in names})


class WatchedEntry(_watching(dict)):  # type: ignore[misc]
    """One parameter's state entry, as native's (a dict), telling its owner when it is written
    (``state[p]["step"] = torch.tensor(0.)``, ``del state[p]["exp_avg"]``): an O(1) flag the step
    reads, instead of comparing every entry at every step."""

    changes: Changes

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickled as the plain dict native keeps
        return (dict, (dict(self),))


class WatchedState(_watching(defaultdict)):  # type: ignore[misc]
    """``optimizer.state``, as native's (a ``defaultdict(dict)``), telling its owner when it is
    written (``clear()``, ``del state[p]``, an entry replaced)."""

    changes: Changes

    def __missing__(self, key: Any) -> WatchedEntry:  # as native's default, a watched entry
        entry = watched_entry({}, self.changes)
        self[key] = entry
        return entry

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickled as the plain defaultdict native keeps
        return (defaultdict, (dict,), None, None, iter(dict(self).items()))


def watched_state(entries: dict[Tensor, dict[str, Any]], changes: Changes) -> WatchedState:
    """A watched ``optimizer.state`` holding a watched copy of each entry, all reporting to ``changes``."""
    state = WatchedState(dict)
    state.changes = changes
    for p, entry in entries.items():
        dict.__setitem__(state, p, watched_entry(entry, changes))
    return state


def watched_by(container: Any, changes: Changes) -> bool:
    """Does every write into ``container`` raise ``changes``' flag (one of our watched containers)?"""
    return (
        isinstance(container, (WatchedState, WatchedEntry)) and getattr(container, "changes", None) is changes
    )


def watched_entry(entry: dict[str, Any], changes: Changes) -> WatchedEntry:
    out = WatchedEntry(entry)
    out.changes = changes
    return out


@dataclass
class StatePlan:
    """What the user did to ``optimizer.state`` since the step before, as native's next step reads
    it (:func:`planned_state`): ``reset``, the parameters whose entry was removed or emptied
    (``clear()``, ``del state[p]``, a new ``state``), which start again from zero moments and step 0
    at their next step with a gradient; ``adopt``, the tensors put in place of the optimizer's
    (``state[p]["exp_avg"] = t``, ``state[p] = {...}``), which are its state from then on;
    ``fresh``, the parameters given a whole entry before their first step (or again after theirs
    was removed), which native's step reads as their state; ``leaving``, each ``(p, key)`` whose
    tensor stops being the state (it keeps its values, as natively)."""

    reset: list[Tensor] = field(default_factory=list)
    adopt: dict[Tensor, dict[str, Tensor]] = field(default_factory=dict)
    fresh: list[Tensor] = field(default_factory=list)
    leaving: list[tuple[Tensor, str]] = field(default_factory=list)


def planned_state(
    state: Any, params: list[Tensor], slots: dict[Tensor, dict[str, Tensor]], stated: set[int]
) -> StatePlan:
    """:class:`StatePlan` of ``state`` against the tensors the optimizer's state is now
    (``slots``, by parameter; ``params`` in the optimizer's order; ``stated``, the ids of the
    parameters that have state), checked before anything is modified. Refused, naming the
    parameter and what was done: what native's step would fail on (an entry that is not a dict or
    lacks a key, a Python-number ``step``, a plain ``dict`` as ``state`` without an entry for a
    parameter with a gradient), and what cannot stay native's bits here (:func:`_check_adopted`,
    :func:`_check_leaving`)."""
    if not isinstance(state, dict):
        raise TypeError(
            f"PackedAdamW: optimizer.state was replaced by a {type(state).__name__}; native's is a "
            "dict from parameter to its state (defaultdict(dict))"
        )
    plan = StatePlan()
    for i, p in enumerate(params):
        where = f"parameter {i} (shape {tuple(p.shape)})"
        mine, entry = slots[p], state.get(p)
        if entry is None or (isinstance(entry, dict) and not entry):
            if entry is None and not isinstance(state, defaultdict) and p.grad is not None:
                raise RuntimeError(
                    f"PackedAdamW: optimizer.state was replaced by a {type(state).__name__}, not a "
                    f"defaultdict(dict), without an entry for {where}, which has a gradient: native's "
                    "step raises KeyError there (assign defaultdict(dict) to start every parameter again)"
                )
            if id(p) in stated:
                plan.reset.append(p)
                plan.leaving.extend((p, key) for key in mine)
            continue
        _check_entry(where, entry, mine, id(p) in stated)
        if id(p) not in stated:
            plan.fresh.append(p)
        for key, want in mine.items():
            if entry[key] is not want:
                plan.adopt.setdefault(p, {})[key] = _replacement(where, key, entry[key], p)
                plan.leaving.append((p, key))
    _check_adopted(plan, params, slots)
    _check_leaving(plan, params, slots)
    return plan


def _check_entry(where: str, entry: Any, mine: dict[str, Tensor], stated: bool) -> None:
    """Refuse a non-empty ``optimizer.state[p]`` native's step would not read: not a dict, or
    lacking one of the keys ``mine`` holds (native's step raises ``KeyError``)."""
    if not isinstance(entry, dict):
        raise TypeError(f"PackedAdamW: optimizer.state[p] of {where} is a {type(entry).__name__}, not a dict")
    missing = [k for k in mine if k not in entry]
    if missing:
        how = "deleted from optimizer.state[p]" if stated else "an entry written without them"
        raise RuntimeError(
            f"PackedAdamW: the state of {where} lacks {missing} ({how}); native's step would raise "
            "KeyError: delete the whole entry (del optimizer.state[p]) to start it again, or assign "
            "every key"
        )


def _replacement(where: str, key: str, value: Any, p: Tensor) -> Tensor:
    """The tensor the user put at ``optimizer.state[p][key]``, refused unless it can be that state
    as natively (:func:`slot_misfit`); a Python-number ``step`` is refused as native's step refuses it."""
    if key == "step" and isinstance(value, (int, float)):
        raise RuntimeError(
            f"PackedAdamW: optimizer.state[p]['step'] of {where} was replaced by the number {value!r}; "
            "native's step raises 'API has changed, `state_steps` argument must contain a list of singleton "
            "tensors': assign torch.tensor(float(step)) (a float32 0-dim tensor), as load_state_dict makes it"
        )
    misfit = type(value).__name__ if not isinstance(value, Tensor) else slot_misfit(key, value, p)
    if misfit is not None:
        raise RuntimeError(
            f"PackedAdamW: optimizer.state[p][{key!r}] of {where} was replaced by {misfit}: assign one in "
            "the parameter's layout (torch.zeros_like(p), t.clone(memory_format=torch.preserve_format); "
            "a step: torch.tensor(0.0)), or write in place"
        )
    return value


def slot_misfit(key: str, t: Tensor, p: Tensor) -> str | None:
    """Why ``t`` cannot be parameter ``p``'s state tensor ``key`` in its packed slot, or None; the one
    home of that rule (a tensor assigned into the state, :func:`planned_state`; a state tensor packed
    again, ``set_mode("packed")``). A ``step`` is a float32 0-dim tensor on ``p``'s device; a moment
    has ``p``'s shape, dtype and device, and its memory order: native's fused kernel pairs the
    elements of the parameter and its state in memory order, so other strides update other elements."""
    shape, dtype = ((), torch.float32) if key == "step" else (tuple(p.shape), p.dtype)
    if (tuple(t.shape), t.dtype, t.device) != (shape, dtype, p.device):
        return f"{tuple(t.shape)} {t.dtype} on {t.device}, where its slot holds {shape} {dtype} on {p.device}"
    if key != "step" and not same_order(t, p):
        return (
            f"a tensor with strides {t.stride()}, the parameter {p.stride()} (native's fused kernel pairs the "
            "elements of the parameter and its state in memory order, so it would update other elements)"
        )
    return None


def _check_adopted(plan: StatePlan, params: list[Tensor], slots: dict[Tensor, dict[str, Tensor]]) -> None:
    """Refuse a tensor put into the state that could not become its packed slot as natively it is
    the state: one the optimizer holds at another place that stays (another key's or another
    parameter's state, a parameter, a gradient), one put at two places, and one whose memory
    another tensor shares (a view of it, or a tensor it views), which natively would follow the
    steps and here would keep the values it had."""
    if not plan.adopt:
        return
    leaving = {id(slots[p][key]) for p, key in plan.leaving}
    ours = {id(t): "a state tensor" for m in slots.values() for t in m.values() if id(t) not in leaving}
    ours.update({id(q): "a parameter" for q in params})
    ours.update({id(q.grad): "a gradient" for q in params if q.grad is not None})
    index = {id(p): i for i, p in enumerate(params)}
    seen: set[int] = set()
    named, tensors = [], []
    for p, values in plan.adopt.items():
        for key, t in values.items():
            where = f"optimizer.state[p][{key!r}] of parameter {index[id(p)]} (shape {tuple(p.shape)})"
            if id(t) in ours or id(t) in seen:
                what = ours.get(id(t), "the tensor put at another place of the state too")
                raise RuntimeError(
                    f"PackedAdamW: {where} was replaced by {what} of this optimizer: natively the two would be "
                    "one tensor, updated twice per step; assign a copy (.clone())"
                )
            seen.add(id(t))
            named.append(where)
            tensors.append(t)
    for k, extra in sharers(tensors)[:1]:
        raise RuntimeError(
            f"PackedAdamW: {named[k]} was replaced by a tensor whose memory {extra} other tensor(s) share (a view "
            "of it, or the tensor it is a view of): natively they would follow its steps, here the tensor "
            "becomes the optimizer's packed memory and they would keep the values it has; assign a copy (.clone())"
        )


def _check_leaving(plan: StatePlan, params: list[Tensor], slots: dict[Tensor, dict[str, Tensor]]) -> None:
    """Refuse, where a state tensor stops being the state (its entry removed or emptied, or itself
    replaced) while a view of it is held: natively the tensor and its views keep the values they
    have; here the tensor takes its values as its own memory, but a view stays on the packed
    buffer, which the parameter's state goes on updating."""
    if not plan.leaving:
        return
    index = {id(p): i for i, p in enumerate(params)}
    reset = {id(p) for p in plan.reset}
    for k, extra in sharers([slots[p][key] for p, key in plan.leaving])[:1]:
        p, key = plan.leaving[k]
        how = (
            "its entry was removed or emptied (optimizer.state.clear(), del optimizer.state[p], a new optimizer.state)"
            if id(p) in reset
            else f"optimizer.state[p][{key!r}] was replaced"
        )
        raise RuntimeError(
            f"PackedAdamW: state[p][{key!r}] of parameter {index[id(p)]} (shape {tuple(p.shape)}) stops being the "
            f"state ({how}) while {extra} other tensor(s) share its memory (a view of it held: .view(-1), a slice): "
            "natively they keep the values they have; here they view the packed buffer, which the parameter's state "
            "goes on updating. Drop the view (a copy, .clone(), is fine) and step again; the optimizer is unchanged"
        )

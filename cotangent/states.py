"""State dicts as native ``AdamW`` writes and loads them, checked and normalised for the flat buffers."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import Tensor

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


def watched_entry(entry: dict[str, Any], changes: Changes) -> WatchedEntry:
    out = WatchedEntry(entry)
    out.changes = changes
    return out


def planned_state(
    state: Any, slots: dict[Tensor, dict[str, Tensor]], stated: set[int]
) -> tuple[list[Tensor], dict[Tensor, dict[str, Tensor]], dict[Tensor, dict[str, Any]]]:
    """What the user did to ``optimizer.state`` since the step before, checked before anything is
    modified: the parameters whose entry was removed (``clear()``, ``del state[p]``, a new
    ``state``), which native's next step starts again from zero moments and step 0; the state
    tensors replaced in an entry (``state[p]["exp_avg"] = torch.zeros_like(p)``), which native's
    step then uses, to copy into the flat buffers; and the keys the user added beside them."""
    if not isinstance(state, dict):
        raise TypeError(
            f"PackedAdamW: optimizer.state was replaced by a {type(state).__name__}; native's is a "
            "dict from parameter to its state (defaultdict(dict))"
        )
    reset: list[Tensor] = []
    copies: dict[Tensor, dict[str, Tensor]] = {}
    extra: dict[Tensor, dict[str, Any]] = {}
    for p, mine in slots.items():
        entry = state.get(p)
        if not entry:
            if id(p) in stated:
                reset.append(p)
            continue
        _check_entry(p, entry, mine, stated)
        for key, value in entry.items():
            if key not in mine:
                extra.setdefault(p, {})[key] = value
                continue
            if value is mine[key]:
                continue
            copies.setdefault(p, {})[key] = _replacement(p, key, value, mine[key])
    return reset, copies, extra


def _check_entry(p: Tensor, entry: Any, mine: dict[str, Tensor], stated: set[int]) -> None:
    """Refuse a non-empty ``optimizer.state[p]`` native's step would not read as ``p``'s state:
    not a dict, written before ``p``'s first step, or lacking one of the keys ``mine`` holds."""
    if not isinstance(entry, dict):
        raise TypeError(f"PackedAdamW: optimizer.state[p] is a {type(entry).__name__}, not a dict")
    if id(p) not in stated:  # an entry written before the parameter's first step
        raise RuntimeError(
            f"PackedAdamW: optimizer.state holds an entry for a parameter of shape {tuple(p.shape)} "
            "before its first step; native would read it as its state, PackedAdamW lays state out "
            "itself: load it with load_state_dict() instead"
        )
    missing = [k for k in mine if k not in entry]
    if missing:
        raise RuntimeError(
            f"PackedAdamW: the state of a parameter of shape {tuple(p.shape)} lacks {missing} (deleted "
            "from optimizer.state[p]); native's step would raise KeyError: delete the whole entry "
            "(del optimizer.state[p]) to start it again, or assign new tensors"
        )


def _replacement(p: Tensor, key: str, value: Any, want: Tensor) -> Tensor:
    """The tensor the user put at ``optimizer.state[p][key]`` in place of ``want`` (a number
    for ``"step"`` as its float32 tensor), refused unless it has ``want``'s shape, dtype and device."""
    if isinstance(value, (int, float)) and key == "step":
        value = torch.tensor(float(value), dtype=torch.float32)
    if (
        not isinstance(value, Tensor)
        or value.shape != want.shape
        or (value.dtype != want.dtype)
        or value.device != want.device
    ):
        got = f"{tuple(value.shape)} {value.dtype}" if isinstance(value, Tensor) else type(value).__name__
        raise RuntimeError(
            f"PackedAdamW: optimizer.state[p][{key!r}] of a parameter of shape {tuple(p.shape)} was "
            f"replaced by {got}; the flat buffer holds {tuple(want.shape)} {want.dtype} on {want.device}: "
            "assign a tensor of that shape, dtype and device (torch.zeros_like(p)), or write in place"
        )
    return value

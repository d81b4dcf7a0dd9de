"""Typed objects at the JSON boundary: exact field sets, the JSON types a field's annotation admits,
and plain JSON values of typed objects. Standard library only (records and the analysis use it).
"""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, fields, is_dataclass
from typing import Any


def exact_fields(what: str, have: Iterable[str], want: Iterable[str], error: type[ValueError]) -> None:
    """Raise ``error`` naming the unknown and the missing fields when ``have`` is not ``want``."""
    have, want = set(have), set(want)
    extra, missing = sorted(have - want), sorted(want - have)
    if extra or missing:
        raise error(
            f"{what}: "
            + "; ".join(
                ([f"unknown fields {', '.join(extra)}"] if extra else [])
                + ([f"missing {', '.join(missing)}"] if missing else [])
            )
        )


def plain(value: Any) -> Any:
    """A value as JSON holds it: objects with ``to_json`` by it, other dataclasses by their fields
    (one whose metadata says ``omit_none`` left out while ``None``), mappings as dicts, sequences as lists."""
    if hasattr(value, "to_json") and not isinstance(value, type):
        return value.to_json()
    if is_dataclass(value) and not isinstance(value, type):  # a field marked omit_none is left out while None
        return {
            f.name: plain(v)
            for f in fields(value)
            if (v := getattr(value, f.name)) is not None or not f.metadata.get("omit_none")
        }
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def json_types(hint: object) -> tuple[type, ...] | None:
    """The JSON types a resolved annotation admits (``None`` aside): ``(int, float)`` for a float,
    ``(dict,)`` for a mapping, dataclass or typed dict, ``(list,)`` for a sequence; ``None`` for any
    (``Any``)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return _union_admits(hint)
    base = typing.get_origin(hint) or hint
    if base is float:
        return (int, float)
    if base in (str, int, bool):
        return (base,)
    return _container_admits(base)


def _union_admits(hint: object) -> tuple[type, ...] | None:
    """The JSON types a union admits: those of each member (``None`` aside), or any when one admits any."""
    parts = [json_types(a) for a in typing.get_args(hint) if a is not type(None)]
    return None if any(p is None for p in parts) else tuple(t for p in parts if p for t in p)


def _container_admits(base: object) -> tuple[type, ...] | None:
    """The JSON type of a mapping, dataclass or typed dict (an object) or a sequence (an array);
    ``None`` (any) for another annotation."""
    if not isinstance(base, type):
        return None
    if issubclass(base, Mapping) or is_dataclass(base) or typing.is_typeddict(base):
        return (dict,)
    if issubclass(base, Sequence):
        return (list,)
    return None


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """A class's resolved field annotations (computed once per class: they never change)."""
    return typing.get_type_hints(cls)


def json_fields(
    cls: type, data: object, what: str, error: type[ValueError], as_nan: Iterable[str] = ()
) -> dict[str, Any]:
    """``data``'s fields for the dataclass ``cls``: exactly its fields (the required ones present), each
    of a JSON type its annotation admits, else ``error`` naming the field; a ``null`` in a field of
    ``as_nan`` (a non-finite measurement) as NaN."""
    nan = set(as_nan)
    if not isinstance(data, Mapping):
        raise error(f"{what} is not a JSON object")
    known = {f.name: f for f in fields(cls)}
    required = {n for n, f in known.items() if f.default is MISSING and f.default_factory is MISSING}
    exact_fields(what, set(data), set(known) & (set(data) | required), error)
    hint_of = hints(cls)
    out = dict(data)
    for name, value in data.items():
        hint = hint_of[name]
        if value is None:
            if type(None) not in typing.get_args(hint):
                raise error(f"{what}: {name} is null")
            out[name] = math.nan if name in nan else None
            continue
        admitted = json_types(hint)
        if admitted is not None and (
            not isinstance(value, admitted) or (isinstance(value, bool) and bool not in admitted)
        ):
            raise error(f"{what}: {name} is {type(value).__name__}, not {known[name].type}")
    return out

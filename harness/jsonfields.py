"""Typed objects at the JSON boundary: exact field sets, the JSON types a field's annotation admits,
and plain JSON values of typed objects. Standard library only (records and the analysis use it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
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
    """A value as JSON holds it: objects with ``to_json`` by it, other dataclasses by their fields,
    mappings as dicts, sequences as lists."""
    if hasattr(value, "to_json") and not isinstance(value, type):
        return value.to_json()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


#: The JSON types a field's annotation admits (``None`` aside).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "Mapping": (dict,),
    "Sequence": (list,),
    "GitState": (dict,),
    "LedgerLink": (dict,),
    "RunSpec": (dict,),
}


def json_fields(
    cls: type, data: Any, what: str, error: type[ValueError], as_nan: Iterable[str] = ()
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
    out = dict(data)
    for name, value in data.items():
        hint = str(known[name].type)
        if value is None:
            if "None" not in hint:
                raise error(f"{what}: {name} is null")
            out[name] = math.nan if name in nan else None
            continue
        admitted = tuple(
            t
            for key, types in _JSON_TYPES.items()
            if key in hint.split("[")[0].replace(" ", "").split("|")
            for t in types
        )
        if admitted and (
            not isinstance(value, admitted) or (isinstance(value, bool) and bool not in admitted)
        ):
            raise error(f"{what}: {name} is {type(value).__name__}, not {hint}")
    return out

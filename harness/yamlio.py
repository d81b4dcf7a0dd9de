"""Strict YAML input: ``yaml.safe_load`` values plus the line of every key, and a small schema.

Every problem raises :class:`InputError` naming the file, the key path and the line.
"""

from __future__ import annotations

import math
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from prereg.bounded import MAX_DEPTH
from prereg.errors import InputError

KeyPath = tuple[Any, ...]


@dataclass
class Document:
    """A parsed YAML file: its data, the line of each key path, its bytes."""

    path: Path
    data: Any
    lines: dict[KeyPath, int]
    raw: bytes

    def line(self, keypath: KeyPath) -> int | None:
        while keypath:
            if keypath in self.lines:
                return self.lines[keypath]
            keypath = keypath[:-1]
        return self.lines.get((), 1)

    def error(self, keypath: KeyPath, message: str) -> InputError:
        return InputError(message, file=str(self.path), key=dotted(keypath), line=self.line(keypath))


def dotted(keypath: KeyPath) -> str:
    out = ""
    for k in keypath:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out or "<top level>"


def _walk(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], doc_path: Path) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise InputError(
                    f"duplicate key {key!r}",
                    file=str(doc_path),
                    key=dotted(path + (key,)),
                    line=key_node.start_mark.line + 1,
                )
            seen.add(key)
            lines[path + (key,)] = key_node.start_mark.line + 1
            _walk(value_node, path + (key,), lines, doc_path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _walk(item, path + (i,), lines, doc_path)


#: The largest protocol or configuration file read (a protocol of the largest study is a few kB).
MAX_BYTES = 1 << 20


def _no_aliases(text: str, p: Path) -> None:
    """Refuse anchors and aliases, and nesting deeper than :data:`prereg.bounded.MAX_DEPTH` (naming
    the line), from the event stream, before anything is built: the audit's reader does not read
    them, and an alias bomb, a recursive alias or a 5000-deep nest would otherwise take exponential
    time or end in a RecursionError (the event parser keeps its own stack; the composer recurses)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise InputError(
                "anchors (&) and aliases (*) are not allowed: write each value out (the public audit's "
                "YAML reader reads none)",
                file=str(p),
                line=event.start_mark.line + 1,
            )
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise InputError(
                    f"nested deeper than {MAX_DEPTH} levels: a protocol or configuration is read at "
                    f"most {MAX_DEPTH} deep",
                    file=str(p),
                    line=event.start_mark.line + 1,
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def load(path: str | Path) -> Document:
    """Read and parse a YAML file safely, keeping key lines; refuse one over :data:`MAX_BYTES` and
    any anchor or alias."""
    p = Path(path)
    try:
        if not stat.S_ISREG(p.stat().st_mode):
            raise InputError("not a regular file (a FIFO, a device or a folder)", file=str(p))
        if p.stat().st_size > MAX_BYTES:
            raise InputError(
                f"{p.stat().st_size} bytes: a protocol or configuration file is at most {MAX_BYTES} bytes",
                file=str(p),
            )
        raw = p.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", file=str(p)) from e
    if raw.startswith(b"\xef\xbb\xbf"):
        raise InputError(
            "the file starts with a UTF-8 byte order mark: save it without one (the protocol's sha256 "
            "is of its bytes, and the mark is invisible in most editors)",
            file=str(p),
            line=1,
        )
    try:
        text = raw.decode("utf-8")
        _no_aliases(text, p)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except UnicodeDecodeError as e:
        raise InputError("not UTF-8 text", file=str(p)) from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise InputError(
            f"invalid YAML: {getattr(e, 'problem', None) or e}",
            file=str(p),
            line=mark.line + 1 if mark is not None else None,
        ) from e
    lines: dict[KeyPath, int] = {}
    if node is not None:
        _walk(node, (), lines, p)
    return Document(p, data, lines, raw)


@dataclass(frozen=True)
class Field:
    """One key of a mapping: its expected type(s), whether required, a default, a check."""

    types: type | tuple[type, ...]
    required: bool = True
    default: Any = None
    check: Callable[[Any], str | None] | None = None


def _type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return t.__name__


def mapping(doc: Document, value: Any, keypath: KeyPath, schema: dict[str, Field]) -> dict[str, Any]:
    """Validate ``value`` as a mapping against ``schema``; unknown keys are errors."""
    if not isinstance(value, dict):
        raise doc.error(keypath, f"expected a mapping, got {type(value).__name__}")
    out: dict[str, Any] = {}
    for key in value:
        if key not in schema:
            known = ", ".join(sorted(schema))
            raise doc.error(keypath + (key,), f"unknown key {key!r} (known keys: {known})")
    for key, field in schema.items():
        if key not in value:
            if field.required:
                raise doc.error(keypath, f"missing required key {key!r}")
            out[key] = field.default
            continue
        v = value[key]
        types = field.types if isinstance(field.types, tuple) else (field.types,)
        ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
        if float in types and isinstance(v, int) and not isinstance(v, bool):
            ok = True
            try:
                v = float(v)
            except OverflowError:
                raise doc.error(
                    keypath + (key,), f"{key!r} must be a finite number, got {str(v)[:24]}..."
                ) from None
        if float in types and isinstance(v, float) and not math.isfinite(v):
            raise doc.error(keypath + (key,), f"{key!r} must be a finite number, got {v!r}")
        if not ok:
            raise doc.error(
                keypath + (key,), f"{key!r} must be {_type_name(field.types)}, got {type(v).__name__} {v!r}"
            )
        if field.check is not None:
            problem = field.check(v)
            if problem:
                raise doc.error(keypath + (key,), f"{key!r}: {problem}")
        out[key] = v
    return out


def positive(v: Any) -> str | None:
    return None if v > 0 else "must be positive"


def non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be non-negative"


def one_of(*choices: Any) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(map(str, choices))}"

    return check


def _first_difference(a: Any, b: Any, path: KeyPath = ()) -> KeyPath | None:
    """The first key path where ``a`` and ``b`` differ in value or type (None when equal)."""
    if type(a) is not type(b):
        return path
    if isinstance(a, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                return path + (k,)
            d = _first_difference(a[k], b[k], path + (k,))
            if d is not None:
                return d
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = _first_difference(x, y, path + (i,))
            if d is not None:
                return d
        return None if len(a) == len(b) else path + (min(len(a), len(b)),)
    same = a == b or (isinstance(a, float) and a != a and b != b)
    return None if same else path


def audit_readable(doc: Document) -> None:
    """Refuse a file that the public audit's standard-library reader (``analysis/public_audit.py``)
    cannot read, or reads differently from ``yaml.safe_load``, naming the line: the audit reads the
    tagged protocol from its bytes alone, so ``harness plan`` and ``harness tag`` accept only what it
    reads."""
    from prereg.yamlsub import YamlError, yaml_subset

    try:
        theirs = yaml_subset(doc.raw.decode("utf-8"))
    except YamlError as e:
        raise InputError(
            f"the public audit's YAML reader cannot read this file ({str(e).partition(': ')[2]}); "
            "write that line in a plainer form",
            file=str(doc.path),
            line=e.line,
        ) from e
    where = _first_difference(doc.data, theirs)
    if where is not None:
        raise doc.error(
            where,
            "the public audit's YAML reader reads this value differently from yaml.safe_load "
            f"(audit: {_get(theirs, where)!r}); write it in a plainer form",
        )


def _get(data: Any, path: KeyPath) -> Any:
    for k in path:
        try:
            data = data[k]
        except (KeyError, IndexError, TypeError):
            return "<absent>"
    return data

"""A configuration file (``configs/*.yaml``: a model and its training, not a protocol) read with
``yaml.safe_load``, keeping the line of every key, into the core's
:class:`~prereg.protocol.schema.Document`, which :func:`prereg.protocol.schema.mapping` checks.

Protocols are not read here: the core's one reader (:mod:`prereg.protocol.read`, the public audit's)
reads them. Every problem raises :class:`InputError` naming the file, the key path and the line.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from prereg.bounded import MAX_DEPTH
from prereg.errors import InputError
from prereg.protocol.read import MAX_BYTES, refuse_bom
from prereg.protocol.schema import Document, KeyPath, dotted


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


def _no_aliases(text: str, p: Path) -> None:
    """Refuse anchors and aliases, and nesting deeper than :data:`prereg.bounded.MAX_DEPTH` (naming
    the line), from the event stream, before anything is built: the protocol's reader does not read
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
    """Read and parse a configuration file safely, keeping key lines; refuse one over
    :data:`~prereg.protocol.read.MAX_BYTES` and any anchor or alias."""
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
    refuse_bom(raw, p)
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

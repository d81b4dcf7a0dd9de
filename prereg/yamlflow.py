"""The YAML subset's inline parts: plain scalars resolved as PyYAML's SafeLoader resolves them,
escapes, line folding, quoted scalars and flow collections."""

from __future__ import annotations

import re

from prereg.bounded import MAX_DEPTH

#: YAML's white space (str.strip() would also take NO-BREAK SPACE and other Unicode spaces, which
#: YAML reads as text).
WS = " \t"

_BOOL = {
    "yes": True,
    "Yes": True,
    "YES": True,
    "true": True,
    "True": True,
    "TRUE": True,
    "on": True,
    "On": True,
    "ON": True,
    "no": False,
    "No": False,
    "NO": False,
    "false": False,
    "False": False,
    "FALSE": False,
    "off": False,
    "Off": False,
    "OFF": False,
}
_NULL = ("", "~", "null", "Null", "NULL")
_INT = re.compile(r"[-+]?(?:0b[0-1_]+|0[0-7_]+|(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+)")
_FLOAT = re.compile(r"[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?)")
_SPECIAL = re.compile(r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")
_UNSUPPORTED = re.compile(
    r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?"
    r"|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}.*|<<|="
)
_ESCAPES = {
    "0": "\0",
    "a": "\a",
    "b": "\b",
    "t": "\t",
    "\t": "\t",
    "n": "\n",
    "v": "\v",
    "f": "\f",
    "r": "\r",
    "e": "\x1b",
    " ": " ",
    '"': '"',
    "/": "/",
    "\\": "\\",
    "N": "\x85",
    "_": "\xa0",
    "L": "\u2028",
    "P": "\u2029",
}


class YamlError(ValueError):
    """What this reader cannot read, with the 1-based line: ``line N: ...``."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


def plain_scalar(text: str, line: int) -> object:
    """A plain scalar resolved as PyYAML's SafeLoader resolves it (YAML 1.1 core)."""
    t = text.strip(WS)
    if t in _BOOL:
        return _BOOL[t]
    if t in _NULL:
        return None
    if _INT.fullmatch(t):
        s = t.replace("_", "")
        sign = -1 if s[0] == "-" else 1
        s = s.lstrip("+-")
        if s.startswith("0b"):
            return sign * int(s[2:], 2)
        if s.startswith("0x"):
            return sign * int(s[2:], 16)
        if len(s) > 1 and s[0] == "0":
            return sign * int(s, 8)
        return sign * int(s)
    if _FLOAT.fullmatch(t):
        return float(t.replace("_", ""))
    if _SPECIAL.fullmatch(t):
        return float(t.lower().replace(".", ""))
    if _UNSUPPORTED.fullmatch(t) or t[:1] in "&*!%@`|>" or t.startswith(("- ", "? ")) or t in ("-", "?"):
        raise YamlError(
            line,
            f"{t!r}: this form (sexagesimal, date, merge, anchor, alias, tag or reserved) "
            "is not read by the audit; write it as a plain number or quoted string",
        )
    return t


def fold_lines(parts: list[str]) -> str:
    """Line folding of flow scalars: one line break is a space, each further empty line a newline."""
    out = parts[0]
    empty = 0
    for p in parts[1:]:
        if p == "":
            empty += 1
            continue
        out += ("\n" * empty if empty else " ") + p
        empty = 0
    return out + "\n" * empty if empty else out


def unescape(s: str, line: int) -> str:
    out, i = [], 0
    while i < len(s):
        ch = s[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = s[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in ("x", "u", "U"):
            n = {"x": 2, "u": 4, "U": 8}[nxt]
            digits = s[i + 2 : i + 2 + n]
            if len(digits) != n or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise YamlError(line, f"bad escape \\{nxt}{digits}")
            out.append(chr(int(digits, 16)))
            i += 2 + n
        else:
            raise YamlError(line, f"unknown escape \\{nxt}")
    return "".join(out)


def quote_end(s: str, i: int) -> int:
    """The index of the quote that closes the quoted scalar opening at ``s[i]`` (``len(s)`` when none):
    ``''`` inside single quotes and a backslash escape inside double quotes do not close it."""
    q = s[i]
    j = i + 1
    while j < len(s):
        if q == "'" and s[j] == "'" and s[j + 1 : j + 2] == "'":
            j += 2
            continue
        if q == '"' and s[j] == "\\":
            j += 2
            continue
        if s[j] == q:
            break
        j += 1
    return min(j, len(s))


def join_quoted(parts: list[str], q: str, line: int) -> str:
    """Fold a quoted scalar's lines: a break is a space, n empty lines are n newlines, a double-quoted
    line ending in an escaped break joins the next without a space."""
    unq = (lambda s: unescape(s, line)) if q == '"' else (lambda s: s.replace("''", "'"))
    segs = []
    for k, p in enumerate(parts):
        s, esc = (p if k == 0 else p.lstrip(" \t")), False
        if k < len(parts) - 1:
            s = s.rstrip(" \t")
            if q == '"' and (len(s) - len(s.rstrip("\\"))) % 2 == 1:
                s, esc = s[:-1], True
        segs.append((s, esc))
    out, esc_prev, empties = unq(segs[0][0]), segs[0][1], 0
    for k, (s, esc) in enumerate(segs[1:], 1):
        if s == "" and k < len(segs) - 1:
            empties += 1
            continue
        out += ("\n" * empties) if empties else ("" if esc_prev else " ")
        out += unq(s)
        esc_prev, empties = esc, 0
    return out


#: Where a flow node's lines are kept: the reader's line of each key path, and this node's key path.
#: A key path into a document: mapping keys (scalars: strings, numbers, booleans, null) and
#: sequence indices, from the top.
KeyPath = tuple[object, ...]
Marks = tuple[dict[KeyPath, int], KeyPath]


def flow_value(s: str, i: int, line: int, depth: int = 1, marks: Marks | None = None) -> tuple[object, int]:
    """One flow node of ``s`` from ``i``: a list, a mapping, a quoted or a plain scalar (``depth``:
    the collections it lies in, this one's included; deeper than :data:`MAX_DEPTH` is refused;
    ``marks``: where to keep each key path's line, ``s`` starting on line ``line``)."""
    i = _skip(s, i)
    if i < len(s) and s[i] in "[{":
        return _flow_collection(s, i, line, depth, marks)
    if i < len(s) and s[i] in "\"'":
        q = s[i]
        j = quote_end(s, i)
        if j >= len(s):
            raise YamlError(line, "unterminated quoted scalar in a flow collection")
        return join_quoted(s[i + 1 : j].split("\n"), q, line), j + 1
    if i < len(s) and (s[i] in "&*!%@`" or s[i : i + 2] in ("? ", "?\n")):
        raise YamlError(
            line, f"{s[i : i + 20]!r}: anchors, aliases, tags and complex keys are not read by the audit"
        )
    j = i
    while (
        j < len(s) and s[j] not in ",]}" and not (s[j] == ":" and (j + 1 == len(s) or s[j + 1] in " \n,]}"))
    ):
        j += 1
    parts = [p.strip(WS) for p in s[i:j].split("\n")]
    while parts and parts[-1] == "":
        parts.pop()
    return (plain_scalar(parts[0], line) if len(parts) <= 1 else fold_lines(parts)) if parts else None, j


def _mark(marks: Marks | None, s: str, i: int, line: int, key: object) -> Marks | None:
    """Keep the line of the element ``key`` that starts at ``i`` of ``s``; its own marks."""
    if marks is None:
        return None
    lines, path = marks
    lines[path + (key,)] = line + s.count("\n", 0, i)
    return lines, path + (key,)


def _flow_collection(s: str, i: int, line: int, depth: int, marks: Marks | None = None) -> tuple[object, int]:
    """:func:`flow_value`'s list or mapping, from its opening bracket at ``i``."""
    if depth > MAX_DEPTH:
        raise YamlError(
            line, f"nested deeper than {MAX_DEPTH} levels: a protocol is read at most {MAX_DEPTH} deep"
        )
    close = "]" if s[i] == "[" else "}"
    seq: list[object] = []
    mp: dict[object, object] = {}
    i += 1
    while True:
        i = _skip(s, i)
        if i >= len(s):
            raise YamlError(line, "unterminated flow collection")
        if s[i] == close:
            return (seq if close == "]" else mp), i + 1
        start = i
        inner = _mark(marks, s, i, line, len(seq)) if close == "]" else None
        key, i = flow_value(s, i, line, depth + 1, inner)
        i = _skip(s, i)
        if i < len(s) and s[i] == ":":
            own = _mark(inner, s, start, line, key) if close == "]" else _mark(marks, s, start, line, key)
            val, i = flow_value(s, i + 1, line, depth + 1, own)
            if close == "]":
                seq.append({key: val})
            else:
                if key in mp:
                    raise YamlError(line, f"duplicate key {key!r}")
                mp[key] = val
        elif close == "]":
            seq.append(key)
        else:
            _mark(marks, s, start, line, key)
            mp[key] = None
        i = _skip(s, i)
        if i < len(s) and s[i] == ",":
            i += 1
        elif i < len(s) and s[i] == close:
            continue
        else:
            raise YamlError(line, f"expected ',' or {close!r} in a flow collection at {s[i : i + 20]!r}")


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\n":
        i += 1
    return i


def block_text(lines: list[str], style: str, chomp: str) -> str:
    """A block scalar's value from its lines (indentation removed): literal (``|``) or folded
    (``>``), with clip, strip or keep chomping."""
    trailing = 0
    while lines and lines[-1] == "":
        lines.pop()
        trailing += 1
    if style == "|":
        text = "\n".join(lines)
    else:  # folded: a break between two normal lines is a space; empty, more-indented lines keep theirs
        text, empties, last_more = "", 0, False
        started = False
        for ln in lines:
            if ln == "":
                empties += 1
                continue
            more = ln[0] in " \t"
            if not started:
                text, started = "\n" * empties + ln, True
            elif not more and not last_more:
                text += ("\n" * empties if empties else " ") + ln
            else:
                text += "\n" * (empties + 1) + ln
            last_more, empties = more, 0
    if not lines:
        return "\n" * trailing if chomp == "keep" else ""
    if chomp == "strip":
        return text
    if chomp == "keep":
        return text + "\n" * (trailing + 1)
    return text + "\n"

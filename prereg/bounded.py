"""Bounded input: every file of a records folder and every JSON value the harness and the audit read
go through here. A file is read only when it is a regular file (not a symlink, a FIFO or a device:
refused by name, without opening it) of at most a given size; a JSON value is refused when it nests
deeper than :data:`MAX_DEPTH`, holds a number of magnitude over :data:`MAX_MAGNITUDE` (or ``NaN``,
``Infinity``), so no reader ends in a RecursionError, an OverflowError, an unbounded read or a hang.

Standard library only (the audit reads with it)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import stat
from collections.abc import Iterator
from typing import Any

#: The deepest nesting of JSON (objects and arrays) or YAML (mappings, sequences, flow collections)
#: read: the committed records nest 9 deep at most (a summary), protocols 6.
MAX_DEPTH = 64
#: The most characters of a protocol read (``harness plan`` refuses a file over 1 MiB first).
MAX_YAML_CHARS = 1 << 20
#: The largest magnitude of a number read from JSON: 2**53, the largest integer a float holds
#: exactly (the committed records' largest value is 1.5e9 bytes; a microsecond count reaches it
#: after 285 years). A larger one is refused: ``10**400`` would end in an OverflowError where it is
#: turned into a float, ``1e400`` reads as infinity.
MAX_MAGNITUDE = 2**53
#: The most bytes of one file of a records folder read (the committed records' largest file is
#: 1.0 MB, a study's summary of the largest design a few MB).
MAX_FILE_BYTES = 64 << 20


class InputLimitError(ValueError):
    """A file or value over a limit, or a file that is not a regular file (the reason is the text)."""


#: Folders of kernel pseudo-files: a file there reports a size it does not hold (``/proc/self/pagemap``
#: is "0 bytes" and fails or never ends when read); none is read (a device is refused as not regular).
PSEUDO_ROOTS = ("/proc", "/sys")


def _pseudo(path: str) -> str | None:
    """The pseudo-file folder ``path`` resolves into (``/proc``, ``/sys``), or None."""
    real = os.path.realpath(path)
    return next((r for r in PSEUDO_ROOTS if real == r or real.startswith(r + "/")), None)


def file_problem(path: str, limit: int = MAX_FILE_BYTES) -> str | None:
    """Why ``path`` may not be read (a symlink, not a regular file, a kernel pseudo-file of /proc or
    /sys, over ``limit`` bytes), or None; only ``lstat``: a FIFO or a device is never opened."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return (
            "a symbolic link: only regular files are read, and a records folder holds regular files only "
            "(git carries links; replace it by the file)"
        )
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a FIFO, a device or a folder): only regular files are read (regular files only)"
    pseudo = _pseudo(path)
    if pseudo is not None:
        return f"a kernel pseudo-file of {pseudo}, not a regular file: only regular files are read"
    if st.st_size > limit:
        return f"{st.st_size} bytes: over the {limit} bytes read from one file"
    return None


def read_regular(path: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``), else :class:`InputLimitError`
    naming the file: a symlink, a FIFO, a device or a pseudo-file of /proc or /sys is refused
    without being opened, and the file is opened without following a link and without blocking,
    so one swapped in after the check is refused too; a failing read is refused, never raised."""
    problem = file_problem(path, limit)
    if problem is not None:
        raise InputLimitError(f"{path}: {problem}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise InputLimitError(f"{path}: cannot be read ({e.strerror})") from e
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise InputLimitError(f"{path}: not a regular file")
            data = f.read(limit + 1)
    except OSError as e:
        raise InputLimitError(f"{path}: cannot be read ({e.strerror or e})") from e
    if len(data) > limit:
        raise InputLimitError(f"{path}: over the {limit} bytes read from one file")
    if st.st_size == 0 and data:  # a pseudo-file: "0 bytes", then content
        raise InputLimitError(
            f"{path}: a pseudo-file (0 bytes by its size, more when read), not a regular file"
        )
    if _ONCE and os.path.dirname(os.path.abspath(path)) == _ONCE[-1].directory:
        _ONCE[-1].values.setdefault(data, _UNPARSED)
    return data


class _Once:
    """The folder whose files :func:`parse_json` parses once while :func:`parsed_once` lasts, and
    their values by the bytes they were parsed from (:data:`_UNPARSED` until the first parse)."""

    def __init__(self, directory: str) -> None:
        self.directory = os.path.abspath(directory)
        self.values: dict[bytes, Any] = {}


#: The :class:`_Once` in force, innermost last (none: every value is parsed each time).
_ONCE: list[_Once] = []
_UNPARSED = object()


@contextlib.contextmanager
def parsed_once(directory: str) -> Iterator[dict[bytes, Any]]:
    """While it lasts, each file directly in ``directory`` is parsed once: :func:`parse_json` of
    the bytes :func:`read_regular` read from one gives every later reader of the same bytes the
    value, the same object, it gave the first (the audit of one records folder: its checks, the
    stall rule of its texts and its calibration's machines each read every record; none changes a
    value it reads, ``tests/test_integrity.py`` checks). Files elsewhere (another folder's records
    would be kept for nothing), and a value that is refused, are parsed each time. Yields the
    values kept, by the bytes they were parsed from."""
    once = _Once(directory)
    _ONCE.append(once)
    try:
        yield once.values
    finally:
        _ONCE.remove(once)


def read_target(path: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """:func:`read_regular` of what ``path`` names, a link followed (a source tree or a corpus may
    link to its files): the target must be a regular file all the same."""
    try:
        return read_regular(os.path.realpath(path), limit)
    except InputLimitError as e:
        raise InputLimitError(f"{path}: {e}") from e


def read_present(path: str, limit: int = MAX_FILE_BYTES) -> bytes | None:
    """:func:`read_regular`, or None where nothing is at ``path`` (not even a dangling link)."""
    if not os.path.lexists(path):
        return None
    return read_regular(path, limit)


#: A JSON string, or an unterminated one to the end of the text: possessive, so every match is
#: linear and a text of unclosed quotes (``"\\"\\"...``) is one match, not one scan per quote.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.S)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text`` (brackets inside strings aside),
    counted without parsing it (a parser recurses), up to the first level past :data:`MAX_DEPTH`:
    the largest running count of opening less closing brackets, counted in C (a Python loop over
    the brackets of a records folder was a good part of the audit's time)."""
    return _depth_outside(_STRING.sub("", text))


def _depth_outside(outside: str) -> int:
    """:func:`json_depth` of the text outside its strings."""
    brackets = _NOT_BRACKETS.sub("", outside)
    deepest = max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)
    return min(max(deepest, 0), MAX_DEPTH + 1)


#: Every digit as ``0``, a fraction's digits left out, and an exponent that is not negative:
#: :func:`_maybe_over`'s scans, each in C (a regular expression tried at every character was a
#: third of the audit's reading time).
_ZEROS = str.maketrans("123456789", "000000000")
_FRACTION = re.compile(r"\.0+")
_EXPONENT = re.compile(r"[eE]\+?0")


def _maybe_over(outside: str) -> bool:
    """Whether a JSON text's part outside its strings may hold a number over :data:`MAX_MAGNITUDE`
    or one that is not finite: ``NaN``, ``Infinity``, an integer part of 16 digits or more, an
    exponent that is not negative. A text with none of them holds only numbers under 10**15 in
    magnitude (at most 15 digits before the point, times a power of ten at most 1), which json.loads
    reads to the same values as the checked parsers of :func:`parse_json`, in C, with no Python
    call per number."""
    if "N" in outside or "I" in outside:
        return True
    zeros = _FRACTION.sub(".", outside.translate(_ZEROS))  # the integer parts and exponents' digits
    return "0" * 16 in zeros or _EXPONENT.search(zeros) is not None


class _Huge:
    """A number over the limit, kept where it stood so that its key can be named."""

    def __init__(self, text: str) -> None:
        self.text = text


def _huge_at(value: object, path: str = "") -> tuple[str, str] | None:
    """The key path and text of the first number over the limit in ``value``, or None."""
    if isinstance(value, _Huge):
        return path or "<top level>", value.text
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _huge_at(v, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}" if path else str(k))
        if found is not None:
            return found
    return None


def parse_json(raw: bytes | str) -> Any:
    """The JSON value of ``raw``, refusing (:class:`InputLimitError`, naming the key) nesting deeper
    than :data:`MAX_DEPTH` and a number over :data:`MAX_MAGNITUDE` in magnitude, ``NaN`` or
    ``Infinity``; ``ValueError`` where it is not JSON (or not UTF-8). Bytes of a file that
    :func:`parsed_once` keeps are parsed once."""
    kept = _ONCE[-1].values if _ONCE and isinstance(raw, bytes) else None
    value = _UNPARSED if kept is None or not isinstance(raw, bytes) else kept.get(raw, _UNPARSED)
    if value is _UNPARSED:
        value = _parse_json(raw)
        if kept is not None and raw in kept:
            kept[raw] = value
    return value


def _parse_json(raw: bytes | str) -> Any:
    """:func:`parse_json` itself: the checks and the parse."""
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    outside = _STRING.sub("", text)
    if _depth_outside(outside) > MAX_DEPTH:
        raise InputLimitError(f"nested deeper than {MAX_DEPTH} levels: JSON is read at most {MAX_DEPTH} deep")
    if not _maybe_over(outside):  # every number in range: json.loads's own parsers
        return json.loads(text)
    made: list[_Huge] = []  # every number over the limit the parser met (none: the value holds none)

    def huge(s: str) -> _Huge:
        made.append(_Huge(s))
        return made[-1]

    def as_int(s: str) -> object:
        if len(s.lstrip("-")) > 16:
            return huge(s)
        value = int(s)
        return value if -MAX_MAGNITUDE <= value <= MAX_MAGNITUDE else huge(s)

    def as_float(s: str) -> object:
        value = float(s)  # NaN and the infinities fail both comparisons
        return value if -MAX_MAGNITUDE <= value <= MAX_MAGNITUDE else huge(s)

    value = json.loads(text, parse_int=as_int, parse_float=as_float, parse_constant=huge)
    found = _huge_at(value) if made else None  # the walk names the key; with none made, none is there
    if found is not None:
        raise InputLimitError(
            f"field {found[0]} = {found[1][:24]}{'...' if len(found[1]) > 24 else ''}: a number out of "
            f"range (at most 2**53 in magnitude, finite)"
        )
    return value


def read_json_file(path: str, limit: int = MAX_FILE_BYTES) -> Any:
    """The JSON value of the regular file ``path``: :func:`read_regular` then :func:`parse_json`;
    every refusal an :class:`InputLimitError` or ``ValueError`` naming the file."""
    raw = read_regular(path, limit)
    try:
        return parse_json(raw)
    except InputLimitError as e:
        raise InputLimitError(f"{path}: {e}") from e
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from e

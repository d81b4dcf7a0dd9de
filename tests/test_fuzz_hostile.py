"""Generated hostile input (hypothesis) through the real readers and the public audit: nesting of
any depth and style, numbers of any size, symbolic links (to ``/dev/zero``, a folder, nowhere, a
good file) and FIFOs in place of any file of a records folder. The readers refuse with their own
error (never a RecursionError, an OverflowError, an unbounded read or a hang) and accept exactly
what ``json.loads`` reads within the limits; the audit, run as a reader runs it on a scratch copy
of a tagged study, exits 1 naming the file (and the key) every time.

The reader properties draw many examples (they take milliseconds); the audit runs a few per test
(a process each), drawn afresh with ``HYPOTHESIS_PROFILE=random``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, private_copy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_integrity import RECS

from prereg.bounded import MAX_DEPTH, MAX_MAGNITUDE, InputLimitError, parse_json
from prereg.formats.record import RecordFormatError, read_entry
from prereg.yamlflow import YamlError
from prereg.yamlsub import yaml_subset

# -- values ------------------------------------------------------------------------------------

#: Number literals past the limits: long integers, exponents past a float's, the constants
#: ``json.loads`` takes by default.
HUGE = st.one_of(
    st.integers(min_value=17, max_value=5000).map(lambda n: "9" * n),
    st.integers(min_value=309, max_value=10**6).map(lambda e: f"1e{e}"),
    st.integers(min_value=309, max_value=400).map(lambda e: f"-2.5E+{e}"),
    st.just(str(MAX_MAGNITUDE + 1)),
    st.sampled_from(["NaN", "Infinity", "-Infinity"]),
)


def nested(depth: int, style: str, leaf: str = "0") -> str:
    """JSON text nested ``depth`` deep: arrays, objects or both in turn."""
    opens = "".join("[" if style == "list" or (style == "mixed" and i % 2) else '{"k":' for i in range(depth))
    closes = "".join("]" if c == "[" else "}" for c in reversed(opens.replace('{"k":', "{")))
    return opens + leaf + closes


@settings(max_examples=60, deadline=None)
@given(
    depth=st.integers(min_value=MAX_DEPTH + 1, max_value=5000),
    style=st.sampled_from(["list", "dict", "mixed"]),
)
def test_json_nested_past_the_limit_is_refused_quickly(depth, style):
    t0 = time.monotonic()
    with pytest.raises(InputLimitError, match=f"nested deeper than {MAX_DEPTH} levels"):
        parse_json(nested(depth, style))
    assert time.monotonic() - t0 < 5


@settings(max_examples=20, deadline=None)
@given(n=st.integers(min_value=1, max_value=2_000_000), opener=st.sampled_from(["", "[", '{"k":']))
def test_unclosed_strings_are_refused_in_linear_time(n, opener):
    """``"\\"\\"...`` never closes: the depth count skips it in one pass (a pattern that started
    again at every quote took time quadratic in their count: a hang for a few megabytes)."""
    t0 = time.monotonic()
    with pytest.raises(ValueError):
        parse_json(opener + '"' + '\\"' * n)
    assert time.monotonic() - t0 < 5


@settings(max_examples=60, deadline=None)
@given(literal=HUGE, key=st.text("abcdefgh_", min_size=1, max_size=8), at=st.integers(0, 3))
def test_a_number_past_the_limit_is_refused_naming_its_key(literal, key, at):
    values = [literal, *["1", "2.5", '"x"'][:at]]  # the literal first, then good values
    text = json.dumps({"ok": 1, key: {"inner": ["@@"]}}).replace('"@@"', ", ".join(values))
    with pytest.raises(InputLimitError) as e:
        parse_json(text)
    assert f"field {key}.inner[0] = " in str(e.value) and "out of range" in str(e.value)


@settings(max_examples=200, deadline=None)
@given(
    value=st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-MAX_MAGNITUDE, MAX_MAGNITUDE)
        | st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: abs(x) <= MAX_MAGNITUDE)
        | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
        max_leaves=30,
    )
)
def test_within_the_limits_the_value_is_json_loads_own(value):
    """The limits change nothing else: what ``json.loads`` reads within them, parse_json reads."""
    text = json.dumps(value)
    got = parse_json(text)
    assert got == json.loads(text)


@settings(max_examples=40, deadline=None)
@given(
    depth=st.integers(min_value=MAX_DEPTH + 1, max_value=5000),
    style=st.sampled_from(["flow", "block-seq", "block-map", "compact"]),
)
def test_yaml_nested_past_the_limit_is_refused_naming_a_line(depth, style):
    if style == "flow":
        text = "id: x\nnotes: " + "[" * depth + "]" * depth + "\n"
    elif style == "compact":
        text = "id: x\nnotes:\n  " + "- " * depth + "x\n"
    elif style == "block-seq":
        text = (
            "id: x\nnotes:\n"
            + "".join("  " * i + "-\n" for i in range(1, min(depth, 400)))
            + "  " * 400
            + "- x\n"
        )
    else:
        text = (
            "id: x\n" + "".join("  " * i + f"k{i}:\n" for i in range(min(depth, 400))) + "  " * 400 + "v: 1\n"
        )
    t0 = time.monotonic()
    with pytest.raises(YamlError, match=f"nested deeper than {MAX_DEPTH} levels") as e:
        yaml_subset(text)
    assert e.value.line >= 2 and time.monotonic() - t0 < 5


# -- files -------------------------------------------------------------------------------------

KINDS = ("dev-zero", "folder", "dangling", "good-file", "fifo")


def plant(path: Path, kind: str, good: Path) -> None:
    """Put a symbolic link (to /dev/zero, a folder, nowhere, a good file) or a FIFO at ``path``."""
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(
            {"dev-zero": "/dev/zero", "folder": "/", "dangling": "/nonexistent/x", "good-file": str(good)}[
                kind
            ]
        )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS))
def test_a_record_reader_refuses_links_and_fifos_unopened(tmp_path, kind):
    good = tmp_path / "good.record.json"
    good.write_text('{"schema_version": 4}')
    path = tmp_path / f"x{time.monotonic_ns()}.a1.record.json"
    plant(path, kind, good)
    t0 = time.monotonic()
    with pytest.raises(RecordFormatError, match="a symbolic link|not a regular file"):
        read_entry(path)
    assert time.monotonic() - t0 < 5


# -- the public audit on a scratch copy ------------------------------------------------------------


@pytest.fixture(scope="module")
def scratch(tagged_done_study: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return private_copy(tagged_done_study, tmp_path_factory.mktemp("hostile") / "study")


def targets(folder: Path) -> list[str]:
    """One file of each kind the audit reads in a records folder."""
    names = sorted(p.name for p in folder.iterdir())
    pick = [
        next(n for n in names if n.endswith(".record.json")),
        next(n for n in names if n.endswith(".started.json")),
        next(n for n in names if n.startswith("protocol.")),
    ]
    return pick + [n for n in ("MANIFEST", "summary.json", "TAG", "report.md", "index.html") if n in names]


def run_audit(repo: Path) -> str:
    a = subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "analysis" / "public_audit.py"), RECS],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=90,  # a FIFO opened or /dev/zero read runs past it
    )
    out = a.stdout + a.stderr
    assert a.returncode == 1 and "Traceback" not in out, out[-3000:]
    return out


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_audit_names_any_file_replaced_by_a_link_or_a_fifo(scratch, data):
    folder = scratch / RECS
    name = data.draw(st.sampled_from(targets(folder)), label="file")
    kind = data.draw(st.sampled_from(KINDS), label="kind")
    path, kept = folder / name, scratch / "kept"
    shutil.move(path, kept)
    try:
        plant(path, kind, kept)
        out = run_audit(scratch)
        assert f"{RECS}/{name}: " in out, out[-3000:]
        assert "a symbolic link" in out or "not a regular file" in out, out[-3000:]
    finally:
        path.unlink()
        shutil.move(kept, path)


def _numeric_paths(value: object, path: str = "") -> list[str]:
    """Every number's key path in ``value``, as prereg.bounded names it."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [path]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [
        p
        for k, v in items
        for p in _numeric_paths(
            v, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}" if path else str(k)
        )
    ]


def _set(value: object, path: str, new: object) -> None:
    import re

    keys = [int(m[1]) if m[1] else m[2] for m in re.finditer(r"\[(\d+)\]|\.?([^.\[\]]+)", path)]
    for k in keys[:-1]:
        value = value[k]  # type: ignore[index]
    value[keys[-1]] = new  # type: ignore[index]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_audit_names_a_deep_value_or_a_huge_number_anywhere_in_a_record(scratch, data):
    folder = scratch / RECS
    name = data.draw(
        st.sampled_from(sorted(p.name for p in folder.glob("*.json") if "protocol." not in p.name))
    )
    path = folder / name
    before = path.read_bytes()
    value = json.loads(before)
    try:
        if data.draw(st.booleans(), label="deep"):
            depth = data.draw(st.integers(MAX_DEPTH + 1, 3000), label="depth")
            value["deep"] = "@@"
            path.write_text(json.dumps(value).replace('"@@"', nested(depth, "mixed")))
            needle = "nested deeper than 64 levels: JSON is read at most 64 deep"
        else:
            where = data.draw(st.sampled_from(_numeric_paths(value)), label="key")
            literal = data.draw(HUGE, label="literal")
            _set(value, where, "@@")
            path.write_text(json.dumps(value).replace('"@@"', literal))
            needle = f"field {where} = "
        out = run_audit(scratch)
        assert f"{RECS}/{name}: " in out and needle in out, out[-3000:]
    finally:
        path.write_bytes(before)

"""The typed record: RunSpec, WorkerResult and RunRecord against the JSON files they are read from."""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import fields
from pathlib import Path

import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from prereg.formats.record import (
    RecordFormatError,
    RunRecord,
    RunSpec,
    StartedEntry,
    WorkerResult,
    canonical,
    jsonable,
    load_started,
    read_entry,
    read_record,
    read_snapshots,
    record_files,
    seal,
    started_files,
)

COMMITTED = sorted(p for d in (ROOT / "records").iterdir() if d.is_dir() for p in record_files(d))


def test_every_committed_record_reads_and_writes_back_to_its_own_bytes():
    """Records written before the typed record existed read into it and write back to the same JSON,
    so their sha256 (and the ledger that chains them) is unchanged. Each file is read once: its
    bytes, their JSON as ``json.loads`` gives it, and the typed record ``read_record`` reads from
    them over its folder's protocol snapshots (read once per folder, as ``load_records`` does;
    ``read_record`` without them reads the same folder's again for every record)."""
    assert len(COMMITTED) > 100
    folders = sorted({p.parent for p in COMMITTED})
    snapshots = {d: read_snapshots(d) for d in folders}
    for d in folders:  # without snapshots given, read_record reads its folder's: the same record
        first = next(p for p in COMMITTED if p.parent == d)
        assert read_record(first) == read_record(first, snapshots[d]), first
    for path in COMMITTED:
        data = path.read_bytes()
        raw = json.loads(data)
        rec = read_record(path, snapshots[path.parent])
        written = rec.to_json()
        assert isinstance(rec.spec, RunSpec) and rec.spec.run_id == raw["spec"]["run_id"]
        assert written == raw, path
        assert canonical(seal(written)) + b"\n" == data, path


STARTED = sorted(p for d in (ROOT / "records").iterdir() if d.is_dir() for p in started_files(d))


def test_every_committed_started_entry_reads_typed_and_writes_back_to_its_own_bytes():
    assert len(STARTED) > 100
    for path in STARTED:
        entry = StartedEntry.from_json(read_entry(path), str(path))
        assert canonical(entry.to_json()) + b"\n" == path.read_bytes(), path


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d.update(gpu=True), "unknown fields gpu"),
        (lambda d: d.pop("run_id"), "field run_id is missing"),
        (lambda d: d.pop("ledger"), "field ledger is missing"),  # on disk, every entry is linked
        (lambda d: d.update(attempt="1"), "attempt"),
        (lambda d: d.update(node=None), "node"),
        (lambda d: d.update(kind="record"), "field kind = 'record'"),
    ],
)
def test_a_started_entry_of_another_shape_is_refused_naming_the_file_and_field(tmp_path: Path, edit, says):
    data = read_entry(STARTED[0])
    edit(data)
    folder = tmp_path / "records"
    folder.mkdir()
    path = folder / STARTED[0].name
    path.write_text(json.dumps(data))
    with pytest.raises(RecordFormatError, match=f"{path}.*{says}"):
        load_started(folder)


def _one() -> dict:
    """A committed record that stands alone (a schema 4 record's protocol is a stub over its folder's
    snapshot, which a copy on its own lacks): a fresh copy each call."""
    return read_entry(_standalone())


@functools.cache
def _standalone() -> Path:
    # the folders without a protocol snapshot first (records before schema 4 carry their whole
    # protocol): the first such record in path order, without reading the thousands of schema 4
    # records of the folders sorted before them
    bare = {d for d in {p.parent for p in COMMITTED} if not any(d.glob("protocol.*.json"))}
    order = sorted(COMMITTED, key=lambda p: p.parent not in bare)
    return next(p for p in order if read_entry(p).get("schema_version", 1) < 4)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d.update(gpu=True), "unknown fields gpu"),
        (lambda d: d.pop("spec"), "field spec is missing"),
        (lambda d: d.pop("status"), "field status is missing"),
        (lambda d: d["spec"].update(gpu=True), "spec: unknown fields gpu"),
        (lambda d: d["spec"].pop("seed"), "field spec.seed is missing"),
        (lambda d: d.update(spec=[1]), r"field spec = \[1\] is not object"),
    ],
)
def test_a_record_with_fields_this_harness_does_not_know_is_refused_naming_them(tmp_path: Path, edit, says):
    data = _one()
    edit(data)
    path = tmp_path / "x.a1.record.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordFormatError, match=f"{path}: {says}"):
        read_record(path)


def test_a_records_optional_fields_are_absent_not_null():
    """What the worker never got to is left out of the JSON; the fields every record has stay, null or not."""
    rec = RunRecord.from_json(_one())
    bare = RunRecord(
        schema_version=3,
        protocol={},
        plan_sha256="p",
        spec=rec.spec,
        attempt=1,
        git={"commit": None, "dirty": None},
        status="interrupted",
    )
    assert set(bare.to_json()) == {
        "schema_version",
        "protocol",
        "plan_sha256",
        "spec",
        "attempt",
        "git",
        "status",
        "reason",
        "timings",
        "unit_attempt",
        "started_at",
        "finished_at",
    }
    assert bare.to_json()["reason"] is None and RunRecord.from_json(bare.to_json()) == bare


def test_a_worker_result_with_an_unknown_field_is_refused():
    with pytest.raises(RecordFormatError, match="worker result: unknown fields bogus"):
        WorkerResult.from_json({"status": "ok", "bogus": 1})
    with pytest.raises(RecordFormatError, match="worker result: missing status"):
        WorkerResult.from_json({"reason": "x"})
    with pytest.raises(RecordFormatError, match="is not a JSON object"):
        WorkerResult.from_json([1])


_floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
_text = st.text(max_size=20)
_optional = {
    "reason": st.none() | _text,
    "env": st.none() | st.dictionaries(_text, _text, max_size=3),
    "parameters": st.none() | st.integers(0, 10**9),
    "curve": st.none() | st.lists(st.lists(_floats, min_size=3, max_size=3), max_size=4),
    "val_bpb": st.none() | _floats,
    "test_bpb": st.none() | _floats,
    "rescore_identical": st.none() | st.booleans(),
    "traceback": st.none() | _text,
    "log_tail": st.none() | _text,
    "timings": st.dictionaries(st.sampled_from(["device_s", "training_s", "total_s"]), st.none() | _floats),
}


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    status=st.sampled_from(["ok", "failed", "running"]), values=st.fixed_dictionaries({}, optional=_optional)
)
def test_worker_results_cross_the_pipe_unchanged(status, values):
    """Any result a worker can build arrives as the same typed result after the JSON line it travels as."""
    res = WorkerResult(status=status, **values)
    line = json.dumps(jsonable(res.to_json()), sort_keys=True, allow_nan=False)
    back = WorkerResult.from_json(json.loads(line))
    assert back == res
    assert set(res.to_json()) == {"status", "reason", "timings"} | {
        k for k, v in values.items() if v is not None
    }


def test_a_non_finite_measurement_is_written_as_null():
    res = WorkerResult(status="failed", curve=[[1.0, math.nan, 0.5]], timings={"device_s": math.inf})
    assert json.loads(canonical(jsonable(res.to_json()))) == {
        "status": "failed",
        "reason": None,
        "curve": [[1.0, None, 0.5]],
        "timings": {"device_s": None},
    }


def test_a_record_is_frozen_and_its_spec_typed():
    rec = RunRecord.from_json(_one())
    with pytest.raises(AttributeError):
        rec.status = "ok"  # type: ignore[misc]
    assert {f.name for f in fields(RunRecord)} >= {f.name for f in fields(WorkerResult)}
    assert RunSpec.from_json(rec.spec.to_json()) == rec.spec


def test_a_non_finite_measurement_keeps_its_key_as_null_through_the_pipe_and_the_record():
    """A worker's inf or NaN BPB travels its pipe as null, reads back as NaN, and is written as null:
    the key stays, as it always has (the audit reads it), and the record writes back the same bytes."""
    rec = RunRecord.from_json(_one())
    res = WorkerResult(status="ok", test_bpb=math.inf, rescored_test_bpb=math.inf, val_bpb=math.nan)
    line = json.loads(json.dumps(jsonable(res.to_json()), allow_nan=False))
    back = WorkerResult.from_json(line)
    assert math.isinf(res.test_bpb) and math.isnan(back.test_bpb) and math.isnan(back.val_bpb)
    written = seal(
        RunRecord(
            **{**rec.worker_fields(), **back.worker_fields()},
            schema_version=3,
            protocol=rec.protocol,
            plan_sha256=rec.plan_sha256,
            spec=rec.spec,
            attempt=1,
            git=rec.git,
        ).to_json()
    )
    assert written["test_bpb"] is None and written["val_bpb"] is None and written["rescored_test_bpb"] is None
    assert canonical(seal(RunRecord.from_json(written).to_json())) == canonical(written)


@pytest.mark.parametrize("version", [1, 2])
def test_older_records_write_back_to_their_own_bytes(version):
    """A version 1 record (no ledger) and a version 2 one (no attempts) gain no field on the way back."""
    drop = {"start", "unit_attempt", "sha256"} | ({"ledger"} if version == 1 else set())
    old = seal({**{k: v for k, v in _one().items() if k not in drop}, "schema_version": version})
    rec = RunRecord.from_json(old)
    assert rec.unit_attempt == 1 and rec.start is None
    assert canonical(seal(rec.to_json())) == canonical(old)


@pytest.mark.parametrize(
    ("result", "says"),
    [
        ({"status": "ok", "timings": None}, "timings is null"),
        ({"status": "ok", "curve": "x"}, "curve is str"),
        ({"status": 3}, "status is int"),
        ({"status": "ok", "parameters": True}, "parameters is bool"),
        ({"status": "ok", "test_bpb": "3.1"}, "test_bpb is str"),
    ],
)
def test_a_worker_result_of_the_wrong_json_type_is_refused(result, says):
    with pytest.raises(RecordFormatError, match=f"worker result: {says}"):
        WorkerResult.from_json(result)


def test_the_shape_every_reader_checks_is_the_dataclasses_fields():
    """One declaration: the record's, its spec's and a started entry's shapes (what the audit and
    ``read_entry`` check before anything else) are their dataclasses' fields, so a field added to
    the class is checked in the file without a second table."""
    from prereg.formats.record import RECORD_SHAPE, SPEC_SHAPE, STARTED_SHAPE

    for shape, cls in ((RECORD_SHAPE, RunRecord), (SPEC_SHAPE, RunSpec), (STARTED_SHAPE, StartedEntry)):
        assert set(shape) == {f.name for f in fields(cls)}
    # what every sealed record has, whatever the class's defaults before it is sealed
    assert {k for k, (_, required) in RECORD_SHAPE.items() if required} == {
        "schema_version",
        "spec",
        "attempt",
        "status",
        "protocol",
        "plan_sha256",
        "sha256",
        "git",
        "timings",
    }
    assert RECORD_SHAPE["ledger"] == ((dict,), False)  # absent before schema 2, never null
    assert RECORD_SHAPE["test_bpb"] == ((int, float, type(None)), False)
    assert all(required for _, required in STARTED_SHAPE.values())


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        # fields the hand-written table did not check, now checked from the class
        (lambda d: d.update(process=[1]), r"field process = \[1\] is not object or null"),
        (lambda d: d.update(final_metric="0.5"), r'field final_metric = "0.5" is not int or float or null'),
        (lambda d: d["spec"].update(compile="no"), r'field spec.compile = "no" is not bool'),
        (lambda d: d["spec"].pop("config_sha256"), "field spec.config_sha256 is missing"),
        # nulls a sealed file never holds, whatever the class's default
        (lambda d: d.update(ledger=None), "field ledger = null is not object"),
        (lambda d: d.update(sha256=None), "field sha256 = null is not str"),
        (lambda d: d.update(timings=None), "field timings = null is not object"),
    ],
)
def test_a_field_of_the_wrong_json_type_is_named_before_any_other_check(tmp_path: Path, edit, says):
    """The audit and the harness name the same field (``entry_problems``, read from the classes)."""
    from prereg.formats.record import entry_problems

    data = _one()
    edit(data)
    path = tmp_path / "x.a1.record.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordFormatError, match=f"{path}: {says}"):
        read_entry(path)
    assert any(re.match(says, p) for p in entry_problems(data))


# -- the bounded JSON reader every record goes through (prereg/bounded.py) -------------------------


def _depth_by_loop(text: str) -> int:
    """json_depth as it was written first: a Python loop over the brackets outside strings."""
    from prereg.bounded import MAX_DEPTH

    depth = deepest = 0
    for m in re.finditer(r"[\[\]{}]", re.sub(r'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', "", text, flags=re.S)):
        depth += 1 if m.group() in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > MAX_DEPTH:
                break
    return deepest


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.text(alphabet='[]{}"\\a,:1 ', max_size=200)
    | st.tuples(st.integers(60, 70), st.integers(0, 70)).map(
        lambda n: "[{" * (n[0] // 2) + "]}" * (n[1] // 2)
    )
)
def test_the_json_depth_is_the_running_count_of_brackets_outside_strings(text):
    from prereg.bounded import json_depth

    assert json_depth(text) == _depth_by_loop(text)


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1e300, -1e308, 2.0**53, 2.0**53 + 2, 10**17, -(10**16), 9007199254740993])
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=20,
)


def _first_over(v: object, path: str = "") -> str | None:
    """The key path of the first number in the JSON value ``v`` that is not finite or is over 2**53 in
    magnitude (the reader's limit), or None."""
    from prereg.bounded import MAX_MAGNITUDE

    if isinstance(v, bool) or v is None or isinstance(v, str):
        return None
    if isinstance(v, (int, float)):
        ok = not (isinstance(v, float) and not math.isfinite(v)) and abs(v) <= MAX_MAGNITUDE
        return None if ok else (path or "<top level>")
    items = v.items() if isinstance(v, dict) else enumerate(v)
    for k, x in items:
        found = _first_over(x, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}" if path else str(k))
        if found is not None:
            return found
    return None


@settings(max_examples=100, deadline=None, derandomize=True)
@given(_json_values)
def test_every_number_over_the_limit_is_refused_naming_its_key_and_the_rest_read_as_json_reads_it(value):
    """parse_json against json.loads: the same value where every number is within 2**53 and finite;
    otherwise InputLimitError naming the first such number's key path and text."""
    from prereg.bounded import InputLimitError, parse_json

    text = json.dumps(value)
    over = _first_over(json.loads(text))
    if over is None:
        assert parse_json(text) == json.loads(text)
    else:
        with pytest.raises(InputLimitError, match=re.escape(f"field {over} = ")):
            parse_json(text)


def test_a_number_over_the_limit_overwritten_by_a_repeated_key_is_read_as_json_reads_it():
    from prereg.bounded import InputLimitError, parse_json

    assert parse_json('{"a": 1e400, "a": 1}') == {"a": 1}
    with pytest.raises(InputLimitError, match=r"field a\.b\[1\] = 1e400: a number out of range"):
        parse_json('{"a": {"b": [1, 1e400]}}')
    with pytest.raises(InputLimitError, match=r"field <top level> = NaN"):
        parse_json("NaN")


@pytest.mark.parametrize(
    "text",
    [
        "[999999999999999, -999999999999999, 999999999999999.9, 0.12345678901234567]",
        "[1e-05, 1.5E-300, 123456789012345.5e-0, 1e-400, -0.0, 0]",
        '{"a": "1e400", "b": "NaN", "c": "Infinity", "d": "12345678901234567", "e": 1}',
        '{"\\"": [1e-7], "x": "\\\\"}',
        "[9007199254740992, -9007199254740992, 9007199254740993]",
        "[1234567890123456.0]",
        "[1e5, 1E+2, 2.5e15]",
        "[1e16]",
        "[NaN]",
        '{"a": [1, -Infinity]}',
        '{"a": 1e400, "a": 1}',
        "[1, 2",
        '[1, "2]',
        "[01]",
    ],
)
def test_every_number_is_read_as_json_reads_it_and_refused_over_the_limit_at_the_fast_path_s_edges(text):
    """Texts at the edges of the reader's fast path (every number under 10**15 read by json.loads's
    own parsers): in range, each value is json.loads's, of its type (``1`` is not ``1.0``); a number
    over 2**53 or not finite is refused naming its key, and a text that is not JSON is json.loads's
    error, whichever path reads it."""
    from prereg.bounded import InputLimitError, parse_json

    try:
        want = json.loads(text)
    except ValueError as e:
        with pytest.raises(ValueError, match=re.escape(str(e))):
            parse_json(text)
        return
    over = _first_over(want)
    if over is None:
        assert json.dumps(parse_json(text)) == json.dumps(want)
    else:
        with pytest.raises(InputLimitError, match=re.escape(f"field {over} = ")):
            parse_json(text)


def test_a_committed_record_is_read_without_a_python_call_per_number():
    """A committed record (about two thousand numbers, all in range) is read by json.loads's own
    number parsers, to the value json.loads reads: a Python call per number was most of the audit's
    time reading a records folder."""
    import sys

    from prereg.bounded import parse_json

    path = max(COMMITTED, key=lambda p: p.stat().st_size)
    raw = path.read_bytes()
    numbers = len(re.findall(rb"[:,\[]-?[0-9]", raw))
    calls: list[str] = []

    def count(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_name)

    sys.setprofile(count)
    try:
        value = parse_json(raw)
    finally:
        sys.setprofile(None)
    assert numbers > 1000 and json.dumps(value) == json.dumps(json.loads(raw))
    assert len(calls) < 10, f"{len(calls)} Python calls reading {numbers} numbers: {calls[:8]}"

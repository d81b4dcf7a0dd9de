"""No traceback on any malformed record: every field of every file the audit reads (a record, its
spec, ledger link and protocol stub, a started entry, MANIFEST, the protocol snapshot and
``summary.json``) replaced by values of every other JSON type, or deleted, and resealed so that the
shape checks (not only the self-hash) are reached. The audit must fail (exit 1) naming the file and
never raise; ``harness status`` and ``harness report`` must end with a message, never a traceback.
The audit and the CLI run in process (the same code the commands run). The fast tier tries a
sample drawn by hypothesis over eight values; the process tier sweeps every field with three
(deleted, null, another type), running ``harness report`` where it reads the file."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from conftest import private_copy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_integrity import PROTO, RECS

from audit.cli import main as audit_main
from prereg.formats.record import canonical, seal

MUTATIONS = ("delete", None, [], "x", -1, 1.5, True, {})


@pytest.fixture(scope="module")
def study(tagged_done_study: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return private_copy(tagged_done_study, tmp_path_factory.mktemp("fuzz") / "study")


def files(study: Path) -> dict[str, Path]:
    folder = study / RECS
    return {
        "record": sorted(folder.glob("*.record.json"))[0],
        "started": sorted(folder.glob("*.started.json"))[0],
        "MANIFEST": folder / "MANIFEST",
        "snapshot": next(folder.glob("protocol.*.json")),
        "summary": folder / "summary.json",
    }


def places(study: Path) -> list[tuple[str, tuple[str, ...]]]:
    """Every field of every file: (file, key path), nested one level into the objects readers open."""
    out = []
    for kind, path in files(study).items():
        data = json.loads(path.read_text())
        for k, v in data.items():
            out.append((kind, (k,)))
            if isinstance(v, dict) and k in (
                "spec",
                "ledger",
                "protocol",
                "start",
                "timings",
                "env",
                "ledger_head",
            ):
                out += [(kind, (k, k2)) for k2 in v]
    return out


def mutate(path: Path, keys: tuple[str, ...], value: object, reseal: bool) -> bool:
    """Write the file with the field changed; False (nothing written) when the value is already so."""
    data = json.loads(path.read_text())
    obj = data
    for k in keys[:-1]:
        obj = obj[k]
    old = obj[keys[-1]]
    if value != "delete" and old == value and type(old) is type(value):
        return False
    if value == "delete":
        obj.pop(keys[-1])
    else:
        obj[keys[-1]] = value
    path.write_text((canonical(seal(data)) if reseal else canonical(data)).decode() + "\n")
    return True


def wrong_type(value: object) -> object:
    """A value of another JSON type than ``value``'s."""
    return 1 if isinstance(value, str) else "x"


def check(study: Path, kind: str, keys: tuple[str, ...], value: object, report: bool = True) -> None:
    path = files(study)[kind]
    before = path.read_bytes()
    try:
        resealed = kind in ("record", "started", "summary") and keys != ("sha256",)  # the seal itself: as is
        if not mutate(path, keys, value, reseal=resealed):
            return
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = audit_main([str(study / RECS)])  # an exception here is the failure this test finds
        assert code == 1, f"{kind} {'.'.join(keys)} = {value!r}: audit exit {code}\n{out.getvalue()[-2000:]}"
        from harness.cli import main as harness_main

        commands = [["status", str(study / PROTO)]] + [["report", str(study / PROTO), "--quiet"]] * report
        for args in commands:
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                harness_main(args)  # a message and an exit code; an exception fails the test
    finally:
        path.write_bytes(before)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_sample_of_malformed_fields_fails_the_audit_without_a_traceback(study, data, monkeypatch):
    monkeypatch.chdir(study)
    kind, keys = data.draw(st.sampled_from(places(study)))
    check(study, kind, keys, data.draw(st.sampled_from(MUTATIONS)))


@pytest.mark.process
def test_every_malformed_field_fails_the_audit_without_a_traceback(study, monkeypatch):
    monkeypatch.chdir(study)
    for kind, keys in places(study):
        data = json.loads(files(study)[kind].read_text())
        for k in keys:
            data = data[k]
        for value in ("delete", None, wrong_type(data)):
            # the report reads the records and the snapshot (status reads every file through reconcile)
            check(study, kind, keys, value, report=kind in ("record", "snapshot"))

"""A protocol is read once (issue 60): the harness reads a protocol file with the core's reader in
``load_protocol`` and takes every key from the typed protocol after that; the file is read again
only for what the typed protocol does not hold (a key's line) or for another file (the calibration
study a protocol names)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Where the harness calls ``read_document``, and why there.
READS = {
    "harness/protocol.py:load_protocol": "the one read of the protocol file",
    "harness/protocol.py:_refuse_uncalibrated": "another file: the calibration study the protocol names",
    "harness/freeze.py:_preregistered_at": "a key's line, which the typed protocol does not keep",
}


def _readers() -> set[str]:
    found = set()
    for path in sorted((ROOT / "harness").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for call in ast.walk(fn):
                    f = getattr(call, "func", None)
                    name = getattr(f, "id", None) or getattr(f, "attr", None)
                    if isinstance(call, ast.Call) and name == "read_document":
                        found.add(f"{rel}:{fn.name}")
    return found


def test_the_harness_reads_a_protocol_file_once_and_keys_from_the_typed_protocol() -> None:
    assert _readers() == set(READS)


def test_the_typed_protocol_holds_origins_and_calibration_as_the_file_does() -> None:
    from harness.protocol import load_protocol
    from prereg.protocol.read import read_document

    for p in sorted((ROOT / "protocols").glob("*.yaml")):
        doc = read_document(p)
        if "origins" not in doc.data and "calibration" not in doc.data:
            continue
        proto = load_protocol(p)
        assert proto.spec.origins == doc.data.get("origins"), p
        assert proto.spec.calibration == doc.data.get("calibration"), p

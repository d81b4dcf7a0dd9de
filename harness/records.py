"""Run records: versioned schema, canonical JSON, self-hashes, atomic no-overwrite writes, MANIFEST.

Format log (``schema_version``):

* 1 - first version: one JSON file per run attempt, ``sha256`` over the canonical JSON of the
  record without that field; MANIFEST lists record and source hashes.

Canonical JSON: ``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
allow_nan=False)`` encoded as UTF-8. Non-finite floats are stored as ``null``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.errors import RefusedError

SCHEMA_VERSION = 1
MANIFEST = "MANIFEST"
RECORD_SUFFIX = ".record.json"


def jsonable(obj: Any) -> Any:
    """Replace non-finite floats by ``None`` (JSON has no NaN) recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def seal(record: dict[str, Any]) -> dict[str, Any]:
    """Return ``record`` with ``sha256`` set to the hash of its canonical form without that field."""
    body = {k: v for k, v in jsonable(record).items() if k != "sha256"}
    body["sha256"] = sha256_bytes(canonical(body))
    return body


def self_hash_ok(record: dict[str, Any]) -> bool:
    body = {k: v for k, v in record.items() if k != "sha256"}
    return record.get("sha256") == sha256_bytes(canonical(body))


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, overwrite: bool) -> None:
    """Write via a temporary file, fsync and rename. With ``overwrite=False`` an existing file is
    never replaced (the final step is a hard link, which fails if the name exists)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError as e:
                raise RefusedError(f"refusing to overwrite existing record {path}") from e
            os.unlink(tmp)
        _fsync_dir(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_record(directory: Path, name: str, record: dict[str, Any]) -> Path:
    """Seal and write one record as ``<name>.record.json``; never overwrites."""
    sealed = seal(record)
    path = directory / f"{name}{RECORD_SUFFIX}"
    atomic_write(path, canonical(sealed) + b"\n", overwrite=False)
    return path


def read_record(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def record_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{RECORD_SUFFIX}")) if directory.is_dir() else []


def load_records(directory: Path) -> list[dict[str, Any]]:
    return [read_record(p) for p in record_files(directory)]


def source_hashes(root: Path, extra: Iterable[Path]) -> dict[str, str]:
    """sha256 of every source file that produces records: harness/, analysis/, configs/, extras."""
    files: set[Path] = set()
    for sub, pattern in (("harness", "*.py"), ("analysis", "*.py"), ("configs", "*.yaml")):
        base = root / sub
        if base.is_dir():
            files.update(p for p in base.rglob(pattern) if "__pycache__" not in p.parts)
    files.update(extra)
    out = {}
    for p in sorted(files):
        rel = p.resolve().relative_to(root.resolve()).as_posix()
        out[rel] = sha256_bytes(p.read_bytes())
    return out


def write_manifest(directory: Path, root: Path, protocol_path: Path, protocol: dict[str, Any]) -> Path:
    """Rewrite MANIFEST atomically: every record file's sha256 and every source file's sha256."""
    records = {p.name: sha256_bytes(p.read_bytes()) for p in record_files(directory)}
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "protocol": protocol,
        "records": records,
        "sources": source_hashes(root, [protocol_path]),
    }
    path = directory / MANIFEST
    atomic_write(path, json.dumps(manifest, sort_keys=True, indent=1).encode("utf-8") + b"\n", overwrite=True)
    return path

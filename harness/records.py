"""The record format: canonical JSON, self-hash, atomic no-overwrite writes, versioned loading.

This is the one home of the format. It imports the Python standard library only, so the torch-free
:mod:`analysis` package and the runner share it. ``analysis/public_audit.py`` keeps its own
independent copy of the hashing rules by design (it must not trust this code).

Format log (``schema_version``):

* 1 - first version: one JSON file per run attempt, ``sha256`` over the canonical JSON of the
  record without that field; MANIFEST lists record and source hashes.
* 2 - ``ledger`` (``seq``: 1-based position in the protocol's append-only chain, ``prev``: the
  ``sha256`` of the record before it, or the freeze manifest's sha256 for the first record) and
  ``protocol.freeze_sha256`` (the hash of the manifest that ``harness tag`` wrote into the tag).
  Version 1 records are still read; they have no ledger, which the audit reports.
* 3 - attempts are ledger entries. Before a worker starts, the runner appends a *started entry*
  (``<run_id>.a<attempt>.started.json``: ``kind: "started"``, run id, attempt, ``unit_attempt``,
  node, runner, ``started_at``) to the chain; the record that ends the attempt links to it
  (``start``: the started entry's ``seq`` and ``sha256``). Every entry's ``ledger`` also holds ``at``,
  the time it was sealed (under the ledger lock). ``unit_attempt`` (1-based) says which run of its
  unit an attempt belongs to: a unit that runs again whole starts a new one, and the records of
  earlier ones are superseded (kept, counted, not analysed). Version 2 records are still read
  (no started entries: every attempt of theirs is its record; ``unit_attempt`` 1).

Canonical JSON: ``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
allow_nan=False)`` encoded as UTF-8. Non-finite floats are stored as ``null``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypedDict, cast

from harness.errors import RefusedError, WriteError  # standard library only, like this module

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
MANIFEST = "MANIFEST"
#: The tag object's raw bytes, kept in a preregistered study's records folder (see Runner._keep_tag).
TAG_FILE = "TAG"
RECORD_SUFFIX = ".record.json"
STARTED_SUFFIX = ".started.json"


class RecordFormatError(ValueError):
    """A record file that cannot be read as a record of a known format version."""


class LedgerLink(TypedDict):
    seq: int  # 1-based position in the protocol's chain
    prev: str  # sha256 of the record before (the freeze manifest's sha256 for seq 1)


class StartedEntry(TypedDict, total=False):
    """An attempt's start, appended to the chain before its worker starts (schema 3)."""

    schema_version: int
    kind: str  # "started"
    protocol: dict[str, Any]  # id, sha256, freeze_sha256
    run_id: str
    unit: str
    attempt: int
    unit_attempt: int
    node: str  # where the worker runs: this host, or a Ray node (host/id)
    runner: dict[str, Any]  # the process that appended it: host, pid
    started_at: str
    ledger: LedgerLink
    sha256: str


class LedgerHead(TypedDict):
    seq: int  # records in the chain
    sha256: str  # the last record's sha256 (or the freeze manifest's sha256 when empty)


class GitState(TypedDict):
    commit: str | None
    dirty: bool | None


class WorkerResult(TypedDict, total=False):
    """What a worker process reports (one line of JSON on its pipe): its status and what it measured,
    as far as it got. The runner merges it into the run's :class:`RunRecord`."""

    status: str  # "ok", "failed" or "interrupted" ("running" while the worker fills it in)
    reason: str | None
    timings: dict[str, Any]  # device_s always; the worker's clocks when it got that far
    # what the worker measured (absent when it failed early)
    env: dict[str, Any]
    parameters: int
    method_paths: dict[str, Any]
    curve: list[list[float]]
    val_curve: list[list[float]]
    val_bpb: float
    test_bpb: float
    rescored_test_bpb: float
    rescore_identical: bool
    eval_bytes: dict[str, int]
    memory: dict[str, Any]
    checkpoint: dict[str, Any]
    traceback: str
    log_tail: str


class RunRecord(WorkerResult, total=False):
    """One run attempt: the worker's result and the runner's fields. Written by the runner; read by the
    analysis and the audit."""

    schema_version: int
    protocol: dict[str, Any]  # Protocol.summary() plus the tag facts and freeze_sha256
    plan_sha256: str
    spec: dict[str, Any]  # RunSpec.as_dict()
    attempt: int  # 1-based attempt number of this run
    unit_attempt: int  # 1-based: which run of its unit this attempt belongs to (schema 3)
    start: dict[str, Any]  # the started entry this record ends: its seq and sha256 (schema 3)
    git: GitState
    started_at: str | None
    finished_at: str | None
    ledger: LedgerLink
    sha256: str
    node: dict[str, Any]  # the Ray node that ran it (id, host, pid); Ray runs only


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


def _free(directory: Path) -> str:
    try:
        return f"{shutil.disk_usage(directory).free} bytes free"
    except OSError:
        return "free space unknown"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


def atomic_write(path: Path, data: bytes, *, overwrite: bool) -> None:
    """Write via a temporary file, fsync and rename. With ``overwrite=False`` an existing file is
    never replaced (the final step is a hard link, which fails if the name exists). Any write error
    (a full disk, a read-only or failing filesystem) raises :class:`WriteError` naming the file and
    the free space, and leaves nothing behind: the file is either complete or absent."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would make it (mkstemp's 0600 would hide a hosted page)
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
    except OSError as e:
        raise WriteError(f"cannot write {path}: {e.strerror or e} ({_free(path.parent)} on its filesystem); "
                         "nothing was half-written: free space (or fix the folder) and run the same command "
                         "again to resume") from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            try:
                os.unlink(tmp)
            except OSError:
                pass


def write_json(path: Path, obj: Any, *, overwrite: bool = True, pretty: bool = False) -> None:
    """Atomically write ``obj`` as JSON (canonical, or sorted and indented when ``pretty``)."""
    data = json.dumps(obj, sort_keys=True, indent=1, allow_nan=False).encode("utf-8") if pretty else canonical(obj)
    atomic_write(path, data + b"\n", overwrite=overwrite)


def record_path(directory: Path, run_id: str, attempt: int) -> Path:
    return directory / f"{run_id}.a{attempt}{RECORD_SUFFIX}"


def write_record(directory: Path, record: RunRecord | dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Seal and write one record as ``<run_id>.a<attempt>.record.json``; never overwrites."""
    sealed = seal(dict(record))
    path = record_path(directory, sealed["spec"]["run_id"], sealed["attempt"])
    atomic_write(path, canonical(sealed) + b"\n", overwrite=False)
    return path, sealed


def started_path(directory: Path, run_id: str, attempt: int) -> Path:
    return directory / f"{run_id}.a{attempt}{STARTED_SUFFIX}"


def write_started(directory: Path, entry: StartedEntry | dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Seal and write one started entry as ``<run_id>.a<attempt>.started.json``; never overwrites."""
    sealed = seal(dict(entry))
    path = started_path(directory, sealed["run_id"], sealed["attempt"])
    atomic_write(path, canonical(sealed) + b"\n", overwrite=False)
    return path, sealed


def read_entry(path: Path) -> dict[str, Any]:
    """Read one entry of the chain (a record or a started entry) as its JSON object, refusing a format
    version this code does not know."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecordFormatError(f"{path}: not a readable JSON record ({e})") from e
    if not isinstance(data, dict):
        raise RecordFormatError(f"{path}: a record is a JSON object, found {type(data).__name__}")
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise RecordFormatError(
            f"{path}: record schema_version {version!r} is not one this harness reads "
            f"({', '.join(map(str, READABLE_VERSIONS))}); a newer harness wrote it: upgrade to read it"
        )
    return data


def read_record(path: Path) -> RunRecord:
    """Read one record, refusing a format version this code does not know."""
    return cast(RunRecord, read_entry(path))  # the JSON of a RunRecord (write_record)


def record_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{RECORD_SUFFIX}")) if directory.is_dir() else []


def started_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{STARTED_SUFFIX}")) if directory.is_dir() else []


def entry_files(directory: Path) -> list[Path]:
    """Every file of the chain: records and started entries."""
    return sorted(record_files(directory) + started_files(directory))


def load_started(directory: Path) -> list[StartedEntry]:
    """Every started entry of a folder, in ledger order."""
    out: list[StartedEntry] = []
    for p in started_files(directory):
        entry = read_entry(p)
        if entry.get("kind") != "started":
            raise RecordFormatError(f"{p}: a started entry has kind 'started', found {entry.get('kind')!r}")
        out.append(cast(StartedEntry, entry))  # the JSON of a StartedEntry (write_started)
    out.sort(key=lambda e: e["ledger"]["seq"])
    return out


def open_attempts(records: list[RunRecord], started: list[StartedEntry]) -> list[StartedEntry]:
    """Started entries that no record ends: attempts interrupted with nothing recorded yet."""
    ended = {(r["spec"]["run_id"], r["attempt"]) for r in records}
    return [e for e in started if (e["run_id"], e["attempt"]) not in ended]


def load_records(directory: Path) -> list[RunRecord]:
    """Every record of a folder, in ledger order (then file name, for version 1 records)."""
    recs = [read_record(p) for p in record_files(directory)]
    recs.sort(key=lambda r: (r.get("ledger", {}).get("seq", 0), r["spec"]["run_id"], r["attempt"]))
    return recs


def source_hashes(root: Path, extra: Iterable[Path]) -> dict[str, str]:
    """sha256 of every source file that produces records: harness/ (Python and C), analysis/,
    configs/, the tracked verified-paths files, and ``extra`` (the protocol, plug-in sources)."""
    files: set[Path] = set()
    for sub, patterns in (("harness", ("*.py", "*.c")), ("analysis", ("*.py",)), ("configs", ("*.yaml",)),
                          ("verified", ("*.json",))):
        base = root / sub
        if base.is_dir():
            for pattern in patterns:
                files.update(p for p in base.rglob(pattern) if "__pycache__" not in p.parts)
    files.update(extra)
    out = {}
    for p in sorted(files):
        rel = p.resolve().relative_to(root.resolve()).as_posix()
        out[rel] = sha256_bytes(p.read_bytes())
    return out


def write_manifest(directory: Path, root: Path, extra: Iterable[Path], protocol: dict[str, Any],
                   head: LedgerHead | None) -> Path:
    """Rewrite MANIFEST atomically: every record's and every started entry's file sha256, the ledger
    head, every source's sha256."""
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "protocol": protocol,
        "records": {p.name: sha256_bytes(p.read_bytes()) for p in record_files(directory)},
        "started": {p.name: sha256_bytes(p.read_bytes()) for p in started_files(directory)},
        "ledger_head": head,
        "sources": source_hashes(root, extra),
    }
    path = directory / MANIFEST
    write_json(path, manifest, pretty=True)
    return path

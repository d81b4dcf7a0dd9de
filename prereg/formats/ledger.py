"""Hashes, records and the ledger: canonical JSON, record self-hashes, record names, the hash chain
and the attempts it announces."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from prereg.bounded import InputLimitError, parse_json, read_regular

RECORD_SUFFIX = ".record.json"
STARTED_SUFFIX = ".started.json"
#: A group-sequential look's entry (``look<k>.look.json``, ``kind: "look"``): appended by ``harness
#: run`` when look ``k``'s pairs are final, before any statistic of the look is computed.
LOOK_SUFFIX = ".look.json"
SCHEMAS = (1, 2, 3, 4, 5, 6)


class Manifest(TypedDict, total=False):
    """A records folder's MANIFEST as the audit reads it once its shape is checked
    (``audit/folder.py``): a known ``schema_version``, ``records`` and ``sources`` objects, each
    other field absent, null or an object; the values inside are the file's, checked where read."""

    schema_version: int  # one of SCHEMAS; absent before schema 3
    records: dict[str, object]  # each record's file name: its file sha256
    started: dict[str, object] | None  # each started entry's (schema 3 on)
    looks: dict[str, object] | None  # each look entry's (a sequential design's)
    snapshots: dict[str, object] | None  # each protocol snapshot's (schema 4 on)
    sources: dict[str, object]  # each source file the runs read: its sha256
    protocol: dict[str, object] | None  # the protocol's id and path
    ledger_head: dict[str, object] | None  # the chain's head: seq and sha256


def study_schema(records: Iterable[Mapping[str, object]]) -> int:
    """The records schema a study's plan and protocol summary are recomputed under: the oldest
    ``schema_version`` among its records (1 where a record names none; the newest schema with no
    record). One harness writes a study's records (a tagged study's: the tag's, whose freeze
    manifest binds the plan's sha256), so a record written under another schema differs from that
    plan and is named (a version not an integer counts for none: the record's shape is named)."""
    versions = [
        v for r in records if isinstance(v := r.get("schema_version", 1), int) and not isinstance(v, bool)
    ]
    return min(versions, default=SCHEMAS[-1])


#: A records folder's protocol snapshots (schema 4 on): the protocol summary that records share,
#: written once by the ledger before the first record that names it, instead of a copy in each;
#: the file ``protocol.<sha256>.json`` is named by the sha256 of its canonical JSON (a study that is
#: not preregistered may change its protocol between runs: one file for each).
SNAPSHOT_PREFIX = "protocol."
SNAPSHOT_SUFFIX = ".json"
#: The fields of a record's ``protocol`` that say what tag it ran under (not part of the snapshot).
TAG_FIELDS = ("tag", "tag_commit", "tag_object", "tag_created", "freeze_sha256")

#: The project's packages, side by side at the repository's root: the core, the audit, the method,
#: the harness and the report. Their sources (and ``configs``, ``verified``) are what produces
#: records: MANIFEST lists each file's sha256 and the audit compares them with the tag's.
PACKAGES = ("prereg", "audit", "cotangent", "harness", "analysis")

#: Each source tree with the file endings that count (a study tagged before the core moved to
#: ``prereg/`` has only ``harness/`` and ``analysis/``, so the same listing reads it too).
SOURCE_TREES: tuple[tuple[str, tuple[str, ...]], ...] = (
    *((pkg, (".py", ".c")) for pkg in PACKAGES),
    ("configs", (".yaml",)),
    ("verified", (".json",)),
)


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def self_hash_ok(obj: Mapping[str, object]) -> bool:
    return obj.get("sha256") == sha256(canonical({k: v for k, v in obj.items() if k != "sha256"}))


def snapshot_of(protocol: Mapping[str, object]) -> dict[str, object]:
    """The protocol summary of a record's full ``protocol`` field: all but :data:`TAG_FIELDS`."""
    return {k: v for k, v in protocol.items() if k not in TAG_FIELDS}


def protocol_stub(protocol: Mapping[str, object]) -> dict[str, object]:
    """What a schema 4 record writes as ``protocol``: its id and sha256, the tag fields, and
    ``snapshot_sha256``, the sha256 of the canonical JSON of :func:`snapshot_of` (the folder's
    :func:`snapshot_name`), so every record's seal binds its snapshot."""
    return {
        "id": protocol["id"],
        "sha256": protocol["sha256"],
        **{k: protocol.get(k) for k in TAG_FIELDS},
        "snapshot_sha256": sha256(canonical(snapshot_of(protocol))),
    }


def snapshot_name(sha: str) -> str:
    """The file name of the snapshot whose canonical JSON has sha256 ``sha``."""
    return f"{SNAPSHOT_PREFIX}{sha}{SNAPSHOT_SUFFIX}"


def is_snapshot_name(name: str) -> bool:
    return name.startswith(SNAPSHOT_PREFIX) and name.endswith(SNAPSHOT_SUFFIX) and len(name) == 64 + 14


def with_snapshot(stub: Mapping[str, object], snapshots: Mapping[str, object]) -> dict[str, object] | None:
    """A schema 4 record's full ``protocol``: its stub over the snapshot it names (``snapshots``: the
    folder's, by sha256 of their canonical JSON), the inverse of :func:`protocol_stub`; ``None`` when
    that snapshot is missing or is not an object whose canonical JSON has that sha256."""
    snapshot = snapshots.get(str(stub.get("snapshot_sha256")))
    if not isinstance(snapshot, dict) or stub.get("snapshot_sha256") != sha256(canonical(snapshot)):
        return None
    return {**snapshot, **{k: v for k, v in stub.items() if k != "snapshot_sha256"}}


def read_json(path: str, raw: bytes | None = None) -> object:
    """The JSON value in ``path`` (or ``raw``), or ``None`` where it is not JSON, not a regular file
    or over a limit (:mod:`prereg.bounded`: :func:`json_problem` says which)."""
    return json_problem(path, raw)[0]


def json_problem(path: str, raw: bytes | None = None) -> tuple[object, str | None]:
    """The JSON value in the regular file ``path`` (or in ``raw``) and ``None``; or ``None`` and why
    it cannot be read (naming the file): not a regular file, over a size, depth or number limit,
    not JSON."""
    try:
        return parse_json(read_regular(path) if raw is None else raw), None
    except InputLimitError as e:
        return None, str(e) if raw is None and str(e).startswith(path) else f"{path}: {e}"
    except (OSError, ValueError) as e:
        return None, f"{path}: not JSON ({e})"


def record_name(rec: dict[str, Any]) -> str:
    """An entry's file name: a record's, a started entry's or a look's."""
    if rec.get("kind") == "look":
        return f"look{rec['look']}{LOOK_SUFFIX}"
    if rec.get("kind") == "started":
        return f"{rec['run_id']}.a{rec['attempt']}{STARTED_SUFFIX}"
    return f"{rec['spec']['run_id']}.a{rec['attempt']}{RECORD_SUFFIX}"


def iso_seconds(text: str) -> float:
    """Seconds since the epoch of an ISO 8601 time with an offset (``...+00:00``)."""
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def check_attempts(records: list[dict[str, Any]], started: list[dict[str, Any]]) -> list[str]:
    """Every schema 3 record ends a started entry of the same run and attempt, earlier in the chain;
    an interrupted record charges at most the ledger's time from that start to itself."""
    out: list[str] = []
    by_key = {(e["run_id"], e["attempt"]): e for e in started}
    for r in records:
        if r.get("schema_version", 1) < 3:
            continue
        key = (r["spec"]["run_id"], r["attempt"])
        e = by_key.get(key)
        link = r.get("start") or {}
        if e is None:
            out.append(
                f"{record_name(r)}: no started entry for run {key[0]} attempt {key[1]} (its start is "
                "not in the ledger: deleted, or the attempt was never announced)"
            )
            continue
        if link.get("sha256") != e["sha256"] or link.get("seq") != e["ledger"]["seq"]:
            out.append(
                f"{record_name(r)}: field start = {link} does not name its started entry "
                f"(seq {e['ledger']['seq']}, sha256 {e['sha256'][:16]})"
            )
        elif e["ledger"]["seq"] >= r["ledger"]["seq"]:
            out.append(
                f"{record_name(r)}: its started entry (seq {e['ledger']['seq']}) is not before it in "
                "the chain"
            )
        if r.get("unit_attempt", 1) != e.get("unit_attempt", 1):
            out.append(
                f"{record_name(r)}: field unit_attempt = {r.get('unit_attempt')} differs from its "
                f"started entry's {e.get('unit_attempt')}"
            )
        if r["status"] == "interrupted" and "at" in r["ledger"] and "at" in e["ledger"]:
            span = iso_seconds(r["ledger"]["at"]) - iso_seconds(e["ledger"]["at"])
            charged = (r.get("timings") or {}).get("device_s") or 0.0
            if charged > span + 1.0:
                out.append(
                    f"{record_name(r)}: an interrupted attempt charged {charged:.1f} device seconds, "
                    f"more than the ledger's {span:.1f} s from its start to its record"
                )
    return out


def check_ledger(
    records: list[dict[str, Any]], manifest: Manifest, genesis: str, published: tuple[int, str] | None
) -> list[str]:
    """The records as one hash chain; returns the breaks, the first one first."""
    out: list[str] = []
    unlinked = [record_name(r) for r in records if "ledger" not in r]
    if unlinked:
        return [
            f"{len(unlinked)} record(s) have no ledger link (schema 1 records predate the ledger): "
            f"{unlinked[0]}"
        ]
    by_seq: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        by_seq.setdefault(r["ledger"]["seq"], []).append(r)
    prev: str | None = genesis  # None after a gap: the record after it links to what is missing
    for seq in range(1, max(by_seq, default=0) + 1):
        here = by_seq.get(seq, [])
        if not here:
            out.append(f"ledger seq {seq}: no record (deleted, or the chain was cut)")
            prev = None
            continue
        if len(here) > 1:
            out.append(
                f"ledger seq {seq}: {len(here)} records claim it "
                f"({', '.join(record_name(r) for r in here)}): inserted"
            )
        r = here[0]
        if prev is not None and r["ledger"]["prev"] != prev:
            out.append(
                f"ledger seq {seq} ({record_name(r)}): prev {r['ledger']['prev'][:16]} is not the "
                f"sha256 of the record before it ({prev[:16]}): a record was edited and resealed, "
                "inserted, swapped or removed before it"
            )
        prev = r["sha256"]
    n = max(by_seq, default=0)
    head = manifest.get("ledger_head")
    if head is not None and (head.get("seq") != n or (n and head.get("sha256") != by_seq[n][0]["sha256"])):
        out.append(f"MANIFEST ledger_head {head} is not the chain's head (seq {n})")
    if published is not None:
        seq, sha = published
        got = by_seq.get(seq)
        if not got or not got[0]["sha256"].startswith(sha):
            out.append(
                f"published head seq {seq} sha256 {sha[:16]}: the records hold "
                f"{got[0]['sha256'][:16] if got else 'no record'} at that position: history was "
                "rewritten"
            )
        elif got[0].get("kind") == "started":
            out.append(
                f"published head seq {seq} sha256 {sha[:16]} is a started entry "
                f"({record_name(got[0])}), not a record: it binds no outcome (the record after it "
                "could be redrawn); publish the head harness status prints once a unit has ended"
            )
    return out

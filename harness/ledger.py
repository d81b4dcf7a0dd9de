"""The ledger: a protocol's records as one append-only hash chain.

Each record carries ``ledger = {"seq": n, "prev": h}``: its 1-based position and the ``sha256``
of the record before it; the first record's ``prev`` is the freeze manifest's sha256 (for a
protocol that is not preregistered, the sha256 of the protocol file), so the chain starts at the
tag. Appends happen under one file lock that also serialises MANIFEST writes, so two runners on
one folder (or two machines sharing it) still produce one linear chain.

The head (``seq`` and the last record's ``sha256``) is what a user publishes (commit it, post
it): any later deletion, insertion, reordering or edit-and-reseal of earlier records changes
every later hash, so it cannot match the published head.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from filelock import FileLock

from harness.records import LedgerHead, RunRecord, load_records, write_manifest, write_record


class Ledger:
    """Append records of one protocol to its chain."""

    def __init__(self, records_dir: Path, lock_path: Path, genesis: str, *, root: Path,
                 sources: Iterable[Path], protocol: dict[str, Any]) -> None:
        self.dir = records_dir
        self.lock = FileLock(str(lock_path))
        self.genesis = genesis
        self.root = root
        self.sources = list(sources)
        self.protocol = protocol
        lock_path.parent.mkdir(parents=True, exist_ok=True)

    def head(self) -> LedgerHead:
        return head_of(load_records(self.dir), self.genesis)

    def append(self, record: RunRecord | dict[str, Any]) -> tuple[Path, LedgerHead]:
        """Link ``record`` after the current head, seal and write it, rewrite MANIFEST."""
        with self.lock:
            head = self.head()
            rec = dict(record)
            rec["ledger"] = {"seq": head["seq"] + 1, "prev": head["sha256"]}
            path, sealed = write_record(self.dir, rec)
            new: LedgerHead = {"seq": head["seq"] + 1, "sha256": sealed["sha256"]}
            write_manifest(self.dir, self.root, self.sources, self.protocol, new)
        return path, new


def head_of(records: list[RunRecord], genesis: str) -> LedgerHead:
    """The chain's head: the record with the highest ``seq`` (genesis when there is none)."""
    linked = [r for r in records if "ledger" in r]
    if not linked:
        return {"seq": 0, "sha256": genesis}
    last = max(linked, key=lambda r: r["ledger"]["seq"])
    return {"seq": last["ledger"]["seq"], "sha256": last["sha256"]}


def describe(head: LedgerHead) -> str:
    return f"ledger head: seq {head['seq']} sha256 {head['sha256']}"

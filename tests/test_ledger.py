"""The ledger's index: appends that cost the same however long the chain, one linear chain with
several writers on one folder, and a crash between an append's two writes. In process, no torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import ledger as ledger_module
from harness.ledger import Ledger, load_entries
from prereg.formats.record import LOOK_SHAPE, MANIFEST, SCHEMA_VERSION, LookEntry, StartedEntry

GENESIS = "0" * 64


def make(folder: Path) -> Ledger:
    return Ledger(
        folder / "records",
        folder / "locks" / "ledger.lock",
        GENESIS,
        root=folder,
        sources=[],
        protocol={"id": "t"},
    )


def started(run: str) -> StartedEntry:
    return StartedEntry(
        schema_version=SCHEMA_VERSION,
        kind="started",
        protocol={"id": "t", "sha256": "0" * 64, "freeze_sha256": None},
        run_id=run,
        unit="u",
        attempt=1,
        unit_attempt=1,
        node="here",
        runner={"host": "here", "pid": 1},
        started_at="2026-12-02T00:00:00.000+00:00",
    )


def linear(folder: Path) -> list[int]:
    """The chain's seqs, checking that every entry links to the one before it."""
    entries = load_entries(folder / "records")
    prev = GENESIS
    for e in entries:
        assert e["ledger"]["prev"] == prev, e
        prev = e["sha256"]
    return [e["ledger"]["seq"] for e in entries]


def test_two_writers_on_one_folder_make_one_chain(tmp_path):
    a, b = make(tmp_path), make(tmp_path)
    for i in range(12):
        (a if i % 3 else b).append_started(started(f"r{i}"))
    assert linear(tmp_path) == list(range(1, 13))
    assert a.head() == b.head() and a.head()["seq"] == 12
    assert [e.run_id for e in a.entries() if isinstance(e, StartedEntry)] == [f"r{i}" for i in range(12)]


def test_a_crash_between_the_mark_and_the_entry_is_seen(tmp_path):
    a = make(tmp_path)
    a.append_started(started("r0"))
    # another runner rewrote the mark, then died before writing its entry
    (tmp_path / "locks" / "ledger.lock.mark").write_text("12345.deadbeef")
    b = make(tmp_path)
    b.append_started(started("r1"))  # b wrote an entry a has not read
    a.append_started(started("r2"))
    assert linear(tmp_path) == [1, 2, 3]


def test_appends_read_no_file_twice(tmp_path, monkeypatch):
    a = make(tmp_path)
    a.append_started(started("r0"))
    reads: list[Path] = []
    real = ledger_module.read_entry
    monkeypatch.setattr(ledger_module, "read_entry", lambda p: reads.append(p) or real(p))
    for i in range(1, 50):
        a.append_started(started(f"r{i}"))
    assert reads == []  # its own appends: indexed as written, the folder never listed again
    b = make(tmp_path)
    b.append_started(started("r50"))
    assert len(reads) == 50  # a new ledger reads the folder once
    reads.clear()
    a.append_started(started("r51"))
    assert [p.name for p in reads] == ["r50.a1.started.json"]  # only what another writer added


def test_manifest_lags_by_seconds_and_is_complete_when_written(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_module, "MANIFEST_EVERY_S", 3600.0)
    a = make(tmp_path)
    for i in range(5):
        a.append_started(started(f"r{i}"))
    listed = json.loads((tmp_path / "records" / MANIFEST).read_text())
    assert list(listed["started"]) == ["r0.a1.started.json"]  # the first append writes it
    assert a.reconcile() is not None  # what a crash now would leave: repaired from the chain
    a.append_started(started("r5"))
    a.write_manifest()  # the runner does when it stops
    listed = json.loads((tmp_path / "records" / MANIFEST).read_text())
    assert len(listed["started"]) == 6 and listed["ledger_head"] == a.head()
    assert a.reconcile() is None


@pytest.mark.parametrize("gone", [0, 3])
def test_an_entry_that_vanished_makes_the_index_read_anew(tmp_path, gone):
    a, b = make(tmp_path), make(tmp_path)
    for i in range(4):
        a.append_started(started(f"r{i}"))
    b.head()
    (tmp_path / "records" / f"r{gone}.a1.started.json").unlink()
    a.append_started(started("x"))  # by a: b's index still holds the vanished entry
    before = b.generation
    b.head()
    assert b.generation == before + 1 and len(b.entries()) == 4


def test_the_index_holds_typed_entries_and_json_only_at_the_file(tmp_path):
    """What the ledger appends and gives back is typed (a sealed started entry, a look entry); the
    JSON object is only what the file holds, and it reads back, by another runner, to the same
    entries. A look entry's shape is its class's, as the old table declared it."""
    a = make(tmp_path)
    sealed = a.append_started(started("r0"))
    assert isinstance(sealed, StartedEntry) and sealed.ledger is not None and sealed.sha256
    assert sealed.ledger["seq"] == 1 and sealed.ledger["prev"] == GENESIS
    assert sealed.link() == {"seq": 1, "sha256": sealed.sha256}
    look = LookEntry(
        schema_version=SCHEMA_VERSION,
        kind="look",
        protocol={"id": "t", "sha256": "0" * 64, "freeze_sha256": None},
        look=1,
        pairs=2,
        records=[],
        runner={"host": "here", "pid": 1},
        taken_at="2026-12-02T00:00:01.000+00:00",
    )
    got = a.append_look(look)
    assert isinstance(got, LookEntry) and got.ledger is not None and got.ledger["prev"] == sealed.sha256
    b = make(tmp_path)  # another runner, reading the folder's files
    assert b.entries() == [sealed, got] and b.looks() == [got]
    assert b.entries_of({"r0"}) == ([], [sealed])
    file = json.loads((tmp_path / "records" / "look1.look.json").read_text())
    assert got.to_json() == file and LookEntry.from_json(file) == got
    with pytest.raises(ValueError, match="a look entry's is 'look'"):
        LookEntry.from_json({**file, "kind": "started"})
    assert LOOK_SHAPE == {
        "schema_version": ((int,), True),
        "kind": ((str,), True),
        "protocol": ((dict,), True),
        "look": ((int,), True),
        "pairs": ((int,), True),
        "records": ((list,), True),
        "runner": ((dict,), True),
        "taken_at": ((str,), True),
        "ledger": ((dict,), True),
        "sha256": ((str,), True),
    }

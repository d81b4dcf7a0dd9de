"""The ledger: a protocol's attempts and records as one append-only hash chain.

Each entry (a record, or the started entry an attempt appends before its worker starts) carries
``ledger = {"seq": n, "prev": h, "at": t}``: its 1-based position, the ``sha256`` of the entry
before it and the time it was sealed; the first entry's ``prev`` is the freeze manifest's sha256
(for a protocol that is not preregistered, the sha256 of the protocol file), so the chain starts
at the tag. Appends happen under one file lock that also serialises MANIFEST writes, so two
runners on one folder (or two machines sharing it) still produce one linear chain.

The chain is the truth; MANIFEST is its index, rewritten at most every few seconds
(:data:`MANIFEST_EVERY_S`) and when the runner stops. A process killed between an entry's write and
the MANIFEST rewrite leaves entries that MANIFEST does not list: :meth:`Ledger.reconcile` (run by
``harness run``, ``report`` and ``status`` on start) lists them again when they extend the chain
MANIFEST names, and leaves anything else for the audit to report.

The head (``seq`` and the last entry's ``sha256``) is what a user publishes (commit it, post
it): any later deletion, insertion, reordering or edit-and-reseal of earlier entries changes
every later hash, so it cannot match the published head.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from prereg.bounded import parse_json, read_regular, read_target
from prereg.files import atomic_write
from prereg.formats.ledger import (
    LOOK_SUFFIX,
    RECORD_SUFFIX,
    SOURCE_TREES,
    STARTED_SUFFIX,
    check_ledger,
    is_snapshot_name,
    record_name,
    self_hash_ok,
)
from prereg.formats.record import (
    MANIFEST,
    SCHEMA_VERSION,
    ChainEntry,
    LedgerHead,
    LookEntry,
    RecordFormatError,
    RunRecord,
    StartedEntry,
    chain_entry,
    entry_files,
    entry_run,
    entry_seq,
    read_entry,
    read_snapshots,
    sha256_bytes,
    write_json,
    write_look,
    write_record,
    write_snapshot,
    write_started,
)

if TYPE_CHECKING:
    from harness.protocol import Protocol

#: MANIFEST is rewritten by an append at most once in this many seconds (its size grows with the
#: chain, so rewriting it on every append made each append cost more as a study grew; the first
#: append always writes it), and always when the runner stops; entries it does not list yet, after
#: a crash, are what :meth:`Ledger.reconcile` restores.
MANIFEST_EVERY_S = 5.0

#: Tests only: ``manifest:N`` kills this process (SIGKILL) after entry seq N is written and before
#: MANIFEST is rewritten, the crash window that :meth:`Ledger.reconcile` closes.
TEST_KILL_ENV = "HARNESS_TEST_KILL_AT"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _ledger_order(e: ChainEntry) -> tuple[int, str, int]:
    if isinstance(e, LookEntry):
        return (entry_seq(e), f"look{e.look}", 0)
    return (entry_seq(e), entry_run(e), e.attempt)


def _file_order(e: dict[str, Any]) -> tuple[int, str, int]:
    """:func:`_ledger_order` of an entry's JSON object, as its file holds it."""
    if e.get("kind") == "look":
        return (e.get("ledger", {}).get("seq", 0), f"look{e['look']}", 0)
    return (e.get("ledger", {}).get("seq", 0), e.get("run_id") or e["spec"]["run_id"], e["attempt"])


def load_entries(directory: Path) -> list[dict[str, Any]]:
    """Every entry of the chain (records, started entries, look entries) as its file holds it, in
    ledger order: what the chain's rules read (:func:`prereg.formats.ledger.check_ledger`, the head,
    MANIFEST); the runner reads the typed entries of :class:`Ledger`."""
    out = [read_entry(p) for p in entry_files(directory)]
    out.sort(key=_file_order)
    return out


class Ledger:
    """Append entries of one protocol to its chain.

    The ledger keeps an index in memory: every entry file's name, the sha256 of its bytes and the
    entry, typed (:data:`prereg.formats.record.ChainEntry`: a record, a started entry, a look; each
    file read and checked once; JSON only at the file). Each append, under the lock, lists the folder's
    entry names and reads only files it has not seen (another runner's appends); an entry that
    vanished or changed makes it read the folder again. So an append costs the same at the
    10,000th entry as at the first, apart from listing names (``benchmarks/ledger_scale.py``).
    MANIFEST is rewritten by appends at most every :data:`MANIFEST_EVERY_S` seconds and by
    :meth:`write_manifest` (the runner, when it stops); a crash before then leaves entries it does
    not list, which :meth:`reconcile` lists again."""

    def __init__(
        self,
        records_dir: Path,
        lock_path: Path,
        genesis: str,
        *,
        root: Path,
        sources: Iterable[Path],
        protocol: Mapping[str, object],
    ) -> None:
        self.dir = records_dir
        self.lock = FileLock(str(lock_path))
        self.genesis = genesis
        self.root = root
        self.sources = list(sources)
        self.protocol = protocol
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, str] = {}  # entry file name -> sha256 of its bytes
        self._entries: list[ChainEntry] = []  # the entries, typed, in ledger order
        self._by_run: dict[str, list[RunRecord | StartedEntry]] = {}  # each run's entries
        self._looks: list[LookEntry] = []  # a sequential design's look entries
        self._names_seen: set[str] = set()  # every name in the folder at the last sync
        self._records: list[RunRecord] = []  # the records, typed, in the order the index met them
        self._head: LedgerHead = {"seq": 0, "sha256": genesis}
        self._snapshots: dict[str, dict[str, object]] = {}  # the folder's protocol snapshots, by sha256
        self._source_sha: dict[str, str] | None = None
        self.generation = 0  # bumped when the index is read anew (an entry vanished or changed)
        # Every append rewrites this mark (a fresh token) *before* it writes its entry, so a mark
        # that still holds this ledger's own last token proves that nobody appended since: the
        # folder need not be listed. Another runner's append, or its crash between the two
        # writes, changes the mark, and the next sync lists the folder.
        self._mark = lock_path.with_name(lock_path.name + ".mark")
        self._token: str | None = None
        self._manifest_at = float("-inf")  # monotonic time of the last MANIFEST write

    # -- the index -------------------------------------------------------------------------
    def _names(self) -> set[str]:
        """The entry file names in the folder (a listing and set operations in C; only names not
        seen before are filtered here, so a sync costs little more at 20,000 files than at 20)."""
        try:
            names = set(os.listdir(self.dir))
        except FileNotFoundError:
            names = set()
        if names == self._names_seen:
            return set(self._files)
        known = set(self._files)
        fresh = {
            n for n in names - self._names_seen if n.endswith((RECORD_SUFFIX, STARTED_SUFFIX, LOOK_SUFFIX))
        }
        self._names_seen = names
        return (known & names) | fresh

    def _add(self, name: str, raw: bytes, data: dict[str, Any]) -> ChainEntry:
        """Index one entry file (its name, bytes and JSON object): typed once, here (a record over
        its folder's protocol snapshot), refusing one of another shape."""
        if data.get("kind") not in ("look", "started") and data.get("schema_version", 1) >= 4:
            named = data["protocol"].get("snapshot_sha256")
            if named is not None and named not in self._snapshots:
                self._snapshots.update(read_snapshots(self.dir))  # another runner's
        entry = chain_entry(data, str(self.dir / name), self._snapshots)
        self._files[name] = sha256_bytes(raw)
        self._entries.append(entry)
        if isinstance(entry, LookEntry):  # a sequential design's look: in the chain, of no run
            self._looks.append(entry)
        else:
            self._by_run.setdefault(entry_run(entry), []).append(entry)
        if isinstance(entry, RunRecord):
            self._records.append(entry)
        if entry.ledger is not None and entry.sha256 is not None and entry_seq(entry) > self._head["seq"]:
            self._head = {"seq": entry_seq(entry), "sha256": entry.sha256}
        return entry

    def _mark_is_mine(self) -> bool:
        if self._token is None:
            return False
        try:
            return self._mark.read_text(encoding="ascii") == self._token
        except (OSError, UnicodeDecodeError):
            return False

    def sync(self) -> None:
        """Bring the index up to the folder: read the entry files not yet seen, in ledger order;
        read everything again if one it knew is gone. Skipped while the mark is this ledger's own."""
        if self._mark_is_mine():
            return
        names = self._names()
        if names == set(self._files):
            return
        if not set(self._files) <= names:
            self._files, self._entries, self._by_run, self._records = {}, [], {}, []
            self._looks = []
            self._head = {"seq": 0, "sha256": self.genesis}
            self._snapshots = {}
            self.generation += 1
        new = []
        for name in sorted(names - set(self._files)):
            path = self.dir / name
            entry = read_entry(path)  # first: a link, a FIFO or a device is refused, never opened
            new.append((name, read_regular(str(path)), entry))
        new.sort(key=lambda t: (t[2].get("ledger", {}).get("seq", 0), t[0]))
        added = [self._add(name, raw, data) for name, raw, data in new]
        self._entries.sort(key=_ledger_order)
        for run in {entry_run(e) for e in added if not isinstance(e, LookEntry)}:
            self._by_run[run].sort(key=_ledger_order)

    def entries(self) -> list[ChainEntry]:
        """Every entry of the chain (records, started entries and looks), typed, in ledger order."""
        self.sync()
        return list(self._entries)

    def entries_of(self, run_ids: Iterable[str]) -> tuple[list[RunRecord], list[StartedEntry]]:
        """The records and the started entries of ``run_ids``, each in ledger order."""
        self.sync()
        recs: list[RunRecord] = []
        starts: list[StartedEntry] = []
        for run in run_ids:
            for e in self._by_run.get(run, []):
                if isinstance(e, StartedEntry):
                    starts.append(e)
                else:
                    recs.append(e)
        recs.sort(key=_ledger_order)
        starts.sort(key=_ledger_order)
        return recs, starts

    def records(self) -> list[RunRecord]:
        """Every record, typed (each file read and checked once), in the order the index met them:
        ledger order for this runner's own appends and each sync's batch; the list is the index's
        own and only grows until :attr:`generation` changes (never change it)."""
        self.sync()
        return self._records

    def head(self) -> LedgerHead:
        self.sync()
        return dict(self._head)  # type: ignore[return-value]

    def _append(
        self,
        entry: dict[str, Any],
        write: Callable[[Path, dict[str, Any]], tuple[Path, dict[str, Any]]],
        snapshot: dict[str, Any] | None = None,
    ) -> tuple[Path, LedgerHead, ChainEntry]:
        with self.lock:
            head = self.head()
            if snapshot is not None:  # a schema 4 record: its protocol snapshot, once per folder
                self._snapshots[write_snapshot(self.dir, snapshot)] = snapshot
            self._token = f"{os.getpid()}.{uuid.uuid4().hex}"
            atomic_write(self._mark, self._token.encode("ascii"), overwrite=True, sync=False)
            entry = dict(entry)
            entry["ledger"] = {"seq": head["seq"] + 1, "prev": head["sha256"], "at": now_iso()}
            path, sealed = write(self.dir, entry)
            typed = self._add(path.name, path.read_bytes(), sealed)
            self._names_seen.add(path.name)
            new: LedgerHead = {"seq": head["seq"] + 1, "sha256": sealed["sha256"]}
            if os.environ.get(TEST_KILL_ENV) == f"manifest:{new['seq']}":
                os.kill(os.getpid(), signal.SIGKILL)
            if time.monotonic() - self._manifest_at >= MANIFEST_EVERY_S:
                self._write_manifest(new)
        return path, new, typed

    def _write_manifest(self, head: LedgerHead) -> None:
        self._manifest_at = time.monotonic()
        if self._source_sha is None:  # the code that produces this runner's records: read once
            self._source_sha = source_hashes(self.root, self.sources)
        write_manifest(
            self.dir,
            self.root,
            self.sources,
            self.protocol,
            head,
            files=self._files,
            sources=self._source_sha,
        )

    def write_manifest(self) -> None:
        """Rewrite MANIFEST for the chain as it is now (the runner does when it stops)."""
        with self.lock:
            self._write_manifest(self.head())

    def append(self, record: RunRecord) -> tuple[Path, LedgerHead]:
        """Link ``record`` after the current head, seal and write it; rewrite MANIFEST unless this
        ledger did less than :data:`MANIFEST_EVERY_S` seconds ago."""
        snapshot = record.snapshot() if record.schema_version >= 4 else None
        path, head, _ = self._append(record.to_json(), write_record, snapshot)
        return path, head

    def looks(self) -> list[LookEntry]:
        """The chain's look entries (a sequential design's), in ledger order."""
        self.sync()
        return sorted(self._looks, key=_ledger_order)

    def append_look(self, entry: LookEntry) -> LookEntry:
        """Append a group-sequential look's entry (MANIFEST as for :meth:`append`); returns it
        sealed (with its ``ledger`` and ``sha256``), as :meth:`looks` gives it."""
        sealed = self._append(entry.to_json(), write_look)[2]
        assert isinstance(sealed, LookEntry)  # typed by its kind, "look"
        return sealed

    def append_started(self, entry: StartedEntry) -> StartedEntry:
        """Append an attempt's started entry (MANIFEST as for :meth:`append`); returns it sealed
        (with its ``ledger`` and ``sha256``), as :meth:`entries_of` gives it."""
        sealed = self._append(entry.to_json(), write_started)[2]
        assert isinstance(sealed, StartedEntry)  # typed by its kind, "started"
        return sealed

    def reconcile(self) -> str | None:
        """Bring MANIFEST back to the chain after a crash between an entry's write and the MANIFEST
        rewrite: when every entry MANIFEST lists is on disk unchanged and the entries it misses
        continue the chain from its head, MANIFEST is rewritten. Returns what was done, or None."""
        with self.lock:
            entries = load_entries(self.dir)
            if not entries:
                return None
            head = head_of(entries, self.genesis)
            found = _manifest_listing(self.dir / MANIFEST)
            if found is None:
                return None  # not ours to judge (a newer harness's, or broken: the audit reports it)
            listed, mhead = found
            files = {p.name: p for p in entry_files(self.dir)}
            if mhead.get("seq") == head["seq"] and set(listed) == set(files):
                return None
            start = int(mhead.get("seq") or 0)
            unlisted = sorted(n for n in files if n not in listed)
            if not self._continues(entries, files, listed, mhead, head, unlisted):
                return None
            write_manifest(self.dir, self.root, self.sources, self.protocol, head)
        return (
            f"MANIFEST reconciled with the chain: {len(unlisted)} entr{'y' if len(unlisted) == 1 else 'ies'} "
            f"after seq {start} listed again ({', '.join(unlisted)})"
        )

    def _continues(
        self,
        entries: list[dict[str, Any]],
        files: dict[str, Path],
        listed: dict[str, str],
        mhead: dict[str, Any],
        head: LedgerHead,
        unlisted: list[str],
    ) -> bool:
        """Whether the entries MANIFEST misses (``unlisted``) continue, as one clean chain, what it
        lists (each on disk unchanged) from its head."""
        if any(n not in files or sha256_bytes(read_regular(str(files[n]))) != h for n, h in listed.items()):
            return False  # an entry changed or vanished: evidence, left for the audit
        by_seq = {e["ledger"]["seq"]: e for e in entries if "ledger" in e}
        start = int(mhead.get("seq") or 0)
        if start and (by_seq.get(start) or {}).get("sha256") != mhead.get("sha256"):
            return False
        tail = [by_seq[s] for s in range(start + 1, head["seq"] + 1) if s in by_seq]
        if check_ledger(entries, {}, self.genesis, None) or not all(map(self_hash_ok, tail)):
            return False  # not one clean chain (the audit's rule) that extends what MANIFEST names
        return unlisted == sorted(record_name(e) for e in tail)


def _manifest_listing(path: Path) -> tuple[dict[str, str], dict[str, Any]] | None:
    """The entries a records folder's MANIFEST lists (name: sha256) and its ledger head; nothing
    listed where there is no MANIFEST; ``None`` where it is a newer harness's or broken (not ours to
    judge: the audit reports a broken MANIFEST)."""
    try:
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        manifest = parse_json(read_regular(str(path)))
        if manifest.get("schema_version", 1) > SCHEMA_VERSION:
            return None  # a newer harness's MANIFEST: not ours to rewrite
        listed = {**manifest["records"], **manifest.get("started", {}), **manifest.get("looks", {})}
        mhead = manifest.get("ledger_head") or {"seq": 0}
        if not isinstance(mhead, dict) or not isinstance(mhead.get("seq"), int):
            return None
    except FileNotFoundError:
        return {}, {"seq": 0}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return listed, mhead


def source_hashes(root: Path, extra: Iterable[Path]) -> dict[str, str]:
    """sha256 of every source file that produces records (the core's :data:`SOURCE_TREES`: the
    packages' Python and C files, configs/, the tracked verified-paths files) and ``extra`` (the
    protocol, plug-in sources)."""
    files: set[Path] = set()
    for sub, endings in SOURCE_TREES:
        base = root / sub
        if base.is_dir():
            files.update(
                p for p in base.rglob("*") if p.name.endswith(endings) and "__pycache__" not in p.parts
            )
    files.update(extra)
    out = {}
    for p in sorted(files):
        rel = p.resolve().relative_to(root.resolve()).as_posix()
        out[rel] = sha256_bytes(read_target(str(p)))
    return out


def write_manifest(
    directory: Path,
    root: Path,
    extra: Iterable[Path],
    protocol: Mapping[str, object],
    head: LedgerHead | None,
    *,
    files: dict[str, str] | None = None,
    sources: dict[str, str] | None = None,
) -> Path:
    """Rewrite MANIFEST atomically: every record's and every started entry's file sha256, the ledger
    head, every source's sha256. ``files`` and ``sources``: those hashes already known (the
    ledger's index), instead of reading every file again."""
    if files is None:
        files = {p.name: sha256_bytes(read_regular(str(p))) for p in entry_files(directory)}
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "protocol": protocol,
        "records": {n: h for n, h in sorted(files.items()) if n.endswith(RECORD_SUFFIX)},
        "started": {n: h for n, h in sorted(files.items()) if n.endswith(STARTED_SUFFIX)},
        **(
            {"looks": looks}
            if (looks := {n: h for n, h in sorted(files.items()) if n.endswith(LOOK_SUFFIX)})
            else {}
        ),
        "ledger_head": head,
        "sources": source_hashes(root, extra) if sources is None else sources,
    }
    snapshots = sorted(p for p in directory.glob("protocol.*.json") if is_snapshot_name(p.name))
    if snapshots:  # schema 4: the protocol snapshots the records name
        manifest["snapshots"] = {p.name: sha256_bytes(read_regular(str(p))) for p in snapshots}
    path = directory / MANIFEST
    write_json(path, manifest, pretty=True)
    return path


def head_of(entries: list[Any], genesis: str) -> LedgerHead:
    """The chain's head: the entry with the highest ``seq`` (genesis when there is none)."""
    linked = [r for r in entries if "ledger" in r]
    if not linked:
        return {"seq": 0, "sha256": genesis}
    last = max(linked, key=lambda r: r["ledger"]["seq"])
    return {"seq": last["ledger"]["seq"], "sha256": last["sha256"]}


def describe(head: LedgerHead) -> str:
    return f"ledger head: seq {head['seq']} sha256 {head['sha256']}"


def check_records_folder(proto: Protocol) -> None:
    """Refuse (InputError naming the protocol and ``records_dir``) a records folder, default or
    explicit, that resolves outside the repository or inside a frozen entry (its records would be
    untracked files there, and the study could never resume), or that has a symlink anywhere on the
    way from the repository to it."""
    from harness.freeze import exempt
    from prereg.errors import InputError

    root = Path(proto.root)
    rel = Path(proto.spec.records_dir or f"records/{proto.spec.id}")
    where = f"records folder {rel.as_posix()!r}" + ("" if proto.spec.records_dir else " (the default)")
    step = root
    for part in rel.parts:
        step = step / part
        if step.is_symlink():
            raise InputError(
                f"{where}: {step} is a symbolic link (to {os.readlink(step)}); a records folder is "
                "a real folder inside the repository, with no link on the way",
                file=str(proto.path),
                key="records_dir",
            )
    resolved = (root / rel).resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise InputError(
            f"{where} resolves to {resolved}, outside the study's repository {root}",
            file=str(proto.path),
            key="records_dir",
        )
    inside = resolved.relative_to(root.resolve()).parts
    if not inside or not exempt(inside[0]):
        top = inside[0] if inside else "."
        raise InputError(
            f"{where} lies inside the frozen entry {top!r}; records there would be untracked files in a "
            "frozen folder and the study could not resume: use records/ (the default) or another exempt "
            "folder",
            file=str(proto.path),
            key="records_dir",
        )


def check_same_protocol(proto: Protocol) -> None:
    """Refuse (InputError naming the protocol and ``records_dir``) a records folder that holds
    entries of another version of the protocol (another sha256: the file was edited after runs were
    recorded), before anything is written: an edited protocol gets its own records folder, never a
    mix with the old one's runs (the audit would then find the chain broken)."""
    from prereg.errors import InputError

    if proto.spec.preregistered or not proto.records_path.is_dir():
        return  # a preregistered protocol's file is bound by its tag: the freeze check names the edit
    others: dict[str, int] = {}
    for p in entry_files(proto.records_path):
        try:
            sha = read_entry(p)["protocol"]["sha256"]
        except (KeyError, TypeError, RecordFormatError):
            continue  # not an entry of this format: the ledger's reader refuses it, naming the file
        if sha != proto.sha256:
            others[sha] = others.get(sha, 0) + 1
    if not others:
        return
    rel = Path(proto.spec.records_dir or f"records/{proto.spec.id}").as_posix()
    sha, n = max(others.items(), key=lambda kv: kv[1])
    raise InputError(
        f"{rel} holds {sum(others.values())} entries of another version of protocol {proto.spec.id!r} "
        f"(sha256 {sha[:12]}..., this file's is {proto.sha256[:12]}...): the file was edited after "
        f"runs were recorded. An edited protocol gets its own records folder, never a mix: give it a "
        f"new id (or a records_dir: of its own), or, to start this study over, move {rel} and "
        f"runs/{proto.spec.id} away; nothing was written",
        file=str(proto.path),
        key="records_dir" if proto.spec.records_dir else "id",
    )


def study_ledger(proto: Protocol, genesis: str) -> Ledger:
    """The ledger of ``proto``'s records folder (its lock under ``runs/<id>/locks``)."""
    plugins = [
        proto.root / fp["path"]
        for fp in proto.plugin_fingerprints().values()
        if not Path(fp["path"]).is_absolute()
    ]
    return Ledger(
        proto.records_path,
        proto.runs_path / "locks" / "ledger.lock",
        genesis,
        root=proto.root,
        sources=[proto.path, *plugins],
        protocol=proto.summary(),
    )


def reconcile_study(proto: Protocol) -> str | None:
    """What ``harness report`` and ``status`` do on start: check the records folder's path, then
    bring MANIFEST back to the chain (genesis: the freeze hash the entries name, else the protocol's)."""
    check_records_folder(proto)
    if not proto.records_path.is_dir():
        return None
    entries = load_entries(proto.records_path)
    genesis = (
        next(
            (e["protocol"].get("freeze_sha256") for e in entries if e["protocol"].get("freeze_sha256")), None
        )
        or proto.sha256
    )
    return study_ledger(proto, genesis).reconcile()

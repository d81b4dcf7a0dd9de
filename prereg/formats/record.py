"""The record format: canonical JSON, self-hash, atomic no-overwrite writes, versioned loading.

This is the core's home of the format: the typed objects and the files. The rules the audit
applies too (canonical JSON, the self-hash, the entry file names) have their one home in
:mod:`prereg.formats.ledger`; this module imports nothing but the standard library and the core, so the
harness, the torch-free :mod:`analysis` package and the public audit (:mod:`audit`) share it.

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
  Added within version 3, read by every reader of it that knows them, absent from earlier
  records: a lockstep run's ``spec`` holds ``block_steps``, ``partner`` and ``steps_first``
  (``design: lockstep``; left out of other runs' specs, so their plans hash as before) and its
  ``env`` a ``lockstep`` object; every run's ``timings`` hold ``training_cpu_s`` and
  ``training_cpu_clock`` (the training steps' CPU time and which clock), and a lockstep arm's
  ``pair_device_s`` (its pair's process; the arm's ``device_s`` is half of it).

* 4 - the protocol summary is stored once per records folder, not in every record: a record's
  ``protocol`` is a stub (``id``, ``sha256``, the tag fields ``tag``, ``tag_commit``,
  ``tag_object``, ``tag_created``, ``freeze_sha256``, and ``snapshot_sha256``), and the summary
  the stub leaves out is the file ``protocol.<snapshot_sha256>.json`` (canonical JSON, written once
  by the ledger before the first record that names it; MANIFEST lists it under ``snapshots``). Each
  record's seal binds its snapshot through that sha256. Readers give a record's ``protocol`` as
  before (the stub over the snapshot: :func:`prereg.formats.ledger.with_snapshot`), so the
  analysis reads every version alike. Started entries are unchanged (their protocol was a stub
  already) but say 4. Version 3 records are still read (cpu1 and cpu2 are version 3); their
  copies of the summary made up about a quarter of their bytes (cpu2: 11.8 MB of records would be
  8.9 MB as version 4).
  Added within version 4, absent from earlier records and from runs that do not use them: a
  run's ``step_times`` (every training step's wall and CPU microseconds, ``wall_us`` and
  ``cpu_us``, warm-up steps included; built-in arms); a planted study candidate's ``spec.planted``
  (the plant, ``prereg/planted.py``) with ``timings.planted_s`` and ``planted_cpu_s``
  (the plant's own time over the timed steps); a study's ``spec.warmup_steps`` with
  ``timings.warmup_s`` and ``warmup_cpu_s`` (those steps, timed apart from ``training_s``).
  Also from the end of version 4 on (written under version 5), absent from earlier records: a
  lockstep arm's ``timings.stall_s`` (its
  timed blocks' wall less CPU time, where positive, summed: ``prereg/interference.py``; derived
  again by the audit from the arm's ``step_times`` or its command's reporter file), and a command
  run's ``process.survivors`` (the processes it left, killed by the harness, which fail the run).
  A summary's paired result holds ``interference`` only where its records hold ``stall_s``.

* 5 - the file format is version 4's; what changes is a rule the analysis applies to the records
  (records carry the version they were written under, so old studies keep theirs): a hypothesis
  whose every pair's difference is exactly 0 is decided by the exact sign test, ``p = 2^-n``
  (:func:`prereg.hypotheses.identical_sign_result`), not by identity's ``p = 0``, which
  established non-inferiority on 3 agreeing pairs (docs/decisions.md, "The identity rule").
  Version 4 records keep identity, version 3 and earlier "not reached". Added within version 5:
  a replicated protocol's run ``spec.replicate`` (1-based, ``prereg/replicates.py``; left out of
  other runs' specs, so their plans hash as before). A lockstep command arm's
  ``process.kernel`` (the kernel's view of it: ``stops``, ``stopped_s``, and over its timed turns
  ``timed_s``, ``run_s``, ``runqueue_s``, ``partner_run_s``, ``samples``;
  ``harness/execute/watch.py``), absent from earlier records; a run it fails is failed, its reason
  said (:func:`prereg.interference.kernel_reason`), and the audit names an ok run it fails. Later
  within version 5: ``process.kernel.observed`` (false: its samples covered under half its timed
  turns, named NOT OBSERVED, not judged) and ``process.isolation`` ("pid namespace", or "arms not
  isolated: ..." with the reason, ``harness/execute/isolate.py``), absent from earlier records.

* 6 - the file format is version 5's; what changes is the name a plan gives a design: a lockstep
  study's runs say ``spec.design: lockstep`` and its protocol summary's study ``design: lockstep``
  (beside ``lockstep: {block_steps}`` as before), where earlier versions wrote what it is analysed
  as, ``paired`` (:meth:`prereg.designs.base.Design.recorded_as`,
  :data:`prereg.designs.base.OWN_NAME_FROM_SCHEMA`). The analysis reads either name as a pair
  (:func:`prereg.designs.registry.study_design`). The audit recomputes a study's plan and summary
  under its records' schema (:func:`prereg.formats.ledger.study_schema`: the oldest), so version 5 and
  earlier lockstep studies (cpu2, calibration-cpu, and cpu3, run from its tag's code) audit byte
  for byte as before. Which schema a study is written under is not the records' word alone: a
  tagged study's freeze manifest binds the plan's sha256 (the plan under another schema differs
  from it), and its records may not be older than the tagged harness's ``SCHEMA_VERSION``
  (``audit/freeze.py``); an untagged study's records seal the protocol's sha256, and a lockstep
  study's record under another schema than its study's differs from the study's plan and is named
  (docs/decisions.md, "A design's name in its records").

Typed objects (frozen dataclasses), with JSON only at the file and process boundaries
(``to_json`` / ``from_json``, which refuse fields they do not know, naming them): :class:`RunSpec`
(one planned run), :class:`WorkerResult` (what a worker reports on its pipe) and :class:`RunRecord`
(a worker result and the runner's fields; what the analysis reads). A field that is ``None`` is
left out of the JSON, except the ones every record has (``reason``, ``started_at``, ...), which are
written as ``null``; so records written before these types read into them and write back to the
same bytes (``tests/test_records.py`` checks every committed record). The harness's ledger types
each entry of the chain once, by its kind (:func:`chain_entry`: a record, a :class:`StartedEntry`,
a :class:`LookEntry`); the audit reads the files as JSON objects.

Canonical JSON: ``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
allow_nan=False)`` encoded as UTF-8. Non-finite floats are stored as ``null`` (and a non-finite
measurement, ``NONFINITE_AS_NULL``, reads back as NaN, so its key stays).
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, TypedDict

from prereg.bounded import InputLimitError, parse_json, read_regular
from prereg.files import atomic_write
from prereg.formats.jsonfields import hints, json_fields, json_types, plain
from prereg.formats.ledger import (
    LOOK_SUFFIX,
    RECORD_SUFFIX,
    SCHEMAS,
    STARTED_SUFFIX,
    canonical,
    is_snapshot_name,
    protocol_stub,
    snapshot_name,
    snapshot_of,
    with_snapshot,
)
from prereg.formats.ledger import sha256 as sha256_bytes

SCHEMA_VERSION = 6
READABLE_VERSIONS = SCHEMAS  # the versions the audit reads too (prereg/formats/ledger.py)
MANIFEST = "MANIFEST"
#: The tag object's raw bytes, kept in a preregistered study's records folder (see Runner._keep_tag).
TAG_FILE = "TAG"


class RecordFormatError(ValueError):
    """A record file that cannot be read as a record of a known format version."""


#: A field's rule in a sealed entry's file beyond its annotation (its metadata's ``"file"``):
#: :data:`SEALED`, every sealed entry has it, never null (the object lacks it until the ledger links
#: or seals it); :data:`NOT_NULL`, absent or set, never null (a field written only when set).
SEALED = "sealed"
NOT_NULL = "not null"


class _Link(TypedDict):
    seq: int  # 1-based position in the protocol's chain
    prev: str  # sha256 of the record before (the freeze manifest's sha256 for seq 1)


class LedgerLink(_Link, total=False):
    """An entry's link in the chain: its position, the entry before it, when it was sealed."""

    at: str  # when the ledger sealed it (schema 3 on)


@dataclass(frozen=True, kw_only=True)
class StartedEntry:
    """An attempt's start, appended to the chain before its worker starts (schema 3). Read from its
    file by :meth:`from_json`, which refuses unknown or missing fields, values of the wrong JSON type
    and any ``kind`` but ``"started"``."""

    schema_version: int
    kind: str  # "started"
    protocol: Mapping[str, object]  # id, sha256, freeze_sha256
    run_id: str
    unit: str
    attempt: int
    unit_attempt: int
    node: str  # where the worker runs: this host, or a Ray node (host/id)
    runner: Mapping[str, object]  # the process that appended it: host, pid
    started_at: str
    ledger: LedgerLink | None = field(
        default=None, metadata={"file": SEALED}
    )  # set when the ledger appends it
    sha256: str | None = field(default=None, metadata={"file": SEALED})  # set when it is sealed

    def to_json(self) -> dict[str, Any]:
        return {f.name: plain(v) for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @classmethod
    def from_json(cls, data: object, what: str = "started entry") -> StartedEntry:
        found = json_fields(cls, data, what, RecordFormatError)
        if found["kind"] != "started":
            raise RecordFormatError(f"{what}: field kind = {found['kind']!r}; a started entry's is 'started'")
        return cls(**found)

    def link(self) -> StartLink:
        """The link a record that ends this attempt holds (``start``): this sealed entry's ``seq``
        and ``sha256``."""
        if self.ledger is None or self.sha256 is None:
            raise RecordFormatError(f"started entry {self.run_id} a{self.attempt} is not sealed in the chain")
        return {"seq": self.ledger["seq"], "sha256": self.sha256}


@dataclass(frozen=True, kw_only=True)
class LookEntry:
    """A group-sequential look, appended to the chain before any of its statistics is computed
    (``look<k>.look.json``): the look's number, the pairs it is taken on and the sha256 of the
    records it binds (:func:`prereg.barrier.look_entry_records`). Read from its file by
    :meth:`from_json`, which refuses unknown or missing fields, values of the wrong JSON type and
    any ``kind`` but ``"look"``."""

    schema_version: int
    kind: str  # "look"
    protocol: Mapping[str, object]  # id, sha256, freeze_sha256
    look: int  # 1-based
    pairs: int  # the pairs it is taken on: 1..pairs
    records: Sequence[str]  # the sha256 of the analysed records it binds, sorted
    runner: Mapping[str, object]  # the process that appended it: host, pid
    taken_at: str
    ledger: LedgerLink | None = field(default=None, metadata={"file": SEALED})  # set when appended
    sha256: str | None = field(default=None, metadata={"file": SEALED})  # set when it is sealed

    def to_json(self) -> dict[str, object]:
        return {f.name: plain(v) for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @classmethod
    def from_json(cls, data: object, what: str = "look entry") -> LookEntry:
        found = json_fields(cls, data, what, RecordFormatError)
        if found["kind"] != "look":
            raise RecordFormatError(f"{what}: field kind = {found['kind']!r}; a look entry's is 'look'")
        return cls(**found)


class StartLink(TypedDict):
    seq: int  # the started entry's ledger seq
    sha256: str  # its sha256


class LedgerHead(TypedDict):
    seq: int  # records in the chain
    sha256: str  # the last record's sha256 (or the freeze manifest's sha256 when empty)


class GitState(TypedDict):
    commit: str | None
    dirty: bool | None


#: RunSpec's fields of a lockstep run and of a command arm's run, left out of the JSON of other runs.
_LOCKSTEP_FIELDS = frozenset(
    {"block_steps", "partner", "steps_first", "command", "metric", "planted", "warmup_steps", "replicate"}
)


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs; produced by the plan, claimed, executed and recorded."""

    run_id: str
    protocol_id: str
    protocol_sha256: str
    study: str
    design: str
    config: str
    config_sha256: str
    arm: str
    role: str  # paired: "baseline" or "candidate"; factorial: the cell
    seed: int
    unit: str  # pair or block id
    position: int  # place within the unit
    order: int  # place in the whole plan
    steps: int
    val_every: int
    val_target_bpb: float
    corpus: str
    data_dir: str | None
    device: str
    compile: bool
    threads: int | None
    # lockstep (both arms of a pair in one process, alternating blocks of steps): None otherwise,
    # and then left out of the JSON, so the plans of studies of other designs hash as before
    block_steps: int | None = None  # steps per block
    partner: str | None = None  # the other arm's run id
    steps_first: bool | None = None  # whether this arm takes the first block (``position`` 0 is built first)
    # a command arm's run (harness.commandarm): its arm (argument list, cwd, env, limit, ref, reporter)
    # and its study's metric (name, target, better); None otherwise, and then left out of the JSON
    command: Mapping[str, Any] | None = None
    metric: Mapping[str, object] | None = None
    # a planted study's candidate (prereg/planted.py): the plant it runs in each timed step
    planted: Mapping[str, object] | None = None
    # the first steps of the run, timed apart from the training clock (``timings.warmup_s``)
    warmup_steps: int | None = None
    # a replicated protocol's run (prereg/replicates.py): which replicate (1-based) its unit is in
    replicate: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            f.name: v
            for f in fields(self)
            if (v := getattr(self, f.name)) is not None or f.name not in _LOCKSTEP_FIELDS
        }

    @property
    def lockstep(self) -> bool:
        """Whether this run shares its process with its partner (``design: lockstep``)."""
        return self.block_steps is not None

    @classmethod
    def from_json(cls, data: object, what: str = "spec", error: type[ValueError] = ValueError) -> RunSpec:
        """Read a spec, refusing one that is not a JSON object of exactly this class's fields, each of
        its JSON type."""
        return cls(**json_fields(cls, data, what, error))


#: WorkerResult's and RunRecord's fields written even when ``None``; the others only when set.
_ALWAYS = frozenset(
    {
        "status",
        "reason",
        "timings",
        "schema_version",
        "protocol",
        "plan_sha256",
        "spec",
        "attempt",
        "git",
        "started_at",
        "finished_at",
    }
)


@dataclass(frozen=True, kw_only=True)
class WorkerResult:
    """What a worker process reports (one line of JSON on its pipe): its status and what it measured,
    as far as it got. The runner turns it into the run's :class:`RunRecord`. A field is ``None`` where
    the worker did not get that far (and is then left out of the JSON)."""

    status: str  # "ok", "failed" or "interrupted" ("running" while the worker is at it)
    reason: str | None = None
    timings: Mapping[str, Any] = field(
        default_factory=dict, metadata={"file": SEALED}
    )  # device_s always; the worker's clocks
    env: Mapping[str, Any] | None = None  # where and with what it ran
    parameters: int | None = None
    method_paths: Mapping[str, object] | None = None  # which code paths the arm took
    curve: Sequence[Sequence[float]] | None = None  # [step, loss, seconds]
    val_curve: Sequence[Sequence[float]] | None = None  # [step, bpb, seconds]
    val_bpb: float | None = None
    test_bpb: float | None = None
    rescored_test_bpb: float | None = None
    rescore_identical: bool | None = None
    eval_bytes: Mapping[str, int] | None = None
    memory: Mapping[str, Any] | None = None
    checkpoint: Mapping[str, object] | None = None
    traceback: str | None = None
    log_tail: str | None = None
    # a command arm's run: the study's metric at its last evaluation, every metric's last value,
    # the evidence file kept beside the record (kind, file, sha256, bytes) and how the process ran
    final_metric: float | None = None
    metrics: Mapping[str, float] | None = None
    evidence: Mapping[str, object] | None = None
    process: Mapping[str, object] | None = None
    # every training step's own wall and CPU time in microseconds ({"wall_us": [...], "cpu_us": [...]},
    # warm-up steps included), for the carry-over and warm-up analyses; built-in arms' runs since planting
    step_times: Mapping[str, object] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object: every set field (and the ones always written), non-finite floats kept
        (:func:`seal` writes them as ``null``)."""
        return {
            f.name: plain(v)
            for f in fields(self)
            if (v := getattr(self, f.name)) is not None or f.name in _ALWAYS
        }

    @classmethod
    def from_json(cls, data: object, what: str = "worker result") -> WorkerResult:
        """Read a worker's result, refusing fields this class does not know or values of the wrong
        JSON type."""
        return cls(**json_fields(cls, data, what, RecordFormatError, NONFINITE_AS_NULL))

    def worker_fields(self) -> dict[str, Any]:
        """This result's own fields, as keyword arguments (to build a record from it)."""
        return {f.name: getattr(self, f.name) for f in fields(WorkerResult)}


#: The measurements a non-finite value turns to ``null`` in a file: read back as NaN, not as
#: ``None`` (a field the worker never got to), so that the record writes back the same bytes.
NONFINITE_AS_NULL = ("val_bpb", "test_bpb", "rescored_test_bpb", "final_metric")


@dataclass(frozen=True, kw_only=True)
class RunRecord(WorkerResult):
    """One run attempt: the worker's result and the runner's fields. Written by the runner (through
    the ledger, which adds ``ledger`` and ``sha256``); read by the analysis. ``to_json`` and
    ``from_json`` are its file boundary; the audit reads the files on its own."""

    schema_version: int
    protocol: Mapping[str, Any]  # Protocol.summary() plus the tag facts and freeze_sha256
    plan_sha256: str
    spec: RunSpec
    attempt: int  # 1-based attempt number of this run
    git: GitState
    unit_attempt: int = 1  # which run of its unit this attempt belongs to (schema 3; 1 before, unwritten)
    start: StartLink | None = None  # the started entry this record ends (schema 3)
    started_at: str | None = None
    finished_at: str | None = None
    node: Mapping[str, Any] | None = None  # the Ray node that ran it (id, host, pid); Ray runs only
    ledger: LedgerLink | None = field(
        default=None, metadata={"file": NOT_NULL}
    )  # set when the ledger appends it (schema 2 on)
    sha256: str | None = field(default=None, metadata={"file": SEALED})  # set when it is sealed

    def to_json(self) -> dict[str, Any]:
        """The record's file form: from schema 4 on, ``protocol`` is its stub (id, sha256, the tag
        fields and the sha256 of the folder's snapshot, which holds the rest once)."""
        out = super().to_json()
        if self.schema_version < 3:
            del out["unit_attempt"]  # records before schema 3 have no unit attempts
        if self.schema_version >= 4:
            out["protocol"] = protocol_stub(out["protocol"])
        return out

    def snapshot(self) -> dict[str, Any]:
        """The protocol snapshot a schema 4 record's stub names (``protocol.<sha256>.json``)."""
        return snapshot_of(plain(self.protocol))

    @classmethod
    def from_json(
        cls, data: object, what: str = "record", snapshots: Mapping[str, object] | None = None
    ) -> RunRecord:
        """Read a record's JSON object, refusing unknown or missing fields (naming them) and values
        of the wrong JSON type. A schema 4 record's ``protocol`` stub is read over the snapshot it
        names (``snapshots``: its folder's, by sha256; :func:`read_snapshots`)."""
        version = data.get("schema_version") if isinstance(data, Mapping) else None
        if isinstance(data, Mapping) and isinstance(version, int) and version >= 4:
            stub = data.get("protocol")
            full = with_snapshot(stub, dict(snapshots or {})) if isinstance(stub, dict) else None
            if full is None:
                named = stub.get("snapshot_sha256") if isinstance(stub, dict) else None
                raise RecordFormatError(
                    f"{what}: field protocol.snapshot_sha256 = {named!r} names no protocol snapshot of "
                    f"its folder ({snapshot_name(str(named))} missing); a schema 4 record's protocol is "
                    "its stub over that file"
                )
            data = {**data, "protocol": full}
        found = json_fields(cls, data, what, RecordFormatError, NONFINITE_AS_NULL)
        return cls(**{**found, "spec": RunSpec.from_json(found["spec"], f"{what}: spec", RecordFormatError)})


_NONE = type(None)
#: A shape: each field's JSON types and whether every entry has it.
Shape = dict[str, tuple[tuple[type, ...], bool]]


def file_shape(cls: type) -> Shape:
    """Each field of the dataclass ``cls`` as a sealed entry's file holds it, read from its one
    declaration (the dataclass): the JSON types its annotation admits
    (:func:`prereg.formats.jsonfields.json_types`), null among them where the annotation admits ``None``
    (unless its metadata says :data:`SEALED` or :data:`NOT_NULL`), and whether every such file has
    it (a field without a default, or :data:`SEALED`); the fields every file has first."""
    hint_of = hints(cls)
    out: Shape = {}
    for f in fields(cls):
        rule = f.metadata.get("file")
        types = json_types(hint_of[f.name]) or (object,)
        nullable = rule is None and _NONE in typing.get_args(hint_of[f.name])
        required = rule == SEALED or (f.default is MISSING and f.default_factory is MISSING)
        out[f.name] = (types + ((_NONE,) if nullable else ()), required)
    return {k: v for k, v in out.items() if v[1]} | {k: v for k, v in out.items() if not v[1]}


#: The shapes every reader relies on (the JSON types of the fields it reads before anything else),
#: checked before any other check reads an entry: a record's, its spec's, a started entry's and a
#: look entry's are their dataclasses' (:func:`file_shape`); a ledger link has no class of its own.
RECORD_SHAPE = file_shape(RunRecord)
SPEC_SHAPE = file_shape(RunSpec)
STARTED_SHAPE = file_shape(StartedEntry)
LOOK_SHAPE = file_shape(LookEntry)

#: An entry of the chain, typed: a run's record, an attempt's started entry, or a look.
ChainEntry = RunRecord | StartedEntry | LookEntry


def chain_entry(
    data: Mapping[str, object], what: str, snapshots: Mapping[str, object] | None = None
) -> ChainEntry:
    """One entry of the chain typed by its ``kind`` (its JSON object as :func:`read_entry` gives it;
    a schema 4 record over its folder's ``snapshots``), refusing fields its class does not know."""
    kind = data.get("kind")
    if kind == "look":
        return LookEntry.from_json(data, what)
    if kind == "started":
        return StartedEntry.from_json(data, what)
    return RunRecord.from_json(data, what, snapshots)


def entry_seq(e: ChainEntry) -> int:
    """An entry's position in the chain (0 for a record before schema 2, which has none)."""
    return e.ledger["seq"] if e.ledger is not None else 0


def entry_run(e: RunRecord | StartedEntry) -> str:
    """The run an attempt's entry (its record or its started entry) belongs to."""
    return e.run_id if isinstance(e, StartedEntry) else e.spec.run_id


LEDGER_SHAPE: Shape = {
    "seq": ((int,), True),
    "prev": ((str,), True),
    "at": ((str,), False),
}


def _shape(obj: Mapping[str, object], shape: Shape, where: str) -> list[str]:
    out = []
    for key, (types, required) in shape.items():
        if key not in obj:
            if required:
                out.append(f"field {where}{key} is missing")
            continue
        v = obj[key]
        if (isinstance(v, bool) and bool not in types) or not isinstance(v, types):
            names = " or ".join(
                "null" if t is _NONE else {"dict": "object", "list": "array"}.get(t.__name__, t.__name__)
                for t in types
            )
            out.append(f"field {where}{key} = {json.dumps(v)[:40]} is not {names}")
    return out


def entry_problems(e: object) -> list[str]:
    """What keeps a chain entry from being read at all: not an object, or a field every reader relies
    on missing or of another JSON type (:data:`RECORD_SHAPE`, :data:`SPEC_SHAPE`,
    :data:`STARTED_SHAPE`, :data:`LOOK_SHAPE`, :data:`LEDGER_SHAPE`; a ledger link from schema 2 on, a positive ``seq``,
    and ``protocol`` with its ``id`` and ``sha256``). Empty when it can be read; the audit names
    each problem and leaves the entry out of every later check, and the harness refuses it (one
    rule: :func:`prereg.formats.record.read_entry`)."""
    if not isinstance(e, dict):
        return [f"not a JSON object ({type(e).__name__})"]
    started = e.get("kind") in ("started", "look")
    out = _shape(e, LOOK_SHAPE if e.get("kind") == "look" else STARTED_SHAPE if started else RECORD_SHAPE, "")
    if not started and isinstance(e.get("spec"), dict):
        out += _shape(e["spec"], SPEC_SHAPE, "spec.")
    v = e.get("schema_version")
    if not started and isinstance(v, int) and v >= 2 and "ledger" not in e:
        out.append("field ledger is missing (schema 2 on, every entry is linked into the chain)")
    if isinstance(e.get("ledger"), dict):
        out += _shape(e["ledger"], LEDGER_SHAPE, "ledger.")
        seq = e["ledger"].get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool) and seq < 1:
            out.append(f"field ledger.seq = {seq} is not a position (1 on)")
    if isinstance(e.get("protocol"), dict):
        out += _shape(e["protocol"], {"id": ((str,), True), "sha256": ((str,), True)}, "protocol.")
    for key, value in (e.get("timings") or {}).items() if isinstance(e.get("timings"), dict) else ():
        if key.endswith("_s") and (isinstance(value, bool) or not isinstance(value, (int, float, _NONE))):
            out.append(f"field timings.{key} = {json.dumps(value)[:40]} is not a number of seconds or null")
    for key in ("curve", "val_curve"):
        points = e.get(key)
        if isinstance(points, list) and not all(
            isinstance(pt, list)
            and len(pt) == 3
            and all(isinstance(x, (int, float, _NONE)) and not isinstance(x, bool) for x in pt)
            for pt in points
        ):
            out.append(f"field {key}: every point is [step, value, seconds], three numbers")
    if isinstance(e.get("start"), dict):
        out += _shape(e["start"], {"seq": ((int,), True), "sha256": ((str,), True)}, "start.")
    return out


def jsonable(obj: Any) -> Any:
    """Replace non-finite floats by ``None`` (JSON has no NaN) recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def seal(record: Mapping[str, object]) -> dict[str, Any]:
    """Return ``record`` with ``sha256`` set to the hash of its canonical form without that field."""
    body = {k: v for k, v in jsonable(record).items() if k != "sha256"}
    body["sha256"] = sha256_bytes(canonical(body))
    return body


def write_json(path: Path, obj: object, *, overwrite: bool = True, pretty: bool = False) -> None:
    """Atomically write ``obj`` as JSON (canonical, or sorted and indented when ``pretty``)."""
    data = (
        json.dumps(obj, sort_keys=True, indent=1, allow_nan=False).encode("utf-8")
        if pretty
        else canonical(obj)
    )
    atomic_write(path, data + b"\n", overwrite=overwrite)


def record_path(directory: Path, run_id: str, attempt: int) -> Path:
    return directory / f"{run_id}.a{attempt}{RECORD_SUFFIX}"


def write_record(directory: Path, record: Mapping[str, object]) -> tuple[Path, dict[str, Any]]:
    """Seal and write one record's JSON object (:meth:`RunRecord.to_json`, linked by the ledger) as
    ``<run_id>.a<attempt>.record.json``; never overwrites."""
    sealed = seal(dict(record))
    path = record_path(directory, sealed["spec"]["run_id"], sealed["attempt"])
    atomic_write(path, canonical(sealed) + b"\n", overwrite=False)
    return path, sealed


def started_path(directory: Path, run_id: str, attempt: int) -> Path:
    return directory / f"{run_id}.a{attempt}{STARTED_SUFFIX}"


def write_started(directory: Path, entry: Mapping[str, object]) -> tuple[Path, dict[str, Any]]:
    """Seal and write one started entry as ``<run_id>.a<attempt>.started.json``; never overwrites."""
    sealed = seal(dict(entry))
    path = started_path(directory, sealed["run_id"], sealed["attempt"])
    atomic_write(path, canonical(sealed) + b"\n", overwrite=False)
    return path, sealed


def write_look(directory: Path, entry: Mapping[str, object]) -> tuple[Path, dict[str, Any]]:
    """Seal and write a group-sequential look's entry as ``look<k>.look.json``; never overwrites."""
    sealed = seal(dict(entry))
    path = directory / f"look{sealed['look']}{LOOK_SUFFIX}"
    atomic_write(path, canonical(sealed) + b"\n", overwrite=False)
    return path, sealed


def read_entry(path: Path) -> dict[str, Any]:
    """Read one entry of the chain (a record or a started entry) as its JSON object, refusing a format
    version this code does not know."""
    try:
        data = parse_json(read_regular(str(path)))
    except InputLimitError as e:  # a link, a FIFO, a device, over a limit: named, never opened
        raise RecordFormatError(f"{path}: {str(e).removeprefix(f'{path}: ')}") from e
    except (OSError, ValueError) as e:
        raise RecordFormatError(f"{path}: not a readable JSON record ({e})") from e
    if not isinstance(data, dict):
        raise RecordFormatError(f"{path}: a record is a JSON object, found {type(data).__name__}")
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise RecordFormatError(
            f"{path}: record schema_version {version!r} is not one this harness reads "
            f"({', '.join(map(str, READABLE_VERSIONS))}); a newer harness wrote it: upgrade to read it"
        )
    if path.name.endswith(STARTED_SUFFIX) and data.get("kind") != "started":
        raise RecordFormatError(f"{path}: field kind = {data.get('kind')!r}; a started entry's is 'started'")
    if path.name.endswith(LOOK_SUFFIX) and data.get("kind") != "look":
        raise RecordFormatError(f"{path}: field kind = {data.get('kind')!r}; a look entry's is 'look'")
    shape = entry_problems(data)  # the core's rule: the audit names the same
    if shape:
        raise RecordFormatError(
            f"{path}: {shape[0]}" + (f" (and {len(shape) - 1} more)" if len(shape) > 1 else "")
        )
    return data


def read_snapshots(directory: Path) -> dict[str, dict[str, object]]:
    """A records folder's protocol snapshots (``protocol.<sha256>.json``, schema 4 on) by sha256,
    each checked against its name."""
    out: dict[str, dict[str, object]] = {}
    for path in sorted(directory.glob("protocol.*.json")) if directory.is_dir() else []:
        if not is_snapshot_name(path.name):
            continue
        try:
            data = parse_json(read_regular(str(path)))
        except InputLimitError as e:
            raise RecordFormatError(f"{path}: {str(e).removeprefix(f'{path}: ')}") from e
        except (OSError, ValueError) as e:
            raise RecordFormatError(f"{path}: not a readable JSON protocol snapshot ({e})") from e
        sha = sha256_bytes(canonical(data)) if isinstance(data, dict) else None
        if sha is None or snapshot_name(sha) != path.name:
            raise RecordFormatError(
                f"{path}: not the protocol snapshot its name says (edited, or another file)"
            )
        out[sha] = data
    return out


def write_snapshot(directory: Path, snapshot: Mapping[str, object]) -> str:
    """Write a protocol snapshot into a records folder once (``protocol.<sha256>.json``, never
    overwritten); returns its sha256."""
    data = canonical(dict(snapshot))
    sha = sha256_bytes(data)
    path = directory / snapshot_name(sha)
    if not path.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data + b"\n", overwrite=False)
    return sha


def read_record(path: Path, snapshots: Mapping[str, object] | None = None) -> RunRecord:
    """Read one record, refusing a format version this code does not know and fields it does not
    (a schema 4 record over ``snapshots``, else its folder's)."""
    data = read_entry(path)
    if snapshots is None and data.get("schema_version", 1) >= 4:
        snapshots = read_snapshots(path.parent)
    return RunRecord.from_json(data, str(path), snapshots)


def record_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{RECORD_SUFFIX}")) if directory.is_dir() else []


def started_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{STARTED_SUFFIX}")) if directory.is_dir() else []


def look_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{LOOK_SUFFIX}")) if directory.is_dir() else []


def entry_files(directory: Path) -> list[Path]:
    """Every file of the chain: records, started entries and a sequential design's look entries."""
    return sorted(record_files(directory) + started_files(directory) + look_files(directory))


def load_started(directory: Path) -> list[StartedEntry]:
    """Every started entry of a folder, validated (:meth:`StartedEntry.from_json`), in ledger order."""
    out = [StartedEntry.from_json(read_entry(p), str(p)) for p in started_files(directory)]
    out.sort(key=lambda e: e.ledger["seq"] if e.ledger else 0)
    return out


def budget_attempts(records: list[RunRecord]) -> list[tuple[str, str, int, str, float]]:
    """Every attempt as the budget rule reads it (``prereg/budget.py``, its one home):
    run id, unit, attempt, status, device seconds."""
    return [
        (r.spec.run_id, r.spec.unit, r.attempt, r.status, (r.timings or {}).get("device_s") or 0.0)
        for r in records
    ]


def failure_attempts(records: list[RunRecord]) -> list[tuple[str, str, str, str, bool, str]]:
    """Every attempt as the failure rule reads it (``prereg/failstop.py``, its one home): study,
    arm, run id, status, whether it failed by itself before its first training step, reason."""
    from prereg.failstop import failed_early

    return [
        (
            r.spec.study,
            r.spec.arm,
            r.spec.run_id,
            r.status,
            failed_early(r.status, r.curve, r.reason),
            r.reason or "",
        )
        for r in records
    ]


def load_records(directory: Path) -> list[RunRecord]:
    """Every record of a folder, in ledger order (then file name, for version 1 records)."""
    snapshots = read_snapshots(directory)
    recs = [read_record(p, snapshots) for p in record_files(directory)]
    recs.sort(key=lambda r: (r.ledger["seq"] if r.ledger else 0, r.spec.run_id, r.attempt))
    return recs

"""From records to every number the report shows (``summary.json``).

Selection rules (their one home is the standard-library core in ``prereg/``: which records
count is :mod:`prereg.attempts`, the pairs, blocks and endpoints built from them
:mod:`prereg.recompute`, which the audit calls on the raw records too):

* a run's outcome is its ``ok`` record (at most one per run); failed and interrupted attempts stay
  in the per-run table and are counted;
* a pair or block is used only when every arm of it has an ``ok`` record; others are listed under
  ``exclusions`` with the reason;
* a run's outcome is the ok record of its latest attempt (a retried unit re-runs every arm);
* exactly one *unit attempt* per unit is analysed: its latest (``unit_attempt``, 1 for records
  that predate it). A unit that ran again whole (a node died, a failed unit retried) keeps the
  records of its earlier unit attempts; they are *superseded*: listed (``runs[].superseded``),
  counted (``records.superseded``, ``flow[].superseded_attempts``), never paired, so both arms of a
  pair always come from the same unit attempt;
* attempts that started (a started entry in the ledger) and have no record yet are listed under
  ``records.unfinished`` as interrupted, with their start time;
* time to target, descriptively: the pairs where both arms reached the target, with the unreached
  count per arm; a decision on it follows its hypothesis' censoring rule (:mod:`prereg.decisions`);
* completeness (:func:`prereg.attempts.completeness`): a study whose planned runs do not all have an ``ok`` record
  is incomplete, and its decisions are "not reached (incomplete)", unless the protocol's budget
  rule explains the stop (the device seconds spent plus one more unit at the mean device seconds
  of the ok runs exceed the budget), in which case the decisions are made and say so.
"""

from __future__ import annotations

from collections.abc import Mapping

from prereg.formats.jsonfields import plain
from prereg.formats.record import RecordFormatError, RunRecord, StartedEntry, jsonable, load_records
from prereg.recompute import summary_of
from prereg.results import Summary

__all__ = ["derive", "load_records", "records_json"]


def records_json(records: list[RunRecord]) -> list[dict[str, object]]:
    """The records as their files hold them (non-finite measurements as ``null``), a schema 4
    record's ``protocol`` read over its folder's snapshot: what the rules' core
    (:mod:`prereg`) reads, in the summary and the audit alike."""
    return [jsonable({**r.to_json(), "protocol": plain(r.protocol)}) for r in records]


def derive(records: list[RunRecord], started: list[StartedEntry] | None = None) -> Summary:
    """Every number of the report, from the records (and the ledger's started entries) alone.

    The rules' one implementation (:func:`prereg.recompute.summary_of`) computes the typed
    :class:`prereg.results.Summary` (which the report, the plots and the study page read, and whose
    ``to_json`` is ``summary.json``) from the records as their files hold them.
    """
    if not records:
        raise RecordFormatError("no records")
    shas = {r.protocol["sha256"] for r in records}
    if len(shas) != 1:
        raise RecordFormatError(f"records name {len(shas)} different protocol files: {sorted(shas)}")
    rows = records_json(records)
    protocol = rows[0]["protocol"]
    if not isinstance(protocol, Mapping):
        raise RecordFormatError(f"the records' protocol is not a JSON object: {protocol!r}")
    return summary_of(protocol, rows, [e.to_json() for e in started or []])

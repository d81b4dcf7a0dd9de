"""The ledger against a group-sequential design's looks, with the standard library alone: every look
taken on complete pairs before any later pair started, and nothing started past the look where the
preregistered rule stopped the study (:mod:`.looks` says which looks the records reach)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from prereg.attempts import analysed, final_units
from prereg.formats.ledger import record_name
from prereg.hypotheses import Family
from prereg.looks import look_units, pair_index
from prereg.recompute import summary_of


def look_entry_records(
    records: Sequence[Mapping[str, Any]], units: Collection[str], before: int
) -> list[str]:
    """The sha256 of the analysed records of ``units`` in the chain before ledger seq ``before``,
    sorted: the data a look entry binds (what the look's statistics are computed from)."""
    early = [r for r in records if int(r.get("ledger", {}).get("seq", 0)) < before]
    want = set(units)
    return sorted(str(r["sha256"]) for r in analysed(early) if r["spec"]["unit"] in want)


def _seq_of(e: Mapping[str, Any]) -> int:
    """An entry's ledger seq (0 where it has none)."""
    return int(e.get("ledger", {}).get("seq", 0))


def _index_of(unit: str, studies: Collection[str]) -> int | None:
    """The pair index of a unit of the family's studies (None: not a pair of them)."""
    return pair_index(unit) if unit.split(".", 1)[0] in studies and ".pair" in unit else None


def look_problems(
    records: Sequence[Mapping[str, Any]],
    started: Sequence[Mapping[str, Any]],
    looks: Sequence[Mapping[str, Any]] = (),
) -> list[str]:
    """What the chain shows against the design's looks (empty for a protocol without one):

    * a look entry for a look the design does not have, at another pair count, out of order, twice,
      or after the look where the rule stopped the study;
    * a look entry whose pairs were not all final before it in the chain, or that binds other
      records than the look's (:func:`look_entry_records`);
    * a look the records reach without its entry, where a later pair started or the rule stopped
      there: ``harness run`` appends it before computing any statistic of the look (a run stopped
      right after the look's pairs, before the entry, is only unfinished);
    * a pair of a look that started again after the look's entry (its statistics would change
      after the look's outcome was seen);
    * a unit past a look that started before the look's entry (a later pair's outcome could have
      been seen before the look was taken), and a unit past the stopping look that started at all.
    """
    if not records:
        return []
    proto = records[0]["protocol"]
    spec = proto.get("hypotheses") or {}
    if "sequential" not in spec:
        return [
            f"a look entry ({record_name(dict(e))}) in a study without a sequential design" for e in looks
        ]
    family = Family.of(spec)
    seq = family.sequential
    assert seq is not None
    studies = {h.study for h in family.tests}
    summary = summary_of(proto, records, started).sequential or {}
    taken = len(summary.get("looks") or [])
    stop_at = summary.get("stopped_at") if summary.get("stop") in ("efficacy", "futility") else None
    out: list[str] = []
    entries = sorted(looks, key=_seq_of)
    for pos, e in enumerate(entries):
        out += _entry_problems(e, pos, proto, family, records, started, stop_at)
    have = {e["look"] for e in entries}
    for k in range(1, taken + 1):
        n = seq.looks[k - 1]
        past = [s for s in started if (i := _index_of(str(s["unit"]), studies)) is not None and i >= n]
        if k not in have and k < len(seq.looks) and (past or (stop_at is not None and k == stop_at)):
            # a run stopped right after a look's pairs, before its entry, is only unfinished: the
            # entry is written when it resumes; a later pair started, or a stop there, needs it
            out.append(f"look {k} ({n} pairs): the records reach it, and the chain has no look entry for it")
    if stop_at is not None:
        n = seq.looks[stop_at - 1]
        past = [s for s in started if (i := _index_of(str(s["unit"]), studies)) is not None and i >= n]
        if past:
            out.append(
                f"the preregistered rule stopped the study at look {stop_at} ({n} pairs, "
                f"{summary['stop']}), and {len(past)} run attempt(s) past it started anyway (first: "
                f"{past[0]['run_id']}, ledger seq {_seq_of(past[0])})"
            )
    return out


def _entry_problems(
    e: Mapping[str, Any],
    pos: int,
    proto: Mapping[str, object],
    family: Family,
    records: Sequence[Mapping[str, Any]],
    started: Sequence[Mapping[str, Any]],
    stop_at: int | None,
) -> list[str]:
    """What is wrong with the chain's look entry ``e``, entry ``pos`` (0-based) of its looks in order."""
    seq = family.sequential
    assert seq is not None
    k, n, name = e["look"], e["pairs"], record_name(dict(e))
    if pos + 1 != k:
        return [
            f"{name}: look {k} is entry {pos + 1} of the chain's looks: looks are taken in order, once each"
        ]
    if k > len(seq.looks) or seq.looks[k - 1] != n:
        planned = seq.looks[k - 1] if k <= len(seq.looks) else "none"
        return [f"{name}: look {k} at {n} pairs; the design's look {k} is at {planned} pairs"]
    out: list[str] = []
    if stop_at is not None and k > stop_at:
        out.append(f"{name}: look {k} taken after the rule stopped the study at look {stop_at}")
    need = look_units(proto, family, n)
    early = [r for r in records if _seq_of(r) < _seq_of(e)]
    if not set(need) <= final_units(early):
        out.append(f"{name}: look {k} was taken before its {n} pairs were final in the chain")
    elif list(e["records"]) != look_entry_records(records, need, _seq_of(e)):
        out.append(f"{name}: look {k} binds other records than its pairs' records before it")
    studies = {h.study for h in family.tests}
    again = [
        s
        for s in started
        if (i := _index_of(str(s["unit"]), studies)) is not None and i < n and _seq_of(s) > _seq_of(e)
    ]
    for s in again[:3]:
        out.append(
            f"{name}: {s['run_id']} attempt {s['attempt']} (one of look {k}'s {n} pairs) started at ledger "
            f"seq {_seq_of(s)}, after the look (seq {_seq_of(e)}): a pair a look was taken on never runs again"
        )
    later = [
        s
        for s in started
        if (i := _index_of(str(s["unit"]), studies)) is not None and i >= n and _seq_of(s) < _seq_of(e)
    ]
    for s in later[:3]:
        out.append(
            f"{name}: {s['run_id']} attempt {s['attempt']} (past look {k}'s {n} pairs) started at ledger "
            f"seq {_seq_of(s)}, before the look (seq {_seq_of(e)}): a look is taken on pairs 1..{n} "
            "complete, before any later pair starts"
        )
    return out

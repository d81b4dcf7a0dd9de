"""The ledger against a group-sequential design's looks, with the standard library alone: every look
taken on complete pairs before any later pair started, and nothing started past the look where the
preregistered rule stopped the study (:mod:`.looks` says which looks the records reach)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .attempts import final_units
from .hypotheses import Family
from .looks import look_units, pair_index
from .recompute import recompute


def look_problems(records: Sequence[Mapping[str, Any]], started: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the chain shows against the design's looks: a unit past a look that started before the
    look's pairs were all final (the look would then not be "pairs 1..n_k, every pair complete":
    a later pair's outcome could have been seen, or the look taken at another count), and a unit
    past the look where the preregistered rule stopped the study that started anyway. Empty for a
    protocol without a sequential design. The audit fails on any."""
    if not records:
        return []
    proto = records[0]["protocol"]
    spec = proto.get("hypotheses") or {}
    if "sequential" not in spec:
        return []
    family = Family.of(spec)
    seq = family.sequential
    assert seq is not None
    studies = {h.study for h in family.tests}

    def seq_of(e: Mapping[str, Any]) -> int:
        return int(e.get("ledger", {}).get("seq", 0))

    def index_of(unit: str) -> int | None:
        study = unit.split(".", 1)[0]
        return pair_index(unit) if study in studies and ".pair" in unit else None

    final = final_units(records)
    out: list[str] = []
    for k, n in enumerate(seq.looks[:-1]):
        need = set(look_units(proto, family, n))
        if not need <= final:
            break
        at = max(seq_of(r) for r in records if r["spec"]["unit"] in need)
        early = [
            e for e in started if (i := index_of(str(e["unit"]))) is not None and i >= n and seq_of(e) < at
        ]
        for e in early[:3]:
            out.append(
                f"look {k + 1} ({n} pairs): {e['run_id']} attempt {e['attempt']} started at ledger seq "
                f"{seq_of(e)}, before the look's pairs were final (seq {at}): a look is taken on pairs "
                f"1..{n} complete, before any later pair starts"
            )
    summary = (
        recompute([dict(r) for r in records], [dict(e) for e in started])["hypotheses"].get("sequential")
        or {}
    )
    if summary.get("stop") in ("efficacy", "futility"):
        n = summary["looks"][-1]["pairs"]
        past = [e for e in started if (i := index_of(str(e["unit"]))) is not None and i >= n]
        if past:
            out.append(
                f"the preregistered rule stopped the study at look {summary['stopped_at']} ({n} pairs, "
                f"{summary['stop']}), and {len(past)} run attempt(s) past it started anyway (first: "
                f"{past[0]['run_id']}, ledger seq {seq_of(past[0])})"
            )
    return out

"""A runner's sequential looks: the group-sequential barrier between a protocol's pairs.

A unit of a hypothesis' study at seed index ``i`` starts only once every look at ``n_k <= i`` pairs
is reached (its pairs final) and the preregistered rule went on there. Each look's entry is appended
to the ledger before any of its statistics is computed; the looks are recomputed from the records by
the rules' one home (:mod:`prereg.looks`, through :func:`prereg.recompute.summary_of`), as the summary
and the audit recompute them. Where the rule stopped, :attr:`SequentialLooks.stopped_at` is set and
no further unit of the protocol starts."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from harness.execute.attempts import utc_stamp
from harness.ledger import Ledger
from harness.protocol import Protocol
from prereg.attempts import final_units
from prereg.barrier import look_entry_records
from prereg.designs import design_named
from prereg.formats.jsonfields import plain
from prereg.formats.record import SCHEMA_VERSION, LookEntry, RunSpec, jsonable
from prereg.hypotheses import Family
from prereg.looks import look_units
from prereg.recompute import summary_of


def records_json(ledger: Ledger) -> list[dict[str, Any]]:
    """The ledger's records as their files hold them (each one's protocol as plain JSON)."""
    return [jsonable({**r.to_json(), "protocol": plain(r.protocol)}) for r in ledger.records()]


class SequentialLooks:
    """The looks of one runner over its study's ledger. ``echo`` receives what the rule decides."""

    def __init__(self, proto: Protocol, host: str, echo: Callable[[str], None]) -> None:
        self.proto = proto
        self.host = host
        self.echo = echo
        self.stopped_at: dict[str, Any] | None = None  # the look where the sequential rule stopped
        self._cache: tuple[int, Mapping[str, Any] | None] = (-1, None)  # (records read, the summary)

    def allows(self, unit: list[RunSpec], ledger: Ledger, freeze_sha256: str | None) -> bool:
        """Whether ``unit`` may start: every look due before it taken, and the rule went on at each;
        a pair a look was computed on never runs again (``--retry-failed`` included)."""
        looks = self._looks_over(unit)
        if looks is None:
            return True
        index = design_named(unit[0].design).unit_index(unit[0].unit)
        due = [n for n in looks if n <= index]
        taken_over = [e for e in ledger.looks() if index < e.pairs]
        if taken_over:
            self.echo(
                f"sequential: {unit[0].unit} is one of the pairs look {taken_over[0].look} was taken on; "
                "it does not run again"
            )
            return False
        if not due:
            return True
        for k, n in enumerate(due, start=1):  # take each look due, in order, once
            if any(e.look == k for e in ledger.looks()):
                continue
            if not self._take(k, n, ledger, freeze_sha256):
                return False  # its pairs are still running (another runner's, or in flight)
            break
        return self._went_on(len(looks), len(due), ledger)

    def _looks_over(self, unit: list[RunSpec]) -> list[int] | None:
        """The pairs at each look of the sequential rule over ``unit``, or None where no look
        applies (no ``sequential`` block, a unit that is not a pair, a study no hypothesis tests)."""
        spec = self.proto.spec.hypotheses
        seq = spec.get("sequential") if isinstance(spec, dict) else None
        if seq is None or not design_named(unit[0].design).pairwise:
            return None
        if unit[0].study not in {t["study"] for t in spec["tests"]}:
            return None
        return list(seq["looks"])

    def _went_on(self, looks: int, due: int, ledger: Ledger) -> bool:
        """After the looks due were taken: whether the rule went on at each (False, with
        :attr:`stopped_at` set, where it stopped; False while one is not in the summary yet)."""
        summary = self.summary(ledger)
        taken = summary["looks"] if summary is not None else []
        if summary is not None and summary["stop"] is not None:
            look = taken[-1]
            self.stopped_at = look
            self.echo(
                f"sequential: stopped at look {look['look']} of {looks} ({look['pairs']} pairs, "
                f"{summary['stop']}): no further run starts"
            )
            return False
        return len(taken) >= due and all(any(e.look == k for e in ledger.looks()) for k in range(1, due + 1))

    def _take(self, k: int, n: int, ledger: Ledger, freeze_sha256: str | None) -> bool:
        """Append look ``k``'s entry (its ``n`` pairs final: the records it binds) before any of its
        statistics is computed; False when its pairs are not all final yet."""
        data = records_json(ledger)
        units = look_units(data[0]["protocol"], Family.of(self.proto.spec.hypotheses), n) if data else []
        if not data or not set(units) <= final_units(data):
            return False
        head = ledger.head()
        entry = LookEntry(
            schema_version=SCHEMA_VERSION,
            kind="look",
            protocol={"id": self.proto.spec.id, "sha256": self.proto.sha256, "freeze_sha256": freeze_sha256},
            look=k,
            pairs=n,
            records=look_entry_records(data, units, head["seq"] + 1),
            runner={"host": self.host, "pid": os.getpid()},
            taken_at=utc_stamp(time.time()),
        )
        ledger.append_look(entry)
        self.echo(f"sequential: look {k} taken on pairs 1..{n} (ledger seq {head['seq'] + 1})")
        return True

    def waits(self, unit: list[RunSpec], ledger: Ledger) -> bool:
        """Whether ``unit`` lies past a look that its pairs in flight have not reached yet (a parallel
        executor holds it back until they end, then claims it: :meth:`allows` decides)."""
        looks = self._looks_over(unit)
        if looks is None:
            return False
        index = design_named(unit[0].design).unit_index(unit[0].unit)
        due = [n for n in looks if n <= index]
        summary = self.summary(ledger) if due else None
        return bool(due) and len(summary["looks"] if summary else []) < len(due)

    def summary(self, ledger: Ledger) -> Mapping[str, Any] | None:
        """The summary's ``hypotheses.sequential`` from the records so far (kept while no record came in)."""
        recs = ledger.records()
        if self._cache[0] != len(recs):
            if not recs:
                self._cache = (0, None)
            else:
                rows = records_json(ledger)
                self._cache = (len(recs), summary_of(rows[0]["protocol"], rows).sequential)
        return self._cache[1]

"""The summary's results, typed: what :func:`prereg.formats.summary.derive` returns and the report, the
plots and the study page read. ``to_json`` gives ``summary.json`` (its keys are these fields' names);
the audit recomputes that JSON on its own.

Tables (a pair's or block's row, every run attempt, the flow of planned runs, exclusions) stay rows
of JSON objects, as they are written and as the order diagnostics and decisions read them.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

from prereg.attempts import Completeness
from prereg.decisions import DECIDED_FIELDS, HypothesisDecision
from prereg.descriptive import Endpoint, Ends, PairedInterval
from prereg.designs import find_design
from prereg.formats.jsonfields import exact_fields, plain
from prereg.hypotheses import Hypothesis, Pair, present

#: summary.json's format (``schema_version``). 2: "completeness"; 3: "hypotheses" (one decision each),
#: "flow", order diagnostics, failed-arm sensitivity; 4: ratio estimands on the log ratio
#: (relative_reduction = 100 (1 - exp) of its interval), a decision's "estimate" / "estimate_of" in the
#: estimand's units, an endpoint's "invalid_pairs"; one unit attempt per unit ("records.superseded",
#: "runs[].unit_attempt/superseded", "flow[].superseded_attempts") and started attempts with no record
#: ("records.unfinished")
SUMMARY_SCHEMA = 4


class SummaryFormatError(ValueError):
    """A summary.json this code cannot read: another format version, or fields it does not know."""


Row = Mapping[str, Any]


T = TypeVar("T")


class _Json:
    """``to_json``: every field by name, as JSON holds it; ``from_json``: the reverse, refusing
    unknown or missing fields."""

    def to_json(self) -> dict[str, object]:
        return {name: plain(v) for name, v in present(self).items()}

    @classmethod
    def from_json(cls: type[T], data: object, where: str = "summary") -> T:
        return typing.cast(T, _build(cls, data, where))


def _build(cls: type, data: object, where: str) -> object:
    """``data`` (JSON) as an instance of ``cls``: a field typed as a result (or a union of results,
    told apart by their fields, or a sequence of them) is built in turn; any other field is kept."""
    if not is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a result")
    if not isinstance(data, Mapping):
        raise SummaryFormatError(f"{where}: expected a JSON object for {cls.__name__}")
    names = [f.name for f in fields(cls) if f.name in data or not f.metadata.get("omit_none")]
    exact_fields(f"{where}: {cls.__name__}", data, names, SummaryFormatError)
    hints = typing.get_type_hints(cls)
    return cls(**{n: _value(hints[n], data[n], f"{where}.{n}") for n in names})


def _fits(cls: type, value: Mapping[str, object]) -> bool:
    """Whether ``value`` has the fields of ``cls``: all of them, a field left out when ``None`` aside."""
    if not is_dataclass(cls):
        return False
    names = {f.name for f in fields(cls)}
    optional = {f.name for f in fields(cls) if f.metadata.get("omit_none")}
    return names - optional <= set(value) <= names


def _value(hint: object, value: object, where: str) -> object:
    """``value`` (JSON) read as ``hint`` says: a union by the member it fits, a result by its
    fields, a sequence of results item by item, anything else kept."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    if value is None:
        if union and type(None) in typing.get_args(hint):
            return None
        raise SummaryFormatError(f"{where} is null")
    if union:
        return _union_value(hint, value, where)
    if isinstance(hint, type) and is_dataclass(hint):
        read = getattr(hint, "from_json", None)
        return read(value, where) if read is not None else _build(hint, value, where)
    if _sequence_of_results(hint):
        if not isinstance(value, list):
            raise SummaryFormatError(f"{where}: expected a JSON list")
        item = typing.get_args(hint)[0]
        return [_value(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _sequence_of_results(hint: object) -> bool:
    """Whether ``hint`` is a sequence of results (or of a union of them)."""
    args = typing.get_args(hint)
    return (
        typing.get_origin(hint) is Sequence
        and bool(args)
        and bool(is_dataclass(args[0]) or typing.get_args(args[0]))
    )


def _union_value(hint: object, value: object, where: str) -> object:
    """A value of a union: kept when already read or when no member is a result, else read as the
    first member whose fields it has."""
    built: list[type] = [a for a in typing.get_args(hint) if isinstance(a, type) and is_dataclass(a)]
    if any(isinstance(value, a) for a in built):
        return value  # already read (Summary.read reads the hypotheses first)
    if not built:
        return value
    fit = [a for a in built if isinstance(value, Mapping) and _fits(a, value)]
    if not fit:
        raise SummaryFormatError(
            f"{where}: its fields are those of none of {', '.join(a.__name__ for a in built)}"
        )
    return _value(fit[0], value, where)


@dataclass(frozen=True)
class TrainingTime(Endpoint):
    """Fixed-budget training time, also on the log ratio (over the pairs with both times positive);
    in a replicated protocol both intervals are over the replicates' estimates (``replicates``: how
    many replicates have pairs; left out otherwise, so earlier summaries read and write back the same)."""

    log_ratio: PairedInterval | None
    replicates: int | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class TimeToTarget(Endpoint):
    """Time to the validation target over the pairs where both arms reached it."""

    rule: str
    unreached: Mapping[str, int]  # per role: pairs where that arm never reached the target


@dataclass(frozen=True)
class FinalMetric(Endpoint):
    """A command study's metric at each arm's last evaluation (``metric``: its name, target and
    which way is better), compared as a difference."""

    metric: Mapping[str, object]


@dataclass(frozen=True)
class PairedResult(_Json):
    """One configuration of a paired study."""

    config: str
    design: str  # "paired"
    level: float
    parameters: int | None
    baseline_arm: str
    candidate_arm: str
    units_seen: int
    pairs_used: int
    training_time: TrainingTime
    time_to_target: TimeToTarget
    total_time: Endpoint
    test_bpb: Endpoint
    peak_memory: Endpoint | None  # None when a pair lacks a memory figure
    counts: Mapping[str, int]  # faster, slower, ties, worse_test_bpb
    order_effects: Mapping[str, Any]  # crossover, drift (prereg.order)
    by_device: Mapping[str, Any] | None
    pairs: Sequence[Pair]
    # training CPU time, when every pair recorded it (records since lockstep; left out otherwise,
    # so earlier summaries read and write back the same)
    training_cpu_time: TrainingTime | None = field(default=None, metadata={"omit_none": True})
    # a study of command arms: its metric at the last evaluation (left out of other studies)
    final_metric: FinalMetric | None = field(default=None, metadata={"omit_none": True})
    # a lockstep study whose records keep their step times (prereg.carryover): the order-cell
    # model per clock and the carry-over; a study with warm-up steps: the warm-up time apart
    order_cells: Mapping[str, object] | None = field(default=None, metadata={"omit_none": True})
    carry_over: Mapping[str, object] | None = field(default=None, metadata={"omit_none": True})
    warmup_time: TrainingTime | None = field(default=None, metadata={"omit_none": True})
    # a lockstep study whose records hold each arm's stall (prereg/interference.py): the pairs
    # judged and those flagged (left out of summaries of records from before the rule)
    interference: Mapping[str, object] | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class FactorialResult(_Json):
    """One configuration of a factorial study."""

    config: str
    design: str  # "factorial"
    level: float
    units_seen: int
    parameters: int | None
    positions: Sequence[Row] | None
    blocks_used: int
    cell_mean_training_s: Mapping[str, float | None]
    effects: Mapping[str, Row]  # per effect: its interval on log time and the reductions in percent
    blocks: Sequence[Row]

    def effect(self, name: str) -> Ends:
        """A within-block effect's log contrast and its interval, at the level this result carries."""
        e = self.effects[name]
        return Ends(e["estimate"], e["low"], e["high"], self.level)

    def effect_reduction(self, name: str) -> Ends:
        """The same effect as a reduction in percent of the baseline's time (its interval's ends as
        the summary holds them), at the level this result carries."""
        e = self.effects[name]
        return Ends(e["reduction_pct"], e["reduction_low_pct"], e["reduction_high_pct"], self.level)


@dataclass(frozen=True)
class StudyResult(_Json):
    name: str
    design: str  # "paired": every configuration a PairedResult; "factorial": a FactorialResult
    configs: Sequence[PairedResult | FactorialResult]

    def paired_configs(self) -> list[PairedResult]:
        """A paired study's configurations."""
        return [c for c in self.configs if isinstance(c, PairedResult)]

    def factorial_configs(self) -> list[FactorialResult]:
        """A factorial study's configurations."""
        return [c for c in self.configs if isinstance(c, FactorialResult)]


@dataclass(frozen=True)
class Decided:
    """A preregistered hypothesis' decision and its sensitivity analysis (a failed arm as adverse)."""

    decision: HypothesisDecision
    sensitivity: Mapping[str, object] | None

    def to_json(self) -> dict[str, object]:
        return {**plain(self.decision.as_dict()), "sensitivity": plain(self.sensitivity)}

    @classmethod
    def from_json(cls, data: object, where: str, tests: Sequence[Mapping[str, object]] = ()) -> Decided:
        """A decision row of summary.json, its hypothesis taken whole from the protocol's ``tests``."""
        own = {f.name for f in fields(HypothesisDecision)} - {"hypothesis"}
        if not isinstance(data, Mapping):
            raise SummaryFormatError(f"{where}: expected a JSON object for a decision")
        exact_fields(
            f"{where}: decision", data, own | set(DECIDED_FIELDS) | {"sensitivity"}, SummaryFormatError
        )
        test = next((t for t in tests if t.get("id") == data["id"]), None)
        if test is None:
            raise SummaryFormatError(f"{where}: decision {data['id']!r} is not a hypothesis of the protocol")
        decision = HypothesisDecision(hypothesis=Hypothesis.of(test), **{k: data[k] for k in own})
        differ = [k for k in DECIDED_FIELDS if decision.as_dict()[k] != data[k]]
        if differ:
            raise SummaryFormatError(
                f"{where}: decision {data['id']!r} differs from the protocol's hypothesis in "
                f"{', '.join(differ)}"
            )
        return cls(decision=decision, sensitivity=data["sensitivity"])


@dataclass(frozen=True)
class Hypotheses(_Json):
    """The preregistered decisions, in the protocol's order."""

    procedure: str
    family_alpha: float
    min_pairs: int
    decisions: Sequence[Decided]
    # a group-sequential design's looks (prereg.looks): the design, each look, the stop
    sequential: Mapping[str, object] | None = field(default=None, metadata={"omit_none": True})

    @classmethod
    def read(cls, data: Mapping[str, Any], tests: Sequence[Mapping[str, Any]], where: str) -> Hypotheses:
        if not isinstance(data, Mapping):
            raise SummaryFormatError(f"{where}: expected a JSON object")
        names = [f.name for f in fields(cls) if f.name in data or not f.metadata.get("omit_none")]
        exact_fields(where, data, names, SummaryFormatError)
        rows = data["decisions"]
        if not isinstance(rows, list):
            raise SummaryFormatError(f"{where}.decisions: expected a JSON list")
        return cls(
            procedure=data["procedure"],
            family_alpha=data["family_alpha"],
            min_pairs=data["min_pairs"],
            decisions=[Decided.from_json(d, f"{where}.decisions[{i}]", tests) for i, d in enumerate(rows)],
            sequential=data.get("sequential"),
        )


@dataclass(frozen=True)
class Descriptive(_Json):
    """A protocol without hypotheses: nothing is decided."""

    descriptive: str


@dataclass(frozen=True)
class RecordCounts(_Json):
    files: int
    ok: int
    failed: int
    interrupted: int
    superseded: int  # attempts of units that ran again whole (kept, not analysed)
    unfinished: Sequence[Row]  # started attempts with no record
    device_seconds: float


@dataclass(frozen=True)
class Summary(_Json):
    """Every number of the report (``summary.json``; ``schema_version`` is its format's)."""

    schema_version: int
    protocol: Mapping[str, Any]
    records: RecordCounts
    completeness: Completeness
    hypotheses: Hypotheses | Descriptive
    flow: Sequence[Row]
    exclusions: Sequence[Row]
    studies: Sequence[StudyResult]
    runs: Sequence[Row]
    # planted studies' bias against their known effects (prereg.planted.planted_rows)
    planted: Sequence[Row] | None = field(default=None, metadata={"omit_none": True})
    # a replicated protocol's per-replicate estimates and their random-effects mean
    # (prereg.replicates.replicate_rows)
    replicates: Sequence[Row] | None = field(default=None, metadata={"omit_none": True})

    @property
    def sequential(self) -> Mapping[str, Any] | None:
        """A group-sequential design's looks (``hypotheses.sequential``); ``None`` for other designs."""
        return self.hypotheses.sequential if isinstance(self.hypotheses, Hypotheses) else None

    @classmethod
    def read(cls, data: object, where: str = "summary.json") -> Summary:
        """A ``summary.json`` (sealed or not), refusing a format version this code does not read."""
        if not isinstance(data, Mapping):
            raise SummaryFormatError(f"{where}: a summary is a JSON object")
        if data.get("schema_version") != SUMMARY_SCHEMA:
            raise SummaryFormatError(
                f"{where}: summary schema_version {data.get('schema_version')!r} is not one this "
                f"code reads ({SUMMARY_SCHEMA})"
            )
        body = {k: v for k, v in data.items() if k != "sha256"}
        if not isinstance(body.get("protocol"), Mapping):
            raise SummaryFormatError(f"{where}: protocol: missing, or not a JSON object")
        hyp = body.get("hypotheses")
        if not isinstance(hyp, Mapping):
            raise SummaryFormatError(f"{where}: hypotheses: missing, or not a JSON object")
        tests = (body["protocol"].get("hypotheses") or {}).get("tests") or []
        typed = (
            Descriptive.from_json(hyp, f"{where}: hypotheses")
            if "descriptive" in hyp
            else Hypotheses.read(hyp, tests, f"{where}: hypotheses")
        )
        out = typing.cast(Summary, _build(cls, {**body, "hypotheses": typed}, where))
        for study in out.studies:
            design = find_design(study.design)
            if design is None:
                raise SummaryFormatError(f"{where}: study {study.name}: unknown design {study.design!r}")
            kind = PairedResult if design.pairwise else FactorialResult
            if any(not isinstance(c, kind) for c in study.configs):
                raise SummaryFormatError(
                    f"{where}: study {study.name}: a {study.design} study's configurations "
                    f"are {kind.__name__}s"
                )
        return out

"""The summary's results, typed: derive's typed summary is summary.json, and summary.json reads back into it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

from prereg.formats.record import load_records, load_started, seal
from prereg.formats.summary import derive
from prereg.hypotheses import Pair
from prereg.results import SUMMARY_SCHEMA, PairedResult, StudyResult, Summary, SummaryFormatError

STUDIES = [d for d in sorted((ROOT / "records").iterdir()) if (d / "summary.json").exists()]
FIXTURE = ROOT / "tests" / "fixtures" / "summary-pagedemo.json"


def close(a: object, b: object, rel: float = 1e-13) -> bool:
    """Equal JSON, but floats to ``rel``: the committed summaries were derived with scipy's t
    distribution, the analysis now derives them with the standard-library one it shares with the audit
    (``prereg/tdist.py``); p-values and interval ends differ in their last digits (at most
    1.5e-14 relative on the committed studies). Every other value, decisions included, is equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != b:
        return abs(a - b) <= rel * max(abs(a), abs(b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("folder", STUDIES, ids=lambda d: d.name)
def test_the_typed_summary_of_committed_records_is_their_summary_json(folder: Path):
    """Derived again from the committed records, the typed summary is the committed file (floats to the
    last digits, :func:`close`); read from that file, it writes the same JSON back, sealing to its sha256."""
    on_disk = json.loads((folder / "summary.json").read_text())
    summary = derive(load_records(folder), load_started(folder))
    assert close(summary.to_json(), {k: v for k, v in on_disk.items() if k != "sha256"})
    back = Summary.read(on_disk, str(folder / "summary.json"))
    assert seal(back.to_json()) == on_disk and close(back.to_json(), summary.to_json())
    assert all(isinstance(s, StudyResult) for s in back.studies)
    assert any(isinstance(c, PairedResult) for s in back.studies for c in s.configs)
    assert all(isinstance(p, Pair) for s in back.studies for c in s.paired_configs() for p in c.pairs)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (
            lambda d: d.update(schema_version=SUMMARY_SCHEMA + 1),
            f"summary schema_version {SUMMARY_SCHEMA + 1} is not",
        ),
        (lambda d: d["records"].update(gpu=1), "records: RecordCounts: unknown fields gpu"),
        (lambda d: d["completeness"].pop("text"), "completeness: Completeness: missing text"),
        (
            lambda d: d["hypotheses"]["decisions"][0].update(id="H9"),
            "decision 'H9' is not a hypothesis of the protocol",
        ),
        (lambda d: d.update(studies={}), "x.json.studies: expected a JSON list"),
    ],
)
def test_a_summary_this_code_cannot_read_is_refused_naming_the_field(edit, says):
    data = json.loads(FIXTURE.read_text())
    edit(data)
    with pytest.raises(SummaryFormatError, match=says):
        Summary.read(data, "x.json")


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d["hypotheses"].update(x=1), "hypotheses: unknown fields x"),
        (lambda d: d["hypotheses"]["decisions"][0].pop("status"), "decision: missing status"),
        (
            lambda d: d["hypotheses"]["decisions"][0].update(margin=99.0),
            "differs from the protocol's hypothesis in margin",
        ),
        (lambda d: d.update(records=None), "x.json.records is null"),
        (lambda d: d.pop("protocol"), "protocol: missing"),
        (
            lambda d: d["studies"][1]["configs"][0].update(bogus=1),
            "fields are those of none of PairedResult, FactorialResult",
        ),
        (
            lambda d: d["studies"][1].update(design="paired"),
            "a paired study's configurations are PairedResults",
        ),
    ],
)
def test_the_reader_refuses_what_summary_json_never_holds_at_any_depth(edit, says):
    data = json.loads(FIXTURE.read_text())
    edit(data)
    with pytest.raises(SummaryFormatError, match=says):
        Summary.read(data, "x.json")


@pytest.mark.parametrize("name", ["cpu1-pilot", "calibration-cpu-pilot"])
def test_the_core_builds_the_typed_summary_the_file_reads_back_into(name: str):
    """``summary_of`` builds the typed summary itself (no dict read back in between): each object is
    the one ``Summary.read`` builds from its JSON, and the audit's JSON view (``recompute``) is its
    ``to_json``."""
    from prereg.formats.summary import records_json
    from prereg.recompute import recompute, summary_of

    folder = ROOT / "records" / name
    rows = records_json(load_records(folder))
    started = [e.to_json() for e in load_started(folder)]
    built = summary_of(rows[0]["protocol"], rows, started)
    assert isinstance(built, Summary)
    read = Summary.read(json.loads(json.dumps(built.to_json())), name)
    for mine, theirs in zip(built.studies, read.studies, strict=True):
        assert [type(c) for c in mine.configs] == [type(c) for c in theirs.configs]
        for a, b in zip(mine.configs, theirs.configs, strict=True):
            assert {f: type(getattr(a, f)) for f in vars(a)} == {f: type(getattr(b, f)) for f in vars(b)}
            if isinstance(a, PairedResult):
                assert all(isinstance(p, Pair) for p in a.pairs)
    assert type(built.hypotheses) is type(read.hypotheses) and type(built.records) is type(read.records)
    assert close(read.to_json(), built.to_json(), 0.0)
    assert close(recompute(rows, started), built.to_json(), 0.0)

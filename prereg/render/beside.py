"""A study beside an earlier one: the same configurations' training-time reductions from an earlier
study's ``summary.json`` (``harness report --beside FOLDER``), for the page and the report, so a
reader sees what a new design resolves that the earlier one could not (cpu2 beside cpu1).

The earlier study is read from its sealed ``summary.json`` (:meth:`prereg.results.Summary.read`),
never recomputed here; its own audit checks it. A configuration is matched when the earlier study
has a paired study of the same configuration with the same two arms.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prereg.bounded import parse_json, read_regular
from prereg.designs import design_label
from prereg.results import PairedResult, Summary, SummaryFormatError


@dataclass(frozen=True)
class BesideRow:
    """One configuration in both studies: each study's name, design and result."""

    config: str
    study: str
    result: PairedResult
    earlier_study: str
    earlier_design: str
    earlier: PairedResult


@dataclass(frozen=True)
class Beside:
    """An earlier study (its protocol id and records folder) and the configurations both have."""

    protocol_id: str
    folder: str
    rows: tuple[BesideRow, ...]


def read_beside(this: Summary, folder: Path, label: str | None = None) -> Beside:
    """The configurations of ``this`` (its paired studies of two different arms) that the study whose
    records are in ``folder`` also ran with the same arms, from that folder's ``summary.json``.

    Raises ``FileNotFoundError`` or :class:`prereg.results.SummaryFormatError` (naming the file)
    when the folder holds no readable summary."""
    path = Path(folder) / "summary.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:  # bounded: a link, a FIFO, a deep or huge value is named, never read without end
        data = parse_json(read_regular(str(path)))
    except ValueError as e:
        raise SummaryFormatError(f"{path}: {str(e).removeprefix(f'{path}: ')}") from e
    earlier = Summary.read(data, str(path))
    designs = {s["name"]: design_label(s, brief=True) for s in earlier.protocol["studies"]}
    found: dict[tuple[str, str, str], tuple[str, PairedResult]] = {}
    for s in earlier.studies:
        for r in s.paired_configs():
            found.setdefault((r.config, r.baseline_arm, r.candidate_arm), (s.name, r))
    rows = [
        BesideRow(c.config, study.name, c, m[0], designs.get(m[0], ""), m[1])
        for study in this.studies
        for c in study.paired_configs()
        if c.baseline_arm != c.candidate_arm and (m := found.get((c.config, c.baseline_arm, c.candidate_arm)))
    ]
    return Beside(str(earlier.protocol["id"]), label or str(folder), tuple(rows))

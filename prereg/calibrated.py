"""A study's calibration: the calibration records a protocol names (``design_calibration``, quiet,
and its loaded twin where it ran), the machine they were made on, the bias they measured for the
study's design and ``effect_class`` (:func:`prereg.planted.design_verdict`, the rows
``harness calibration-verdict`` and ``harness compare`` read), and the refusal of a calibration made
on another CPU model than the one it is applied to.

The report and page of a protocol that names a ``design_calibration`` show that bias beside every
speed result, with the calibration's machine; ``harness report`` and the public audit find the
calibration the same way (:func:`find_calibration`): from the study's own protocol file, checked
against the sha256 its records hold, so a study rendered before this existed (or with no
calibration) renders as it did.

One sign convention (docs/decisions.md, "One sign convention"): points of ``100 x ln(T_candidate /
T_baseline)``, positive: the candidate slower; a bias is the design's reading less the truth in
the same points (positive: it reads the change as costing more than it does).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prereg.bounded import InputLimitError, parse_json, read_regular
from prereg.errors import InputError
from prereg.planted import DEFAULT_CLASS, Verdict, design_verdict
from prereg.yamlsub import yaml_subset

#: The convention, in words, as every output that prints a signed change or bias states it.
SIGN = "points of 100 x ln(T_candidate / T_baseline); positive: the candidate slower"
#: A calibration's loaded twin: the same plants under a known load, in ``<records>-loaded``.
LOADED_SUFFIX = "-loaded"
#: Studies frozen before the class calibration existed, by their protocol's sha256 (which their
#: records hold): their protocols cannot name a ``design_calibration`` without changing that hash, so
#: the calibration measured afterwards for their design on the cache-heavy class is applied here, and
#: their texts say it was applied after the study (docs/decisions.md, "One sign convention, and the
#: calibrated bias beside every result").
LATER = {
    "b7ca953e1c33db1ceb99f7f7ebba039e368d3f7869f7a08ea507d668c385f432": "protocols/calibration-classes.yaml",  # cpu1
    "76690f746ebcabd9cfb05f050fba00c170343a9e038d60a6ff93311184a652cd": "protocols/calibration-classes.yaml",  # cpu2
}
#: How the texts cite each calibration folder's sealed summary, pinned by its sha256 (the audit reads
#: the citation back with :data:`PIN_CITED` and refuses a calibration whose summary has changed).
PIN = "{folder} ({condition}, summary.json sha256 {sha256})"
PIN_CITED = re.compile(r"([^\s();]+) \((quiet|loaded), summary\.json sha256 ([0-9a-f]{64})\)")


@dataclass(frozen=True)
class Condition:
    """One calibration run: its records folder (as named), quiet or loaded, its planted rows
    (``summary.json``'s ``planted``) and the CPU models its records ran on."""

    folder: str
    condition: str
    rows: tuple[Mapping[str, object], ...]
    machines: tuple[str, ...]
    sha256: str = ""  # the sealed summary.json's bytes, as the texts cite it (:data:`PIN`)

    def pin(self) -> str:
        """The folder as the texts cite it: its condition and its summary's sha256."""
        return PIN.format(folder=self.folder, condition=self.condition, sha256=self.sha256)


@dataclass(frozen=True)
class Calibration:
    """A study's calibration: the class of its change, the calibration protocol, its conditions."""

    effect_class: str
    protocol: str
    conditions: tuple[Condition, ...]
    study_machines: tuple[str, ...] = ()  # the CPU models the study's own records ran on
    later: bool = False  # applied after the study (:data:`LATER`): its protocol names none

    def machines(self) -> tuple[str, ...]:
        """The CPU models every condition's records ran on, in order, once each."""
        return tuple(dict.fromkeys(m for c in self.conditions for m in c.machines))


#: :func:`machines` per folder, kept for the process: the folder's listing (each record file's name,
#: size, modification time and inode) and what it gave. A calibration folder holds about 550 records
#: (17 MB) that the bounded parser reads in seconds, and a report, ``harness compare`` and the audit
#: ask for the same folders several times in one process.
_MACHINES: dict[str, tuple[tuple[tuple[str, int, int, int], ...], dict[str, tuple[str, int]]]] = {}


def _listing(paths: list[str]) -> tuple[tuple[str, int, int, int], ...]:
    """Each file's name, size, modification time (ns) and inode: a changed or replaced file changes it."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append((path, -1, -1, -1))
            continue
        out.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def machines(folder: str) -> dict[str, tuple[str, int]]:
    """The CPU models (each record's ``env.device_name``) of the run records in ``folder``, each with
    the first record file and line that names it. Unreadable records are the audit's to name.
    Read once per process while the folder's record files are unchanged (:data:`_MACHINES`)."""
    paths = sorted(glob.glob(os.path.join(glob.escape(folder), "*.record.json")))
    listing = _listing(paths)
    kept = _MACHINES.get(folder)
    if kept is not None and kept[0] == listing:
        return dict(kept[1])
    out: dict[str, tuple[str, int]] = {}
    for path in paths:
        try:
            raw = read_regular(path)
            env = (parse_json(raw) or {}).get("env")
        except (InputLimitError, ValueError, AttributeError):
            continue
        name = env.get("device_name") if isinstance(env, dict) else None
        if isinstance(name, str) and name not in out:
            text = raw.decode("utf-8", "replace")
            at = text.find('"device_name"')
            out[name] = (path, text.count("\n", 0, at) + 1 if at >= 0 else 1)
    _MACHINES[folder] = (listing, dict(out))
    return out


def refuse_other_machine(folders: Sequence[str], here: str | None) -> None:
    """InputError, naming the record file, key and line, when a calibration's records in ``folders``
    were made on another CPU model than ``here`` (this machine's), or, with ``here`` None, on more
    than one model (calibrations of different machines mixed in one verdict)."""
    seen: dict[str, tuple[str, int]] = {}
    for folder in folders:
        for name, (path, line) in machines(folder).items():
            seen.setdefault(name, (path, line))
            if here is not None and name != here:
                raise InputError(
                    f"{name!r}: this calibration's records were made on another CPU model than this "
                    f"machine's ({here!r}); its bias does not carry over: run the calibration here "
                    "(harness calibration-study, then harness run)",
                    file=path,
                    key="env.device_name",
                    line=line,
                )
            if here is None and len(seen) > 1:
                first = next(iter(seen))
                raise InputError(
                    f"{name!r}: these calibrations were made on different CPU models ({first!r} in "
                    f"{seen[first][0]}); a verdict over both mixes machines: give one machine's "
                    "calibrations",
                    file=path,
                    key="env.device_name",
                    line=line,
                )


def _planted_rows(folder: str) -> tuple[tuple[Mapping[str, object], ...], str] | None:
    """The planted rows of ``folder``'s sealed ``summary.json`` and the sha256 of its bytes (None
    when it has none)."""
    path = os.path.join(folder, "summary.json")
    try:
        raw = read_regular(path)
        data = parse_json(raw)
    except (InputLimitError, ValueError, OSError):
        return None
    rows = data.get("planted") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        return None
    return tuple(r for r in rows if isinstance(r, dict)), hashlib.sha256(raw).hexdigest()


def cited_pins(text: str) -> dict[str, str]:
    """The calibration folders a study's texts cite, each with the summary sha256 they pin."""
    return {m.group(1): m.group(3) for m in PIN_CITED.finditer(text)}


def changed_pins(records_dir: str, protocol: Mapping[str, object], text: str) -> list[str]:
    """Each calibration folder that ``text`` (a study's report.md or page) cites whose sealed summary
    is no longer the one it pins (:func:`find_calibration`'s, from the same protocol), named with both
    hashes; empty when every cited pin holds (or none is cited: a study without a calibration)."""
    cited = cited_pins(text)
    if not cited:
        return []
    cal = find_calibration(records_dir, protocol)
    now = {} if cal is None else {c.folder: c.sha256 for c in cal.conditions}
    return [
        f"{records_dir}: its texts cite the calibration {folder} at summary.json sha256 {sha}, but "
        + (f"that summary now has sha256 {now[folder]}" if folder in now else "no such calibration is found")
        + ": the calibration changed after the study's texts were written (its bias is not the one "
        "published); refused"
        for folder, sha in cited.items()
        if now.get(folder) != sha
    ]


def _yaml(path: str) -> tuple[dict[str, object], str] | None:
    try:
        raw = read_regular(path)
        doc = yaml_subset(raw.decode("utf-8"))
    except (InputLimitError, ValueError, OSError, UnicodeDecodeError):
        return None
    return (doc, hashlib.sha256(raw).hexdigest()) if isinstance(doc, dict) else None


def _root(records_dir: str, protocol_rel: str, sha: str) -> tuple[str, dict[str, object]] | None:
    """The repository root above ``records_dir`` holding the study's protocol file at
    ``protocol_rel`` with the sha256 its records hold, and that file's document."""
    d = os.path.abspath(records_dir)
    while True:
        found = _yaml(os.path.join(d, protocol_rel))
        if found is not None and found[1] == sha:
            return d, found[0]
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def calibration_folders(root: str, calibration_protocol: str) -> list[tuple[str, str]]:
    """The records folders (relative to ``root``) of a calibration protocol, each with its condition:
    its own ``records_dir`` (quiet) and, where it exists, its loaded twin (:data:`LOADED_SUFFIX`)."""
    found = _yaml(os.path.join(root, calibration_protocol))
    if found is None:
        return []
    doc = found[0]
    quiet = str(doc.get("records_dir") or f"records/{doc.get('id')}")
    out = [(quiet, "quiet")]
    if os.path.isdir(os.path.join(root, quiet + LOADED_SUFFIX)):
        out.append((quiet + LOADED_SUFFIX, "loaded"))
    return out


def find_calibration(records_dir: str, protocol: Mapping[str, object]) -> Calibration | None:
    """The calibration of the study whose records are in ``records_dir`` and whose protocol summary
    is ``protocol`` (``summary.json``'s): from its protocol file (found above the records by its
    ``path``, and only if its sha256 is the records'), its ``design_calibration`` and
    ``effect_class`` (default cache-heavy); None when it names none (it renders as before)."""
    path, sha = protocol.get("path"), protocol.get("sha256")
    found = _root(records_dir, path, sha) if isinstance(path, str) and isinstance(sha, str) else None
    if found is None:
        return None
    root, doc = found
    named, later = doc.get("design_calibration"), LATER.get(str(sha))
    if not isinstance(named, str) and later is None:
        return None
    cls = (doc.get("effect_class") or DEFAULT_CLASS) if isinstance(named, str) else DEFAULT_CLASS
    protocol_file = named if isinstance(named, str) else str(later)
    conditions = []
    for folder, condition in calibration_folders(root, protocol_file):
        read = _planted_rows(os.path.join(root, folder))
        if read is not None:
            ms = tuple(machines(os.path.join(root, folder)))
            conditions.append(Condition(folder, condition, read[0], ms, read[1]))
    here = tuple(machines(records_dir))
    return Calibration(str(cls), protocol_file, tuple(conditions), here, not isinstance(named, str))


def endpoint_design(block_steps: int | None, endpoint: str) -> tuple[str, str] | None:
    """A speed endpoint's design label and clock as a calibration's rows name them (a lockstep
    study's block size, the after-own estimator), or None for an endpoint that is not a time."""
    clock = {"training_time": "wall", "own_step_time": "wall"}.get(endpoint)
    clock = clock or {"training_cpu_time": "CPU", "own_step_cpu_time": "CPU"}.get(endpoint)
    if clock is None:
        return None
    design = "a process per arm" if block_steps is None else f"lockstep, blocks of {block_steps}"
    return (design + ", steps after its own" if endpoint.startswith("own_") else design), clock


def bias_of(
    cal: Calibration, block_steps: int | None, endpoint: str
) -> list[tuple[Condition, Verdict | None]]:
    """Per condition, the design's measured bias for the calibration's class on the endpoint's
    clock (:func:`prereg.planted.design_verdict`), or None where it measured none."""
    shown = endpoint_design(block_steps, endpoint)
    return [
        (c, None if shown is None else design_verdict(c.rows, cal.effect_class, *shown))
        for c in cal.conditions
    ]


def bias_text(cal: Calibration, block_steps: int | None, endpoint: str) -> str:
    """The bias beside a speed result: each condition's bias per plant with its 95% interval and
    the calibration's machine, or "bias not calibrated for this class" where it measured none."""
    parts = []
    for c, v in bias_of(cal, block_steps, endpoint):
        if v is None:
            continue
        each = "; ".join(
            f"{r['plant']} {r['bias']:+.2f} ({r['bias_lo']:+.2f} to {r['bias_hi']:+.2f})" for r in v.rows
        )
        parts.append(f"{c.condition} {each}")
    if not cal.conditions:
        return f"bias not calibrated for this class (no records of {cal.protocol} here: harness run {cal.protocol})"
    if not parts:
        return f"bias not calibrated for this class ({cal.effect_class}: {cal.protocol} measured none)"
    on = ", ".join(cal.machines()) or "an unrecorded machine"
    return f"{', '.join(parts)} (calibrated on {on})"

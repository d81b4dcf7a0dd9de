"""The audit of one records folder, every check in its order: its files against MANIFEST, the study
as the tag defines it, the protocol and the plan, corpus, chain and attempts, what the tag froze,
the anchors, and ``summary.json`` against the recomputation; and what a folder with no record can
still prove. Each check reports a row (``ok:`` or ``FAILED:``) and its problems."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, cast

from audit.anchors import check_anchor, check_result, check_signature, signers_kept
from audit.freeze import (
    check_freeze,
    check_protocol_copies,
    check_time,
    check_versions,
    check_what_ran,
    tagged_schema,
)
from audit.published import check_calibration, check_published
from prereg.attempts import unfinished
from prereg.barrier import look_problems
from prereg.bounded import InputLimitError, file_problem, parsed_once, read_present, read_regular
from prereg.corpora import check_corpus
from prereg.evidence import clock_problems, evidence_problems, stall_problems
from prereg.formats.ledger import (
    LOOK_SUFFIX,
    RECORD_SUFFIX,
    SCHEMAS,
    STARTED_SUFFIX,
    Manifest,
    canonical,
    check_attempts,
    check_ledger,
    is_snapshot_name,
    json_problem,
    record_name,
    self_hash_ok,
    sha256,
    snapshot_name,
    with_snapshot,
)
from prereg.formats.record import entry_problems, seal
from prereg.interference import kernel_named, kernel_problems
from prereg.plan import OPTIONAL_SPEC, plan_from_protocol, plan_notes
from prereg.recompute import SUMMARY_SCHEMAS, compare, recompute
from prereg.replicates import anchored_gap_problems, replicate_times, time_problems, unwitnessed
from prereg.results import Summary
from prereg.tag import PLOT_FILES, Truth, check_sources, git_out, git_root, load_truth, stored_tag


def find_root(start: str, protocol_rel: str) -> str:
    d = os.path.abspath(start)
    while True:
        if os.path.isfile(os.path.join(d, protocol_rel)):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return os.path.abspath(start)
        d = parent


@dataclass
class _Report:
    """Where one folder's checks report: a row per check (``ok:`` or ``FAILED:`` and a detail), problems."""

    directory: str
    rows: list[tuple[str, str, str]]
    problems: list[str]
    #: the folders of earlier studies this folder's page shows beside it, each audited in turn
    besides: list[str] = field(default_factory=list)

    def row(self, check: str, ok: bool, detail: str) -> None:
        self.rows.append((check, self.directory, ("ok: " if ok else "FAILED: ") + detail))

    def fail(self, check: str, found: list[str], ok_detail: str) -> None:
        self.problems.extend(found)
        self.row(check, not found, found[0] if found else ok_detail)


P = ParamSpec("P")


def _each_file_parsed_once(
    audit: Callable[Concatenate[str, P], None],
) -> Callable[Concatenate[str, P], None]:
    """``audit`` of a records folder with each of the folder's files parsed once, whichever checks
    read it (:func:`prereg.bounded.parsed_once`)."""

    def once(directory: str, /, *args: P.args, **kwargs: P.kwargs) -> None:
        with parsed_once(directory):
            audit(directory, *args, **kwargs)

    once.__name__, once.__qualname__, once.__doc__ = audit.__name__, audit.__qualname__, audit.__doc__
    return once


@_each_file_parsed_once
def audit_dir(
    directory: str,
    rows: list[tuple[str, str, str]],
    problems: list[str],
    notes: list[str],
    published: tuple[int, str] | None = None,
    *,
    anchor: str | None = None,
    signers: str | None = None,
    anchored: dict[str, int] | None = None,
    unverified: dict[str, list[str]] | None = None,
    besides: list[str] | None = None,
) -> None:
    """Audit one records folder, every check in its order: its files against MANIFEST, the study as
    the tag defines it, the plan, corpus, chain and attempts, what the tag froze, the anchors, and the
    summary recomputed. ``anchored`` receives the folder's anchored heads, ``besides`` the folders
    of the earlier studies its page shows beside it (each to be audited as its own folder). Each
    file of the folder is parsed once (:func:`_each_file_parsed_once`), whichever checks read it."""
    anchored = {} if anchored is None else anchored
    # why the folder's study is not vouched for by the reader's keys (docs/provenance.md, "Exit statuses")
    why = (unverified if unverified is not None else {}).setdefault(directory, [])
    out = _Report(directory, rows, problems, besides if besides is not None else [])
    if _newer_than_this_auditor(out, why):
        return
    _folder_files(out)
    manifest = _manifest(out)
    if manifest is None:
        return
    records, started = _entries(out, manifest)
    looks = [e for e in started if e.get("kind") == "look"]  # a sequential design's looks
    started = [e for e in started if e.get("kind") != "look"]
    if not records:
        why.append("the folder holds no record")
        audit_empty(directory, manifest, started, published, anchor, out.fail, notes)
        return
    root = _study_root(out, records)
    if root is None:
        return
    # the study as the tag (or, without one, the checkout's protocol file) defines it
    truth, found = load_truth(root, directory, records, manifest)
    proto = truth.get("summary")
    source_problems, source_detail = check_sources(root, truth, records, manifest)
    problems.extend(source_problems)
    out.row("MANIFEST source files", not source_problems, source_detail)
    plan, plan_sha = _protocol_and_plan(out, truth, records, manifest, found)
    if proto is None:
        return
    _chain_and_runs(out, root, truth, records, started, looks, manifest, published)
    _what_was_frozen(out, root, truth, records, manifest, plan_sha, signers, notes)
    times: list[tuple[int, str]] | None = None if anchor is None else []
    if anchor is not None:
        found, detail, anchored[directory] = check_anchor(
            root, truth, records + started + looks, anchor, times
        )
        out.fail("anchored heads", found, detail)
    _replicates_anchored(out, proto, records + started, times)
    _vouched(out, root, truth, records + started + looks, signers, why)
    _statistics(out, root, manifest, plan, proto, records, started, looks, notes)


def _statistics(
    out: _Report,
    root: str,
    manifest: Manifest,
    plan: list[dict[str, Any]] | None,
    proto: dict[str, Any],
    records: list[dict[str, Any]],
    started: list[dict[str, Any]],
    looks: list[dict[str, Any]],
    notes: list[str],
) -> None:
    """The checks on the tag's study (``proto``): the sequential looks, the plan's and the interrupted
    attempts' notes, summary.json recomputed, and report.md and index.html rendered again."""
    records = [{**r, "protocol": {**r["protocol"], **proto}} for r in records]  # the tag's study
    if "sequential" in (proto.get("hypotheses") or {}):
        out.fail(
            "sequential looks",
            look_problems(records, started, looks),
            f"{len(looks)} look entries, each on complete pairs, in order",
        )
    _interrupted_notes(out.directory, plan, records, started, notes)
    verified, mine = _check_summary(out, records, started)
    _check_published(out, root, manifest, verified, mine)


def _chain_and_runs(
    out: _Report,
    root: str,
    truth: Truth,
    records: list[dict[str, Any]],
    started: list[dict[str, Any]],
    looks: list[dict[str, Any]],
    manifest: Manifest,
    published: tuple[int, str] | None,
) -> None:
    """The corpus, the ledger chain, the attempts, the replicates' times, the command runs' evidence,
    the lockstep stall times and the training clocks, each a row in that order."""
    proto, fail = truth["summary"], out.fail
    if not all(r["spec"].get("command") for r in records):  # a command arm's script reads its own data
        fail("corpus", *check_corpus(root, proto, records))
    genesis = truth["freeze"] if truth.get("tagged") else proto["sha256"]
    fail(
        "ledger chain",
        check_ledger(records + started + looks, manifest, genesis, published),
        f"{len(records) + len(started) + len(looks)} entries linked from "
        f"{'the freeze manifest' if truth.get('tagged') else 'the protocol'}",
    )
    fail(
        "attempts in the ledger",
        check_attempts(records, started),
        f"{len(started)} started entries, "
        f"{sum(r.get('schema_version', 1) >= 3 for r in records)} records end one",
    )
    if isinstance(proto.get("replicates"), dict):
        gap = int(proto["replicates"].get("min_gap_s", 0))
        fail(
            "replicates apart in time",
            time_problems(records + started, gap),
            f"{len(replicate_times(records))} of {proto['replicates'].get('count')} replicates run, each on a "
            f"machine at least {gap} s after the one before it there"
            + (
                "; UNWITNESSED: the machines are told apart by hostname alone (started entries without a "
                "boot id), which the runner's owner sets at will"
                if unwitnessed(started)
                else "; machines told apart by boot id, not hostname alone"
            ),
        )
    _run_evidence(out, records)


def _replicates_anchored(
    out: _Report, proto: dict[str, Any], entries: list[dict[str, Any]], times: list[tuple[int, str]] | None
) -> None:
    """A replicated study's separation in time as the anchor witnesses it (each replicate's first
    entry at its anchored time: :func:`prereg.replicates.anchored_gap_problems`); without an anchor,
    named UNWITNESSED: the times are the runner's own."""
    if not isinstance(proto.get("replicates"), dict):
        return
    if times is None:
        out.row(
            "replicates' times, witnessed",
            True,
            "UNWITNESSED: no anchor (--anchor REMOTE), so each replicate's time is the runner's own "
            "(ledger.at), which a key holder writes at will",
        )
        return
    gap = int(proto["replicates"].get("min_gap_s", 0))
    found, notes = anchored_gap_problems(entries, gap, times)
    detail = f"each replicate's first entry anchored at least {gap} s after the one before it on its machine"
    out.fail(
        "replicates' times, witnessed",
        found,
        detail
        + (
            f"; UNWITNESSED: {notes[0]}" + (f" (and {len(notes) - 1} more)" if len(notes) > 1 else "")
            if notes
            else ""
        ),
    )


def _run_evidence(out: _Report, records: list[dict[str, Any]]) -> None:
    """The command runs' evidence, the lockstep stall times and the training clocks derived again
    from what the records hold, each a row."""
    fail = out.fail
    if any("command" in (r.get("spec") or {}) for r in records):
        found_ev, kept = evidence_problems(out.directory, records)
        fail(
            "command runs' evidence",
            found_ev,
            f"{kept} evidence files, each the one its record's sha256 names, every figure derived again from it",
        )
    found_stall, stalls = stall_problems(records)
    if stalls:  # lockstep arms since the stall rule (prereg/interference.py); none in earlier records
        fail("lockstep stall times", found_stall, f"{stalls} arms' stall derived again from their step times")
    found_kernel, viewed = kernel_problems(records)
    if viewed:  # lockstep command arms since the kernel's view (prereg/interference.py); none before
        named = "".join(f"; {n}" for n in kernel_named(records))
        fail(
            "lockstep arms, the kernel's view",
            found_kernel,
            f"{viewed} arms neither stopped nor starved{named}",
        )
    clocks, timed = clock_problems(records)
    fail(
        "training clocks against their steps",
        clocks,
        f"{timed} records' training_s summed again from their per-step times; every curve ends at its clock",
    )


def _vouched(
    out: _Report,
    root: str,
    truth: Truth,
    entries: list[dict[str, Any]],
    signers: str | None,
    why: list[str],
) -> None:
    """The signed result head's row, where a tag binds the study; and in ``why`` what leaves the
    study not vouched for by the reader's keys."""
    if not truth.get("tagged"):
        why.append("NOT PREREGISTERED: no tag binds the records")
        return
    found, detail, head_why = check_result(root, out.directory, truth, entries, signers)
    part = replicate_part(truth.get("summary") or {}, entries)
    if part and not head_why:
        detail += f"; {part}"
        head_why = f"the signed result head {part}"
    out.fail("signed result head", found, detail)
    why.extend([head_why] if head_why else [])
    if signers is None or not truth.get("signed"):
        why.insert(
            0,
            "the protocol tag's signature is not verified (pass --allowed-signers FILE, the "
            "maintainers' keys as you hold them)"
            if truth.get("signed")
            else "the protocol tag is not signed",
        )


def replicate_part(proto: dict[str, Any], entries: list[dict[str, Any]]) -> str | None:
    """Where a replicated study's chain ends short of its last replicate: "closes replicate k of n
    ..." (a signed head there vouches for those replicates, never for the study: later ones could be
    hidden behind it); None for a study without replicates or with entries of every replicate."""
    reps = proto.get("replicates")
    if not isinstance(reps, dict) or not isinstance(reps.get("count"), int):
        return None
    seen = {
        e["spec"]["replicate"]
        for e in entries
        if isinstance(e.get("spec"), dict) and isinstance(e["spec"].get("replicate"), int)
    }
    n = reps["count"]
    if seen and max(seen) < n:
        return (
            f"closes replicate {max(seen)} of {n}: it vouches for the replicates up to it, not for the "
            "study (later replicates could be hidden behind it)"
        )
    return None


def _interrupted_notes(
    directory: str,
    plan: list[dict[str, Any]] | None,
    records: list[dict[str, Any]],
    started: list[dict[str, Any]],
    notes: list[str],
) -> None:
    """The plan's notes and one note per interrupted attempt (started, no record)."""
    open_ = unfinished(records, started)
    if plan is not None:
        notes.extend(plan_notes(directory, plan, records, open_))
    notes.extend(
        f"{directory}: interrupted (started, no record): {u['run_id']} attempt {u['attempt']} "
        f"started at {u['started_at']} on {u['node']} (ledger seq {u['seq']})"
        for u in open_
    )


def _check_published(
    out: _Report,
    root: str,
    manifest: Manifest,
    verified: dict[str, Any] | None,
    mine: dict[str, Any] | None,
) -> None:
    """report.md and index.html rendered again: from the verified summary.json, or, where there is
    none (missing, not a regular file, or not matching the records), from the audit's own
    recomputation, sealed as ``harness report`` seals it."""
    source = "the verified summary.json"
    if verified is None and mine is not None:
        source = "the audit's recomputation from the records"
        try:
            verified = resealed(mine)
        except (ValueError, KeyError, TypeError) as e:
            out.fail(
                "report.md and index.html",
                [f"{out.directory}: the recomputed summary cannot be read ({e})"],
                "",
            )
            return
    if verified is None:
        out.row(
            "report.md and index.html",
            True,
            "not compared: no summary could be recomputed to render them from",
        )
        return
    pinned = check_calibration(out.directory, verified)
    if pinned is not None:
        out.fail("calibration", *pinned)
    out.fail(
        "report.md and index.html",
        *check_published(out.directory, root, verified, manifest, source, out.besides),
    )


def resealed(summary: Mapping[str, object]) -> dict[str, object]:
    """A recomputed summary as ``harness report`` writes it to summary.json: read as the typed
    summary, written back, sealed, its keys sorted (the texts render from its key order)."""
    body = Summary.read(summary, "the recomputed summary").to_json()
    sealed = seal(body)
    return dict(json.loads(json.dumps(sealed, sort_keys=True)))


def irregular_files(directory: str) -> list[str]:
    """Every entry of a records folder that is a symbolic link or not a regular file or folder (a
    FIFO, a device, a socket), named; only ``lstat`` is called on them."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as e:
        return [f"{directory}: cannot be listed ({e.strerror})"]
    return [
        f"{e.path}: {file_problem(e.path)}"
        for e in entries
        if e.is_symlink() or not (e.is_file(follow_symlinks=False) or e.is_dir(follow_symlinks=False))
    ]


#: The names a study writes in its records folder besides its entries and snapshots: its MANIFEST,
#: kept tag and signed head, the summary, the texts, the plots (``analysis/plots.py``) and the export.
STUDY_FILES = {
    "MANIFEST",
    "TAG",
    "RESULT",
    "summary.json",
    "report.md",
    "index.html",
    "runs.csv",
    "runs.parquet",
}


def _folder_files(out: _Report) -> None:
    """The folder's entries: links, FIFOs and devices (each named, none opened: a FIFO would hang a
    reader, /dev/zero fill its memory), files the study did not write, and its PNG plots, named."""
    odd = irregular_files(out.directory)
    if odd:
        out.fail("regular files only", odd, "")
    out.fail("files the study wrote", foreign_files(out.directory), "no other file in the folder")
    plots = sorted(n for n in _names(out.directory) if n in PLOT_FILES)
    if plots and not _plots_sealed(out.directory):  # the signed result head's row checks sealed ones
        out.row(
            "PNG plots (not verified)",
            True,
            f"{len(plots)} named, not verified: the audit renders report.md and index.html (their plots "
            "inline SVG) again, not matplotlib's PNGs, and no signed result head seals them (harness "
            "report --sign does, since issue 59); harness report draws them again from summary.json",
        )


def _plots_sealed(directory: str) -> bool:
    """Whether the folder's RESULT seals its PNG plots (:func:`audit.anchors.plot_problems` checks them)."""
    from prereg.tag import RESULT_FILE, parse_result

    try:
        raw = read_present(os.path.join(directory, RESULT_FILE), 1 << 20)
    except InputLimitError:
        return False
    got = parse_result(raw) if raw is not None else None
    return got is not None and got["plots"] is not None


def _names(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def foreign_files(directory: str) -> list[str]:
    """Every entry of a records folder that the study did not write (a README.md or report.html a
    code host renders, an extra plot, a folder), named: the audit vouches for none of them."""
    from prereg.evidence import EVIDENCE_SUFFIX

    kept = (RECORD_SUFFIX, STARTED_SUFFIX, LOOK_SUFFIX, *EVIDENCE_SUFFIX.values())
    return [
        f"{os.path.join(directory, n)}: a file the study did not write (harness run and harness report "
        "write none of this name); nothing in it is verified: remove it, or keep it outside the records"
        for n in _names(directory)
        if n not in STUDY_FILES
        and n not in PLOT_FILES
        and not n.endswith(kept)
        and not is_snapshot_name(n)
        and not n.startswith(".")
    ]


#: A row's result where this auditor checked nothing (a records schema newer than it knows).
UNCHECKED = "NOT CHECKED:"


def _newer_than_this_auditor(out: _Report, why: list[str]) -> bool:
    """The "records schema" row where MANIFEST claims a newer schema (:func:`newer_schema`): True
    where this audit stops there (not certified, not failed: it cannot read what a newer one wrote)."""
    newer, forged = newer_schema(out.directory)
    if forged is not None:
        out.problems.append(forged)
        out.row("records schema", False, forged)
    if newer is not None:
        why.append(newer)
        out.rows.append(("records schema", out.directory, f"{UNCHECKED} {newer}"))
    return newer is not None


def newer_schema(directory: str) -> tuple[str | None, str | None]:
    """Whether this audit can certify the folder, where its MANIFEST says a records schema newer
    than any it knows: (why not, exit status 3 and never "Verified", so the reader runs a newer
    auditor; a problem, exit status 1). MANIFEST is not signed, so its word alone decides nothing:
    the schema is the one the tagged harness writes (its commit's ``SCHEMA_VERSION``, which the
    signed tag fixes) for every tag the folder names, or without a tag the one every record says;
    a claim neither bears out is a problem (README, "Verifying a study")."""
    manifest, _ = json_problem(os.path.join(directory, "MANIFEST"))
    version = manifest.get("schema_version") if isinstance(manifest, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or version <= max(SCHEMAS):
        return None, None
    assert isinstance(manifest, dict)
    claim = f"MANIFEST says records schema {version}, and this auditor knows {', '.join(map(str, SCHEMAS))}"
    source, schemas = _schema_witnesses(directory, manifest)
    if schemas and all(v > max(SCHEMAS) for v in schemas):
        return (
            f"NEWER THAN THIS AUDITOR: {claim}; {source} says schema {max(schemas)}: it cannot certify them; "
            'run the auditor of the newest signed release (README, "Verifying a study")'
        ), None
    return None, (
        f"{directory}/MANIFEST: field schema_version = {version}, but {source} says "
        f"{', '.join(map(str, sorted(set(schemas)))) or 'nothing'}: {claim}, and an unsigned MANIFEST "
        "alone does not make a folder unauditable"
    )


def _schema_witnesses(directory: str, manifest: Mapping[str, object]) -> tuple[str, list[int]]:
    """What says the folder's records schema besides MANIFEST: the harness at each tag the folder
    names (:func:`_tag_commits`), or, where none is found, each record MANIFEST lists (0: none said)."""
    root = git_root(directory)
    commits = _tag_commits(root, directory, manifest) if root is not None else {}
    if root is not None and commits:
        found = [tagged_schema(root, c) for c in commits.values()]
        return f"the harness at {', '.join(sorted(commits))}", [v or 0 for v in found]
    listed = manifest.get("records")
    versions = []
    for name in sorted(listed) if isinstance(listed, dict) else []:
        record, _ = json_problem(os.path.join(directory, os.path.basename(str(name))))
        v = record.get("schema_version") if isinstance(record, dict) else None
        versions.append(v if isinstance(v, int) and not isinstance(v, bool) else 0)
    return "no tag; the records", versions


def _tag_commits(root: str, directory: str, manifest: Mapping[str, object]) -> dict[str, str]:
    """The commit of each tag the folder names: its kept ``TAG``, and ``protocol-<id>`` for
    MANIFEST's protocol id and the folder's name."""
    mp = manifest.get("protocol")
    mp = mp if isinstance(mp, dict) else {}
    commits: dict[str, str] = {}
    kept = stored_tag(directory)
    if kept is not None:
        obj = kept[1].split(b"\n", 1)[0].split(b" ")[1].decode()
        if (git_out(root, "cat-file", "-t", obj) or "").strip() == "commit":
            commits[kept[0]] = obj
    for i in {mp.get("id"), os.path.basename(os.path.normpath(directory))}:
        got = (
            git_out(root, "rev-parse", "-q", "--verify", f"refs/tags/protocol-{i}^{{commit}}") if i else None
        )
        if isinstance(i, str) and got:
            commits[f"protocol-{i}"] = got.strip()
    return commits


def _manifest(out: _Report) -> Manifest | None:
    """The folder's MANIFEST, or None (a failed row) when it is missing or not one."""
    manifest_path = os.path.join(out.directory, "MANIFEST")
    if not os.path.isfile(manifest_path):
        out.problems.append(f"{manifest_path}: missing")
        out.row("manifest", False, "MANIFEST missing")
        return None
    manifest, unread = json_problem(manifest_path)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("records"), dict):
        out.problems.append(
            (f"{unread}; " if unread else f"{manifest_path}: ")
            + "not a MANIFEST (a JSON object with a 'records' mapping); "
            "harness status or harness report rebuilds it from the ledger"
        )
        out.row("manifest", False, "MANIFEST unreadable")
        return None
    shapes = {
        "started": dict,
        "ledger_head": dict,
        "sources": dict,
        "protocol": dict,
        "snapshots": dict,
        "looks": dict,
    }
    wrong = [k for k, t in shapes.items() if manifest.get(k) is not None and not isinstance(manifest[k], t)]
    if wrong or not isinstance(manifest.get("sources"), dict):
        out.problems.append(
            f"{manifest_path}: field {wrong[0] if wrong else 'sources'} is not a JSON object; harness "
            "status or harness report rebuilds MANIFEST from the ledger"
        )
        out.row("manifest", False, "MANIFEST malformed")
        return None
    if manifest.get("schema_version", 1) not in SCHEMAS:  # MANIFESTs before schema 3 do not say
        out.problems.append(
            f"{manifest_path}: schema_version {manifest.get('schema_version')!r} is not one this "
            f"audit reads ({', '.join(map(str, SCHEMAS))})"
        )
        out.row("manifest", False, "MANIFEST of an unknown format")
        return None
    return cast(Manifest, manifest)  # its shape, checked above


def _with_snapshot(
    directory: str, manifest: Manifest, records: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Schema 4 records with their ``protocol`` read over the snapshot their stub names by sha256
    (``protocol.<sha256>.json``, each listed in MANIFEST with its file sha256); the problems where a
    snapshot is missing, unlisted or not what its name says."""
    problems: list[str] = []
    snapshots: dict[str, Any] = {}
    listed = manifest.get("snapshots") or {}
    names = sorted(n for n in os.listdir(directory) if is_snapshot_name(n))
    for name in names:
        path = os.path.join(directory, name)
        try:
            raw = read_regular(path)
        except InputLimitError as e:
            problems.append(str(e))
            continue
        data, unread = json_problem(path, raw)
        if not isinstance(data, dict) or snapshot_name(sha256(canonical(data))) != name:
            problems.append(
                unread or f"{path}: not the protocol snapshot its name says (edited, or another file)"
            )
            continue
        if not isinstance(listed, dict) or listed.get(name) != sha256(raw):
            problems.append(
                f"{path}: protocol snapshot not listed in MANIFEST with its file sha256 {sha256(raw)}"
            )
        snapshots[sha256(canonical(data))] = data
    for name in sorted(set(listed) - set(names)) if isinstance(listed, dict) else []:
        problems.append(f"{os.path.join(directory, name)}: listed in MANIFEST but missing")
    out = []
    for r in records:
        stub = r.get("protocol")
        full = (
            with_snapshot(stub, snapshots)
            if r.get("schema_version", 1) >= 4 and isinstance(stub, dict)
            else None
        )
        if full is None and r.get("schema_version", 1) >= 4:
            named = stub.get("snapshot_sha256") if isinstance(stub, dict) else None
            problems.append(
                f"{record_name(r)}: field protocol.snapshot_sha256 = {named!r} names no protocol snapshot "
                f"of the folder ({snapshot_name(str(named))} missing or not what its name says)"
            )
        out.append(r if full is None else {**r, "protocol": full})
    return out, problems


def _read_entry(
    path: str, name: str, listed: Mapping[str, object], problems: list[str]
) -> tuple[dict[str, Any] | None, int]:
    """One entry file read and checked against its own sha256 and MANIFEST's file sha256: the entry,
    or None where it is left out of every later check, and how many problems it counted."""
    try:
        raw = read_regular(path)
    except InputLimitError as e:  # a link, a FIFO, a device: named, never opened
        problems.append(str(e))
        return None, 1
    rec, unread = json_problem(path, raw)
    if not isinstance(rec, dict):
        problems.append(f"{unread}: not a JSON record" if unread else f"{path}: not a JSON record")
        return None, 1
    if rec.get("schema_version") not in SCHEMAS:
        problems.append(
            f"{path}: schema_version {rec.get('schema_version')!r} is unknown to this audit (a newer "
            'harness\'s records are read by a newer auditor: README, "Verifying a study")'
        )
        return None, 1
    shape = entry_problems(rec)
    if shape:  # unreadable: named, and left out of every later check
        problems.extend(f"{path}: {x}" for x in shape)
        return None, 1
    bad = 0
    if not self_hash_ok(rec):
        problems.append(
            f"{path}: field sha256 = {rec.get('sha256')!r} does not match the record's canonical content"
        )
        bad += 1
    if listed.get(name) != sha256(raw):
        if name in listed:
            problems.append(f"{path}: file sha256 {sha256(raw)} differs from MANIFEST's {listed[name]}")
        else:
            problems.append(f"{path}: record not listed in MANIFEST")
        bad += 1
    return rec, bad


def _kind_problem(path: str, name: str, rec: dict[str, Any]) -> str | None:
    """Why a look or started entry is not the kind its file name says, or None."""
    if name.endswith(LOOK_SUFFIX):
        if rec.get("kind") != "look" or name != record_name(rec):
            return f"{path}: not the look entry its name says (kind {rec.get('kind')!r})"
    elif name.endswith(STARTED_SUFFIX):
        if rec.get("kind") != "started":
            return f"{path}: field kind = {rec.get('kind')!r}, a started entry says 'started'"
    return None


def _entries(out: _Report, manifest: Manifest) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The folder's records and started entries that read as such, each checked against its own
    sha256 and MANIFEST's file sha256; MANIFEST's entries that are missing count too."""
    directory, problems = out.directory, out.problems
    listed = {  # schema 3: started entries apart; a sequential design's looks apart too
        **manifest["records"],
        **(manifest.get("started") or {}),
        **(manifest.get("looks") or {}),
    }
    files = sorted(
        n for n in os.listdir(directory) if n.endswith((RECORD_SUFFIX, STARTED_SUFFIX, LOOK_SUFFIX))
    )
    records: list[dict[str, Any]] = []
    started: list[dict[str, Any]] = []  # looks sit in the chain beside them; barrier.py reads them
    bad = 0
    for name in files:
        path = os.path.join(directory, name)
        rec, counted = _read_entry(path, name, listed, problems)
        bad += counted
        if rec is None:
            continue
        wrong_kind = _kind_problem(path, name, rec)
        if wrong_kind is not None:
            problems.append(wrong_kind)
            bad += 1
            continue
        (started if name.endswith((LOOK_SUFFIX, STARTED_SUFFIX)) else records).append(rec)
    for name in sorted(set(listed) - set(files)):
        problems.append(f"{os.path.join(directory, name)}: listed in MANIFEST but missing")
        bad += 1
    newest = max((e.get("schema_version", 1) for e in records + started), default=1)
    if manifest.get("schema_version", 1) < newest:  # the harness writes MANIFEST at its own version
        problems.append(
            f"{os.path.join(directory, 'MANIFEST')}: field schema_version = "
            f"{manifest.get('schema_version')!r}, older than its entries' schema {newest}"
        )
        bad += 1
    records, found = _with_snapshot(directory, manifest, records)
    problems.extend(found)
    bad += len(found)
    out.row(
        "record hashes + MANIFEST records",
        bad == 0,
        f"{len(records)} records, {len(started)} started entries, {bad} problems",
    )
    return records, started


def _study_root(out: _Report, records: list[dict[str, Any]]) -> str | None:
    """The study's repository (or, outside git, the folder that holds the records' protocol); None (a
    failed row) when that repository lies inside another one."""
    directory = out.directory
    root = git_root(directory) or find_root(directory, records[0]["protocol"]["path"])
    outer = git_root(os.path.dirname(os.path.abspath(root))) if git_root(directory) else None
    if outer is not None:
        out.problems.append(
            f"{directory}: its git repository {root} lies inside another one ({outer}): "
            "a nested repository's tags are not the study's; audit the records in the "
            "repository that tagged them"
        )
        out.row("records inside the study's repository", False, f"nested repository {root}")
        return None
    return root


def _protocol_and_plan(
    out: _Report,
    truth: Truth,
    records: list[dict[str, Any]],
    manifest: Manifest,
    found: list[str],
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Check the protocol (``found``: what loading it found) and every record's copy of it, then each record
    against the plan recomputed from it; returns the plan and its sha256 (None where there is none)."""
    proto = truth.get("summary")
    plan: list[dict[str, Any]] | None = None
    plan_sha: str | None = None
    if proto is not None:
        found += check_protocol_copies(truth, records, manifest)
        try:
            plan = plan_from_protocol(truth["spec"], truth["sha256"], truth["config_sha"], truth["schema"])
            plan_sha = sha256(canonical(plan))
        except (ValueError, KeyError, TypeError) as e:
            found.append(
                f"{truth['path']}: the plan cannot be recomputed from the protocol ({type(e).__name__}: {e})"
            )
    where = (
        f"{truth['path']} at {truth['tag']}"
        if truth.get("tagged")
        else f"{truth.get('path')} in this checkout"
    )
    out.fail(
        "protocol: the tagged file",
        found,
        f"{proto['id']} {proto['sha256'][:16]}... from {where}; every record's copy equal" if proto else "",
    )
    if plan is not None and plan_sha is not None:
        found = []
        by_id = {p["run_id"]: p for p in plan}
        for r in records:
            if r.get("plan_sha256") != plan_sha:
                found.append(
                    f"{record_name(r)}: field plan_sha256 = {r.get('plan_sha256')} differs from the "
                    f"plan recomputed from the protocol ({plan_sha})"
                )
                break
        for r in records:
            want = by_id.get(r["spec"]["run_id"])
            if want is None:
                found.append(f"{record_name(r)}: run {r['spec']['run_id']} is not in the plan")
            else:  # the plan's fields, and an optional field the plan lacks
                diff = sorted(
                    {k for k in want if r["spec"].get(k) != want[k]}
                    | {k for k in OPTIONAL_SPEC if k in r["spec"] and k not in want}
                )
                if diff:
                    found.append(f"{record_name(r)}: spec differs from the plan in {', '.join(diff)}")
        out.fail(
            "plan recomputed from the protocol", found, f"{len(plan)} planned runs, sha256 {plan_sha[:16]}..."
        )
    return plan, plan_sha


def _what_was_frozen(
    out: _Report,
    root: str,
    truth: Truth,
    records: list[dict[str, Any]],
    manifest: Manifest,
    plan_sha: str | None,
    signers: str | None,
    notes: list[str],
) -> None:
    """A tagged study: the tag freezes it, what ran is what it froze, time order, its signature. An
    untagged one is marked not preregistered (its package versions are still compared)."""
    if truth.get("tagged"):
        found, detail = check_freeze(root, truth, records, plan_sha)
        out.fail("tag freezes the experiment", found, detail)
        found, varied, detail = check_what_ran(root, truth, records, manifest)
        out.fail("what ran is what was frozen", found, detail)
        notes.extend(f"{out.directory}: {v}" for v in varied)
        out.fail("time order", *check_time(truth, records))
        found, detail = check_signature(root, truth, signers)
        kept = signers_kept(root, truth)
        out.fail("tag signature", found + kept, detail if not kept else f"{detail}; allowed_signers changed")
    else:
        out.row(
            "tag freezes the experiment",
            True,
            "NOT PREREGISTERED: no tag binds these records (they prove nothing about a frozen experiment)",
        )
        notes.extend(f"{out.directory}: {v}" for v in check_versions(records)[1])
        out.problems.extend(check_versions(records)[0])


def _check_summary(
    out: _Report, records: Sequence[Mapping[str, object]], started: Sequence[Mapping[str, object]]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """summary.json, if there is one: its own sha256, and every value against the recomputation.
    Returns summary.json when it matched (else None) and the recomputation (None where the rules
    refuse the protocol). A summary.json that is missing while report.md or index.html is
    published, or is not a regular file, is named: the published texts are then checked against
    the recomputation alone."""
    spath = os.path.join(out.directory, "summary.json")
    problems = out.problems
    try:
        mine: dict[str, Any] | None = recompute(records, started)
    except ValueError as e:  # a protocol the rules refuse (decide names the hypothesis and key)
        problems.append(f"{spath}: the summary cannot be recomputed from the records: {e}")
        out.row("summary.json recomputed", False, str(e))
        return None, None
    published = [n for n in ("report.md", "index.html") if os.path.lexists(os.path.join(out.directory, n))]
    if not os.path.lexists(spath):
        if published:
            found = [
                f"{spath}: missing, while {' and '.join(published)} are published: they are checked "
                "against the audit's own recomputation (harness report writes all three)"
            ]
            out.fail("summary.json recomputed", found, "")
        else:
            out.row(
                "summary.json recomputed", True, "no summary.json and nothing published (run harness report)"
            )
        return None, mine
    summary, unread = json_problem(spath)
    if not isinstance(summary, dict):
        problems.append(
            (unread if unread else f"{spath}: not a JSON summary")
            + "; harness report writes it again (the published texts are checked against the recomputation)"
        )
        out.row("summary.json recomputed", False, "summary.json unreadable")
        return None, mine
    before = len(problems)
    if summary.get("schema_version") not in SUMMARY_SCHEMAS:
        problems.append(
            f"{spath}: schema_version {summary.get('schema_version')!r} is not one this audit reads "
            f"({', '.join(map(str, SUMMARY_SCHEMAS))}); harness report writes it again"
        )
        out.row("summary.json recomputed", False, "summary.json of an unknown format")
        return None, mine
    if not self_hash_ok(summary):
        problems.append(f"{spath}: field sha256 = {summary.get('sha256')!r} does not match its content")
    theirs = {k: v for k, v in summary.items() if k != "sha256"}
    n = compare("summary", mine, theirs, problems, spath)
    out.row(
        "summary.json recomputed",
        len(problems) == before,
        f"{n} values compared, {len(problems) - before} mismatches",
    )
    return (summary if len(problems) == before else None), mine


def audit_empty(
    directory: str,
    manifest: Manifest,
    started: Sequence[Mapping[str, object]],
    published: tuple[int, str] | None,
    anchor: str | None,
    fail: Callable[[str, list[str], str], None],
    notes: list[str],
) -> None:
    """A folder with no record yet: what it can still prove. Started entries with no record are listed
    as interrupted attempts; a MANIFEST head, a published head or an anchor that promises entries the
    folder does not hold is a failure (records were removed)."""
    head = manifest.get("ledger_head") or {}
    found = []
    seq = head.get("seq") or 0
    if not isinstance(seq, int) or isinstance(seq, bool):
        found.append(
            f"{os.path.join(directory, 'MANIFEST')}: field ledger_head.seq = {seq!r} is not a position"
        )
    elif seq > len(started):
        found.append(
            f"{os.path.join(directory, 'MANIFEST')}: ledger_head seq {seq}, but the folder holds "
            f"{len(started)} ledger entries and no record: records were removed"
        )
    if published is not None:
        found.append(
            f"--head {published[0]}:{published[1][:16]}...: the folder holds no record at that position"
        )
    if anchor is not None:
        found.append(f"--anchor {anchor}: the folder holds no record to check the anchored heads against")
    fail("ledger of a folder with no record", found, f"no record yet; {len(started)} started entries")
    notes.extend(
        f"{directory}: interrupted (started, no record): {u['run_id']} attempt {u['attempt']} "
        f"started at {u['started_at']} on {u['node']} (ledger seq {u['seq']})"
        for u in unfinished([], started)
    )

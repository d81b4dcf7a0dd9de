"""What ran is what was frozen: the protocol copies in the records, the tag's object, commit and freeze
hash, the frozen trees and code, one installation per study, the phase kernels, and time order."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from prereg.commands import refs_of
from prereg.formats.ledger import SOURCE_TREES, Manifest, record_name, sha256
from prereg.tag import Truth, field_differences, frozen_trees, git_bytes, git_out, parse_time, torch_matches

#: Fields a record's ``protocol`` holds beyond those derived from the protocol file (checked
#: against the tag, the manifest's plug-ins).
FROZEN_FIELDS = ("tag_commit", "tag_object", "tag_created", "freeze_sha256", "plugins")


def _plugin_shas(plugins: object) -> object:
    """A protocol copy's plug-in fingerprints as the tag's manifest lists them (name: sha256); a
    value that is not an object, as it is."""
    if not isinstance(plugins, dict):
        return plugins
    return {k: v.get("sha256") if isinstance(v, dict) else v for k, v in plugins.items()}


def check_protocol_copies(truth: Truth, records: list[dict[str, Any]], manifest: Manifest) -> list[str]:
    """Every copy of the protocol inside a record (and MANIFEST) equals the one derived from the
    protocol file: a difference names the record and the field."""
    want = truth["summary"]
    out = []
    for r in records:
        got = {k: v for k, v in r["protocol"].items() if k not in FROZEN_FIELDS}
        out += [f"{record_name(r)}: field {d}" for d in field_differences(want, got, "protocol")]
        if truth["tagged"]:
            frozen = truth["manifest"].get("plugins") or {}
            shas = _plugin_shas(r["protocol"].get("plugins") or {})
            if shas != frozen:
                out.append(
                    f"{record_name(r)}: field protocol.plugins {shas} differs from the tag's manifest "
                    f"{frozen}"
                )
    mp = manifest.get("protocol")
    if isinstance(mp, dict):
        got = {k: v for k, v in mp.items() if k not in FROZEN_FIELDS}
        out += [f"MANIFEST: field {d}" for d in field_differences(want, got, "protocol")]
        if truth["tagged"]:
            named = _plugin_shas(mp.get("plugins"))  # missing: None, never the tag's {}
            if named != (truth["manifest"].get("plugins") or {}):
                out.append(f"MANIFEST: field protocol.plugins {named} differs from the tag's manifest")
    elif manifest.get("schema_version", 1) >= 3:  # every MANIFEST the harness writes names its protocol
        out.append(f"MANIFEST: field protocol = {mp!r}; MANIFEST names the study's protocol")
    return out


def check_freeze(
    root: str, truth: Truth, records: list[dict[str, Any]], plan_sha: str | None
) -> tuple[list[str], str]:
    """The records name the tag's object, commit, creation and freeze hash, and the tag's manifest
    binds the protocol, configurations and plan derived here: returns problems and a description."""
    tag, m, obj, commit = truth["tag"], truth["manifest"], truth["object"], truth["commit"]
    problems: list[str] = []
    names = sorted({r["protocol"].get("sha256") for r in records} - {truth.get("sha256")}, key=str)
    if names:
        problems.append(
            f"tag {tag}: the protocol file at the tag ({truth.get('path')}, sha256 "
            f"{str(truth.get('sha256'))[:16]}) is not the protocol the records name "
            f"({str(names[0])[:16]})"
        )
    if plan_sha is not None and (m.get("plan") or {}).get("sha256") != plan_sha:
        problems.append(
            f"tag {tag}: the freeze manifest's plan sha256 differs from the plan recomputed from the protocol"
        )
    for c, sha in sorted((truth.get("config_sha") or {}).items()):
        if (m.get("configs") or {}).get(c) != sha:
            problems.append(
                f"tag {tag}: configuration {c} at the tagged commit (sha256 {sha[:16]}) is not "
                "the one its manifest names"
            )
    for r in records:
        p = r["protocol"]
        for field, want in (
            ("tag", tag),
            ("tag_commit", commit),
            ("tag_object", obj),
            ("freeze_sha256", truth["freeze"]),
        ):
            if p.get(field) != want:
                problems.append(
                    f"{record_name(r)}: field protocol.{field} = {p.get(field)!r}, the tag's is {want}"
                )
                break
        else:
            made, created = parse_time(p.get("tag_created")), truth.get("created")
            if made is None or created is None or abs(made - created) > 1.0:
                problems.append(
                    f"{record_name(r)}: field protocol.tag_created = {p.get('tag_created')!r} is "
                    f"not the tag's creation time"
                )
    return problems, f"{tag} (object {obj[:12]}, commit {commit[:12]}, freeze {truth['freeze'][:12]})"


def check_what_ran(
    root: str, truth: Truth, records: list[dict[str, Any]], manifest: Manifest
) -> tuple[list[str], list[str], str]:
    """Each record's commit holds the tag's frozen trees and its code hash is the tag's; MANIFEST's
    sources are the tagged files; the packages that compute are one version per study. Returns
    problems, notes (what varies between runs of one study anyway) and a description."""
    m = truth["manifest"]
    trees, exempt = m.get("trees") or {}, list(m.get("exempt") or [])
    problems, commits = _commit_problems(root, truth, records, trees, exempt)
    problems += ref_problems(root, truth)
    code = (m.get("code") or {}).get("harness")
    for r in records:
        env = r.get("env")
        if env is None and r.get("status") != "ok":
            continue
        if (env or {}).get("harness_sha256") != code:
            problems.append(
                f"{record_name(r)}: field env.harness_sha256 = "
                f"{(env or {}).get('harness_sha256')!r}, the tag's manifest says the harness "
                f"code is {code}"
            )
    # MANIFEST: its sources are the tagged files, its head is given
    sources = manifest.get("sources")
    if not isinstance(sources, dict):
        sources = {}
    want = _tagged_sources(root, truth)
    bad = sorted(n for n, s in want.items() if sources.get(n) != s)
    if bad:
        problems.append(
            f"MANIFEST: sources {'lack' if any(n not in sources for n in bad) else 'differ in'} "
            f"{len(bad)} tagged file(s) ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})"
        )
    if any("ledger" in r for r in records) and not isinstance(manifest.get("ledger_head"), dict):
        problems.append(
            f"MANIFEST: field ledger_head = {manifest.get('ledger_head')!r}; linked records need the head"
        )
    problems += check_declared(root, truth, records)
    versions, notes = check_versions(records)
    found, said = dirty_worktrees(records, exempt)
    return (
        problems + versions + found,
        notes + said,
        (
            f"{commits} commit(s) hold the tag's {len(trees)} frozen trees; "
            f"code {str(code)[:12]}; MANIFEST names {len(want)} tagged files"
        ),
    )


def _commit_problems(
    root: str, truth: Truth, records: list[dict[str, Any]], trees: Mapping[str, object], exempt: list[str]
) -> tuple[list[str], int]:
    """Each record's commit: one of this repository, descending from the tag's commit, holding the
    tag's frozen trees. Returns the problems and how many distinct commits the records name."""
    problems: list[str] = []
    seen: dict[object, dict[str, str] | None] = {}
    descends: dict[object, bool] = {}
    for r in records:
        commit = (r.get("git") or {}).get("commit")
        if commit not in seen:
            seen[commit] = frozen_trees(root, commit, exempt) if isinstance(commit, str) else None
            if seen[commit] is not None:
                # the runner refuses a tag that is not an ancestor of HEAD: a commit holding the same
                # frozen trees but off the tag's history is not one a run of this study ran at
                descends[commit] = commit == truth["commit"] or (
                    git_bytes(root, "merge-base", "--is-ancestor", truth["commit"], str(commit)) is not None
                )
        got = seen[commit]
        if got is None:
            problems.append(
                f"{record_name(r)}: field git.commit = {commit!r} is not a commit of this repository"
            )
        elif not descends[commit]:
            problems.append(
                f"{record_name(r)}: field git.commit = {str(commit)[:12]} does not descend from the tag's "
                f"commit {str(truth['commit'])[:12]}: no run of this study ran there (the runner refuses "
                "a tag that is not an ancestor of HEAD)"
            )
        elif got != trees:
            diff = sorted(k for k in set(got) | set(trees) if got.get(k) != trees.get(k))
            problems.append(
                f"{record_name(r)}: field git.commit = {str(commit)[:12]} does not hold the frozen "
                f"trees of the tag's manifest (differs in {', '.join(diff)})"
            )
    return problems, len(seen)


def _tagged_sources(root: str, truth: Truth) -> dict[str, str]:
    """The sha256 of each file MANIFEST's sources must name: the protocol file and every source file
    of the tag's commit, read in one ``git cat-file --batch``."""
    want = {truth["path"]: truth["sha256"]}
    listing = git_out(root, "ls-tree", "-r", "--name-only", truth["commit"], "--", *dict(SOURCE_TREES)) or ""
    endings = dict(SOURCE_TREES)
    names = [
        n
        for n in listing.splitlines()
        if "__pycache__" not in n and n.endswith(endings.get(n.split("/", 1)[0], ()))
    ]
    if names:
        batch = git_bytes(
            root, "cat-file", "--batch", stdin="".join(f"{truth['commit']}:{n}\n" for n in names).encode()
        )
        pos = 0
        for n in names:
            if batch is None:
                break
            nl = batch.index(b"\n", pos)
            header = batch[pos:nl].split()
            size = int(header[2]) if len(header) == 3 else 0
            want[n] = sha256(batch[nl + 1 : nl + 1 + size])
            pos = nl + 1 + size + 1
    return want


def dirty_worktrees(records: list[dict[str, Any]], exempt: list[str]) -> tuple[list[str], list[str]]:
    """``git.dirty`` of a tagged study's records: a bool (its runs ran in its repository), and
    every ``true`` named in a note. A run of a tagged study starts only when nothing outside the
    tag's exempt entries differs from the commit (``harness run`` refuses), so ``true`` says an
    exempt file (a record, a page) was changed: said, since the audit cannot tell which."""
    problems = [
        f"{record_name(r)}: field git.dirty = {json.dumps((r.get('git') or {}).get('dirty'))}: a tagged "
        "study's run says whether its repository's tracked files differed from its commit (true or false)"
        for r in records
        if not isinstance((r.get("git") or {}).get("dirty"), bool)
    ]
    dirty = [record_name(r) for r in records if (r.get("git") or {}).get("dirty") is True]
    notes = (
        [
            f"DIRTY WORKTREE: {len(dirty)} record(s) say git.dirty = true ({', '.join(dirty[:3])}"
            f"{', ...' if len(dirty) > 3 else ''}): tracked files differed from the record's commit when "
            "it ran; harness run refuses any difference outside the tag's exempt entries "
            f"({', '.join(exempt) or 'none'}), so only those could have differed"
        ]
        if dirty
        else []
    )
    return problems, notes


def tagged_schema(root: str, commit: str) -> int | None:
    """The records schema the harness at ``commit`` writes (``SCHEMA_VERSION`` in its
    ``prereg/formats/record.py``; ``prereg/records.py`` or ``harness/records.py`` at older commits);
    None: not found."""
    for where in ("prereg/formats/record.py", "prereg/records.py", "harness/records.py"):
        text = git_out(root, "show", f"{commit}:{where}") or ""
        found = re.search(r"^SCHEMA_VERSION = (\d+)$", text, re.M)
        if found:
            return int(found.group(1))
    return None


def check_declared(root: str, truth: Truth, records: list[dict[str, Any]]) -> list[str]:
    """What the tag says each record must be: no older record format than the tagged harness
    writes (``SCHEMA_VERSION`` in its ``prereg/formats/record.py``: a record downgraded to an older
    schema, without its started entries, is named), and the PyTorch the protocol declares."""
    problems: list[str] = []
    writes = tagged_schema(root, truth["commit"])
    if writes is not None:
        for r in records:
            v = r.get("schema_version")
            if not isinstance(v, int) or v < writes:
                problems.append(
                    f"{record_name(r)}: field schema_version = {v!r}, but the tagged harness writes "
                    f"schema {writes} (an older format is a downgraded record)"
                )
    declared = truth["spec"].torch_version if truth.get("spec") is not None else None
    if isinstance(declared, str):
        for r in records:
            got = (r.get("env") or {}).get("torch")
            if isinstance(got, str) and not torch_matches(declared, got):
                problems.append(
                    f"{record_name(r)}: field env.torch = {got!r}, the tagged protocol declares "
                    f"torch_version {declared!r}"
                )
    return problems


#: What a run records about its machine and process that may differ between runs without the
#: study being another experiment; the audit names every one that varies within a study.
VARYING = ("host", "os", "python", "device_name", "threads", "cpu_capability")


def check_versions(records: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """torch and numpy versions are one per study (a failure otherwise); what else varies is named."""
    by_study: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("env"):
            by_study.setdefault(r["spec"]["study"], []).append(r)
    problems, notes = [], []
    for study, rs in sorted(by_study.items()):
        for key in ("torch", "numpy"):
            vals = sorted({str(x["env"].get(key)) for x in rs})
            if len(vals) > 1:
                problems.append(
                    f"study {study}: the runs used {len(vals)} versions of {key} "
                    f"({', '.join(vals)}); one study runs on one installation"
                )
        varied = []
        for key in VARYING:
            vals = sorted({json.dumps(x["env"].get(key), sort_keys=True) for x in rs if key in x["env"]})
            if len(vals) > 1:
                varied.append(f"{key} ({', '.join(v[:40] for v in vals)})")
        arms: dict[str, set[str]] = {}
        for x in rs:
            arms.setdefault(x["spec"]["arm"], set()).add(
                json.dumps((x.get("method_paths") or {}).get("phase_kernel"))
            )
        varied += [
            f"phase kernel of arm {a} ({len(v)} different)" for a, v in sorted(arms.items()) if len(v) > 1
        ]
        if varied:
            notes.append(f"study {study}: varies between runs: {'; '.join(varied)}")
        found, named = check_phase_kernels(study, rs)
        problems += found
        if any(_kernel_kind(r) is not None for r in rs):  # a study without PackedAdamW: nothing to name
            notes.append(named)
    return problems, notes


def _kernel_kind(r: dict[str, Any]) -> str | None:
    """What a record says ran the one-pass phase: ``phase.c``, ``torch kernels`` or None (no PackedAdamW)."""
    k = (r.get("method_paths") or {}).get("phase_kernel")
    if k is None:
        return None
    return next((kind for kind in ("phase.c", "torch kernels") if str(k).startswith(kind)), str(k))


def check_phase_kernels(study: str, rs: list[dict[str, Any]]) -> tuple[list[str], str]:
    """Every record of one arm names the same phase kernel (phase.c, or torch's kernels), and every
    record that names one names the same phase.c library (``method_paths.phase_so_sha256``): the
    environment (``CC``, ``PATH``) must not switch an arm's code between runs. Returns problems and
    the note naming each arm's kernel."""
    problems: list[str] = []
    arms: dict[str, dict[str | None, list[dict[str, Any]]]] = {}
    for r in rs:
        arms.setdefault(r["spec"]["arm"], {}).setdefault(_kernel_kind(r), []).append(r)
    for arm, kinds in sorted(arms.items()):
        if len(kinds) > 1:
            parts = [
                f"{len(v)} {k or 'no phase kernel'} (e.g. {record_name(v[0])})"
                for k, v in sorted(kinds.items(), key=lambda kv: str(kv[0]))
            ]
            problems.append(
                f"study {study}: the records of arm {arm} disagree on field "
                f"method_paths.phase_kernel: {', '.join(parts)}; one arm runs one code path"
            )
    libs: dict[object, list[dict[str, Any]]] = {}
    for r in rs:
        if _kernel_kind(r) is not None:
            libs.setdefault((r.get("method_paths") or {}).get("phase_so_sha256"), []).append(r)
    if len(libs) > 1:
        parts = [
            f"{str(k)[:16] if k else 'none'} ({record_name(v[0])}, {len(v)} record(s))"
            for k, v in sorted(libs.items(), key=lambda kv: str(kv[0]))
        ]
        problems.append(
            f"study {study}: field method_paths.phase_so_sha256 differs between runs: {', '.join(parts)}"
        )
    named = []
    for arm, kinds in sorted(arms.items()):
        ks = sorted(kinds, key=str)
        named.append(
            f"arm {arm}: "
            + (
                ", ".join(
                    (
                        str((kinds[k][0].get("method_paths") or {}).get("phase_kernel"))
                        if k
                        else "none (no PackedAdamW)"
                    )
                    + f" in {len(kinds[k])} record(s)"
                    for k in ks
                )
            )
        )
    return problems, f"study {study}: phase kernel: {'; '.join(named)}"


def check_time(truth: Truth, records: list[dict[str, Any]]) -> tuple[list[str], str]:
    """The tag was created before the first record started; in the ledger, a record starts after the
    one before it unless the two ran at once on different machines; none finishes before it starts."""
    out = []
    stamped = ((parse_time(r.get("started_at")), r) for r in records)
    starts = [(s, r) for s, r in stamped if s is not None]  # the records whose start time reads
    first = min((s for s, _ in starts), default=None)
    created = truth.get("created")
    if truth.get("tagged"):
        if created is None:
            out.append(f"tag {truth['tag']}: no tagger date")
        elif first is not None and created > first:
            r = min(starts, key=lambda x: x[0])[1]
            out.append(
                f"tag {truth['tag']} was created at {_iso(created)}, after {record_name(r)} started "
                f"({r.get('started_at')}): the tag must precede every outcome"
            )
    linked = sorted((r for r in records if "ledger" in r), key=lambda r: r["ledger"]["seq"])
    for a, b in zip(linked, linked[1:]):
        sa, sb = parse_time(a.get("started_at")), parse_time(b.get("started_at"))
        if sa is not None and sb is not None and sb < sa and _machine(a) == _machine(b):
            out.append(
                f"ledger seq {b['ledger']['seq']} ({record_name(b)}) started at "
                f"{b.get('started_at')}, before seq {a['ledger']['seq']} on the same machine "
                f"({a.get('started_at')}): out of time order"
            )
    for r in records:
        s, f = parse_time(r.get("started_at")), parse_time(r.get("finished_at"))
        if s is not None and f is not None and f < s:
            out.append(
                f"{record_name(r)}: finished_at {r.get('finished_at')} precedes started_at "
                f"{r.get('started_at')}"
            )
    what = f"tag created {_iso(created)}; " if created is not None else ""
    return out, what + (f"first record started {_iso(first)}" if first is not None else "no start times")


def _iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def _machine(r: dict[str, Any]) -> object:
    node = r.get("node")
    return (
        (node or {}).get("id")
        if isinstance(node, dict) and node.get("id")
        else (r.get("env") or {}).get("host")
    )


def ref_problems(root: str, truth: Truth) -> list[str]:
    """A protocol's command arms at commits (``ref``): the tag's manifest binds each ref the tagged
    protocol names, and each ref's tree here is the one it bound (a ref rewritten, or a commit
    missing from this clone, is named)."""
    refs = refs_of(truth["spec"]) if truth.get("spec") is not None else []
    bound = (truth["manifest"].get("commands") or {}).get("refs") or {}
    out = []
    for ref in refs:
        if ref not in bound:
            out.append(f"ref {ref[:12]}: named by the tagged protocol, not bound by the tag's manifest")
            continue
        tree = git_bytes(root, "rev-parse", "--verify", "-q", f"{ref}^{{tree}}")
        if tree is None:
            out.append(f"ref {ref[:12]}: not a commit of this repository (fetch it to check the runs' code)")
        elif tree.decode().strip() != bound[ref]:
            out.append(
                f"ref {ref[:12]}: its tree {tree.decode().strip()[:12]} is not the tag's {str(bound[ref])[:12]}"
            )
    return out

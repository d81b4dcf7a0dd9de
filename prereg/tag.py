"""The study as the tag defines it: git with replace objects disabled, the tag object (from the ref or
the records folder's ``TAG``), its freeze manifest, and the protocol file and configurations it names."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from prereg.bounded import InputLimitError, file_problem, read_present, read_regular
from prereg.formats.ledger import Manifest, canonical, sha256, study_schema
from prereg.plan import expected_summary
from prereg.protocol.read import protocol_from_text
from prereg.yamlflow import YamlError
from prereg.yamlsub import yaml_subset

if TYPE_CHECKING:
    from prereg.protocol.model import Protocol


class ResultTag(TypedDict):
    """A signed result tag's fields (:func:`parse_result`)."""

    tag: str  # the tag's name
    protocol: str | None
    freeze: str | None  # the freeze manifest's sha256
    seq: int  # the ledger head's position
    sha256: str  # the ledger head's sha256
    plots: dict[str, str] | None  # the sealed PNG plots by name (None: signed before they were)
    plots_said: str | None  # the ``plots N`` line's count, as written


class TagInfo(TypedDict):
    """A protocol tag object as :func:`read_tag` reads it."""

    tag: str
    object: str  # its object id
    commit: str  # the commit it tags
    created: float | None  # the tagger's time, seconds since the epoch
    manifest: dict[str, Any]  # its freeze manifest (JSON: its fields checked where read)
    freeze: str  # the freeze manifest's sha256
    signed: bool
    tag_raw: bytes  # the tag object's bytes


class Truth(TypedDict, total=False):
    """What the study is (:func:`load_truth`): the tag's facts (:class:`TagInfo`, with ``tagged``;
    ``tag`` None without one), the protocol file (``path``, ``raw``, ``sha256``), and what is derived
    from it (the typed ``spec``, the configurations' hashes, the records schema and the protocol
    summary every record's ``protocol`` copies)."""

    tag: str | None
    tagged: bool
    object: str
    commit: str
    created: float | None
    manifest: dict[str, Any]
    freeze: str
    signed: bool
    tag_raw: bytes
    path: str
    raw: bytes
    sha256: str
    spec: Protocol
    config_sha: dict[str, str]
    schema: int
    summary: dict[str, Any]


def _git_env() -> dict[str, str]:
    """git with replace objects disabled: ``git replace`` cannot substitute a tag, commit or blob."""
    return {**os.environ, "GIT_NO_REPLACE_OBJECTS": "1", "GIT_TERMINAL_PROMPT": "0"}


#: The transports an anchor remote may use: what git fetches and pushes itself, without a remote
#: helper (``fd::5`` waits on a file descriptor, ``ext::CMD`` runs a command, ``foo::`` and
#: ``foo://`` run ``git-remote-foo``). Also git's ``GIT_ALLOW_PROTOCOL`` for every anchor command.
ANCHOR_PROTOCOLS = ("file", "git", "http", "https", "ssh")
_HELPER = re.compile(r"[A-Za-z0-9][A-Za-z0-9+.-]*::")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def remote_problem(remote: str) -> str | None:
    """Why ``remote`` (``--anchor``) is not a remote git reaches by itself, or None: an option, a
    remote helper (``<transport>::<address>``), a URL of another scheme than
    :data:`ANCHOR_PROTOCOLS` (``git+ssh`` and ``ssh+git`` are ssh), a control character. A path,
    a URL of those schemes, ``host:path`` and a remote's name are taken."""
    if not remote or remote.startswith("-"):
        return "not a git remote (a name, a path or a URL; it may not start with '-')"
    if any(ord(c) < 32 or ord(c) == 127 for c in remote):
        return "holds a control character"
    if _HELPER.match(remote):
        return (
            f"{remote.split('::', 1)[0]}:: runs a git remote helper (fd:: waits on a file descriptor, "
            f"ext:: runs a command); an anchor is a remote git reaches itself: {', '.join(ANCHOR_PROTOCOLS)}"
        )
    m = _SCHEME.match(remote)
    if m and m.group(1).lower() not in (*ANCHOR_PROTOCOLS, "git+ssh", "ssh+git"):
        return (
            f"{m.group(1)}:// is not a transport git has itself (it would run git-remote-{m.group(1)}); "
            f"an anchor is reached by {', '.join(ANCHOR_PROTOCOLS)}"
        )
    return None


def git_bytes(root: str, *args: str, stdin: bytes | None = None) -> bytes | None:
    try:
        r = subprocess.run(
            ["git", "--no-replace-objects", *args],
            cwd=root,
            capture_output=True,
            check=False,
            env=_git_env(),
            input=stdin,
        )
    except OSError:
        return None
    return r.stdout if r.returncode == 0 else None


def git_out(root: str, *args: str) -> str | None:
    out = git_bytes(root, *args)
    return None if out is None else out.decode("utf-8", "replace")


#: A ``git cat-file --batch`` header of an object found: its id, type and size in bytes.
_BATCH_HEADER = re.compile(rb"[0-9a-f]{40,64} (blob|tree|commit|tag) ([0-9]+)")


def _one_line(name: str) -> bool:
    """Whether ``git cat-file --batch`` reads ``name`` as ``git cat-file blob NAME`` does: one line
    of its input (no line break or NUL, which the batch would cut and an argument refuses), not an
    option, and encoded as an argument is."""
    if name.startswith("-") or any(c in name for c in "\n\r\0"):
        return False
    try:
        os.fsencode(name)
    except UnicodeError:
        return False
    return True


def git_blobs(root: str, names: list[str]) -> list[bytes | None]:
    """``git_bytes(root, "cat-file", "blob", name)`` of each of ``names`` (``REV:PATH``), read in one
    ``git cat-file --batch`` (a ``git`` process each was most of a tagged folder's git time): each
    blob's bytes, or None where no object has that name. A name the batch does not read as its own
    call would (:func:`_one_line`), or that names an object of another type than a blob, is read by
    a call of its own, as is every name where the batch does not run."""
    out: list[bytes | None] = [None] * len(names)
    batched = [i for i, n in enumerate(names) if _one_line(n)]
    stdin = b"".join(os.fsencode(names[i]) + b"\n" for i in batched)
    data = (git_bytes(root, "cat-file", "--batch", stdin=stdin) if batched else None) or b""
    done: set[int] = set()
    pos = 0
    for i in batched if data else []:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        header = _BATCH_HEADER.fullmatch(data, pos, nl)
        pos = nl + 1 if header is None else nl + 1 + int(header.group(2)) + 1
        if header is None or header.group(1) == b"blob":  # None: "NAME missing", no such object
            out[i] = None if header is None else data[nl + 1 : pos - 1]
            done.add(i)
    for i, name in enumerate(names):
        if i not in done:
            out[i] = git_bytes(root, "cat-file", "blob", name)
    return out


def git_root(directory: str) -> str | None:
    out = git_out(directory if os.path.isdir(directory) else ".", "rev-parse", "--show-toplevel")
    return out.strip() if out else None


def is_exempt(name: str, exempt: list[str]) -> bool:
    """Whether the top-level entry ``name`` is exempt from the freeze under the manifest's ``exempt``
    list (names, and ``*suffix`` patterns such as ``*.md``)."""
    return name in exempt or any(e.startswith("*") and name.endswith(e[1:]) for e in exempt)


def frozen_trees(root: str, rev: str, exempt: list[str]) -> dict[str, str] | None:
    """The top-level entries of ``rev``'s tree that the freeze binds, with their git object ids
    (``None`` when ``rev`` is not a commit of ``root``): what ``harness tag`` writes as the manifest's
    ``trees`` and what the audit compares each record's commit with."""
    listing = git_out(root, "ls-tree", rev)
    if listing is None:
        return None
    out = {}
    for line in listing.splitlines():
        meta, _, name = line.partition("\t")
        if not is_exempt(name, exempt):
            out[name] = meta.split()[2]
    return out


#: Freeze manifest formats this audit reads (``harness.freeze.FORMAT``).
FREEZE_FORMATS = (1,)


#: The line of a tag message after which its freeze manifest follows as JSON (``harness tag``).
FREEZE_MARKER = "freeze-manifest:"


def parse_manifest(message: str) -> dict[str, object] | None:
    """The freeze manifest in a tag message, or ``None`` when it has none (a signature after it is
    ignored: ``harness tag --sign``). The one reader of it: ``harness`` reads tags with it too."""
    _, sep, body = message.partition(FREEZE_MARKER)
    if not sep:
        return None
    try:
        m, _ = json.JSONDecoder().raw_decode(body.lstrip())
    except json.JSONDecodeError:
        return None
    return m if isinstance(m, dict) else None


def _tagger_time(message: str) -> float | None:
    """Seconds since the epoch from a tag object's ``tagger`` header."""
    for line in message.splitlines():
        if not line:
            return None
        if line.startswith("tagger "):
            parts = line.rsplit(" ", 2)
            try:
                return float(parts[1])
            except (IndexError, ValueError):
                return None
    return None


def parse_time(stamp: object) -> float | None:
    from datetime import datetime

    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


TAG_FILE = "TAG"
#: The signed result tag's raw bytes, kept in the records folder (``harness.freeze.sign_result``).
RESULT_FILE = "RESULT"
#: The first line of a result tag's message; the fields follow, one ``key value`` a line.
RESULT_TITLE = "ledger head of protocol-"


#: The plot PNGs ``harness report`` draws in a records folder (``analysis/plots.py``).
PLOT_FILES = frozenset(f"plot_{k}.png" for k in ("time", "quality", "forest", "drift", "validation"))


def result_message(pid: str, freeze: str, seq: int, sha: str, plots: Mapping[str, str] | None = None) -> str:
    """A signed result tag's message: the protocol, its freeze manifest's sha256 and the head; and
    since the PNG plots are sealed there, a ``plot NAME SHA256`` line for each (none: the study
    has none), after a ``plots`` line saying how many, so a reader tells "none" from "not sealed"."""
    text = f"{RESULT_TITLE}{pid}: seq {seq}\n\nprotocol {pid}\nfreeze {freeze}\nseq {seq}\nsha256 {sha}\n"
    if plots is None:
        return text
    return text + f"plots {len(plots)}\n" + "".join(f"plot {n} {h}\n" for n, h in sorted(plots.items()))


def parse_result(raw: bytes) -> ResultTag | None:
    """A result tag object's fields (``protocol``, ``freeze``, ``seq``, ``sha256``, ``tag``, its
    name, and ``plots``, the sealed PNG plots by name, None in a head signed before they were), or
    None when it is not one."""
    header, _, body = raw.decode("utf-8", "replace").partition("\n\n")
    if not re.match(r"object [0-9a-f]{40,64}\ntype commit\ntag result-\S+\n", header + "\n"):
        return None
    lines = [line for line in body.splitlines() if " " in line and not line.startswith("-")]
    fields = dict(line.split(" ", 1) for line in lines if not line.startswith("plot "))
    plots = dict(
        line.split(" ", 2)[1:] for line in lines if line.startswith("plot ") and line.count(" ") == 2
    )
    tag = header.split("\n")[2][4:]
    try:
        seq = int(fields["seq"])
    except (KeyError, ValueError):
        return None
    if not re.fullmatch(r"[0-9a-f]{64}", fields.get("sha256", "")) or not body.startswith(RESULT_TITLE):
        return None
    return {
        "tag": tag,
        "protocol": fields.get("protocol"),
        "freeze": fields.get("freeze"),
        "seq": seq,
        "sha256": fields["sha256"],
        # the sealed PNG plots (None: a head signed before they were sealed)
        "plots": plots if "plots" in fields else None,
        "plots_said": fields.get("plots"),
    }


def stored_tag(directory: str | None) -> tuple[str, bytes] | None:
    """The tag object ``harness run`` keeps as ``TAG`` in the records folder (read once): the tag's
    name and the object's bytes, or ``None`` when there is none or it is not a tag of a commit."""
    path = os.path.join(directory, TAG_FILE) if directory else ""
    if not path or not os.path.lexists(path):
        return None
    try:
        raw = read_regular(path, 1 << 20)  # a link, a FIFO, a device: not read (the audit names it)
    except InputLimitError:
        return None
    m = re.match(rb"object [0-9a-f]{40,64}\ntype commit\ntag (\S+)\n", raw)
    return (m.group(1).decode("utf-8", "replace"), raw) if m else None


def object_id(root: str, kind: str, raw: bytes) -> str:
    """Git's object id of ``raw`` as a ``kind`` object (SHA-1, or SHA-256 in such a repository)."""
    algo = (git_out(root, "rev-parse", "--show-object-format") or "sha1").strip() or "sha1"
    return hashlib.new(algo, b"%s %d\x00" % (kind.encode(), len(raw)) + raw).hexdigest()


def read_tag(
    root: str, tag: str, directory: str | None = None, kept: tuple[str, bytes] | None = None
) -> tuple[TagInfo | None, list[str]]:
    """The tag object, its commit, creation time and freeze manifest, read with replace objects off.
    Without the ref (a clone that did not fetch tags), from the ``TAG`` file the records folder
    keeps: the same bytes, whose object id the records name and whose commit must be in the
    repository. With both, they must be the same object."""
    kind = git_out(root, "cat-file", "-t", f"refs/tags/{tag}")
    stored = kept[1] if kept is not None and kept[0] == tag else None
    if kind is None and stored is None:
        return None, [
            f"tag {tag} not found in the git repository at {root} (nor as {TAG_FILE} in {directory})"
        ]
    if kind is not None and kind.strip() != "tag":
        return None, [
            f"tag {tag} is a lightweight tag (no tag object, no freeze manifest): not made by harness tag"
        ]
    if kind is None:
        raw = stored or b""
        obj = object_id(root, "tag", raw)
        commit = raw.split(b"\n", 1)[0].split(b" ")[1].decode()
        if (git_out(root, "cat-file", "-t", commit) or "").strip() != "commit":
            return None, [
                f"{directory}/{TAG_FILE}: tag {tag}'s commit {commit[:12]} is not in the git repository"
            ]
    else:
        obj = (git_out(root, "rev-parse", f"refs/tags/{tag}") or "").strip()
        commit = (git_out(root, "rev-parse", f"{obj}^{{commit}}") or "").strip()
        raw = git_bytes(root, "cat-file", "tag", obj) or b""
        if stored is not None and stored != raw:
            return None, [
                f"{directory}/{TAG_FILE} is not the object of the repository's tag {tag} ({obj[:12]})"
            ]
    message = raw.decode("utf-8", "replace")
    m = parse_manifest(message)
    if m is None:
        return None, [f"tag {tag}: its message holds no readable freeze manifest"]
    if m.get("format") not in FREEZE_FORMATS:
        return None, [
            f"tag {tag}: freeze manifest format {m.get('format')!r} is not one this audit reads "
            f"({', '.join(map(str, FREEZE_FORMATS))})"
        ]
    return {
        "tag": tag,
        "object": obj,
        "commit": commit,
        "created": _tagger_time(message),
        "manifest": m,
        "freeze": sha256(canonical(m)),
        "signed": "-----BEGIN " in message,
        "tag_raw": raw,
    }, []


def checkout_bytes(path: str) -> bytes | None:
    """The bytes of the checkout's regular file ``path``, or None where there is none or it may not
    be read (a link, a FIFO, a device, a pseudo-file of /proc, over the size limit): what the
    caller then names as missing or different, never a crash or a hang."""
    try:
        return read_present(path)
    except InputLimitError:
        return None


def _configs_at(root: str, rev: str, ppath: str, names: list[str]) -> dict[str, bytes]:
    """The configuration files a protocol names, as ``harness.config`` finds them: ``configs/`` in
    the nearest folder at or above the protocol's that has one (at ``rev``, or in the checkout)."""
    d = os.path.dirname(ppath)
    while True:
        base = f"{d}/configs" if d else "configs"
        out = {}
        for c in names:
            if rev:
                blob = git_bytes(root, "cat-file", "blob", f"{rev}:{base}/{c}.yaml")
            else:
                blob = checkout_bytes(os.path.join(root, base, f"{c}.yaml"))
            if blob is not None:
                out[c] = blob
        if out or not d:
            return out
        d = os.path.dirname(d)


def kept_tag_problems(directory: str, kept: tuple[str, bytes] | None, tags: list[str]) -> list[str]:
    """The records folder's ``TAG`` against the study's tag: a file there must be a tag object of a
    commit (what ``harness run`` keeps), and of this study's tag (``tags``: the ones the records,
    MANIFEST and the folder name), not another protocol's, even while that protocol's ref exists."""
    path = os.path.join(directory, TAG_FILE)
    if kept is None:
        if os.path.lexists(path):
            return [
                f"{path}: not a tag object of a commit ({file_problem(path, 1 << 20) or 'another file'}); "
                "harness run keeps the study's tag object there"
            ]
        return []
    if kept[0] not in tags:
        return [
            f"{path} holds tag {kept[0]}, not this study's"
            + (f" {tags[0]}" if tags else " (no tag of the protocol the records name)")
            + ": another protocol's tag object put in its place"
        ]
    return []


def load_truth(
    root: str, directory: str, records: list[dict[str, Any]], manifest: Manifest
) -> tuple[Truth, list[str]]:
    """What the study is, from the tag's protocol file (or, without any tag, the checkout's).

    The protocol ids and paths the records, MANIFEST and folder name are only where to look: a
    tag ``protocol-<id>`` for any of them, or a checkout protocol file that says ``preregistered:
    true``, makes the study preregistered, and then only the tag's manifest and the file it names
    (``git show TAG_COMMIT:PATH``, sha256 as the manifest says) define it."""
    problems: list[str] = []
    ids, in_checkout, claims = _where_to_look(root, directory, records, manifest)
    kept = stored_tag(directory)
    tags = _existing_tags(root, ids, kept)
    truth: Truth = {"tag": None, "tagged": False}
    problems += kept_tag_problems(directory, kept, tags)
    if len(tags) > 1:
        problems.append(f"{directory}: the records name several tagged protocols ({', '.join(tags)})")
    if tags:
        problems += _from_tag(root, directory, tags[0], kept, truth)
    elif in_checkout or claims:
        why = (
            f"{in_checkout[0][0]} in this checkout says preregistered: true"
            if in_checkout
            else "the records say preregistered: true"
        )
        pid = in_checkout[0][1] if in_checkout else claims[0]
        problems.append(
            f"{directory}: {why}, but there is no tag protocol-{pid} in {root}: nothing binds "
            "these records to a frozen experiment"
        )
    # not preregistered: the checkout's file, as the records name it
    if "raw" not in truth and not truth["tagged"]:
        path = records[0]["protocol"].get("path")
        full = os.path.join(root, str(path))
        try:
            raw = read_present(full) if isinstance(path, str) else None
        except InputLimitError as e:
            problems.append(f"the protocol file the records name: {e}")
        else:
            if raw is None:
                problems.append(f"{full}: protocol file missing")
            else:
                truth.update({"path": path, "raw": raw, "sha256": sha256(raw)})
    if "raw" in truth:
        problems += _derive_study(root, truth, study_schema(records))
    return truth, problems


def _where_to_look(
    root: str, directory: str, records: list[dict[str, Any]], manifest: Manifest
) -> tuple[set[object], list[tuple[str, object]], list[str]]:
    """The protocol ids the records, MANIFEST, folder name and checkout files name; the checkout's
    protocol files that say ``preregistered: true`` (path, id); the ids the records claim preregistered."""
    mp = manifest.get("protocol")
    if not isinstance(mp, dict):
        mp = {}
    ids = {r["protocol"].get("id") for r in records} | {r["spec"].get("protocol_id") for r in records}
    ids |= {mp.get("id"), os.path.basename(os.path.normpath(directory))}
    paths = sorted(
        {p for p in {r["protocol"].get("path") for r in records} | {mp.get("path")} if isinstance(p, str)}
    )
    claims = sorted({str(r["protocol"].get("id")) for r in records if r["protocol"].get("preregistered")})
    in_checkout = []
    for p in paths:
        raw = checkout_bytes(os.path.join(root, p))
        if raw is not None:
            try:
                d = yaml_subset(raw.decode("utf-8"))
            except (YamlError, UnicodeDecodeError):
                continue
            if isinstance(d, dict) and d.get("preregistered") is True:
                in_checkout.append((p, d.get("id")))
                ids.add(d.get("id"))
    return ids, in_checkout, claims


def _existing_tags(root: str, ids: set[object], kept: tuple[str, bytes] | None) -> list[str]:
    """The tags ``protocol-<id>`` of those ids that the repository (or the folder's kept tag) holds, sorted."""
    return sorted(
        f"protocol-{i}"
        for i in ids
        if isinstance(i, str)
        and i
        and (
            git_out(root, "rev-parse", "-q", "--verify", f"refs/tags/protocol-{i}") is not None
            or (kept is not None and kept[0] == f"protocol-{i}")
        )
    )


def _from_tag(root: str, directory: str, tag: str, kept: tuple[str, bytes] | None, truth: Truth) -> list[str]:
    """Fill ``truth`` from the tag and the protocol file its manifest names; return the problems."""
    info, found = read_tag(root, tag, directory, kept)
    problems = list(found)
    if info is None:
        truth["tag"] = tag
        return problems
    truth.update(
        {
            "tag": info["tag"],
            "object": info["object"],
            "commit": info["commit"],
            "created": info["created"],
            "manifest": info["manifest"],
            "freeze": info["freeze"],
            "signed": info["signed"],
            "tag_raw": info["tag_raw"],
            "tagged": True,
        }
    )
    mprot = info["manifest"].get("protocol") or {}
    path, want = mprot.get("path"), mprot.get("sha256")
    blob = git_bytes(root, "cat-file", "blob", f"{info['commit']}:{path}") if isinstance(path, str) else None
    if blob is None or not isinstance(path, str) or sha256(blob) != want:
        problems.append(
            f"tag {tag}: the file its manifest names ({path}) is not at the tagged "
            f"commit {info['commit'][:12]} with sha256 {str(want)[:16]}"
        )
    else:
        truth.update({"path": path, "raw": blob, "sha256": want})
    return problems


def _derive_study(root: str, truth: Truth, schema: int) -> list[str]:
    """Fill ``truth`` with the protocol document, its configurations' hashes and its summary (as
    records schema ``schema`` writes it, ``truth["schema"]``); the problem when the study cannot be
    derived from the protocol."""
    try:
        truth["spec"] = spec = protocol_from_text(truth["raw"], truth["path"])
        names = sorted({c for st in spec.studies if not st.commands for c in st.configs})
        blobs = _configs_at(root, truth.get("commit") or "", truth["path"], names)
        truth["config_sha"] = {c: sha256(b) for c, b in blobs.items()}
        missing = [c for c in names if c not in blobs]
        if missing:
            raise ValueError(
                f"configuration file(s) {', '.join(missing)} not found"
                + (f" at the tagged commit {truth['commit'][:12]}" if truth.get("commit") else "")
            )
        truth["schema"] = schema
        truth["summary"] = expected_summary(spec, truth["sha256"], truth["path"], schema)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        truth.pop("spec", None)
        return [
            f"{truth['path']}{' at ' + truth['tag'] if truth['tag'] else ''}: the study "
            f"cannot be derived from the protocol ({type(e).__name__}: {e})"
        ]
    return []


def check_sources(
    root: str, truth: Truth, records: list[dict[str, Any]], manifest: Manifest
) -> tuple[list[str], str]:
    """MANIFEST's source hashes (the code, configurations and protocol a run read) against the tagged
    commit's files for a tagged study, so later work in the repository never unseals it; without a
    tag, against the checkout, or else the one commit every record names (the records' word: an
    untagged study proves nothing about a frozen experiment)."""
    sources = sorted(manifest["sources"].items())

    def problems_at(rev: str | None, against: str | None = None) -> list[str]:
        """Files at ``rev`` (None: the checkout) whose sha256 is not MANIFEST's, or with ``against``,
        checkout files that differ from that commit's (a commit's files read in one batch)."""
        at = against if against is not None else rev
        blobs = git_blobs(root, [f"{at}:{rel}" for rel, _ in sources]) if against is not None or rev else []
        out = []
        for k, (rel, digest) in enumerate(sources):
            if against is not None:
                here = checkout_bytes(os.path.join(root, rel))
                if here != blobs[k]:
                    out.append(rel)
                continue
            if rev:
                raw = blobs[k]
                where = f"{rel} at {rev[:12]}"
            else:
                where = os.path.join(root, rel)
                raw = checkout_bytes(where)
            if raw is None:
                out.append(
                    f"{where}: source file listed in MANIFEST is missing"
                    + ("" if rev else " from the checkout")
                )
            elif sha256(raw) != digest:
                out.append(f"{where}: source sha256 {sha256(raw)} differs from MANIFEST's {digest}")
        return out

    if truth.get("tagged"):
        found = problems_at(truth["commit"])
        return found, (
            f"{len(sources)} files, {len(found)} problems, at the tagged commit {truth['commit'][:12]}"
        )
    found = problems_at(None)
    commits = {(r.get("git") or {}).get("commit") for r in records}
    head = (git_out(root, "rev-parse", "-q", "--verify", "HEAD") or "").strip()
    commit = next(iter(commits)) if len(commits) == 1 else None
    if found and head and isinstance(commit, str) and not problems_at(None, head):
        # later committed work, no uncommitted edit: the records' own commit
        if (
            (git_out(root, "cat-file", "-t", commit) or "").strip() == "commit"
            and not problems_at(commit)
            and git_out(root, "merge-base", "--is-ancestor", commit, "HEAD") is not None
        ):
            return [], (
                f"{len(sources)} files, 0 problems, at commit {commit[:12]}, which every record "
                "names (the checkout has changed since)"
            )
    return found, f"{len(sources)} files, {len(found)} problems, in this checkout"


def same_json(a: object, b: object) -> bool:
    """Equal as JSON values: numbers by value (1 == 1.0), booleans only to booleans."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def field_differences(want: Mapping[str, object], got: Mapping[str, object], prefix: str) -> list[str]:
    """Every difference of ``got`` from ``want`` (the tagged protocol's fields), each named by its
    dotted path under ``prefix``: missing, not in the tag, or another value."""
    out = []
    for k in sorted(set(want) | set(got)):
        if k not in got:
            out.append(f"{prefix}.{k} is missing (the tagged protocol's is {want[k]!r})")
        elif k not in want:
            out.append(f"{prefix}.{k} = {got[k]!r} is not in the tagged protocol")
        elif isinstance(w := want[k], dict) and isinstance(g := got[k], dict):
            out += field_differences(w, g, f"{prefix}.{k}")
        elif not same_json(want[k], got[k]):
            out.append(
                f"{prefix}.{k} = {json.dumps(got[k], sort_keys=True)[:120]}, the tagged protocol's is "
                f"{json.dumps(want[k], sort_keys=True)[:120]}"
            )
    return out


def torch_matches(declared: str, running: str) -> bool:
    """Whether the PyTorch a protocol declares (``torch_version``) is the one running: the same
    string, or, for a declaration without a local part (``2.14.1``), the same public version
    (``2.14.1+cu130`` is 2.14.1 built for CUDA 13.0). The one rule: ``harness run`` refuses a
    mismatch before any run and the audit names one in a record."""
    return running == declared or ("+" not in declared and running.split("+", 1)[0] == declared)

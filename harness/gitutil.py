"""The few git facts the harness needs: tracked state of a file, tags, ancestry.

Every call runs with git's replace objects disabled (``GIT_NO_REPLACE_OBJECTS=1``), so a
``git replace`` of a tag, commit or blob cannot stand in for what was frozen.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from prereg.bounded import InputLimitError, read_regular


def env() -> dict[str, str]:
    return {**os.environ, "GIT_NO_REPLACE_OBJECTS": "1", "GIT_TERMINAL_PROMPT": "0"}


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check, env=env())


def toplevel(path: Path) -> Path | None:
    d = path if path.is_dir() else path.parent
    try:
        r = git(d, "rev-parse", "--show-toplevel", check=False)
    except FileNotFoundError:
        return None
    return Path(r.stdout.strip()) if r.returncode == 0 else None


def head(repo: Path) -> str | None:
    r = git(repo, "rev-parse", "HEAD", check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def is_dirty(repo: Path) -> bool:
    return bool(git(repo, "status", "--porcelain", "--untracked-files=no", check=False).stdout.strip())


def file_state(repo: Path, rel: str) -> str:
    """'clean', 'modified' or 'untracked' for a file relative to ``repo``."""
    if git(repo, "ls-files", "--error-unmatch", rel, check=False).returncode != 0:
        return "untracked"
    if git(repo, "status", "--porcelain", "--", rel, check=False).stdout.strip():
        return "modified"
    return "clean"


@dataclass(frozen=True)
class TagInfo:
    name: str
    commit: str
    object: str
    created: str  # tagger date, ISO 8601 strict ("" for a lightweight tag)
    message: str
    annotated: bool  # a tag object (``git tag -a``), not a bare ref to a commit


def tag_info(repo: Path, name: str) -> TagInfo | None:
    r = git(repo, "rev-parse", "-q", "--verify", f"refs/tags/{name}", check=False)
    if r.returncode != 0:
        return None
    obj = r.stdout.strip()
    commit = git(repo, "rev-parse", f"{name}^{{commit}}").stdout.strip()
    fmt = git(
        repo, "for-each-ref", "--format=%(taggerdate:iso-strict)%00%(contents)", f"refs/tags/{name}"
    ).stdout
    created, _, message = fmt.partition("\x00")
    kind = git(repo, "cat-file", "-t", obj).stdout.strip()
    return TagInfo(name, commit, obj, created.strip(), message.strip(), kind == "tag")


def git_bytes_in(repo: Path, args: list[str], stdin: bytes) -> str | None:
    """``git ARGS`` fed ``stdin``; its first line of output (an object id), or None on failure."""
    r = subprocess.run(["git", *args], cwd=repo, input=stdin, capture_output=True, check=False, env=env())
    return r.stdout.decode().strip() if r.returncode == 0 else None


def tag_object(repo: Path, obj: str) -> bytes | None:
    """The raw bytes of tag object ``obj`` (``git cat-file tag``): what its object id hashes."""
    r = subprocess.run(["git", "cat-file", "tag", obj], cwd=repo, capture_output=True, check=False, env=env())
    return r.stdout if r.returncode == 0 else None


def blob_at(repo: Path, rev: str, rel: str) -> bytes | None:
    r = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=repo, capture_output=True, check=False, env=env())
    return r.stdout if r.returncode == 0 else None


def tree_files(repo: Path, rev: str) -> dict[str, tuple[str, str]]:
    """Every file of ``rev``'s tree (``git ls-tree -r``): path to (mode, object id)."""
    r = subprocess.run(
        ["git", "ls-tree", "-r", "-z", "--full-tree", rev],
        cwd=repo,
        capture_output=True,
        check=False,
        env=env(),
    )
    out: dict[str, tuple[str, str]] = {}
    for item in r.stdout.split(b"\0") if r.returncode == 0 else []:
        meta, _, path = item.partition(b"\t")
        if path:
            mode, _kind, oid = meta.decode("ascii").split()
            out[os.fsdecode(path)] = (mode, oid)
    return out


def checkout_mismatches(repo: Path, where: Path, rev: str) -> list[str]:
    """Every way the files of the checkout ``where`` differ from ``rev``'s tree, compared as git's
    blob ids of their raw bytes (no filter, no conversion): a file changed, missing or added."""
    fmt = object_format(repo)
    tree = tree_files(repo, rev)
    out = []
    for path, (mode, oid) in sorted(tree.items()):
        if mode == "160000":  # a submodule is a commit, not bytes
            continue
        got = disk_blob_id(where / path, mode, fmt)
        if got != oid:
            out.append(f"{path} missing" if got is None else f"{path} is not the committed blob")
    for top, dirs, files in os.walk(where):
        dirs[:] = [d for d in dirs if not (top == str(where) and d == ".git")]
        for name in files:
            rel = os.path.relpath(os.path.join(top, name), where).replace(os.sep, "/")
            if rel != ".git" and rel not in tree:
                out.append(f"{rel} is not in the commit")
    return out


def disk_blob_id(disk: Path, mode: str, fmt: str) -> str | None:
    """Git's blob id of the raw bytes at ``disk`` (a symbolic link's target for mode 120000), as
    git would store them with no filter or conversion; None when it cannot be read."""
    try:
        data = os.fsencode(os.readlink(disk)) if mode == "120000" else read_regular(str(disk))
    except (OSError, InputLimitError):
        return None
    return blob_id(data, fmt)


def object_format(repo: Path) -> str:
    """The repository's object hash (``sha1``, or ``sha256`` for a SHA-256 repository)."""
    r = git(repo, "rev-parse", "--show-object-format", check=False)
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "sha1"


def blob_id(data: bytes, fmt: str = "sha1") -> str:
    """The object id git gives a blob of these raw bytes (no filter, no conversion)."""
    import hashlib

    return hashlib.new(fmt, b"blob %d\0" % len(data) + data).hexdigest()


def blobs(repo: Path, oids: list[str]) -> dict[str, bytes]:
    """The raw bytes of blobs ``oids`` (``git cat-file --batch``: no filter, textconv or conversion)."""
    if not oids:
        return {}
    r = subprocess.run(
        ["git", "cat-file", "--batch"],
        cwd=repo,
        input="".join(f"{o}\n" for o in oids).encode(),
        capture_output=True,
        check=False,
        env=env(),
    )
    out: dict[str, bytes] = {}
    data, pos = r.stdout, 0
    while pos < len(data):
        nl = data.index(b"\n", pos)
        head = data[pos:nl].decode("ascii").split()
        pos = nl + 1
        if len(head) != 3:  # "<oid> missing"
            continue
        size = int(head[2])
        out[head[0]] = data[pos : pos + size]
        pos += size + 1
    return out


def is_ancestor(repo: Path, ancestor: str, descendant: str = "HEAD") -> bool:
    return git(repo, "merge-base", "--is-ancestor", ancestor, descendant, check=False).returncode == 0


def create_tag(
    repo: Path, name: str, message: str, sign: bool = False, target: str = "HEAD", force: bool = False
) -> None:
    """An annotated tag on ``target`` (HEAD); with ``sign``, signed by git itself (``gpg.format`` ssh
    or openpgp, ``user.signingkey``), so a reader verifies it against their own allowed signers;
    with ``force``, replacing a tag of that name."""
    r = git(
        repo,
        "tag",
        "-s" if sign else "-a",
        *(["-f"] if force else []),
        name,
        "-m",
        message,
        target,
        check=False,
    )
    if (
        r.returncode == 0
        and sign
        and "-----BEGIN " not in git(repo, "cat-file", "tag", name, check=False).stdout
    ):
        git(repo, "tag", "-d", name, check=False)  # git can leave an unsigned tag behind when signing fails
        r = subprocess.CompletedProcess(r.args, 1, r.stdout, r.stderr or "git made no signature")
    if r.returncode != 0:
        from prereg.errors import RefusedError

        raise RefusedError(
            f"git could not {'sign and ' if sign else ''}create tag {name}: "
            f"{r.stderr.strip()[-400:] or 'no detail'}"
            + (
                "; set up signing first (git config gpg.format ssh; git config user.signingkey KEY)"
                if sign
                else ""
            )
        )


EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def anchor(repo: Path, remote: str, ref: str, protocol: str, freeze: str, seq: int, sha: str) -> str | None:
    """Record the ledger head as a commit on ``ref`` (its parent the previous anchor, its message the
    head) and push ``ref`` to ``remote``; returns what went wrong, or None."""
    parent = git(repo, "rev-parse", "-q", "--verify", ref, check=False).stdout.strip()
    if parent:
        last = git(repo, "log", "-1", "--format=%B", parent, check=False).stdout
        if f"\nseq {seq}\nsha256 {sha}\n" in last:  # already anchored
            return _push(repo, remote, ref)
    subprocess.run(
        ["git", "hash-object", "-t", "tree", "-w", "--stdin"],
        cwd=repo,
        input="",
        capture_output=True,
        text=True,
        check=False,
        env=env(),
    )  # the empty tree, in case this repository lacks it
    message = f"ledger head of protocol-{protocol}: seq {seq}\n\nprotocol {protocol}\nfreeze {freeze}\nseq {seq}\nsha256 {sha}\n"
    e = env()
    if not git(repo, "config", "user.email", check=False).stdout.strip():
        e.update(
            GIT_AUTHOR_NAME="cotangent harness",
            GIT_AUTHOR_EMAIL="harness@localhost",
            GIT_COMMITTER_NAME="cotangent harness",
            GIT_COMMITTER_EMAIL="harness@localhost",
        )
    r = subprocess.run(
        ["git", "commit-tree", EMPTY_TREE, *(["-p", parent] if parent else []), "-m", message],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
        env=e,
    )
    if r.returncode != 0:
        return f"git commit-tree failed: {r.stderr.strip()[-300:]}"
    upd = git(repo, "update-ref", ref, r.stdout.strip(), *([parent] if parent else []), check=False)
    if upd.returncode != 0:
        return f"git update-ref {ref} failed: {upd.stderr.strip()[-300:]}"
    return _push(repo, remote, ref)


def _push(repo: Path, remote: str, ref: str) -> str | None:
    try:
        r = subprocess.run(
            ["git", "push", "--quiet", remote, f"{ref}:{ref}"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=False,
            env=env(),
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        return f"git push to {remote} timed out"
    return None if r.returncode == 0 else f"git push {remote} {ref} failed: {r.stderr.strip()[-300:]}"

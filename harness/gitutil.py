"""The few git facts the harness needs: tracked state of a file, tags, ancestry."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


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
    fmt = git(repo, "for-each-ref", "--format=%(taggerdate:iso-strict)%00%(contents)", f"refs/tags/{name}").stdout
    created, _, message = fmt.partition("\x00")
    kind = git(repo, "cat-file", "-t", obj).stdout.strip()
    return TagInfo(name, commit, obj, created.strip(), message.strip(), kind == "tag")


def blob_at(repo: Path, rev: str, rel: str) -> bytes | None:
    r = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=repo, capture_output=True, check=False)
    return r.stdout if r.returncode == 0 else None


def is_ancestor(repo: Path, ancestor: str, descendant: str = "HEAD") -> bool:
    return git(repo, "merge-base", "--is-ancestor", ancestor, descendant, check=False).returncode == 0


def create_tag(repo: Path, name: str, message: str) -> None:
    git(repo, "tag", "-a", name, "-m", message, "HEAD")

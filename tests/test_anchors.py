"""Anchors that cannot be merged around: the audit reads every commit an anchor ref reaches, along
every parent, and refuses merges (docs/provenance.md, "Anchors"). Real git repositories, anchor
commits made as ``harness run --anchor`` makes them (``git commit-tree`` of the empty tree with the
ledger head in the message); the audit's own check on records of a chain. No torch."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from audit.anchors import check_anchor

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
FREEZE = "f" * 64
REF = "refs/ledger/protocol-tiny"


def git(where: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args],
        cwd=where,
        capture_output=True,
        text=True,
        check=True,
        env={
            "GIT_AUTHOR_NAME": "a",
            "GIT_AUTHOR_EMAIL": "a@example.invalid",
            "GIT_COMMITTER_NAME": "a",
            "GIT_COMMITTER_EMAIL": "a@example.invalid",
            "PATH": "/usr/bin:/bin",
            "HOME": str(where),
        },
    ).stdout.strip()


def head_commit(remote: Path, seq: int, sha: str, *parents: str) -> str:
    msg = f"ledger head of protocol-tiny: seq {seq}\n\nprotocol tiny\nfreeze {FREEZE}\nseq {seq}\nsha256 {sha}\n"
    return git(remote, "commit-tree", EMPTY_TREE, *[a for p in parents for a in ("-p", p)], "-m", msg)


def chain(prefix: str, n: int = 3) -> list[dict]:
    """Records of a chain: seq 1..n, each with its sha256 (made up: the check reads only these)."""
    return [
        {"ledger": {"seq": i}, "sha256": f"{prefix}{i}".ljust(64, "0"), "protocol": {"id": "tiny"}}
        for i in range(1, n + 1)
    ]


def line(remote: Path, records: list[dict], upto: int) -> str:
    """The anchor history of ``records`` up to seq ``upto``: a line of single-parent commits."""
    tip = ""
    for r in records[:upto]:
        tip = head_commit(remote, r["ledger"]["seq"], r["sha256"], *([tip] if tip else []))
    return tip


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    r = tmp_path / "anchor.git"
    subprocess.run(["git", "init", "-q", "--bare", str(r)], check=True)
    return r


def audit_anchor(remote: Path, records: list[dict]) -> tuple[list[str], str]:
    found, detail, _ = check_anchor(
        str(remote), {"freeze": FREEZE, "summary": {"id": "tiny"}}, records, str(remote)
    )
    return found, detail


def test_a_line_of_anchors_that_the_records_hold_passes(remote):
    real = chain("a")
    git(remote, "update-ref", REF, line(remote, real, 3))
    found, detail = audit_anchor(remote, real)
    assert found == [] and "3 anchored heads" in detail and "up to seq 3 of 3" in detail


@pytest.mark.parametrize("parents", [2, 3])
def test_a_forged_history_merged_in_front_of_the_real_anchor_is_named(remote, parents):
    """The attack: a merge whose first parent is a forged anchor history and whose other parents
    include the real anchor tip is a fast-forward of the real tip (a remote refusing non-fast-forward
    pushes accepts it); a first-parent walk then sees only the forgery, which the resealed records
    match. Two parents, and an octopus of three."""
    real, forged = chain("a"), chain("b")
    real_tip = line(remote, real, 3)
    forged_tip = line(remote, forged, 2)
    others = [real_tip] + ([line(remote, chain("c"), 1)] if parents == 3 else [])
    merge = head_commit(remote, 3, forged[2]["sha256"], forged_tip, *others)
    git(remote, "update-ref", REF, merge)
    assert git(remote, "merge-base", "--is-ancestor", real_tip, merge) == ""  # a fast-forward
    found, _ = audit_anchor(remote, forged)  # the forger's resealed records
    assert any(f"a merge of {parents} parents" in x for x in found), found
    assert any("history was rewritten after it was anchored" in x for x in found), found  # the real heads


def test_a_rewritten_parent_behind_the_tip_still_contradicts(remote):
    """A new tip over a rewritten history without any merge: the records that match the rewritten
    line fail against nothing, but the real records fail against it (and a published head or an
    earlier fetch is what tells the reader which is real)."""
    real, forged = chain("a"), chain("b")
    git(remote, "update-ref", REF, line(remote, forged, 3))
    found, _ = audit_anchor(remote, real)
    assert sum("history was rewritten" in x for x in found) == 3

"""Hostile records, as an attacker leaves them in a scratch copy of a tagged, finished study: a
3000-deep record, numbers past any float (``10**400``, ``1e400``), symbolic links to ``/dev/zero``
and FIFOs named as records, a missing or linked ``summary.json`` beside edited published texts, a
``training_s`` halved against its own per-step times, a resealed ``git.dirty``, another protocol's
tag object in ``TAG``, a 3000-deep protocol at a re-pointed tag, and anchors through git's remote
helpers. The public audit (``python -I -S analysis/public_audit.py``) and ``harness status`` /
``harness report`` must name each (file, key) and exit, never crash with a traceback or hang."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, git, harness, private_copy, tiny_protocol
from test_integrity import PROTO, RECS, by_seq
from test_provenance import reseal_all

from audit.cli import NOT_VERIFIED
from prereg.tag import parse_manifest

#: Each command here must end well inside this; a hang (a FIFO opened, /dev/zero read) runs past it.
QUICK_S = 90


@pytest.fixture
def study(tagged_done_study: Path, tmp_path: Path) -> Path:
    return private_copy(tagged_done_study, tmp_path / "copy")


def named(repo: Path, *needles: str, code: int = 1, extra: tuple[str, ...] = ()) -> str:
    """The audit exits ``code``, names every needle, and shows no traceback."""
    a = subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "analysis" / "public_audit.py"), RECS, *extra],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=QUICK_S,
    )
    out = a.stdout + a.stderr
    assert a.returncode == code, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    for n in needles:
        assert n in out, f"{n!r} not in:\n{out[-3000:]}"
    return out


def commands_end_cleanly(repo: Path, *needles: str) -> None:
    """``harness status`` and ``harness report`` end with a message naming the needles, no traceback."""
    for args in (("status", PROTO), ("report", PROTO, "--quiet")):
        r = harness(repo, *args, timeout=QUICK_S)
        out = r.stdout + r.stderr
        assert "Traceback" not in out, out[-3000:]
        for n in needles:
            assert n in out, f"harness {args[0]}: {n!r} not in:\n{out[-3000:]}"


def candidate(repo: Path) -> Path:
    return next(p for p in by_seq(repo) if ".candidate." in p.name)


# -- no crash ------------------------------------------------------------------------------------


def test_a_3000_deep_record_is_named_not_a_recursion_error(study):
    path = candidate(study)
    text = path.read_text()
    path.write_text(text.replace('"status":', '"deep":' + "[" * 3000 + "]" * 3000 + ',"status":', 1))
    named(study, path.name, "nested deeper than 64 levels: JSON is read at most 64 deep")
    commands_end_cleanly(study, path.name, "nested deeper than 64 levels")


@pytest.mark.parametrize("number", ["1" + "0" * 400, "1e400", "NaN"])
def test_a_number_past_any_float_is_refused_naming_its_key(study, number):
    path = candidate(study)
    text = path.read_text()
    forged, n = re.subn(r'"training_s":[-0-9.eE+]+', f'"training_s":{number}', text, count=1)
    assert n == 1
    path.write_text(forged)
    named(study, path.name, "field timings.training_s", "a number out of range")
    commands_end_cleanly(study, path.name, "timings.training_s")


def test_links_and_fifos_in_a_records_folder_are_named_never_opened(study):
    """A link to /dev/zero (git carries symlinks) was read without end; a FIFO named as a record
    hung the audit at its open."""
    folder = study / RECS
    good = candidate(study).name
    (folder / "zz.pairs.a1.record.json").symlink_to("/dev/zero")
    os.mkfifo(folder / "zz.pairs.a2.record.json")
    (folder / "zz.pairs.a1.started.json").symlink_to(good)  # a link to a good one
    out = named(
        study,
        "zz.pairs.a1.record.json: a symbolic link",
        "zz.pairs.a2.record.json: not a regular file",
        "zz.pairs.a1.started.json: a symbolic link",
    )
    assert "regular files only" in out
    commands_end_cleanly(study, "zz.pairs.a1.record.json")


# -- figures the records can check ---------------------------------------------------------------


def _edit_published(folder: Path) -> None:
    """The published texts claim a faster candidate than the records show."""
    for name in ("report.md", "index.html"):
        text = (folder / name).read_text()
        forged, n = re.subn(r"-?\d+\.\d+%", "50.0%", text, count=1)
        assert n == 1, name
        (folder / name).write_text(forged)


@pytest.mark.parametrize("how", ["deleted", "a link to /dev/zero", "a FIFO"])
def test_published_texts_without_a_summary_are_checked_against_the_records(study, how):
    """Was: "no summary.json ... nothing to compare", exit 0, whatever report.md and index.html said."""
    folder = study / RECS
    spath = folder / "summary.json"
    spath.unlink()
    if how == "a link to /dev/zero":
        spath.symlink_to("/dev/zero")
    elif how == "a FIFO":
        os.mkfifo(spath)
    _edit_published(folder)
    out = named(
        study,
        f"{RECS}/report.md: not what the audit's recomputation from the records renders",
        f"{RECS}/index.html: not what the audit's recomputation from the records renders",
        "50.0%",
    )
    assert (
        "summary.json: missing, while report.md and index.html are published" in out
        if how == "deleted"
        else "summary.json: a symbolic link" in out
        if how.startswith("a link")
        else "summary.json: not a regular file" in out
    ), out[-3000:]


def test_a_missing_summary_alone_is_named_and_the_texts_still_match(study):
    (study / RECS / "summary.json").unlink()
    out = named(study, "summary.json: missing, while report.md and index.html are published")
    assert "index.html and report.md byte for byte as the audit's recomputation from the records" in out


@pytest.mark.parametrize("curve_too", [False, True], ids=["training_s", "training_s-and-curve"])
def test_training_s_halved_before_sealing_is_named_against_its_own_steps(study, curve_too):
    """A doctored writer halves the candidate's ``training_s`` (and, a careful one, its curve's
    clock) before sealing: the chain, MANIFEST and summary.json all agree, but the record's own
    per-step times sum to twice that."""

    def halve(r):
        if r["spec"]["role"] == "candidate":
            r["timings"]["training_s"] /= 2
            if curve_too:
                for point in r["curve"] + r["val_curve"]:
                    point[2] /= 2

    reseal_all(study, halve)
    needles = ["timings.training_s", "steps it times sum to"]
    out = named(study, *needles)
    if not curve_too:
        assert "its training curve ends at" in out


def test_training_clocks_of_an_intact_study_match_their_steps(study):
    out = named(study, "training clocks against their steps", code=NOT_VERIFIED)
    line = next(x for x in out.splitlines() if x.startswith("training clocks against their steps"))
    assert "ok: 6 records' training_s summed again" in line, line


# -- the tag, TAG and git.dirty ------------------------------------------------------------------


def test_a_resealed_dirty_record_is_named(study):
    target = candidate(study).name

    def dirty(r):
        if f"{r['spec']['run_id']}.a{r['attempt']}.record.json" == target:
            r["git"]["dirty"] = True

    reseal_all(study, dirty)
    out = named(study, "DIRTY WORKTREE: 1 record(s) say git.dirty = true", target, code=NOT_VERIFIED)
    assert "only those could have differed" in out

    def unknown(r):
        r["git"]["dirty"] = None

    reseal_all(study, unknown)
    named(study, "field git.dirty = null")


def test_another_protocols_tag_in_TAG_is_named_while_its_ref_exists(study):
    """Both refs exist; records/tiny/TAG holds protocol-other's tag object."""
    (study / "protocols" / "other.yaml").write_text(tiny_protocol(id="other", prereg="true", steps=6))
    git(study, "add", "protocols/other.yaml")
    git(study, "commit", "-qm", "another protocol")
    t = harness(study, "tag", "protocols/other.yaml")
    assert t.returncode == 0, t.stdout + t.stderr
    other = subprocess.run(
        ["git", "cat-file", "tag", "protocol-other"], cwd=study, capture_output=True, check=True
    ).stdout
    assert (study / RECS / "TAG").is_file()
    (study / RECS / "TAG").write_bytes(other)
    named(study, f"{RECS}/TAG holds tag protocol-other, not this study's protocol-tiny")
    (study / RECS / "TAG").unlink()
    (study / RECS / "TAG").symlink_to("/dev/zero")
    named(study, f"{RECS}/TAG: not a tag object of a commit (a symbolic link")


def test_a_3000_deep_protocol_at_a_repointed_tag_is_named(study):
    """The tag moved to a commit whose protocol nests 3000 deep, its manifest naming that file's
    sha256: the audit read it with a RecursionError."""
    import hashlib

    proto = study / PROTO
    deep = proto.read_text() + "notes: " + "[" * 3000 + "]" * 3000 + "\n"
    proto.write_text(deep)
    git(study, "commit", "-qam", "deep")
    message = subprocess.run(
        ["git", "cat-file", "tag", "protocol-tiny"], cwd=study, capture_output=True, text=True, check=True
    ).stdout.split("\n\n", 1)[1]
    m = parse_manifest(message)
    assert m is not None
    m["protocol"]["sha256"] = hashlib.sha256(deep.encode()).hexdigest()
    head = message.split("freeze-manifest:", 1)[0]
    git(study, "tag", "-f", "-a", "protocol-tiny", "-m", head + "freeze-manifest:\n" + json.dumps(m))
    (study / RECS / "TAG").unlink()
    named(study, "nested deeper than 64 levels")


# -- anchors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("remote", ["fd::5", "ext::sh -c touch% /tmp/x", "foo://host/x"])
def test_an_anchor_through_a_remote_helper_is_refused(study, remote):
    """``--anchor fd::5`` hung the audit (git waited on descriptor 5); ext:: runs a command."""
    a = subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "analysis" / "public_audit.py"), RECS, "--anchor", remote],
        cwd=study,
        capture_output=True,
        text=True,
        timeout=QUICK_S,
    )
    assert a.returncode == 2, a.stdout + a.stderr
    assert f"--anchor {remote}:" in a.stdout and "Traceback" not in a.stdout + a.stderr
    before = sorted(p.name for p in (study / RECS).iterdir())
    r = harness(study, "run", PROTO, "--quiet", "--anchor", remote, timeout=QUICK_S)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"--anchor {remote}:" in r.stderr and "nothing was run" in r.stderr, r.stderr
    assert sorted(p.name for p in (study / RECS).iterdir()) == before


def test_a_replicate_written_into_an_unreplicated_study_is_named(study):
    """``spec.replicate`` resealed into the records of a protocol without replicates (where it could
    change how the decisions read the pairs) is named against the plan recomputed from the tag."""
    target = candidate(study).name

    def replicated(r):
        if f"{r['spec']['run_id']}.a{r['attempt']}.record.json" == target:
            r["spec"]["replicate"] = 2

    reseal_all(study, replicated)
    named(study, "spec differs from the plan in replicate", target)


def test_blobs_read_in_one_batch_are_what_git_cat_file_gives_each_name(tmp_path):
    """:func:`prereg.tag.git_blobs` (a commit's files in one ``git cat-file --batch``) against ``git
    cat-file blob NAME`` run once per name: the same bytes, or None, for files, an empty file, a
    link, a folder, a missing path, and names a hostile MANIFEST can list (a line break that would
    read a second object in a batch, a carriage return, an option, spaces, nothing after the colon)."""
    from prereg.tag import git_blobs, git_bytes

    repo = tmp_path / "r"
    (repo / "d").mkdir(parents=True)
    (repo / "a.py").write_bytes(b"x = 1\n")
    (repo / "empty.py").write_bytes(b"")
    (repo / "d" / "b.py").write_bytes(b"\n" * 7 + b"missing\n")
    (repo / " sp ace.py ").write_bytes(b"z")
    os.symlink("a.py", repo / "link.py")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "c")
    head = git(repo, "rev-parse", "HEAD").strip()
    rels = ["a.py", "empty.py", "d/b.py", " sp ace.py ", "link.py", "d", "", "nothing.py"]
    rels += ["a.py\nHEAD:empty.py", "a.py\r"]
    names = [f"{head}:{r}" for r in rels] + ["-p", "HEAD:a.py", f"{head[:7]}:d/b.py"]
    want = [git_bytes(str(repo), "cat-file", "blob", n) for n in names]
    assert want[:6] == [b"x = 1\n", b"", b"\n" * 7 + b"missing\n", b"z", b"a.py", None]
    assert git_blobs(str(repo), names) == want


def test_a_tagged_study_s_source_files_are_read_in_one_git_process(monkeypatch):
    """MANIFEST's sources against the tagged commit's files (cpu3's 130): one ``git cat-file --batch``,
    not a ``git`` process per file (most of a folder's git time), with the same verdict."""
    import prereg.tag
    from prereg.tag import check_sources

    folder = ROOT / "records" / "cpu3"
    if not (folder / "TAG").is_file():
        pytest.skip("records/cpu3 is not in this checkout")
    manifest = json.loads((folder / "MANIFEST").read_text())
    commit = (folder / "TAG").read_text().split("\n", 1)[0].split()[1]
    calls: list[list[str]] = []
    run = subprocess.run

    def counted(args, *a, **k):
        calls.append(list(args))
        return run(args, *a, **k)

    monkeypatch.setattr(prereg.tag.subprocess, "run", counted)
    found, detail = check_sources(str(ROOT), {"tagged": True, "commit": commit}, [], manifest)
    n = len(manifest["sources"])
    assert n > 100 and (found, detail) == ([], f"{n} files, 0 problems, at the tagged commit {commit[:12]}")
    assert len(calls) == 1, [c[2:4] for c in calls[:3]]

"""A new user's first hour (issue 48's cases), through the command line where a user would use it:
an edited protocol never mixes studies, a protocol outside its repository is refused before
anything is written, a clone's run of a published study restores its tag instead of inviting a new
one. Ctrl-C and SIGTERM mid-run: tests/test_runner_scenarios.py (in process) and
tests/test_run_endings.py (real processes)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import ROOT, harness, record_dicts
from fake_trainer import FakeTrainer
from test_runner_scenarios import PROTO, RECS, run, study

from harness import freeze
from harness.cliargs import RUN_COMPLETE
from harness.protocol import load_protocol


def test_an_edited_protocol_never_writes_into_the_old_folder(tmp_path):
    """A user raises the seed count of a study already run and runs it again: refused before
    anything is written (exit 2, the file and key named, how to go on), the old records untouched;
    with a new id the edited study gets its own folder."""
    repo = study(tmp_path)
    assert run(repo, FakeTrainer())[0] == RUN_COMPLETE
    before = {p.name: p.read_bytes() for p in (repo / RECS).iterdir()}
    proto = repo / PROTO
    proto.write_text(proto.read_text().replace("seeds: [1, 2]", "seeds: [1, 2, 3]"))
    r = harness(repo, "run", PROTO, "--quiet")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "protocols/tiny.yaml" in r.stderr and "key id" in r.stderr
    assert "holds 8 entries of another version of protocol 'tiny'" in r.stderr
    assert "give it a new id" in r.stderr and "nothing was written" in r.stderr
    assert {p.name: p.read_bytes() for p in (repo / RECS).iterdir()} == before
    proto.write_text(proto.read_text().replace("id: tiny", "id: tiny3"))
    assert run(repo, FakeTrainer())[0] == RUN_COMPLETE
    recs3 = repo / "records" / "tiny3"
    assert (
        len(record_dicts(recs3)) == 6 and {p.name: p.read_bytes() for p in (repo / RECS).iterdir()} == before
    )


def test_a_protocol_outside_the_repository_is_refused_before_anything_is_written(tmp_path):
    """The demo copied into another folder and run from there: plan and run refuse it with the
    file, key and line and what to do, exit 2, no traceback, and nothing is written."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "demo.yaml").write_bytes((ROOT / "protocols" / "demo.yaml").read_bytes())
    for command in ("plan", "run"):
        r = harness(elsewhere, command, "demo.yaml")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "demo.yaml:" in r.stderr and "key studies[0].configs[0]" in r.stderr
        assert "has no configs/ above it" in r.stderr and "nothing was written" in r.stderr
        assert sorted(p.name for p in elsewhere.iterdir()) == ["demo.yaml"]


def _clone(tmp_path: Path) -> Path:
    """A clone of this repository as a reader makes one, without the published tags."""
    c = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-tags", str(ROOT), str(c)], check=True)
    return c


def test_a_clone_restores_a_published_tag_from_its_records_not_a_new_one(tmp_path):
    """cpu2's signed tag, restored from records/cpu2/TAG: the same object id every record names,
    once; a TAG file with one byte changed restores nothing."""
    c = _clone(tmp_path)
    proto = load_protocol(c / "protocols" / "cpu2.yaml")
    named = {
        json.loads(f.read_text())["protocol"]["tag_object"]
        for f in (c / "records" / "cpu2").glob("*.record.json")
    }
    said = freeze.restore_tag(proto)
    assert said is not None and said.startswith("restored tag protocol-cpu2 from records/cpu2/TAG")
    assert "python analysis/public_audit.py records/cpu2" in said
    oid = subprocess.run(
        ["git", "rev-parse", "refs/tags/protocol-cpu2"], cwd=c, capture_output=True, text=True
    ).stdout.strip()
    assert {oid} == named
    assert freeze.restore_tag(proto) is None  # there now: nothing to do
    subprocess.run(["git", "tag", "-d", "protocol-cpu2"], cwd=c, check=True, capture_output=True)
    kept = c / "records" / "cpu2" / "TAG"
    kept.write_bytes(kept.read_bytes().replace(b"protocol-cpu2", b"protocol-cpu3", 1))
    assert freeze.restore_tag(proto) is None
    assert subprocess.run(["git", "tag", "-l"], cwd=c, capture_output=True, text=True).stdout == ""


def test_the_methods_old_import_path_still_works_and_says_where_it_moved():
    """A user's script written against ``harness.cotangent`` gets the same objects and a warning."""
    import importlib
    import sys
    import warnings

    import cotangent

    sys.modules.pop("harness.cotangent", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("harness.cotangent")
    assert old.PackedAdamW is cotangent.PackedAdamW and old.clip_grad_norm_ is cotangent.clip_grad_norm_
    assert any(
        issubclass(w.category, DeprecationWarning) and "import cotangent" in str(w.message) for w in caught
    )

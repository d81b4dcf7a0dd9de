"""A group-sequential study driven through the CLI as a user would (issue 34): two looks, a
hypothesis (bitwise-identical BPB, decided at a look by the sign test: 2^-6 below Pocock's
nominal 0.031) established at the first, the study stopped there, reported and audited; then the
audit's checks of the looks against the chain, each attack a hostile reviewer would try on the
entries the run wrote (in memory: the chain's own hashes are the ledger check's, not these)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, harness, init_study, tiny_protocol

from audit.cli import NOT_VERIFIED
from prereg.barrier import look_problems

pytestmark = pytest.mark.process

PROTOCOL = (
    tiny_protocol(id="seq")
    .replace("  min_pairs: 3\n", "  min_pairs: 3\n  sequential: {looks: [6, 12], spending: pocock}\n")
    .replace("seeds: [1, 2]", f"seeds: {list(range(1, 13))}")
)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    repo = init_study(tmp_path_factory.mktemp("seq") / "study")
    (repo / "protocols" / "seq.yaml").write_text(PROTOCOL)
    r = harness(repo, "run", "protocols/seq.yaml", "--quiet")
    return repo, r


def entries(folder: Path) -> tuple[list[dict], list[dict], list[dict]]:
    from conftest import record_dicts

    started = [json.loads(p.read_text()) for p in sorted(folder.glob("*.started.json"))]
    looks = [json.loads(p.read_text()) for p in sorted(folder.glob("*.look.json"))]
    return record_dicts(folder), started, looks


def test_two_looks_stop_at_the_first_and_are_reported_and_audited(study):
    repo, r = study
    folder = repo / "records" / "seq"
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sequential: look 1 taken on pairs 1..6" in r.stdout
    assert "STOPPED AT LOOK 1 by the preregistered sequential rule (efficacy, 6 pairs)" in r.stdout
    assert len(list(folder.glob("*.record.json"))) == 12 and (folder / "look1.look.json").is_file()
    report = (folder / "report.md").read_text()
    assert "STOPPED AT LOOK 1 OF 2" in report and "(look 1 of 2, 6 pairs, pocock spending" in report
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["hypotheses"]["sequential"]["stopped_at"] == 1
    a = subprocess.run(
        [sys.executable, str(ROOT / "analysis" / "public_audit.py"), str(folder)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert a.returncode == NOT_VERIFIED, a.stdout + a.stderr
    assert "sequential looks" in a.stdout and "1 look entries, each on complete pairs, in order" in a.stdout
    again = harness(repo, "run", "protocols/seq.yaml", "--quiet")  # stops at once, the same way
    assert again.returncode == 0 and "STOPPED AT LOOK 1" in again.stdout
    assert len(list(folder.glob("*.record.json"))) == 12


def test_the_audit_names_each_attack_on_the_looks(study):
    repo, _ = study
    records, started, looks = entries(repo / "records" / "seq")
    assert look_problems(records, started, looks) == []
    (look,) = looks
    at = look["ledger"]["seq"]

    def named(recs, sts, lks, needle):
        found = look_problems(recs, sts, lks)
        assert any(needle in x for x in found), found

    named(records, started, [{**look, "pairs": 7}], "look 1 at 7 pairs; the design's look 1 is at 6 pairs")
    named(records, started, [{**look, "look": 2}], "look 2 is entry 1 of the chain's looks")
    named(records, started, [], "the records reach it, and the chain has no look entry for it")
    named(
        records,
        started,
        [{**look, "ledger": {**look["ledger"], "seq": at - 2}}],
        "before its 6 pairs were final",
    )
    named(records, started, [{**look, "records": look["records"][1:]}], "binds other records")
    # a later pair started before the look was taken, and past the stop
    early = copy.deepcopy(started[0])
    early.update(run_id="pairs.tiny_conv.pair006.baseline", unit="pairs.tiny_conv.pair006")
    early["ledger"] = {**early["ledger"], "seq": at - 1}
    named(records, started + [early], looks, "before the look (seq")
    named(records, started + [early], looks, "started anyway")
    # a pair of the look ran again after the look was taken (a retry after its outcome was seen)
    redo = copy.deepcopy(started[0])
    redo.update(attempt=2)
    redo["ledger"] = {**redo["ledger"], "seq": at + 1}
    named(records, started + [redo], looks, "a pair a look was taken on never runs again")

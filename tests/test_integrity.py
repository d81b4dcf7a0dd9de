"""What the tag binds, what a run refuses, and what the public audit detects: one test per tamper.

A module fixture makes a real study: a temporary git repository holding a copy of the harness and
analysis code, the configurations and a tiny preregistered protocol; it is tagged (`harness tag`)
and run to completion through the CLI. Each test works on its own copy of that repository, so
every tamper starts from an intact, tagged, complete study.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, edit_record, git, harness, private_copy, record_dicts, tiny_protocol, typed

from audit.cli import NOT_VERIFIED
from harness.ledger import head_of, load_entries, write_manifest
from harness.plan import make_plan, plan_sha256
from harness.protocol import load_protocol
from prereg.formats.ledger import PACKAGES
from prereg.formats.record import (
    RECORD_SUFFIX,
    RecordFormatError,
    canonical,
    entry_files,
    read_entry,
    read_record,
    record_files,
    seal,
)
from prereg.plan import plan_from_protocol
from prereg.protocol.read import protocol_from_text
from prereg.recompute import compare, recompute
from prereg.yamlsub import yaml_subset

PROTO = "protocols/tiny.yaml"
RECS = "records/tiny"


def audit(repo: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", str(ROOT / "analysis" / "public_audit.py"), RECS, *extra],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )


def make_study(
    base: Path, *, seeds: str = "[1, 2, 3]", budget: float = 600, text: str | None = None, name: str = "study"
) -> Path:
    """A tagged study of ``text`` (default: the tiny protocol, preregistered, with ``seeds``), the
    harness and analysis copied in as a user's repository holds them."""
    r = base / name
    (r / "protocols").mkdir(parents=True)
    for sub in ("configs", *PACKAGES):
        shutil.copytree(ROOT / sub, r / sub, ignore=shutil.ignore_patterns("__pycache__"))
    (r / ".gitignore").write_text("runs/\n__pycache__/\n")
    (r / PROTO).write_text(
        text
        if text is not None
        else tiny_protocol(prereg="true", steps=6, budget=budget).replace("seeds: [1, 2]", f"seeds: {seeds}")
    )
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "test@example.invalid")
    git(r, "config", "user.name", "Test")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "study")
    t = harness(r, "tag", PROTO)
    assert t.returncode == 0, t.stderr
    return r


@pytest.fixture(scope="module")
def done_study(tagged_done_study: Path) -> Path:
    """The session's tagged, complete study (conftest's ``tagged_done_study``, shared with the
    other of test_integrity and test_provenance)."""
    return tagged_done_study


@pytest.fixture
def study(done_study: Path, tmp_path: Path) -> Path:
    return private_copy(done_study, tmp_path / "copy")


def resealed(path: Path, edit) -> dict:
    """One entry edited and resealed consistently (conftest's ``edit_record``)."""
    return edit_record(path, edit)


def rebuild_manifest(repo: Path) -> None:
    entries = load_entries(repo / RECS)
    head = head_of(entries, "") if entries else None
    write_manifest(repo / RECS, repo, [repo / PROTO], record_dicts(repo / RECS)[0]["protocol"], head)


def by_seq(repo: Path) -> list[Path]:
    """The record files, in ledger order."""
    return sorted(record_files(repo / RECS), key=lambda p: read_entry(p)["ledger"]["seq"])


def chain(repo: Path) -> list[Path]:
    """Every file of the chain (started entries and records), in ledger order."""
    return sorted(entry_files(repo / RECS), key=lambda p: read_entry(p)["ledger"]["seq"])


def seq_of(path: Path) -> int:
    return read_entry(path)["ledger"]["seq"]


# -- the intact study ----------------------------------------------------------------------------


def test_intact_study_passes_and_records_bind_the_tag(study):
    intact(study)


@pytest.mark.process
def test_the_study_run_under_its_launcher_passes_as_the_in_process_one(tmp_path):
    """The session's study (conftest's ``tagged_done_study``) runs ``harness run``'s code in the test
    process; here the same study runs as a user starts it, through the CLI's entry point with each
    run in its launcher's fresh process, and passes the same checks."""
    r = make_study(tmp_path)
    run = harness(r, "run", PROTO, "--quiet")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("ledger head: seq") == 3  # printed after each unit
    intact(r)


def intact(study: Path) -> None:
    """The audit passes ``study`` (an intact, tagged, complete copy of the tiny study) and its records
    bind the tag: the freeze manifest's trees and plan, each attempt a started entry and its record."""
    r = audit(study)
    assert r.returncode == NOT_VERIFIED, r.stdout
    assert "Integrity: everything matched." in r.stdout and "INCOMPLETE" not in r.stdout
    for check in ("ledger chain", "plan recomputed from the protocol", "tag freezes the experiment"):
        assert any(line.startswith(check) and "ok:" in line for line in r.stdout.splitlines()), check
    msg = git(study, "cat-file", "tag", "protocol-tiny")
    m = json.loads(msg.split("freeze-manifest:", 1)[1])
    assert set(m["trees"]) == {"configs", *PACKAGES}  # every non-exempt entry, by construction
    assert (
        m["plan"]["runs"] == 6
        and m["configs"]["tiny_conv"] == load_protocol(study / PROTO).configs["tiny_conv"].sha256
    )
    freeze = hashlib.sha256(canonical(m)).hexdigest()
    recs = record_dicts(study / RECS)
    entries = load_entries(study / RECS)
    # each attempt is a started entry, then the record that ends it and links to it
    assert [x["ledger"]["seq"] for x in recs] == [2, 4, 6, 8, 10, 12]
    assert [e["kind"] for e in entries[::2]] == ["started"] * 6
    assert all(
        r["start"] == {"seq": e["ledger"]["seq"], "sha256": e["sha256"]}
        and e["run_id"] == r["spec"]["run_id"]
        for e, r in zip(entries[::2], recs)
    )
    assert all(r["unit_attempt"] == 1 for r in recs)
    assert entries[0]["ledger"]["prev"] == freeze
    assert all(x["protocol"]["freeze_sha256"] == freeze for x in entries)
    st = harness(study, "status", PROTO)
    assert f"ledger head: seq 12 sha256 {recs[-1]['sha256']}" in st.stdout
    assert audit(study, "--head", f"12:{recs[-1]['sha256']}").returncode == NOT_VERIFIED


def test_the_protocol_is_stored_once_per_study_and_bound_by_every_record(study):
    """Schema 4 on: each record's ``protocol`` is a stub (id, sha256, the tag fields, the snapshot's
    sha256); the summary the records share is one file, ``protocol.<sha256>.json``, listed in
    MANIFEST; the analysis reads the records over it as before."""
    from prereg.formats.ledger import snapshot_name
    from prereg.formats.record import SCHEMA_VERSION

    raw = [read_entry(p) for p in record_files(study / RECS)]
    (snap,) = sorted((study / RECS).glob("protocol.*.json"))
    sha = hashlib.sha256(canonical(json.loads(snap.read_text()))).hexdigest()
    assert snap.name == snapshot_name(sha) and all(r["schema_version"] == SCHEMA_VERSION for r in raw)
    assert all(
        set(r["protocol"])
        == {
            "id",
            "sha256",
            "tag",
            "tag_commit",
            "tag_object",
            "tag_created",
            "freeze_sha256",
            "snapshot_sha256",
        }
        and r["protocol"]["snapshot_sha256"] == sha
        for r in raw
    )
    assert json.loads((study / RECS / "MANIFEST").read_text())["snapshots"] == {
        snap.name: hashlib.sha256(snap.read_bytes()).hexdigest()
    }
    full = record_dicts(study / RECS)[0]["protocol"]
    assert full["hypotheses"]["tests"] and full["tag"] == "protocol-tiny" and "snapshot_sha256" not in full


@pytest.mark.parametrize("attack", ["edit the snapshot", "delete the snapshot", "another snapshot, relisted"])
def test_a_snapshot_edited_or_deleted_is_named_by_the_audit_and_the_reader(study, attack):
    snap = next((study / RECS).glob("protocol.*.json"))
    data = json.loads(snap.read_text())
    data["budget_device_seconds"] = 1.0e6
    if attack == "edit the snapshot":
        snap.write_text(json.dumps(data))
        needle = f"{snap.name}: not the protocol snapshot its name says"
    elif attack == "delete the snapshot":
        snap.unlink()
        needle = "names no protocol snapshot"
    else:  # a second file named by its own hash and listed: the records' seals still name the first
        from prereg.formats.ledger import snapshot_name
        from prereg.formats.record import write_snapshot

        snap.unlink()
        new = study / RECS / snapshot_name(write_snapshot(study / RECS, data))
        m = json.loads((study / RECS / "MANIFEST").read_text())
        m["snapshots"] = {new.name: hashlib.sha256(new.read_bytes()).hexdigest()}
        (study / RECS / "MANIFEST").write_text(json.dumps(m))
        needle = "names no protocol snapshot"
    a = audit(study)
    assert a.returncode == 1 and needle in a.stdout, a.stdout
    r = harness(study, "report", PROTO, "--quiet")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "protocol snapshot" in r.stderr, r.stderr


# -- drift: harness run refuses before any worker starts, writing nothing -----------------------


def _refused(repo: Path, *needles: str) -> None:
    before = sorted(p.name for p in record_files(repo / RECS))
    (repo / RECS / "MANIFEST").unlink()  # a run that writes anything would recreate it
    for p in record_files(repo / RECS):
        if "pair002" in p.name:
            p.unlink()  # leave work to do
    left = sorted(p.name for p in record_files(repo / RECS))
    r = harness(repo, "run", PROTO, "--quiet")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "has drifted; nothing was run" in r.stderr and "new protocol id" in r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr
    assert (
        sorted(p.name for p in record_files(repo / RECS)) == left and not (repo / RECS / "MANIFEST").exists()
    )
    assert len(before) == 6


def test_config_edit_committed_after_tag_is_refused(study):
    cfg = study / "configs" / "tiny_conv.yaml"
    cfg.write_text(cfg.read_text().replace("lr: ", "lr: 2.0e-3 #", 1))
    git(study, "commit", "-qam", "tune lr")
    _refused(study, "configuration tiny_conv", "configs/tiny_conv.yaml: changed after the tag")


def test_uncommitted_code_edit_is_refused(study):
    plan = study / "harness" / "plan.py"
    plan.write_text(plan.read_text() + "\n# a quiet change\n")
    _refused(study, "harness/plan.py: uncommitted change", "the running harness package's source")


def test_untracked_module_is_refused(study):
    (study / "harness" / "extra.py").write_text("X = 1\n")
    (study / "plugins").mkdir()
    (study / "plugins" / "arm.py").write_text("Y = 2\n")
    _refused(study, "harness/extra.py: untracked", "plugins/arm.py: untracked")


def test_new_top_level_folder_committed_after_tag_is_refused(study):
    (study / "plugins").mkdir()
    (study / "plugins" / "arm.py").write_text("Y = 2\n")
    git(study, "add", "-A")
    git(study, "commit", "-qm", "plug-in")
    _refused(study, "plugins: added after the tag")


def test_exempt_changes_do_not_block_a_run(study):
    (study / "README.md").write_text("notes\n")
    (study / "protocols" / "next.yaml").write_text("# a later protocol\n")
    r = harness(study, "run", PROTO, "--quiet", "--no-report")
    assert r.returncode == 0, r.stderr


def test_lightweight_tag_is_refused_and_audited_without_traceback(study):
    commit = git(study, "rev-parse", "protocol-tiny^{commit}").strip()
    git(study, "tag", "-d", "protocol-tiny")
    git(study, "tag", "protocol-tiny", commit)
    r = harness(study, "run", PROTO, "--quiet")
    assert r.returncode == 2 and "lightweight tag" in r.stderr
    a = audit(study)
    assert a.returncode == 1 and "Traceback" not in a.stdout + a.stderr
    assert "lightweight tag" in a.stdout


def test_records_dir_outside_the_repository_is_refused(study):
    p = study / "protocols" / "out.yaml"
    p.write_text(
        tiny_protocol(id="out").replace("order_seed: 1", "order_seed: 1\nrecords_dir: ../../outside")
    )
    r = harness(study, "plan", str(p))
    assert (
        r.returncode == 2 and "key records_dir" in r.stderr and "outside the study's repository" in r.stderr
    )
    assert f"{p}:" in r.stderr


# -- the ledger: the audit names the first break -------------------------------------------------


@pytest.mark.process
def test_deleted_record_rerun_is_detected(study):
    first = by_seq(study)[0]
    first.unlink()
    r = harness(study, "run", PROTO, "--quiet")  # its started entry remains: the attempt is noted interrupted
    assert r.returncode == 0, r.stderr
    assert "noted interrupted attempt 1" in r.stdout
    a = audit(study)
    assert a.returncode == 1
    assert "ledger seq 2: no record (deleted" in a.stdout


def test_swapped_records_are_detected(study):
    p2, p3 = by_seq(study)[1:3]
    l2, l3 = read_entry(p2)["ledger"], read_entry(p3)["ledger"]
    resealed(p2, lambda r: r.update(ledger=l3))
    resealed(p3, lambda r: r.update(ledger=l2))
    rebuild_manifest(study)
    a = audit(study)
    assert a.returncode == 1 and f"ledger seq {seq_of(p2) + 1}" in a.stdout and "swapped" in a.stdout


def test_edit_and_reseal_is_detected(study):
    p = by_seq(study)[2]
    resealed(p, lambda r: r["timings"].update(training_s=r["timings"]["training_s"] / 2))
    rebuild_manifest(study)
    a = audit(study)
    assert (
        a.returncode == 1 and f"ledger seq {seq_of(p) + 1}" in a.stdout and "edited and resealed" in a.stdout
    )


def test_protocol_edited_and_everything_resealed_is_detected(study):
    proto = study / PROTO
    proto.write_text(proto.read_text().replace("margin: 0.01", "margin: 0.05"))
    git(study, "commit", "-qam", "loosen the tolerance")
    new_sha = hashlib.sha256(proto.read_bytes()).hexdigest()
    runs = make_plan(load_protocol(proto))
    prev = read_entry(chain(study)[0])["ledger"]["prev"]
    for p in chain(study):  # a consistent forgery: every entry, the chain and MANIFEST rewritten

        def edit(r, prev=prev):
            r["protocol"]["sha256"] = new_sha
            r["ledger"]["prev"] = prev
            if r.get("kind") == "started":
                return
            r["protocol"]["hypotheses"]["tests"][0]["margin"] = 0.05
            r["spec"]["protocol_sha256"] = new_sha
            r["plan_sha256"] = plan_sha256(runs)

        prev = resealed(p, edit)["sha256"]
    rebuild_manifest(study)
    a = audit(study)
    assert a.returncode == 1
    assert "ledger chain" in a.stdout and "tag freezes the experiment" in a.stdout
    assert "the protocol file at the tag" in a.stdout and "is not the protocol the records name" in a.stdout


def test_rewritten_history_misses_the_published_head(study):
    head = read_entry(by_seq(study)[-1])
    p = by_seq(study)[-1]
    resealed(p, lambda r: r["timings"].update(training_s=0.001))
    rebuild_manifest(study)
    a = audit(study, "--head", f"12:{head['sha256']}")
    assert a.returncode == 1 and "published head seq 12" in a.stdout and "history was rewritten" in a.stdout


# -- completeness ----------------------------------------------------------------------------------


def test_stopped_study_is_incomplete_not_broken(study):
    for p in chain(study)[8:]:  # the runner stopped after two of three units
        p.unlink()
    rebuild_manifest(study)
    r = harness(study, "report", PROTO, "--quiet")
    assert r.returncode == 0, r.stderr
    md = (study / RECS / "report.md").read_text()
    assert md.splitlines()[0] == "**INCOMPLETE: 2 of 6 planned runs have no ok record.**"
    assert "not reached (incomplete: 2 of 6 planned runs have no ok record)" in md
    a = audit(study)
    assert a.returncode == NOT_VERIFIED, a.stdout
    assert "INCOMPLETE: 2 of 6 planned runs have no ok record" in a.stdout
    assert "pairs / tiny_conv / native: planned 3, ok 2, failed 0, interrupted 0, missing 1" in a.stdout


@pytest.mark.process
def test_budget_stop_is_explained(tmp_path):
    # any unit spends more than 0.01 device seconds: the rule refuses the second on any machine
    repo = make_study(tmp_path, budget=0.01)
    r = harness(repo, "run", PROTO, "--quiet")
    assert r.returncode == 3 and "no further run starts" in r.stdout, r.stdout + r.stderr
    # a result: the run itself wrote the report (banner first), the page and the summary
    md = (repo / RECS / "report.md").read_text()
    assert md.startswith("**STOPPED BY THE BUDGET RULE: 4 of 6 planned runs have no ok record; ")
    assert "the next unit in plan order (pairs.tiny_conv.pair001: 2 runs" in md
    assert (repo / RECS / "index.html").is_file() and (repo / RECS / "summary.json").is_file()
    assert "This is the preregistered study's result" in r.stdout
    assert "run the same command again" not in r.stdout + r.stderr
    again = harness(repo, "run", PROTO, "--quiet")
    assert again.returncode == 3 and "This is the preregistered study's result" in again.stdout
    assert len(list((repo / RECS).glob("*.record.json"))) == 2
    a = audit(repo)
    assert a.returncode == NOT_VERIFIED and "STOPPED BY THE BUDGET RULE" in a.stdout, a.stdout


def test_budget_stop_decisions_are_made_and_say_so(done_study):
    from prereg.formats.summary import derive

    recs = record_dicts(done_study / RECS)  # three complete pairs of a plan made four pairs long
    spent = sum(r["timings"]["device_s"] for r in recs)
    least = min(r["timings"]["device_s"] for r in recs)
    for r in recs:
        # one more pair (2 runs at the mean device seconds) cannot fit, whatever the machine's speed
        r["protocol"]["budget_device_seconds"] = spent + 0.5 * least
        r["protocol"]["studies"][0]["seeds"] = [*r["protocol"]["studies"][0]["seeds"], 99]
        r["protocol"]["hypotheses"].update(
            min_pairs=3,
            tests=[
                {  # a speed hypothesis (BPB is bitwise equal)
                    "id": "S",
                    "study": "pairs",
                    "config": "tiny_conv",
                    "endpoint": "training_time",
                    "estimand": "log_ratio",
                    "type": "superiority",
                    "margin": 0.0,
                    "better": "lower",
                    "censoring": None,
                    "period_adjusted": False,
                }
            ],
        )
    s = derive(typed(recs)).to_json()
    assert s["completeness"]["budget_stop"] is True
    decision = s["hypotheses"]["decisions"][
        0
    ]  # the stop depended on run times: not preregistered, not decided
    assert decision["status"] == "not reached" and "depends on run times" in decision["reason"]
    for r in recs:
        r["protocol"]["hypotheses"]["decide_time_after_budget_stop"] = True
    s = derive(typed(recs)).to_json()
    decision = s["hypotheses"]["decisions"][0]
    assert decision["text"].startswith(
        "(study stopped by its budget rule; the stop depended on run times, this "
        "endpoint's outcome) S: superiority"
    )
    assert decision["status"] in ("established", "not established")
    problems: list[str] = []
    compare("h", recompute(recs)["hypotheses"], s["hypotheses"], problems, "budget")
    assert not problems, problems
    for r in recs:
        r["protocol"]["budget_device_seconds"] = spent * 100  # room left: the stop is unexplained
    s = derive(typed(recs)).to_json()
    assert s["completeness"]["budget_stop"] is False
    assert s["hypotheses"]["decisions"][0]["status"] == "not reached"
    assert s["hypotheses"]["decisions"][0]["reason"].startswith("incomplete: 2 of 8")


# -- the record format and the audit's independent plan ----------------------------------------------


def test_record_versions(tmp_path, done_study):
    src = by_seq(done_study)[0]
    rec = read_entry(src)
    v1 = {k: v for k, v in rec.items() if k not in ("ledger", "sha256", "start", "unit_attempt")}
    v1["schema_version"] = 1
    (tmp_path / f"a{RECORD_SUFFIX}").write_text(json.dumps(seal(v1)))
    old = read_record(tmp_path / f"a{RECORD_SUFFIX}")  # a version 1 record: no ledger, no attempts
    assert (old.schema_version, old.ledger, old.start, old.unit_attempt) == (1, None, None, 1)
    v9 = dict(v1, schema_version=9)
    (tmp_path / f"b{RECORD_SUFFIX}").write_text(json.dumps(seal(v9)))
    with pytest.raises(RecordFormatError, match="schema_version 9 is not one this harness reads"):
        read_record(tmp_path / f"b{RECORD_SUFFIX}")


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "protocols").glob("*.yaml")))
def test_audit_plan_equals_harness_plan(name):
    path = ROOT / "protocols" / name
    text = path.read_text()
    assert yaml_subset(text) == yaml.safe_load(text)
    proto = load_protocol(path)
    shas = {c: cfg.sha256 for c, cfg in proto.configs.items()}
    mine = plan_from_protocol(protocol_from_text(text.encode(), name), proto.sha256, shas)
    assert mine == [r.to_json() for r in make_plan(proto)]


# -- one parse per file (prereg.bounded.parsed_once) ---------------------------------------------


def _parsed_texts(monkeypatch) -> list[str]:
    """Every text json.loads parses from here on (the bounded reader's parse of each file)."""
    texts: list[str] = []
    loads = json.loads

    def counted(s, *a, **k):
        texts.append(s.decode("utf-8") if isinstance(s, bytes) else s)
        return loads(s, *a, **k)

    monkeypatch.setattr(json, "loads", counted)
    return texts


@pytest.mark.parametrize("name", ["cpu1-pilot", "calibration-cpu-pilot"])
def test_the_audit_parses_each_file_of_a_folder_once(monkeypatch, tmp_path, name):
    """The audit of a committed folder parses each of its JSON files once, though its checks, the
    stall rule of the texts it renders again and MANIFEST's two readers each read them (reading
    every record three times was a good part of the fast tier's time)."""
    from in_process import audit_here

    folder = ROOT / "records" / name
    texts = _parsed_texts(monkeypatch)
    a = audit_here(tmp_path, str(folder))  # from elsewhere: the modules it imports stay loaded
    assert "Traceback" not in a.stderr and f"records/{name}" in a.stdout, a.stdout + a.stderr
    assert re.search(r"report\.md and index\.html +\S+ +ok: ", a.stdout), a.stdout  # rendered again
    files = [p for p in sorted(folder.iterdir()) if p.name == "MANIFEST" or p.suffix == ".json"]
    counts = {p.name: texts.count(p.read_text()) for p in files}
    assert len(files) > 30 and set(counts.values()) == {1}, {n: c for n, c in counts.items() if c != 1}


def test_no_reader_changes_a_value_the_others_read(monkeypatch, tmp_path):
    """The values of a folder's files that the audit hands every reader of the same bytes
    (:func:`prereg.bounded.parsed_once`) are, after the whole audit of the folder, still what those
    bytes parse to: no check, renderer or rule changed one that another then read."""
    import contextlib

    from in_process import audit_here

    import audit.folder
    from prereg import bounded

    kept: list[dict[bytes, object]] = []
    once = bounded.parsed_once

    @contextlib.contextmanager
    def watched(directory):
        with once(directory) as values:
            yield values
            kept.append(dict(values))

    monkeypatch.setattr(audit.folder, "parsed_once", watched)
    a = audit_here(tmp_path, str(ROOT / "records" / "cpu1-pilot"))
    assert "Traceback" not in a.stderr and re.search(r"report\.md and index\.html +\S+ +ok: ", a.stdout)
    parsed = {raw: value for values in kept for raw, value in values.items() if isinstance(value, dict)}
    assert len(parsed) > 100
    for raw, value in parsed.items():
        assert json.dumps(value, sort_keys=True) == json.dumps(bounded.parse_json(raw), sort_keys=True)

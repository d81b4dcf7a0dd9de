"""Issue 25's attacks, each driven through the CLI in a temporary clone of a tagged, complete study:
every one is refused before anything runs, or makes the public audit fail naming the cause.

The module fixture tags and runs a tiny preregistered study once; each test works on its own copy.
The audit's command line runs in this process (tests/in_process.py: the same ``main``, output and
exit status), so that forty tests do not each start an interpreter that compiles the audit's
sources afresh; the intact study's test runs it as a reader does, ``python -I -S
analysis/public_audit.py``, and so do test_integrity's.
"""

from __future__ import annotations

import hashlib
import json
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, git, harness, private_copy, record_dicts, tiny_protocol
from in_process import audit_here, harness_here
from test_integrity import PROTO, RECS, by_seq, chain, make_study, rebuild_manifest, resealed
from test_integrity import audit as audit_process

from audit.cli import NOT_VERIFIED
from prereg.formats.ledger import PACKAGES
from prereg.formats.record import read_entry


@pytest.fixture(scope="module")
def done_study(tagged_done_study: Path) -> Path:
    """The session's tagged, complete study (conftest's ``tagged_done_study``, shared with the
    other of test_integrity and test_provenance)."""
    return tagged_done_study


@pytest.fixture
def study(done_study: Path, tmp_path: Path) -> Path:
    return private_copy(done_study, tmp_path / "copy")


def audit(repo: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The public audit of the study's records (``extra``: its options), in this process."""
    return audit_here(repo, RECS, *extra)


def reseal_all(repo: Path, edit) -> None:
    """A consistent forgery: every record edited, the chain relinked from the same genesis, MANIFEST
    and summary.json rewritten by the harness's own code."""
    paths = chain(repo)  # started entries too: every entry is relinked, only records are edited
    prev = read_entry(paths[0])["ledger"]["prev"]
    starts: dict[int, str] = {}  # a started entry's seq -> its new sha256, for the record that links to it
    for p in paths:

        def e(r, prev=prev, p=p):
            if p.name.endswith(".record.json"):
                edit(r)
                if isinstance(r.get("start"), dict) and r["start"].get("seq") in starts:
                    r["start"]["sha256"] = starts[r["start"]["seq"]]
            r["ledger"]["prev"] = prev

        new = resealed(p, e)
        prev = new["sha256"]
        if not p.name.endswith(".record.json"):
            starts[new["ledger"]["seq"]] = new["sha256"]
    rebuild_manifest(repo)
    report = harness_here(repo, "report", PROTO, "--quiet")  # the report follows the forged records
    assert report.returncode == 0, report.stdout + report.stderr


def failed(repo: Path, *needles: str, extra: tuple[str, ...] = ()) -> str:
    a = audit(repo, *extra)
    out = a.stdout + a.stderr
    assert a.returncode == 1, out
    assert "Traceback" not in out
    for n in needles:
        assert n in out, out
    return out


def refused(
    repo: Path,
    *needles: str,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    in_process: bool = False,
) -> str:
    """harness run refuses (exit 2) before any worker starts and writes nothing: ``python -m
    harness.cli run`` started in the study's folder, or with ``in_process`` its ``main`` called in
    this process (for a refusal that does not depend on what a fresh interpreter imports)."""
    for p in chain(repo)[8:]:
        p.unlink()  # leave a unit to do
    (repo / RECS / "MANIFEST").unlink(missing_ok=True)
    left = sorted(p.name for p in (repo / RECS).glob("*.record.json"))
    if in_process:
        r = harness_here(repo, "run", PROTO, "--quiet", *args, env=env)
    else:
        r = subprocess.run(
            [sys.executable, "-m", "harness.cli", "run", PROTO, "--quiet", *args],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr
    assert sorted(p.name for p in (repo / RECS).glob("*.record.json")) == left
    assert not (repo / RECS / "MANIFEST").exists()
    return r.stderr


# -- 1. the tag is the source of truth ------------------------------------------------------------


def test_intact_study_passes_every_provenance_check(study):
    """As a reader runs the audit: ``python -I -S analysis/public_audit.py``, a process of its own."""
    a = audit_process(study)
    assert a.returncode == NOT_VERIFIED, a.stdout
    for check in ("protocol: the tagged file", "what ran is what was frozen", "time order", "tag signature"):
        assert any(line.startswith(check) and "ok:" in line for line in a.stdout.splitlines()), check
    assert a.stdout.rstrip().splitlines()[-1].startswith("NOT ANCHORED: no published head")


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda h: h["tests"].clear(), "protocol.hypotheses"),
        (lambda h: h.update(family_alpha=0.45), "protocol.hypotheses.family_alpha"),
        (lambda h: h["tests"][0].update(better="higher"), "protocol.hypotheses"),
    ],
)
def test_hypotheses_edited_inside_the_records_fail_naming_record_and_field(study, edit, field):
    reseal_all(study, lambda r: edit(r["protocol"]["hypotheses"]))
    out = failed(study, "protocol: the tagged file", field)
    assert "pairs.tiny_conv.pair000.baseline.a1.record.json: field protocol.hypotheses" in out


def test_records_rewritten_as_not_preregistered_with_the_tag_deleted(study):
    def edit(r):
        r["protocol"].update(
            preregistered=False,
            tag=None,
            tag_commit=None,
            tag_object=None,
            tag_created=None,
            freeze_sha256=None,
        )

    reseal_all(study, edit)
    git(study, "tag", "-d", "protocol-tiny")
    (study / RECS / "TAG").unlink()  # the kept copy of the tag object too: a consistent forgery
    failed(
        study,
        "protocols/tiny.yaml in this checkout says preregistered: true",
        "no tag protocol-tiny",
        "nothing binds these records",
    )


def test_budget_and_margins_come_from_the_tag_not_the_records(study):
    reseal_all(study, lambda r: r["protocol"].update(budget_device_seconds=1.0e6))
    failed(study, "field protocol.budget_device_seconds = 1000000.0, the tagged protocol's is 600.0")


# -- 2. what ran is what was frozen ---------------------------------------------------------------


def test_record_commit_without_the_frozen_trees_fails(study):
    plan = study / "harness" / "plan.py"
    plan.write_text(plan.read_text() + "\n# after the tag\n")
    git(study, "commit", "-qam", "code change after the tag")
    head = git(study, "rev-parse", "HEAD").strip()
    reseal_all(study, lambda r: r["git"].update(commit=head))
    failed(study, f"field git.commit = {head[:12]} does not hold the frozen trees", "differs in harness")


def test_record_commit_off_the_tag_s_history_fails(study):
    """Records resealed to name another commit than the tag's: one with the very same tree, made
    off the tag's history (git commit-tree), holds the frozen trees but no run ran there."""
    tagged = git(study, "rev-parse", "protocol-tiny^{commit}").strip()
    orphan = git(study, "commit-tree", f"{tagged}^{{tree}}", "-m", "the same tree, another history").strip()
    later = study / "docs.md"
    later.write_text("an exempt edit\n")
    git(study, "add", "docs.md")
    git(study, "commit", "-qm", "an exempt change after the tag")
    descendant = git(study, "rev-parse", "HEAD").strip()
    reseal_all(study, lambda r: r["git"].update(commit=descendant))
    assert (
        audit(study).returncode == NOT_VERIFIED
    )  # a later commit with the frozen trees: a run may have run there
    reseal_all(study, lambda r: r["git"].update(commit=orphan))
    failed(study, f"field git.commit = {orphan[:12]} does not descend from the tag's commit {tagged[:12]}")


def test_the_report_and_the_page_are_rendered_again_and_compared(study):
    """Issue 35's fifth attack: a decision edited in report.md and index.html, summary.json intact."""
    ok = audit(study)
    assert ok.returncode == NOT_VERIFIED, ok.stdout
    assert "index.html and report.md byte for byte as the verified summary.json renders them" in ok.stdout
    for name in ("report.md", "index.html"):
        path = study / RECS / name
        text = path.read_text()
        word, forged = (
            ("not established", "ESTABLISHED") if "not established" in text else ("established", "REFUTED")
        )
        assert word in text
        path.write_text(text.replace(word, forged, 1))
    out = failed(study, "report.md: not what the verified summary.json renders (line ")
    assert "index.html: not what the verified summary.json renders" in out


def test_a_published_text_with_a_line_added_or_cut_is_named(study):
    report = study / RECS / "report.md"
    report.write_text(report.read_text() + "\nAll speed hypotheses ESTABLISHED.\n")
    failed(
        study, "report.md: not what the verified summary.json renders", "goes on where the rendered one ends"
    )
    page = study / RECS / "index.html"
    page.write_text(page.read_text()[:-200])
    failed(study, "index.html: not what the verified summary.json renders")


def test_record_code_hash_other_than_the_manifest_fails(study):
    reseal_all(study, lambda r: r["env"].update(harness_sha256="0" * 64))
    failed(study, "field env.harness_sha256 = '" + "0" * 64 + "', the tag's manifest says")


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda m: m.update(sources={}), "MANIFEST: sources lack"),
        (lambda m: m.update(ledger_head=None), "MANIFEST: field ledger_head = None"),
    ],
)
def test_manifest_emptied(study, edit, needle):
    path = study / RECS / "MANIFEST"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))
    failed(study, needle)


@pytest.mark.parametrize(
    "var, value",
    [
        ("COTANGENT_NATIVE", "0"),
        ("CC", "/nonexistent/cc"),
        ("ATEN_CPU_CAPABILITY", "default"),
        ("OMP_NUM_THREADS", "2"),
        ("HARNESS_VERIFIED", "/tmp/elsewhere.json"),
        ("LD_PRELOAD", "/tmp/x.so"),
    ],
)
def test_code_path_variables_are_refused_before_anything_runs(study, var, value):
    """The first variable through ``python -m harness.cli run``, the others through its ``main`` in
    this process: the refusal reads the environment's strings, whichever process holds them."""
    refused(
        study,
        f"{var}={value}",
        "the environment sets what changes a run's code path; nothing was run",
        env={var: value},
        in_process=var != "COTANGENT_NATIVE",
    )


def test_pythonpath_with_sitecustomize_is_refused(study, tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import time; time.sleep(0.01)\n")
    refused(study, "PYTHONPATH=", env={"PYTHONPATH": str(tmp_path / "site")})


def test_ignored_package_shadowing_pyyaml_is_refused(study):
    (study / ".gitignore").write_text((study / ".gitignore").read_text() + "yaml/\n")  # .gitignore is exempt
    (study / "yaml").mkdir()
    (study / "yaml" / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    refused(study, "yaml/__init__.py: a module 'yaml' in the study's folder shadows the installed package")
    (study / "yaml" / "__init__.py").write_text("from os import *\n")  # not a package the harness imports
    shutil.move(study / "yaml", study / "helpers")
    (study / ".gitignore").write_text((study / ".gitignore").read_text() + "helpers/\n")
    refused(study, "helpers/: ignored by .gitignore but inside a frozen entry")


def test_ignored_module_inside_a_frozen_folder_is_refused(study):
    (study / ".gitignore").write_text((study / ".gitignore").read_text() + "harness/extra_*.py\n")
    (study / "harness" / "extra_speed.py").write_text("X = 1\n")
    refused(study, "harness/extra_speed.py: ignored by .gitignore but inside a frozen entry", in_process=True)


@pytest.mark.process
def test_stale_unchecked_bytecode_is_never_read_by_a_worker(study):
    """An unchecked-hash .pyc for a module only workers import, whose code would fail the run: the
    worker compiles the frozen source instead, so the runs are ok."""
    src = study / "harness" / "data" / "batches.py"
    original = src.read_text()
    src.write_text(
        "import os\nif os.environ.get('HARNESS_CODE_PATH'):\n    raise SystemExit('STALE BYTECODE')\n"
        + original
    )
    cache = study / "harness" / "data" / "__pycache__"
    pyc = cache / f"batches.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(
        str(src), cfile=str(pyc), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    src.write_text(original)  # the tracked source is untouched; the stale bytecode stays beside it
    for p in chain(study)[8:]:
        p.unlink()
    kept = {x["spec"]["run_id"] for x in record_dicts(study / RECS) if x["status"] == "ok"}
    r = harness(study, "run", PROTO, "--quiet", "--no-report")
    assert r.returncode == 0, r.stdout + r.stderr
    recs = record_dicts(study / RECS)
    assert [x["status"] for x in recs].count("ok") == 6
    ran = [x for x in recs if x["status"] == "ok" and x["spec"]["run_id"] not in kept]
    # the runs this command's workers made (the fixture's own may have trained in process)
    assert ran and all(x["env"]["isolated"] is True for x in ran)


@pytest.mark.process
def test_planted_phase_library_is_replaced_by_a_fresh_build(study, tmp_path):
    cache = tmp_path / "kernel-cache"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COTANGENT_NATIVE_CACHE": str(cache)}
    for p in chain(study)[8:]:
        p.unlink()
    run = lambda: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "harness.cli", "run", PROTO, "--quiet", "--no-report"],
        cwd=study,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    first = run()
    assert first.returncode == 0, first.stdout + first.stderr
    (so,) = cache.glob("phase-*.so")
    good = hashlib.sha256(so.read_bytes()).hexdigest()
    cand = [x for x in record_dicts(study / RECS) if x["spec"]["arm"] == "cotangent"]
    if not cand[-1]["method_paths"]["phase_kernel"].startswith("phase.c"):
        pytest.skip(f"this CPU does not run phase.c ({cand[-1]['method_paths']['phase_kernel']})")
    assert cand[-1]["method_paths"]["phase_so_sha256"] == good
    so.write_bytes(b"\x7fELF planted library, reused by name")  # the cache key names the file, not its bytes
    for p in chain(study)[8:]:
        p.unlink()
    second = run()
    assert second.returncode == 0, second.stdout + second.stderr
    assert hashlib.sha256(so.read_bytes()).hexdigest() == good
    rec = [x for x in record_dicts(study / RECS) if x["spec"]["arm"] == "cotangent"][-1]
    assert rec["method_paths"]["phase_so_sha256"] == good and rec["method_paths"]["phase_kernel"].startswith(
        "phase.c"
    )


def test_torch_version_differs_from_the_study_s_earlier_runs(study):
    reseal_all(study, lambda r: r["env"].update(torch="1.0.0"))
    stderr = refused(study, "earlier runs of this study used torch 1.0.0", in_process=True)
    assert "one study runs on one installation" in stderr


@pytest.mark.parametrize(
    ("declared", "running", "same"),
    [
        ("2.14.1", "2.14.1", True),
        ("2.14.1", "2.14.1+cu130", True),  # a build of 2.14.1
        ("2.14.1", "2.14.10", False),
        ("2.14.1+cpu", "2.14.1+cu130", False),  # a declared build is that build
        ("2.14.1+cpu", "2.14.1+cpu", True),
        ("2.14", "2.14.1", False),
    ],
)
def test_one_torch_version_rule_for_the_runner_and_the_audit(declared, running, same):
    from prereg.tag import torch_matches

    assert torch_matches(declared, running) is same


def test_records_downgraded_to_an_older_schema_are_named(study):
    """Every record resealed as schema 3 (the protocol copy it then carries, its chain relinked): the
    tagged harness writes the current schema, so the records are not what it wrote."""
    from prereg.formats.record import SCHEMA_VERSION

    reseal_all(study, lambda r: r.update(schema_version=3))
    failed(study, f"field schema_version = 3, but the tagged harness writes schema {SCHEMA_VERSION}")


def test_a_published_head_at_a_started_entry_binds_no_outcome(study):
    started = [read_entry(p) for p in chain(study) if p.name.endswith(".started.json")][-1]
    out = failed(
        study, "is a started entry", extra=("--head", f"{started['ledger']['seq']}:{started['sha256']}")
    )
    assert "not a record" in out


def test_audit_fails_when_a_study_mixes_package_versions(study):
    def edit(r):
        if r["spec"]["unit"].endswith("pair000"):
            r["env"]["numpy"] = "0.1"

    reseal_all(study, edit)
    failed(study, "study pairs: the runs used 2 versions of numpy")


def test_what_varies_between_runs_of_a_study_is_named_not_failed(study):
    def edit(r):
        if r["spec"]["unit"].endswith("pair001"):
            r["env"].update(threads=2, host="other-host")

    reseal_all(study, edit)
    a = audit(study)
    assert a.returncode == NOT_VERIFIED, a.stdout
    assert "study pairs: varies between runs: host (" in a.stdout and "threads (1, 2)" in a.stdout


def _kernel_of(r: dict) -> str:
    return r["method_paths"]["phase_kernel"]


def test_audit_names_each_arm_s_phase_kernel(study):
    recs = [read_entry(p) for p in by_seq(study)]
    kernel = next(_kernel_of(r) for r in recs if r["spec"]["arm"] == "cotangent")
    a = audit(study)
    assert a.returncode == NOT_VERIFIED, a.stdout
    assert (
        f"study pairs: phase kernel: arm cotangent: {kernel} in 3 record(s); arm native: none (no PackedAdamW) "
        "in 3 record(s)"
    ) in a.stdout


def test_an_arm_whose_records_disagree_on_the_phase_kernel_fails(study):
    """CC or PATH switched phase.c off for some runs: the arm ran two code paths."""

    def edit(r):
        if r["spec"]["unit"].endswith("pair001") and r["spec"]["arm"] == "cotangent":
            other = "torch kernels (no C compiler (set CC, or install cc/gcc/clang))"
            if not _kernel_of(r).startswith("phase.c"):
                other = "phase.c (forms chosen)"
            r["method_paths"]["phase_kernel"] = other

    reseal_all(study, edit)
    failed(
        study,
        "study pairs: the records of arm cotangent disagree on field method_paths.phase_kernel: ",
        " (e.g. pairs.tiny_conv.pair001.candidate.a1.record.json)",
        "one arm runs one code path",
    )


def test_a_phase_library_that_differs_between_runs_fails(study):
    def edit(r):
        if r["spec"]["unit"].endswith("pair002") and r["spec"]["arm"] == "cotangent":
            r["method_paths"]["phase_so_sha256"] = "0" * 64

    reseal_all(study, edit)
    failed(
        study, "study pairs: field method_paths.phase_so_sha256 differs between runs: ", "0000000000000000 ("
    )


# -- 3. time order --------------------------------------------------------------------------------


def test_tag_dated_after_the_records_fails(study):
    old = git(study, "rev-parse", "protocol-tiny").strip()
    message = git(study, "for-each-ref", "--format=%(contents)", "refs/tags/protocol-tiny")
    commit = git(study, "rev-parse", "protocol-tiny^{commit}").strip()
    git(study, "tag", "-d", "protocol-tiny")
    subprocess.run(
        ["git", "tag", "-a", "protocol-tiny", "-m", message.strip(), commit],
        cwd=study,
        check=True,
        env={**os.environ, "GIT_COMMITTER_DATE": "2031-01-01T00:00:00+00:00"},
    )
    new = git(study, "rev-parse", "protocol-tiny").strip()
    assert new != old
    reseal_all(study, lambda r: r["protocol"].update(tag_object=new, tag_created="2031-01-01T00:00:00+00:00"))
    (study / RECS / "TAG").write_bytes(
        subprocess.run(["git", "cat-file", "tag", new], cwd=study, capture_output=True, check=True).stdout
    )  # the kept copy replaced too
    failed(
        study,
        "time order",
        "tag protocol-tiny was created at 2031-01-01T00:00:00+00:00, after",
        "the tag must precede every outcome",
    )


def test_record_started_before_its_predecessor_on_the_same_machine_fails(study):
    recs = [read_entry(p) for p in by_seq(study)]
    first, second, third = (r["ledger"]["seq"] for r in recs[:3])

    def edit(r):
        if r["ledger"]["seq"] == third:
            r["started_at"] = recs[0][
                "started_at"
            ]  # claims to have started with the first run, on the same host

    reseal_all(study, edit)
    failed(
        study,
        "time order",
        f"ledger seq {third}",
        f"before seq {second} on the same machine",
        "out of time order",
    )


def test_git_replace_of_the_tag_object_is_not_honoured(study):
    """A forged tag object (its manifest naming another protocol hash) put in place of the real one
    with `git replace`: the audit reads the real tag, so the records resealed to the forgery fail."""
    real = git(study, "rev-parse", "protocol-tiny").strip()
    message = git(study, "cat-file", "tag", real)
    body = message.split("\n\n", 1)[1]
    forged_body = body.replace(
        json.loads(body.split("freeze-manifest:", 1)[1])["protocol"]["sha256"], "f" * 64
    )
    header = message.split("\n\n", 1)[0]
    forged = subprocess.run(
        ["git", "mktag"],
        cwd=study,
        input=f"{header}\n\n{forged_body}",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    git(study, "replace", "-f", real, forged)
    assert "f" * 64 in git(study, "cat-file", "tag", real)  # git itself now shows the forgery
    a = audit(study)
    assert a.returncode == NOT_VERIFIED, (
        a.stdout
    )  # the audit still reads the real tag: the intact records pass
    fm = json.loads(forged_body.split("freeze-manifest:", 1)[1])
    forged_freeze = hashlib.sha256(json.dumps(fm, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    reseal_all(study, lambda r: r["protocol"].update(freeze_sha256=forged_freeze))
    failed(study, "field protocol.freeze_sha256")


# -- 4. anchoring ---------------------------------------------------------------------------------


def test_head_must_be_a_full_sha256(study):
    last = read_entry(by_seq(study)[-1])
    head, seq = last["sha256"], last["ledger"]["seq"]
    a = audit(study, "--head", f"{seq}:{head[:4]}")
    assert a.returncode == 2 and "full 64-hex-digit sha256" in a.stdout
    ok = audit(study, "--head", f"{seq}:{head}")
    assert ok.returncode == NOT_VERIFIED, ok.stdout
    assert (
        ok.stdout.rstrip()
        .splitlines()[-1]
        .startswith("Anchored: the chain was checked against the published head")
    )


@pytest.mark.process
def test_anchor_pushes_every_unit_and_the_audit_checks_the_history(tmp_path):
    remote = tmp_path / "anchor.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    repo = make_study(tmp_path)
    bad = harness(repo, "run", PROTO, "--quiet", "--anchor", str(tmp_path / "nowhere.git"))
    assert bad.returncode == 2 and "not a reachable git remote" in bad.stderr and not (repo / RECS).exists()
    r = harness(repo, "run", PROTO, "--quiet", "--anchor", str(remote))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("anchored seq") == 9  # at every start, before its worker, and after every unit
    log = git(remote, "log", "--format=%s", "refs/ledger/protocol-tiny").splitlines()
    assert log == [f"ledger head of protocol-tiny: seq {n}" for n in (12, 11, 9, 8, 7, 5, 4, 3, 1)]
    a = audit(repo, "--anchor", str(remote))
    assert a.returncode == NOT_VERIFIED, a.stdout
    assert (
        f"9 anchored heads in refs/ledger/protocol-tiny fetched from {remote}, up to seq 12 of 12" in a.stdout
    )
    assert a.stdout.rstrip().splitlines()[-1].startswith("Anchored:")
    # the audited repository's git config redirects the anchor to forged heads: not honoured
    fake = tmp_path / "fake.git"
    subprocess.run(["git", "clone", "-q", "--mirror", str(remote), str(fake)], check=True)
    ref = "refs/ledger/protocol-tiny"
    body = git(fake, "log", "-1", "--format=%B", ref)
    forged = body.replace(body.split("sha256 ")[1].split()[0], "f" * 64)
    new = git(
        fake, "commit-tree", "4b825dc642cb6eb9a060e54bf8d69288fbee4904", "-p", ref, "-m", forged
    ).strip()
    git(fake, "update-ref", ref, new)
    git(repo, "config", f"url.{fake}.insteadOf", str(remote))
    before = git(repo, "for-each-ref")
    a = audit(repo, "--anchor", str(remote))
    assert a.returncode == NOT_VERIFIED, a.stdout
    assert f"fetched from {remote}," in a.stdout and str(fake) not in a.stdout
    assert git(repo, "for-each-ref") == before  # nothing fetched into the audited repository
    failed(
        repo, "anchored head seq 12 sha256 ffffffffffffffff", extra=("--anchor", str(fake))
    )  # the forgery itself
    git(repo, "config", "--unset", f"url.{fake}.insteadOf")
    # the tail after an anchored head, rewritten and resealed: the anchor's history does not match
    resealed(by_seq(repo)[-1], lambda x: x["timings"].update(training_s=0.001))
    rebuild_manifest(repo)
    out = failed(
        repo,
        "anchored head seq 12",
        "history was rewritten after it was anchored",
        extra=("--anchor", str(remote)),
    )
    assert "anchored head seq 8" not in out  # the earlier anchors still hold


def test_allowed_signers_on_an_unsigned_tag_fails(study, tmp_path):
    allowed = tmp_path / "allowed"
    allowed.write_text("test@example.invalid ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA\n")
    failed(study, "tag protocol-tiny is not signed", extra=("--allowed-signers", str(allowed)))


def signed_study(r: Path, config: tuple[tuple[str, str], ...], signers: str | None = None) -> Path:
    """A tiny preregistered study at ``r``, tagged by ``harness tag --sign`` under ``config`` and run
    (with ``signers`` committed as ``protocols/allowed_signers`` before the tag)."""
    (r / "protocols").mkdir(parents=True)
    if signers is not None:
        (r / "protocols" / "allowed_signers").write_text(signers)
    for sub in ("configs", *PACKAGES):
        shutil.copytree(ROOT / sub, r / sub, ignore=shutil.ignore_patterns("__pycache__"))
    (r / ".gitignore").write_text("runs/\n__pycache__/\n")
    (r / PROTO).write_text(tiny_protocol(prereg="true", steps=6))
    git(r, "init", "-q", "-b", "main")
    for k, v in (("user.email", "test@example.invalid"), ("user.name", "Test"), *config):
        git(r, "config", k, v)
    git(r, "add", "-A")
    git(r, "commit", "-qm", "study")
    t = harness(r, "tag", PROTO, "--sign")
    assert t.returncode == 0, t.stderr
    assert "signed" in t.stdout
    run = harness(r, "run", PROTO, "--quiet", "--no-report")  # the runner reads the manifest of a signed tag
    assert run.returncode == 0, run.stdout + run.stderr
    return r


def ssh_key(path: Path) -> str:
    """A fresh ed25519 key pair at ``path``; returns the public key's line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text()


def ssh_signed_study(tmp_path: Path, principal: str) -> tuple[Path, Path, str, Path, str]:
    """A study tagged with a fresh ssh key whose line, after ``principal``, is the committed signers
    file, and a second key (the forger's): the study, the key, its public line, the forger's key and
    its line. Skips where ssh-keygen is not installed."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    key, forger = tmp_path / "key", tmp_path / "forger"
    pub, forged_pub = ssh_key(key), ssh_key(forger)
    r = signed_study(
        tmp_path / "study", (("gpg.format", "ssh"), ("user.signingkey", str(key))), f"{principal} {pub}"
    )
    return r, key, pub, forger, forged_pub


@pytest.mark.process
def test_signed_tag_verifies_against_the_reader_s_allowed_signers(tmp_path):
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    key, other = tmp_path / "key", tmp_path / "other"
    pub, other_pub = ssh_key(key), ssh_key(other)
    r = signed_study(tmp_path / "study", (("gpg.format", "ssh"), ("user.signingkey", str(key))))
    assert "-----BEGIN SSH SIGNATURE-----" in git(r, "cat-file", "tag", "protocol-tiny")
    good, wrong = tmp_path / "allowed", tmp_path / "wrong"
    good.write_text(f"test@example.invalid {pub}")
    wrong.write_text(f"test@example.invalid {other_pub}")
    ok = audit(r, "--allowed-signers", str(good))
    assert ok.returncode == 0, ok.stdout
    assert "good SSH signature by test@example.invalid (key SHA256:" in ok.stdout  # issue 59: its fingerprint
    assert f"), allowed by {good}" in ok.stdout
    assert "signed, not verified (pass --allowed-signers FILE)" in audit(r).stdout
    failed(r, "its signature does not verify against", extra=("--allowed-signers", str(wrong)))
    # the audited repository's config cannot swap the verifier: ssh-keygen runs, not gpg.ssh.program
    git(r, "config", "gpg.ssh.program", "/bin/true")
    failed(r, "its signature does not verify against", extra=("--allowed-signers", str(wrong)))


@pytest.mark.process
def test_trust_roots_from_the_repository_prove_nothing_and_a_re_signed_tag_is_named(tmp_path):
    """Issue 35's second attack: a new tag object with the same message, signed by the forger's key,
    written to the records' TAG, and the repository's signers file swapped. With the repository's
    own roots the audit says so first and does not pass; with the reader's copy it fails."""
    from audit.anchors import split_signature

    r, _, pub, forger, forged_pub = ssh_signed_study(tmp_path, "test@example.invalid")
    mine = tmp_path / "trusted_signers"  # the reader's own file, kept outside the repository
    mine.write_text(f"reader {pub}")
    assert audit(r, "--allowed-signers", str(mine)).returncode == 0
    borrowed = audit(r, "--allowed-signers", "protocols/allowed_signers")
    assert borrowed.returncode == 3, borrowed.stdout
    assert borrowed.stdout.startswith("TRUST ROOTS FROM THE REPOSITORY")
    # the forgery: same message, tagger and date, signed by another key; the signers file swapped
    raw = git(r, "cat-file", "tag", "protocol-tiny").encode()
    payload, _, _ = split_signature(raw)
    header, _, message = payload.decode().partition("\n\n")
    when = next(line for line in header.splitlines() if line.startswith("tagger ")).split("> ", 1)[1]
    commit = next(line for line in header.splitlines() if line.startswith("object ")).split()[1]
    (tmp_path / "msg").write_text(message)
    subprocess.run(
        [
            "git",
            "-c",
            f"user.signingkey={forger}",
            "tag",
            "-f",
            "-s",
            "-F",
            str(tmp_path / "msg"),
            "protocol-tiny",
            commit,
        ],
        cwd=r,
        check=True,
        capture_output=True,
        env={**os.environ, "GIT_COMMITTER_DATE": when},
    )
    (r / RECS / "TAG").write_text(git(r, "cat-file", "tag", "protocol-tiny"))
    (r / "protocols" / "allowed_signers").write_text(f"test@example.invalid {forged_pub}")
    out = failed(
        r,
        "does not list: the tag was signed again by another key",
        "line(s) of the copy bound at the tag",
        extra=("--allowed-signers", "protocols/allowed_signers"),
    )
    assert out.startswith("TRUST ROOTS FROM THE REPOSITORY")
    failed(r, "its signature does not verify against", extra=("--allowed-signers", str(mine)))


@pytest.mark.process
def test_an_openpgp_signed_tag_does_not_pass_for_the_allowed_signers(tmp_path, monkeypatch):
    """A gpg signature that the reader's keyring accepts is not an SSH signature the reader's
    allowed-signers file names: refused, whatever gpg says."""
    if shutil.which("gpg") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("gpg or ssh-keygen is not installed")
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("GNUPGHOME", str(home))
    subprocess.run(
        [
            "gpg",
            "--batch",
            "--quiet",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            "--quick-gen-key",
            "Test <test@example.invalid>",
            "ed25519",
            "sign",
            "never",
        ],
        check=True,
        capture_output=True,
    )
    r = signed_study(
        tmp_path / "study", (("gpg.format", "openpgp"), ("user.signingkey", "test@example.invalid"))
    )
    assert "-----BEGIN PGP SIGNATURE-----" in git(r, "cat-file", "tag", "protocol-tiny")
    gpg_ok = subprocess.run(["git", "verify-tag", "protocol-tiny"], cwd=r, capture_output=True, text=True)
    assert gpg_ok.returncode == 0, gpg_ok.stderr  # the keyring calls it good
    allowed = tmp_path / "allowed"
    allowed.write_text(f"reviewer@example.invalid {ssh_key(tmp_path / 'unrelated')}")
    failed(
        r,
        "tag protocol-tiny: the tag object carries an OpenPGP signature, not an SSH signature",
        extra=("--allowed-signers", str(allowed)),
    )
    assert "signed, not verified (pass --allowed-signers FILE)" in audit(r).stdout


def test_sign_without_a_signing_key_is_refused(tmp_path):
    r = tmp_path / "study"
    (r / "protocols").mkdir(parents=True)
    shutil.copytree(ROOT / "configs", r / "configs")
    (r / PROTO).write_text(tiny_protocol(prereg="true", steps=6))
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "test@example.invalid")
    git(r, "config", "user.name", "Test")
    git(r, "config", "gpg.format", "ssh")
    git(r, "config", "user.signingkey", str(tmp_path / "no-such-key"))
    git(r, "add", "-A")
    git(r, "commit", "-qm", "study")
    t = harness(r, "tag", PROTO, "--sign")
    assert t.returncode == 2 and "git could not sign and create tag protocol-tiny" in t.stderr, t.stderr
    assert "Traceback" not in t.stderr
    assert git(r, "tag", "-l") == ""


# -- the audit reads what the harness accepted ----------------------------------------------------


@pytest.mark.process
def test_a_safe_dump_protocol_is_tagged_run_and_audited(tmp_path):
    """The issue's case: a long quoted description folded over three lines by yaml.safe_dump."""
    import yaml

    doc = yaml.safe_load(tiny_protocol(prereg="true", steps=6))
    doc["description"] = (
        "A long description: written by yaml.safe_dump, which quotes it for the colon and folds "
        "it over three lines because it is longer than the width"
    )
    r = tmp_path / "study"
    (r / "protocols").mkdir(parents=True)
    for sub in ("configs", *PACKAGES):
        shutil.copytree(ROOT / sub, r / sub, ignore=shutil.ignore_patterns("__pycache__"))
    (r / ".gitignore").write_text("runs/\n__pycache__/\n")
    (r / PROTO).write_text(yaml.safe_dump(doc, width=60))
    assert (r / PROTO).read_text().count("\n  ") >= 2
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "test@example.invalid")
    git(r, "config", "user.name", "Test")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "study")
    assert harness(r, "tag", PROTO).returncode == 0
    run = harness(r, "run", PROTO, "--quiet")
    assert run.returncode == 0, run.stdout + run.stderr
    a = audit(r)
    assert a.returncode == NOT_VERIFIED, a.stdout
    assert "Integrity: everything matched." in a.stdout


@pytest.mark.process
def test_plug_in_importing_from_an_exempt_folder_is_refused(tmp_path):
    r = tmp_path / "study"
    (r / "protocols").mkdir(parents=True)
    for sub in ("configs", *PACKAGES):
        shutil.copytree(ROOT / sub, r / sub, ignore=shutil.ignore_patterns("__pycache__"))
    (r / ".gitignore").write_text("runs/\n__pycache__/\n")
    (r / "benchmarks").mkdir()
    (r / "benchmarks" / "__init__.py").write_text("")
    (r / "benchmarks" / "helper.py").write_text("FOREACH = True  # exempt: may change after the tag\n")
    (r / "plugs").mkdir()
    arm = (ROOT / "examples" / "foreach_arm.py").read_text()
    (r / "plugs" / "arm.py").write_text(
        arm.replace(
            "import torch\n", "import torch\n\nfrom benchmarks.helper import FOREACH  # noqa: F401\n", 1
        )
    )
    (r / "plugs" / "dyn.py").write_text(
        arm.replace(
            "def build(ctx: ArmContext) -> ForeachAdamW:\n",
            "def build(ctx: ArmContext) -> ForeachAdamW:\n    import importlib\n"
            "    importlib.import_module('bench' + 'marks.helper')\n",
        )
    )
    for name in ("arm", "dyn"):
        (r / "protocols" / f"{name}.yaml").write_text(
            tiny_protocol(id=name, prereg="true", steps=6).replace(
                "[native, cotangent]", f"[native, plugs.{name}:build]"
            )
        )
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "test@example.invalid")
    git(r, "config", "user.name", "Test")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "study")
    for name in ("arm", "dyn"):
        t = harness(r, "tag", f"protocols/{name}.yaml")
        assert t.returncode == 0, t.stderr
    s = harness(r, "run", "protocols/arm.yaml", "--quiet")
    assert s.returncode == 2, s.stdout + s.stderr
    assert (
        "plugs/arm.py:15: imports benchmarks.helper, which lies in benchmarks/, exempt from the freeze"
        in s.stderr
    )
    assert not (r / "records" / "arm").exists()
    # a dynamic import gets past the static check, not past the worker's bootstrap: the run fails, saying why
    d = harness(r, "run", "protocols/dyn.yaml", "--quiet", "--no-report")
    assert d.returncode == 1, d.stdout + d.stderr
    failed_runs = [x for x in record_dicts(r / "records" / "dyn") if x["status"] == "failed"]
    assert failed_runs and all(x["spec"]["arm"] == "plugs.dyn:build" for x in failed_runs)
    assert "lies in benchmarks/, which the freeze exempts" in failed_runs[0]["reason"]


# -- review findings: hidden edits, emptied folders, nested repositories ----------------------------


@pytest.mark.parametrize("mark", ["skip-worktree", "assume-unchanged"])
def test_a_frozen_file_hidden_from_git_status_is_refused(study, mark):
    """git status does not look at a file marked skip-worktree or assume-unchanged, so an edit to a
    frozen file (a plug-in's helper, say) would run unseen: the mark itself is refused."""
    git(study, "update-index", f"--{mark}", "configs/tiny_conv.yaml")
    refused(study, f"configs/tiny_conv.yaml: marked {mark} in git's index", in_process=True)


def test_an_edit_hidden_by_a_clean_filter_is_refused(study):
    """Issue 35's fourth attack: an edit to a frozen file hidden from git status and git diff by a
    clean filter in .git/info/attributes and repo-local config. The run is refused, naming it,
    because the working tree's bytes are compared with the blobs directly."""
    rel = "configs/tiny_gqa.yaml"  # frozen, and named by no manifest field but its tree
    oid = git(study, "rev-parse", f"HEAD:{rel}").strip()
    (study / ".git" / "info").mkdir(exist_ok=True)
    (study / ".git" / "info" / "attributes").write_text(f"{rel} filter=hide\n")
    git(study, "config", "filter.hide.clean", f"git cat-file blob {oid}")
    (study / rel).write_text((study / rel).read_text() + "# the payload\n")
    git(study, "add", rel)  # staged, even: the filter gives the committed blob back
    assert rel not in git(study, "status", "--porcelain") and git(study, "diff", "HEAD", "--", rel) == ""
    refused(
        study,
        f"{rel}: its bytes on disk are not the committed blob although git may call it clean",
        in_process=True,
    )


def test_a_folder_emptied_of_its_records_fails_against_its_heads(study):
    manifest_path = study / RECS / "MANIFEST"
    manifest = json.loads(manifest_path.read_text())
    head = manifest["ledger_head"]
    for p in [*(study / RECS).glob("*.record.json"), *(study / RECS).glob("*.started.json")]:
        p.unlink()
    manifest_path.write_text(json.dumps({**manifest, "records": {}, "started": {}}))
    failed(study, f"ledger_head seq {head['seq']}", "records were removed")
    manifest_path.write_text(json.dumps({**manifest, "records": {}, "started": {}, "ledger_head": None}))
    failed(
        study,
        "the folder holds no record at that position",
        extra=("--head", f"{head['seq']}:{head['sha256']}"),
    )


def test_a_manifest_field_of_the_wrong_json_type_is_named_not_a_traceback(study):
    """MANIFEST's ``looks`` not an object, and an emptied folder's ``ledger_head.seq`` not a
    position: each named by field (the audit read both unchecked before, and crashed)."""
    manifest_path = study / RECS / "MANIFEST"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "looks": ["look1.look.json"]}))
    failed(study, "field looks is not a JSON object", "MANIFEST malformed")
    for p in [*(study / RECS).glob("*.record.json"), *(study / RECS).glob("*.started.json")]:
        p.unlink()
    head = {**manifest["ledger_head"], "seq": "9"}
    manifest_path.write_text(json.dumps({**manifest, "records": {}, "started": {}, "ledger_head": head}))
    failed(study, "field ledger_head.seq = '9' is not a position")


def test_records_inside_a_nested_repository_fail(study):
    """A records folder that is (or lies in) a git repository of its own would have the audit read
    that repository's tags instead of the study's."""
    git(study / RECS, "init", "-q")
    failed(study, "lies inside another one")


# -- the tag travels with the records ---------------------------------------------------------------


def test_the_records_folder_keeps_the_tag_object(study):
    """A clone without the tag ref (a branch pushed without tags) audits from the TAG file the runner
    keeps; a TAG that is not the tag's object, or names a commit the repository lacks, fails."""
    kept = (study / RECS / "TAG").read_bytes()
    assert (
        kept
        == subprocess.run(
            ["git", "cat-file", "tag", "protocol-tiny"], cwd=study, capture_output=True, check=True
        ).stdout
    )
    git(study, "tag", "-d", "protocol-tiny")
    a = audit(study)
    assert a.returncode == NOT_VERIFIED, a.stdout
    assert any(
        line.startswith("what ran is what was frozen") and "ok:" in line for line in a.stdout.splitlines()
    )
    (study / RECS / "TAG").write_bytes(kept.replace(b"tagger ", b"tagger X", 1))  # another object id
    failed(study, "field protocol.tag_object")
    (study / RECS / "TAG").write_bytes(b"object " + b"0" * 40 + kept[47:])
    failed(study, "is not in the git repository")


def test_a_tag_file_other_than_the_repository_s_tag_fails(study):
    kept = (study / RECS / "TAG").read_bytes()
    (study / RECS / "TAG").write_bytes(kept.replace(b"tagger ", b"tagger X", 1))
    failed(study, "TAG is not the object of the repository's tag protocol-tiny")


@pytest.mark.process
def test_a_signed_tag_verifies_from_the_tag_file(tmp_path):
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    key = tmp_path / "key"
    pub = ssh_key(key)
    r = signed_study(tmp_path / "study", (("gpg.format", "ssh"), ("user.signingkey", str(key))))
    git(r, "tag", "-d", "protocol-tiny")
    good = tmp_path / "allowed"
    good.write_text(f"test@example.invalid {pub}")
    ok = audit(r, "--allowed-signers", str(good))
    assert ok.returncode == 0, ok.stdout
    assert "good SSH signature by test@example.invalid" in ok.stdout

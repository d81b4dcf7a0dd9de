"""The reader holds only the maintainers' keys (issue 50): the auditor taken from the signed tag and
never from bytecode, signed result heads and one NOT VERIFIED status, no planted bytecode in the
runner, ref checkouts made without hooks and checked against the ref's tree, and the started entry
anchored before its worker starts. Each attack is driven as an attacker would, through the CLI and
the public audit, in a scratch repository (a copy of a tagged, complete study, or a fresh one)."""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import signal
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import git, harness, private_copy, tiny_protocol
from test_integrity import PROTO, RECS, audit, chain
from test_provenance import refused, reseal_all, signed_study, ssh_key, ssh_signed_study

from audit.cli import NOT_VERIFIED
from harness.freeze import bytecode_problems, faithful_cache
from prereg.formats.record import read_entry

CACHE = f"cli.{sys.implementation.cache_tag}.pyc"


@pytest.fixture
def study(tagged_done_study: Path, tmp_path: Path) -> Path:
    return private_copy(tagged_done_study, tmp_path / "copy")


def own_audit(repo: Path, *args: str, where: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The audit program the repository holds (or ``where`` holds), run as the README runs it."""
    script = (where or repo) / "analysis" / "public_audit.py"
    return subprocess.run(
        [sys.executable, "-I", "-S", "-B", str(script), RECS, *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )


def plant(source: Path, cache: Path, edit) -> None:
    """An unchecked-hash ``.pyc`` at ``cache`` of ``source`` doctored by ``edit`` (Python loads it
    without looking at the source)."""
    doctored = cache.parent / "doctored.py"
    cache.parent.mkdir(parents=True, exist_ok=True)
    doctored.write_text(edit(source.read_text()))
    py_compile.compile(
        str(doctored),
        cfile=str(cache),
        dfile=str(source),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    doctored.unlink()


def passing_main(text: str) -> str:
    """audit/cli.py whose main says everything matched and exits 0."""
    return text.replace(
        "def main(argv: list[str]) -> int:\n",
        "def main(argv: list[str]) -> int:\n    print('Integrity: everything matched.')\n    return 0\n",
        1,
    )


def halve_training(r: dict) -> None:
    if r.get("status") == "ok":
        r["timings"]["training_s"] /= 2


def halve_training_consistently(r: dict) -> None:
    """A careful forger's halving: the timed steps' own times, the curve's clock and training_s
    together, so the record agrees with itself (the audit's clock check passes) and only a key
    can tell."""
    if r.get("status") != "ok":
        return
    t, steps, w = r["timings"], r.get("step_times"), r["spec"].get("warmup_steps") or 0
    old = t["training_s"]
    if steps:
        steps["wall_us"] = [*steps["wall_us"][:w], *(v // 2 for v in steps["wall_us"][w:])]
        t["training_s"] = sum(steps["wall_us"][w:]) / 1e6
    else:
        t["training_s"] = old / 2
    for point in r.get("curve") or []:
        point[2] *= t["training_s"] / old
    if r.get("curve"):
        r["curve"][-1][2] = t["training_s"]


# -- 1. the auditor is source, from the signed tag -----------------------------------------------------


def test_doctored_audit_bytecode_is_never_read_and_refused_when_tracked(study, tmp_path):
    """Issue 50, case 1: a forged, resealed study fails; a doctored ``audit/cli.py`` planted as an
    unchecked-hash ``.pyc`` (every ``.py`` byte-identical) is never read in a checkout, and once
    tracked (``git add -f``), a fresh clone's audit refuses to run, naming it."""
    last = read_entry(chain(study)[-1])
    genuine = f"{last['ledger']['seq']}:{last['sha256']}"
    reseal_all(study, halve_training)
    assert own_audit(study, "--head", genuine).returncode == 1
    cache = study / "audit" / "__pycache__" / CACHE
    plant(study / "audit" / "cli.py", cache, passing_main)
    a = own_audit(study, "--head", genuine)
    assert a.returncode == 1 and "problem(s)" in a.stdout, a.stdout[-2000:]  # compiled from source
    git(study, "add", "-A")
    git(study, "add", "-f", str(cache.relative_to(study)))
    git(study, "commit", "-qm", "records")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(study), str(clone)], check=True)
    assert (clone / "audit" / "__pycache__" / CACHE).is_file()
    a = own_audit(clone, "--head", genuine)
    assert a.returncode == 1, a.stdout
    assert f"audit/__pycache__/{CACHE}" in a.stdout and "not Python source" in a.stdout
    assert "everything matched" not in a.stdout


def test_an_extracted_audit_refuses_any_file_that_is_not_source(study, tmp_path):
    """The audit taken with ``git archive`` (no git checkout around it) refuses bytecode inside its
    own packages, whether or not git tracked it."""
    fresh = extract(study, "protocol-tiny", tmp_path / "fresh")
    ok = own_audit(study, where=fresh)
    assert ok.returncode == NOT_VERIFIED and "Integrity: everything matched." in ok.stdout, ok.stdout[-2000:]
    assert not list(fresh.rglob("__pycache__"))  # -B: the audit wrote no bytecode
    plant(fresh / "audit" / "cli.py", fresh / "audit" / "__pycache__" / CACHE, passing_main)
    a = own_audit(study, where=fresh)
    assert a.returncode == 1 and f"audit/__pycache__/{CACHE}" in a.stdout, a.stdout


# -- 2. signed result heads; exit 0 only with the reader's own keys -----------------------------------


def extract(repo: Path, rev: str, fresh: Path) -> Path:
    """``git archive REV | tar -x -C FRESH``: the tree of ``rev``, outside the repository."""
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir()
    archive = subprocess.run(["git", "archive", rev], cwd=repo, capture_output=True, check=True)
    tarfile.open(fileobj=BytesIO(archive.stdout)).extractall(fresh)
    return fresh


def _verify(clone: Path, fresh: Path, signers: Path | str | None) -> subprocess.CompletedProcess[str]:
    """docs/provenance.md, "Verifying a study", command by command: the protocol tag kept with the
    records made an object again, its signature verified with the reader's keys, the audit taken
    from its tree and run with those keys."""
    obj = (
        subprocess.run(
            ["git", "mktag"],
            cwd=clone,
            input=(clone / RECS / "TAG").read_bytes(),
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    if signers is not None:
        v = subprocess.run(
            ["git", "-c", f"gpg.ssh.allowedSignersFile={signers}", "verify-tag", obj],
            cwd=clone,
            capture_output=True,
            text=True,
        )
        if v.returncode != 0:
            return v
    extract(clone, obj, fresh)
    return subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-B",
            str(fresh / "analysis" / "public_audit.py"),
            RECS,
            *(["--allowed-signers", str(signers)] if signers is not None else []),
        ],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.process
def test_the_verification_recipe_from_a_fresh_clone_passes_only_with_outside_keys(tmp_path):
    """Issue 50, cases 1 and 7: the study's run signs its ledger head; a fresh clone verifies with
    the recipe (the tags' signatures, then the audit from the signed tag) and exits 0 only with the
    reader's own keys. No roots or the repository's signers file: exit 3, the same status. A copy
    of its file kept outside (issue 59, case 3) verifies and prints the key's fingerprint. A forgery
    resealed and signed again by another key: exit 1."""
    r, _, pub, forger, forged_pub = ssh_signed_study(tmp_path, 'maintainers@example.invalid namespaces="git"')
    assert (r / RECS / "RESULT").is_file() and "result-tiny" in git(r, "tag", "-l")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "records")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(r), str(clone)], check=True)
    mine = tmp_path / "trusted" / "allowed_signers"  # the reader's own file: their own principal name
    mine.parent.mkdir()
    mine.write_text(f"release-keys {pub}")
    fresh = tmp_path / "fresh"
    ok = _verify(clone, fresh, mine)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "Verified: each study's protocol tag and ledger head are signed by keys of" in ok.stdout
    assert "good SSH signature by release-keys" in ok.stdout
    none = _verify(clone, fresh, None)
    assert none.returncode == NOT_VERIFIED and "NOT VERIFIED" in none.stdout, none.stdout[-2000:]
    assert "the protocol tag's signature is not verified" in none.stdout
    inside = _verify(clone, fresh, "protocols/allowed_signers")
    assert inside.returncode == NOT_VERIFIED and inside.stdout.startswith("TRUST ROOTS FROM THE REPOSITORY")
    # issue 59, case 3: no judging by bytes. A byte copy of the maintainers' file (what an honest
    # reader holds) and a copy with a cosmetic edit both verify, and both print the key's
    # fingerprint, which is what the reader compares (was: exit 3 for the copy, 0 for the edit)
    fingerprint = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(tmp_path / "key.pub")], capture_output=True, text=True
    ).stdout.split()[1]
    assert fingerprint.startswith("SHA256:")
    copy = tmp_path / "copied_signers"
    shutil.copy(clone / "protocols" / "allowed_signers", copy)
    copied = _verify(clone, fresh, copy)
    assert copied.returncode == 0 and "holds the same bytes as" not in copied.stdout, copied.stdout
    edited = tmp_path / "edited_signers"
    edited.write_text("# renamed\n" + copy.read_text().replace("maintainers@", "someone@") + "  \n")
    cosmetic = _verify(clone, fresh, edited)
    assert cosmetic.returncode == 0, cosmetic.stdout
    for out in (ok, copied, cosmetic):
        assert (
            f"(key {fingerprint})" in out.stdout and f"outside the repository: {fingerprint}." in out.stdout
        )
    # the forgery: training_s halved with its steps, resealed, the head signed again by the forger's key
    reseal_all(clone, halve_training_consistently)
    git(clone, "config", "gpg.format", "ssh")
    git(clone, "config", "user.signingkey", str(forger))
    assert harness(clone, "report", PROTO, "--quiet", "--sign").returncode == 0
    forged = _verify(clone, fresh, None)  # without keys: the forgery agrees with itself, not verified
    assert forged.returncode == NOT_VERIFIED, forged.stdout[-2000:]
    bad = subprocess.run(
        [sys.executable, "-I", "-S", "-B", str(fresh / "analysis" / "public_audit.py"), RECS]
        + ["--allowed-signers", str(mine)],
        cwd=clone,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "RESULT: its signature does not verify against" in bad.stdout, bad.stdout
    assert forged_pub not in mine.read_text()


@pytest.mark.process
def test_a_head_short_of_the_chain_is_not_vouched(tmp_path):
    """A signed head that the chain has grown past (a later run appended) vouches for nothing after
    it; an edited RESULT naming another head is named."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    key = tmp_path / "key"
    pub = ssh_key(key)
    r = signed_study(tmp_path / "study", (("gpg.format", "ssh"), ("user.signingkey", str(key))))
    mine = tmp_path / "mine"
    mine.write_text(f"reader {pub}")
    ok = audit(r, "--allowed-signers", str(mine))
    assert ok.returncode == 0 and "\nVerified: " in ok.stdout, ok.stdout[-2000:]
    # issue 59, case 12: keys alone: a key holder's redraw is named as not excluded
    assert "a key holder's redraw (a run killed, its started entry deleted" in ok.stdout
    middle = chain(r)[3]
    entry = middle.read_bytes()
    middle.unlink()  # an entry of the chain removed: the records fail, the signatures still verify
    failed = audit(r, "--allowed-signers", str(mine))  # was: "Verified: ..." above exit 1
    assert failed.returncode == 1 and "Verified" not in failed.stdout.replace("NOT VERIFIED", ""), (
        failed.stdout
    )
    assert "NOT VERIFIED (exit status 1)" in failed.stdout
    middle.write_bytes(entry)
    kept = (r / RECS / "RESULT").read_bytes()
    last = read_entry(chain(r)[-1])
    n, head = last["ledger"]["seq"], last["sha256"]
    (r / RECS / "RESULT").write_bytes(kept.replace(head.encode(), b"0" * 64))
    a = audit(r, "--allowed-signers", str(mine))
    assert a.returncode == 1 and "history was rewritten after it was signed" in a.stdout, a.stdout
    (r / RECS / "RESULT").write_bytes(kept)
    prev = read_entry(chain(r)[-2])
    (r / RECS / "RESULT").unlink()
    git(r, "tag", "-d", "result-tiny")
    from harness.freeze import sign_result
    from harness.protocol import load_protocol

    cwd = os.getcwd()
    os.chdir(r)
    try:
        sign_result(load_protocol(r / PROTO), prev["ledger"]["seq"], prev["sha256"])
    finally:
        os.chdir(cwd)
    short = audit(r, "--allowed-signers", str(mine))
    assert short.returncode == NOT_VERIFIED, short.stdout
    assert f"the signed result head is seq {n - 1}, but the chain goes on to seq {n}" in short.stdout


# -- 3. no bytecode in the runner, no hooks in ref checkouts -----------------------------------------


def test_planted_runner_bytecode_is_refused_before_a_run_and_a_faithful_cache_is_not(study):
    """Issue 50, case 3: an unchecked-hash ``.pyc`` of ``harness/ledger.py`` that halves
    ``training_s`` before sealing (``git status`` clean: ``__pycache__`` is ignored) is refused by
    ``harness run``, naming it; the cache Python itself writes of the same source is not."""
    source = study / "harness" / "ledger.py"
    cache = study / "harness" / "__pycache__" / f"ledger.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(str(source), cfile=str(cache), dfile=str(source), doraise=True)
    assert faithful_cache(cache) and bytecode_problems(study) == []
    plant(source, cache, lambda t: t + "\n\ndef _doctored():\n    return 0.5\n")
    assert not faithful_cache(cache)
    assert git(study, "status", "--porcelain", "--untracked-files=all", "--", "harness") == ""
    refused(study, f"harness/__pycache__/{cache.name}: bytecode in a frozen folder that is not")
    sourceless = study / "harness" / "ledger.pyc"  # imported when ledger.py is gone
    cache.unlink()
    py_compile.compile(str(source), cfile=str(sourceless), doraise=True)
    assert any(p.startswith("harness/ledger.pyc: bytecode") for p in bytecode_problems(study))


def test_the_runner_bytecode_check_cannot_be_switched_off_by_its_own_cache(study):
    """Issue 59, case 5: unchecked-hash caches of ``harness/freeze.py`` (whose bytecode check then
    finds nothing) and of ``harness/ledger.py`` (doctored) in the ignored ``__pycache__`` let a run
    go on. The project's modules are now compiled from source, never read from a cache, so the
    check runs as its source says and names the planted caches; nothing is run."""
    tag = sys.implementation.cache_tag
    freeze_cache = study / "harness" / "__pycache__" / f"freeze.{tag}.pyc"
    plant(
        study / "harness" / "freeze.py",
        freeze_cache,
        lambda t: t + "\n\ndef bytecode_problems(root):\n    return []\n",
    )
    ledger_cache = study / "harness" / "__pycache__" / f"ledger.{tag}.pyc"
    plant(
        study / "harness" / "ledger.py", ledger_cache, lambda t: t + "\n\ndef _doctored():\n    return 0.5\n"
    )
    assert git(study, "status", "--porcelain", "--untracked-files=all", "--", "harness") == ""
    refused(study, f"harness/__pycache__/{freeze_cache.name}: bytecode in a frozen folder that is not")


@pytest.mark.parametrize("mode", list(py_compile.PycInvalidationMode), ids=lambda m: m.name)
def test_a_cache_is_judged_by_its_code_not_its_header(tmp_path, mode):
    """Each kind of ``.pyc`` Python writes passes when it is the source's compilation, and fails
    with its header kept and another source's code behind it; a stale cache that Python would not
    read (the source edited since) passes."""
    source = tmp_path / "m.py"
    source.write_text("x = 1\n")
    cache = tmp_path / "__pycache__" / f"m.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(str(source), cfile=str(cache), invalidation_mode=mode, doraise=True)
    assert faithful_cache(cache)
    other = tmp_path / "other.py"
    other.write_text("x = 2\n")
    py_compile.compile(str(other), cfile=str(tmp_path / "o.pyc"), invalidation_mode=mode, doraise=True)
    cache.write_bytes(cache.read_bytes()[:16] + (tmp_path / "o.pyc").read_bytes()[16:])
    assert not faithful_cache(cache)
    if mode is not py_compile.PycInvalidationMode.UNCHECKED_HASH:
        source.write_text("x = 3  # edited since\n")
        assert faithful_cache(cache)  # stale: Python compiles the source instead


def test_tracked_bytecode_is_refused_before_tag(study):
    """A ``.pyc`` committed with ``git add -f`` inside a frozen folder: ``harness tag`` of a new
    protocol refuses, naming it."""
    cache = study / "harness" / "__pycache__" / f"ledger.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(str(study / "harness" / "ledger.py"), cfile=str(cache), doraise=True)
    (study / "protocols" / "tiny2.yaml").write_text(tiny_protocol(id="tiny2", prereg="true", steps=6))
    git(study, "add", "-f", "protocols/tiny2.yaml", str(cache.relative_to(study)))
    git(study, "commit", "-qm", "bytecode")
    t = harness(study, "tag", "protocols/tiny2.yaml")
    assert t.returncode == 2, t.stdout + t.stderr
    assert f"harness/__pycache__/{cache.name}: bytecode tracked in a frozen folder" in t.stderr


def test_workers_and_commands_write_no_bytecode():
    from harness.execute.commands import command_environment
    from harness.execute.launchers import worker_command

    assert worker_command()[1:3] == ["-I", "-B"]
    spec = SimpleNamespace(command={"command": ["python", "x.py"]}, threads=None, planted=None)
    assert command_environment(spec, Path("out.json"))["PYTHONDONTWRITEBYTECODE"] == "1"  # type: ignore[arg-type]
    import harness  # noqa: F401 - the CLI's package

    assert sys.dont_write_bytecode


def _two_commits(repo: Path) -> str:
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.invalid")
    git(repo, "config", "user.name", "T")
    (repo / "train.py").write_text("print('baseline')\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    return git(repo, "rev-parse", "HEAD").strip()


def test_a_post_checkout_hook_does_not_rewrite_a_ref_checkout(tmp_path):
    """Issue 50, case 5: an untracked ``.git/hooks/post-checkout`` that edits the candidate's
    script after ``git worktree add`` never runs; a smudge filter that changes it is caught by the
    blob-by-blob comparison and fails the run with its reason."""
    from harness.execute.commands import ref_checkout
    from prereg.evidence import EvidenceError

    repo = tmp_path / "repo"
    ref = _two_commits(repo)
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text("#!/bin/sh\necho 'import time; time.sleep = lambda s: None' >> train.py\n")
    hook.chmod(0o755)
    spec = SimpleNamespace(command={"ref": ref}, run_id="r1")
    keep: list[Path] = []
    where = ref_checkout(spec, repo, tmp_path / "work", keep)  # type: ignore[arg-type]
    assert (where / "train.py").read_text() == "print('baseline')\n"
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("*.py filter=evil\n")
    git(repo, "config", "filter.evil.smudge", "sed s/baseline/candidate/")
    with pytest.raises(EvidenceError, match="train.py is not the committed blob"):
        ref_checkout(spec, repo, tmp_path / "work", keep)  # type: ignore[arg-type]


# -- 5. the started entry anchored before its worker starts --------------------------------------------


@pytest.mark.process
def test_a_deleted_unfinished_attempt_is_named_under_anchor(tmp_path):
    """Issue 50, case 6: ``harness run --anchor`` killed while its first worker runs; its started
    entry (the chain's tail, no reseal needed) deleted and the study resumed: the audit with
    ``--anchor`` names the anchored head the records no longer hold."""
    from test_attempts import alive, running_worker, wait_for

    from prereg.formats.record import entry_files

    remote = tmp_path / "anchor.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    from test_integrity import make_study

    repo = make_study(tmp_path, text=tiny_protocol(prereg="true", steps=100))
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            PROTO,
            "--quiet",
            "--no-report",
            "--anchor",
            str(remote),
        ],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    _, pid = wait_for(lambda: running_worker(repo), what="a running worker")
    assert alive(pid)
    p.send_signal(signal.SIGKILL)
    p.wait()
    wait_for(lambda: not alive(pid), timeout=30, what="the worker to die with its runner")
    (tail,) = entry_files(repo / RECS)
    assert tail.name.endswith(".started.json")
    assert "seq 1" in git(remote, "log", "--format=%s", "refs/ledger/protocol-tiny")
    tail.unlink()
    (repo / RECS / "MANIFEST").unlink(missing_ok=True)
    shutil.rmtree(repo / "runs")
    r = harness(repo, "run", PROTO, "--quiet", "--no-report", "--anchor", str(remote))
    assert r.returncode == 0, r.stdout + r.stderr
    a = audit(repo, "--anchor", str(remote))
    assert a.returncode == 1, a.stdout
    assert "anchored head seq 1" in a.stdout and "history was rewritten after it was anchored" in a.stdout


@pytest.mark.process
def test_a_signed_head_of_one_replicate_never_verifies_the_study(tmp_path):
    """Issue 59, case 10: replicate 1 of 2 run and its head signed (``harness report --sign``) verified
    as the study (exit 0, INCOMPLETE), so later replicates could be hidden behind a valid signature.
    Now the head is "replicate 1 of 2" and the study is NOT VERIFIED (exit 3)."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    from conftest import ROOT
    from test_provenance import PACKAGES

    key = tmp_path / "key"
    pub = ssh_key(key)
    r = tmp_path / "study"
    (r / "protocols").mkdir(parents=True)
    for sub in ("configs", *PACKAGES):
        shutil.copytree(ROOT / sub, r / sub, ignore=shutil.ignore_patterns("__pycache__"))
    (r / ".gitignore").write_text("runs/\n__pycache__/\n")
    text = tiny_protocol(prereg="true", steps=5).replace("seeds: [1, 2]", "seeds: [1, 2, 3, 4]")
    (r / PROTO).write_text(
        text.replace("order_seed:", "replicates: {count: 2, min_gap_s: 0}\norder_seed:", 1)
    )
    git(r, "init", "-q", "-b", "main")
    for k, v in (("user.email", "t@example.invalid"), ("user.name", "T"), ("gpg.format", "ssh")):
        git(r, "config", k, v)
    git(r, "config", "user.signingkey", str(key))
    git(r, "add", "-A")
    git(r, "commit", "-qm", "study")
    assert harness(r, "tag", PROTO, "--sign").returncode == 0
    one = harness(r, "run", PROTO, "--quiet", "--replicate", "1", "--no-report")
    assert one.returncode == 0, one.stdout + one.stderr
    signed = harness(r, "report", PROTO, "--quiet", "--sign")
    assert signed.returncode == 0, signed.stdout + signed.stderr
    mine = tmp_path / "mine"
    mine.write_text(f"reader {pub}")
    a = audit(r, "--allowed-signers", str(mine))
    assert a.returncode == NOT_VERIFIED, a.stdout[-3000:]
    assert "closes replicate 1 of 2: it vouches for the replicates up to it, not for the study" in a.stdout
    assert "\nVerified" not in a.stdout


def _recipe(clone: Path, keys: Path) -> subprocess.CompletedProcess[str]:
    """docs/provenance.md's "Verifying a study" block, run as bash in ``clone`` as written there,
    ``RECORDS`` the study's folder and ``$HOME/trusted/allowed_signers`` the reader's ``keys``."""
    text = (Path(__file__).parents[1] / "docs" / "provenance.md").read_text()
    block = text.split("## Verifying a study", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    home = keys.parent.parent
    assert keys == home / "trusted" / "allowed_signers"
    return subprocess.run(
        ["bash", "-e", "-c", block.replace("RECORDS", RECS)],
        cwd=clone,
        env={**os.environ, "HOME": str(home), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _release(r: Path, name: str, marker: str, key: Path, *, apart: bool = False, date: str) -> None:
    """A release tag ``name`` signed by ``key``, on a new commit whose auditor prints ``marker``
    first: on main, or (``apart``) on a history of its own that does not hold the study's tag."""
    if apart:
        git(r, "checkout", "-q", "--orphan", f"apart-{name}")
    cli = r / "audit" / "cli.py"
    cli.write_text(
        cli.read_text().replace(
            "def main(argv: list[str]) -> int:\n",
            f"def main(argv: list[str]) -> int:\n    print({marker!r})\n",
            1,
        )
    )
    git(r, "commit", "-qam", f"release {name}")
    env = {**os.environ, "GIT_COMMITTER_DATE": date}
    subprocess.run(
        ["git", "-c", f"user.signingkey={key}", "tag", "-s", "-m", name, name],
        cwd=r,
        env=env,
        check=True,
        capture_output=True,
    )
    git(r, "checkout", "-q", "main")


@pytest.mark.process
def test_the_recipe_runs_the_newest_signed_auditor_that_holds_the_study(tmp_path):
    """Issue 59, case 2: the docs' recipe, run as written, takes the auditor of the newest release
    signed by the reader's keys whose history holds the study's tag: not the study's own tag's, not
    an older release tagged later, not a newer one signed by another key."""
    r, key, pub, forger, _ = ssh_signed_study(tmp_path, 'maintainers@example.invalid namespaces="git"')
    git(r, "add", "-A")
    git(r, "commit", "-qm", "records")
    _release(r, "audit-2", "AUDITOR OF RELEASE audit-2", key, date="2030-01-01T00:00:00")
    _release(r, "audit-1", "AUDITOR OLDER THAN THE STUDY", key, apart=True, date="2031-01-01T00:00:00")
    _release(r, "audit-9", "AUDITOR SIGNED BY ANOTHER KEY", forger, date="2032-01-01T00:00:00")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(r), str(clone)], check=True)
    keys = tmp_path / "home" / "trusted" / "allowed_signers"
    keys.parent.mkdir(parents=True)
    keys.write_text(f"release-keys {pub}")
    got = _recipe(clone, keys)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-2000:]
    assert got.stdout.startswith("AUDITOR OF RELEASE audit-2"), got.stdout[:500]
    assert "OLDER THAN" not in got.stdout and "ANOTHER KEY" not in got.stdout
    assert "Verified:" in got.stdout
    # without a release, the study's own tag's auditor (the first print is the audit's own)
    for t in ("audit-1", "audit-2", "audit-9"):
        git(clone, "tag", "-d", t)
    plain = _recipe(clone, keys)
    assert plain.returncode == 0 and "AUDITOR" not in plain.stdout, plain.stdout[-2000:]


def test_an_auditor_refuses_to_certify_a_records_schema_newer_than_it_knows(tmp_path):
    """Issue 59, case 2: records a newer harness wrote (MANIFEST's schema_version past every one
    this auditor knows) are not certified and not failed: exit 3, the schema named, no Verified."""
    from prereg.formats.ledger import SCHEMAS

    folder = tmp_path / "records"
    folder.mkdir()
    (folder / "r.record.json").write_text(json.dumps({"schema_version": max(SCHEMAS) + 1}))
    (folder / "MANIFEST").write_text(
        json.dumps({"schema_version": max(SCHEMAS) + 1, "records": {"r.record.json": "0" * 64}})
    )
    got = subprocess.run(
        [sys.executable, "-I", "-S", "-B", str(Path(__file__).parents[1] / "analysis" / "public_audit.py")]
        + [str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == NOT_VERIFIED, got.stdout
    assert f"NEWER THAN THIS AUDITOR: MANIFEST says records schema {max(SCHEMAS) + 1}" in got.stdout
    assert "Verified:" not in got.stdout and "NOT VERIFIED" in got.stdout
    (folder / "MANIFEST").write_text(json.dumps({"schema_version": max(SCHEMAS), "records": {}}))
    known = subprocess.run(
        [sys.executable, "-I", "-S", "-B", str(Path(__file__).parents[1] / "analysis" / "public_audit.py")]
        + [str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "NEWER THAN THIS AUDITOR" not in known.stdout


def _tagged_repo(tmp_path: Path, writes: int) -> Path:
    """A repository whose tag ``protocol-x`` holds a harness that writes records schema ``writes``,
    and a records folder of that study whose MANIFEST claims a schema newer than this auditor's."""
    from prereg.formats.ledger import SCHEMAS

    repo = tmp_path / f"repo{writes}"
    (repo / "prereg").mkdir(parents=True)
    (repo / "prereg" / "records.py").write_text(f"SCHEMA_VERSION = {writes}\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "harness")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "tag", "-am", "protocol", "protocol-x")
    folder = repo / "records" / "x"
    folder.mkdir(parents=True)
    (folder / "r.record.json").write_text(json.dumps({"schema_version": max(SCHEMAS) + 1}))
    manifest = {
        "schema_version": max(SCHEMAS) + 1,
        "records": {"r.record.json": "0" * 64},
        "protocol": {"id": "x"},
    }
    (folder / "MANIFEST").write_text(json.dumps(manifest))
    return folder


def test_a_manifest_edited_to_a_newer_schema_does_not_turn_a_failure_into_not_checked(tmp_path):
    """Review finding: "newer than this auditor" came from MANIFEST's schema_version alone, which
    nothing signs, so a forger turned exit 1 into exit 3 NOT CHECKED by editing it (records edited
    to match as well). Now the schema is the one the tagged harness writes (the signed tag fixes its
    commit): the edit is a failed "records schema" row, exit 1; a tag whose harness does write a
    newer schema still gives NOT CHECKED, exit 3."""
    from audit.folder import newer_schema
    from prereg.formats.ledger import SCHEMAS

    forged = _tagged_repo(tmp_path, max(SCHEMAS))
    newer, problem = newer_schema(str(forged))
    assert newer is None and problem is not None and "the harness at protocol-x says" in problem, problem
    got = subprocess.run(
        [sys.executable, "-I", "-S", "-B", str(Path(__file__).parents[1] / "analysis" / "public_audit.py")]
        + [str(forged)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 1, got.stdout
    assert "NEWER THAN THIS AUDITOR" not in got.stdout and "field schema_version" in got.stdout, got.stdout
    honest = _tagged_repo(tmp_path, max(SCHEMAS) + 1)
    newer, problem = newer_schema(str(honest))
    assert problem is None and newer is not None and "NEWER THAN THIS AUDITOR" in newer, newer


@pytest.mark.process
def test_a_replaced_plot_fails_against_the_signed_head_that_seals_it(tmp_path):
    """Issue 59, case 8: ``harness report --sign`` seals the PNG plots in the signed result head, so
    a plot replaced, removed or added afterwards fails the audit (exit 1, named); the folder no
    longer says "not verified" of them. A head signed without plots checks none (committed studies)."""
    r, _, pub, _, _ = ssh_signed_study(tmp_path, "maintainers@example.invalid")
    keys = tmp_path / "keys"
    keys.write_text(f"release-keys {pub}")
    unsealed = audit(r, "--allowed-signers", str(keys))
    assert unsealed.returncode == 0, unsealed.stdout[-2000:]
    assert harness(r, "report", PROTO, "--quiet", "--sign").returncode == 0
    plots = sorted((r / RECS).glob("plot_*.png"))
    assert plots, "the report drew no plot"
    assert "\nplots " in (r / RECS / "RESULT").read_text()
    ok = audit(r, "--allowed-signers", str(keys))
    assert ok.returncode == 0 and "PNG plots (not verified)" not in ok.stdout, ok.stdout[-2000:]
    original = plots[0].read_bytes()
    plots[0].write_bytes(original[:-8] + b"forged!!")
    bad = audit(r, "--allowed-signers", str(keys))
    assert bad.returncode == 1 and "the plot was replaced after the head was signed" in bad.stdout
    plots[0].unlink()
    gone = audit(r, "--allowed-signers", str(keys))
    assert gone.returncode == 1 and f"{plots[0].name}: missing; " in gone.stdout
    plots[0].write_bytes(original)
    assert audit(r, "--allowed-signers", str(keys)).returncode == 0


@pytest.mark.process
def test_an_unsigned_report_leaves_the_plots_a_signed_head_seals(tmp_path):
    """Review finding: ``harness report`` without ``--sign`` redrew the PNG plots that the signed
    head sealed (a newer matplotlib, another beside study: other bytes, and the audit failed). Now
    it leaves them (not rewritten: same mtime and inode), says so, and the audit still passes;
    ``--sign`` redraws them and signs the head again."""
    r, _, pub, _, _ = ssh_signed_study(tmp_path, "maintainers@example.invalid")
    keys = tmp_path / "keys"
    keys.write_text(f"release-keys {pub}")
    assert harness(r, "report", PROTO, "--quiet", "--sign").returncode == 0
    plots = sorted((r / RECS).glob("plot_*.png"))
    assert plots, "the report drew no plot"
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in plots}
    got = harness(r, "report", PROTO, "--quiet")
    assert got.returncode == 0, got.stderr
    assert "were left as the signed result head (RESULT) seals them" in got.stdout, got.stdout
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in plots} == before
    assert audit(r, "--allowed-signers", str(keys)).returncode == 0
    again = harness(r, "report", PROTO, "--quiet", "--sign")
    assert again.returncode == 0 and "were left" not in again.stdout, again.stdout
    assert audit(r, "--allowed-signers", str(keys)).returncode == 0


def test_a_head_whose_plot_count_is_not_its_plot_lines_is_named(tmp_path):
    """The audit compares the number of plots the head says (``plots N``) with the plot lines it
    seals: a head that repeats a name (two lines, one plot kept) or counts more is named."""
    import hashlib

    from audit.anchors import plot_problems

    (tmp_path / "plot_time.png").write_bytes(b"png")
    sealed = {"plot_time.png": hashlib.sha256(b"png").hexdigest()}
    assert plot_problems(str(tmp_path), sealed, "RESULT", "1") == []
    found = plot_problems(str(tmp_path), sealed, "RESULT", "2")
    assert len(found) == 1 and "says plots 2, but seals 1 plot line(s)" in found[0], found

"""What ran is what was hashed (issue 35, item 3): a worker imports frozen code only from bytes
whose hash the runner read once (and compared with the committed blobs), ``phase.c`` is compiled
from and loaded from bytes that were hashed, and an edit that git's filters hide from ``git
status`` is still seen, because the working tree's bytes are compared with the blobs directly."""

from __future__ import annotations

import ctypes
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git

from harness import freeze, gitutil
from harness.execute import launchers

RUN_WORKER = 'runpy.run_module("harness.execute.worker", run_name="__main__", alter_sys=True)'


def boot_importing(module: str) -> str:
    """The worker's real bootstrap, importing ``module`` where it would run the worker."""
    assert RUN_WORKER in launchers.BOOT
    return launchers.BOOT.replace(RUN_WORKER, f"import {module}; print('ran', {module}.VALUE)")


def frozen_folder(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    study = tmp_path / "study"
    (study / "plugs").mkdir(parents=True)
    (study / "plugs" / "__init__.py").write_text("")
    (study / "plugs" / "helper.py").write_text("VALUE = 'tagged'\n")
    env = launchers.worker_env(
        [str(Path(launchers.__file__).resolve().parents[2])], frozen=[str(study / "plugs")]
    )
    return study, env


def run_boot(study: Path, env: dict[str, str], module: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-c", boot_importing(module)],
        cwd=study,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_worker_imports_the_bytes_the_runner_hashed(tmp_path):
    study, env = frozen_folder(tmp_path)
    sources = json.loads(env["HARNESS_SOURCES"])
    listed = sources[str((study / "plugs").resolve())]
    assert listed["helper.py"] == hashlib.sha256(b"VALUE = 'tagged'\n").hexdigest()
    ok = run_boot(study, env, "plugs.helper")
    assert ok.returncode == 0 and "ran tagged" in ok.stdout, ok.stderr


def test_a_file_swapped_after_the_check_does_not_run(tmp_path):
    """The fork-server attack: the file is swapped after the runner read it (and would be restored
    after the import); the import fails, naming the file, instead of running the payload."""
    study, env = frozen_folder(tmp_path)
    (study / "plugs" / "helper.py").write_text("VALUE = 'payload'\n")
    bad = run_boot(study, env, "plugs.helper")
    assert bad.returncode != 0 and "ran payload" not in bad.stdout
    assert "its bytes are not the ones the runner verified before the run" in bad.stderr
    assert "helper.py" in bad.stderr


def test_a_file_added_after_the_check_does_not_run(tmp_path):
    study, env = frozen_folder(tmp_path)
    (study / "plugs" / "late.py").write_text("VALUE = 'late'\n")
    bad = run_boot(study, env, "plugs.late")
    assert bad.returncode != 0 and "not among the sources the runner verified" in bad.stderr


def test_the_record_s_code_hash_is_the_hash_of_the_checked_bytes(monkeypatch):
    """In a worker, harness_sha256 comes from the map the imports are checked against: the same
    value as a fresh read of an untouched tree, with no second read that could see other bytes."""
    fresh = freeze.code_sha256()
    env = launchers.worker_env([str(Path(launchers.__file__).resolve().parents[2])])
    monkeypatch.setenv("HARNESS_SOURCES", env["HARNESS_SOURCES"])
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"read {self} again"))
    assert freeze.code_sha256() == fresh


def test_the_phase_library_loaded_is_the_one_hashed(monkeypatch):
    """Swapping the cached library between its hash and ``dlopen`` changes nothing: the loaded
    bytes are a sealed copy of the hashed ones."""
    from cotangent import kernel

    cc = kernel.compiler()
    if cc is None or kernel.lane_widths(__import__("torch").backends.cpu.get_cpu_capability()) == []:
        pytest.skip("phase.c needs a C compiler and an x86-64 CPU with AVX2 (this machine has neither)")
    path = kernel.build(cc)
    good = path.read_bytes()
    real = ctypes.CDLL
    seen: list[str] = []

    def swap_then_load(name, *a, **k):
        seen.append(name)
        path.write_bytes(b"\x7fELF not a library")  # the planted swap, after the hash was taken
        return real(name, *a, **k)

    monkeypatch.setattr(kernel.ctypes, "CDLL", swap_then_load)
    try:
        lib = kernel._load(path)  # noqa: SLF001 - the loader under attack
        assert hasattr(lib, "cot_update")
        assert kernel.loaded_sha256() == hashlib.sha256(good).hexdigest()
        assert seen and seen[0] != str(path)
        if sys.platform.startswith("linux"):
            assert seen[0].startswith("/proc/self/fd/")
            with open(seen[0], "rb") as f:
                assert f.read() == good
            with pytest.raises(PermissionError), open(seen[0], "r+b") as f:
                f.write(b"x")  # sealed: no process can change it
    finally:
        path.write_bytes(good)


def test_phase_c_is_compiled_only_from_verified_bytes(monkeypatch):
    from cotangent import kernel

    env = launchers.worker_env([str(Path(launchers.__file__).resolve().parents[2])])
    monkeypatch.setenv("HARNESS_SOURCES", env["HARNESS_SOURCES"])
    assert kernel.verified_source() == kernel.SOURCE.read_bytes()

    monkeypatch.setenv(
        "HARNESS_SOURCES", json.dumps({str(kernel.SOURCE.parent.resolve()): {"phase.c": "0" * 64}})
    )
    with pytest.raises(RuntimeError, match="not the ones the runner verified"):
        kernel.verified_source()


@pytest.fixture
def filtered_repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "plugs").mkdir(parents=True)
    (r / "plugs" / "helper.py").write_text("DELAY = 0.0\n")
    (r / "docs").mkdir()
    (r / "docs" / "notes.md").write_text("notes\n")
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.email", "test@example.invalid")
    git(r, "config", "user.name", "Test")
    git(r, "add", "-A")
    git(r, "commit", "-qm", "study")
    return r


def test_an_edit_hidden_by_a_clean_filter_is_named(filtered_repo):
    """A clean filter in ``.git/info/attributes`` and repo-local config that gives back the committed
    bytes: ``git status`` and ``git diff`` are empty, the direct comparison is not."""
    r = filtered_repo
    oid = gitutil.tree_files(r, "HEAD")["plugs/helper.py"][1]
    (r / ".git" / "info").mkdir(exist_ok=True)
    (r / ".git" / "info" / "attributes").write_text("plugs/helper.py filter=hide\n")
    git(r, "config", "filter.hide.clean", f"git cat-file blob {oid}")
    (r / "plugs" / "helper.py").write_text("DELAY = 0.3  # the payload\n")
    git(r, "add", "-A")  # even staged: the filter gives the committed blob back
    assert git(r, "status", "--porcelain").strip() == ""
    assert git(r, "diff", "HEAD").strip() == ""
    found = freeze.worktree_mismatches(r, "HEAD")
    assert len(found) == 1 and found[0].startswith(
        "plugs/helper.py: its bytes on disk are not the committed blob"
    )
    assert freeze.uncommitted(r) == []  # what git status alone would have let through


def test_an_exempt_file_may_differ_and_an_untouched_tree_passes(filtered_repo):
    r = filtered_repo
    assert freeze.worktree_mismatches(r, "HEAD") == []
    (r / "docs" / "notes.md").write_text("edited\n")
    assert freeze.worktree_mismatches(r, "HEAD") == []  # docs/ is exempt from the freeze


def test_sources_read_for_the_workers_are_compared_with_the_blobs(filtered_repo):
    r = filtered_repo
    sources = launchers.source_hashes([str(r / "plugs")])
    assert freeze.sources_mismatches(r, "HEAD", sources) == []
    root = str((r / "plugs").resolve())
    forged = {root: {**sources[root], "helper.py": hashlib.sha256(b"DELAY = 0.3\n").hexdigest()}}
    assert freeze.sources_mismatches(r, "HEAD", forged) == [
        "plugs/helper.py: the bytes read for the workers are not the committed blob (changed during the check)"
    ]
    (r / "plugs" / "extra.py").write_text("")
    assert "plugs/extra.py: a source file the workers could import is not tracked" in " ".join(
        freeze.sources_mismatches(r, "HEAD", launchers.source_hashes([str(r / "plugs")]))
    )


def test_a_fork_server_that_cannot_import_verified_code_is_refused_cleanly(tmp_path):
    """The fork server imports the harness once; a module changed after the runner read it makes
    the start a refusal naming the module (exit 2 at the command line), before any run starts."""
    from prereg.errors import RefusedError

    code = str(Path(launchers.__file__).resolve().parents[2])
    env = launchers.worker_env([code])
    sources = json.loads(env["HARNESS_SOURCES"])
    root = next(r for r in sources if r.endswith(f"{Path('/').joinpath('harness')}"))
    sources[root]["execute/worker.py"] = "0" * 64  # as if worker.py had changed since the read
    env["HARNESS_SOURCES"] = json.dumps(sources)
    server = launchers.ForkServer()
    with pytest.raises(RefusedError) as refused:
        server.start(tmp_path, env)
    assert "the fork server did not start" in str(refused.value)
    assert "worker.py): its bytes are not the ones the runner verified" in str(refused.value)
